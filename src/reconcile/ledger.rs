//! Per-key counts (times sent, times processed) in a temporary RocksDB, so reconciling millions
//! of keys costs disk rather than memory; one ordered scan then yields each key's verdict.

use super::records::Settlement;
use crate::store::write::write_batch;
use anyhow::{Context, Result};
use rocksdb::{BlockBasedOptions, Cache, MergeOperands, Options, WriteBatch, DB};
use std::path::Path;

/// Count updates per WriteBatch.
const BATCH_OPS: usize = 10_000;
/// Memtable size; with `MAX_WRITE_BUFFERS` it bounds the write side's memory. Each full memtable
/// becomes one sorted table that the scan merges, so larger memtables mean fewer tables.
const WRITE_BUFFER_BYTES: usize = 64 << 20;
const MAX_WRITE_BUFFERS: i32 = 3;
/// Block cache for the scan, index and filter blocks included.
const CACHE_BYTES: usize = 16 << 20;

/// How often a key was sent, processed, and settled without an output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Times upstream listed it as sent.
    pub sent: u64,
    /// Times it was processed (emitted).
    pub processed: u64,
    /// Times tally dropped it by its rules (a duplicate, a stale version).
    pub dropped: u64,
    /// Times it was dead-lettered.
    pub dead_lettered: u64,
}

/// What a key's counts say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Sent and processed once.
    Reconciled,
    /// Sent, never processed, never settled: lost.
    Missing,
    /// Sent, never emitted, dropped by the rules (a duplicate or a stale version): correct.
    Dropped,
    /// Sent, never emitted, dead-lettered: known and recoverable, not lost.
    DeadLettered,
    /// Processed, never sent.
    Ghost,
    /// Sent, processed more than once.
    Duplicate,
}

impl Counts {
    /// The verdict on a key with these counts. A key processed twice but never sent is a ghost
    /// (its count says how often), not also a duplicate; one only settled and never sent is
    /// nothing to report (outside the sent period, say). An output outweighs a dead letter: the
    /// event came through after all.
    pub fn verdict(self) -> Verdict {
        match (self.sent, self.processed) {
            (0, 0) => Verdict::Reconciled,
            (0, _) => Verdict::Ghost,
            (_, 0) if self.dead_lettered > 0 => Verdict::DeadLettered,
            (_, 0) if self.dropped > 0 => Verdict::Dropped,
            (_, 0) => Verdict::Missing,
            (_, 1) => Verdict::Reconciled,
            _ => Verdict::Duplicate,
        }
    }

    /// Four LEB128 varints (sent, processed, dropped, dead-lettered), on the stack: a single
    /// count update is 4 bytes, which keeps the memtables and tables small.
    fn encode(self) -> Encoded {
        let mut out = Encoded {
            bytes: [0; ENCODED_MAX],
            len: 0,
        };
        for mut n in [self.sent, self.processed, self.dropped, self.dead_lettered] {
            while n >= 0x80 {
                out.bytes[out.len] = (n as u8) | 0x80;
                out.len += 1;
                n >>= 7;
            }
            out.bytes[out.len] = n as u8;
            out.len += 1;
        }
        out
    }

    /// Decodes what `encode` wrote; the database is private to this run, so a short or
    /// malformed value cannot occur, and its missing counts would read as zero.
    fn decode(bytes: &[u8]) -> Self {
        let mut fields = [0u64; 4];
        let mut bytes = bytes.iter();
        for field in &mut fields {
            let mut shift = 0;
            for &b in bytes.by_ref() {
                if shift < 64 {
                    *field |= u64::from(b & 0x7f) << shift;
                }
                shift += 7;
                if b & 0x80 == 0 {
                    break;
                }
            }
        }
        let [sent, processed, dropped, dead_lettered] = fields;
        Self {
            sent,
            processed,
            dropped,
            dead_lettered,
        }
    }

    /// Both counts added, saturating.
    pub fn plus(self, other: Self) -> Self {
        Self {
            sent: self.sent.saturating_add(other.sent),
            processed: self.processed.saturating_add(other.processed),
            dropped: self.dropped.saturating_add(other.dropped),
            dead_lettered: self.dead_lettered.saturating_add(other.dead_lettered),
        }
    }
}

/// The longest encoding: four varints of at most 10 bytes.
const ENCODED_MAX: usize = 40;

/// Encoded counts.
struct Encoded {
    bytes: [u8; ENCODED_MAX],
    len: usize,
}

impl AsRef<[u8]> for Encoded {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Sums count updates: RocksDB merges them without a read per update.
fn add_counts(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let start = existing.map(Counts::decode).unwrap_or_default();
    let total = operands.iter().map(Counts::decode).fold(start, Counts::plus);
    Some(total.encode().as_ref().to_vec())
}

/// The temporary count database; deleted when dropped.
pub struct Ledger {
    // Declared before `dir` so the database closes before its directory is removed.
    db: DB,
    batch: WriteBatch,
    dir: tempfile::TempDir,
}

impl Ledger {
    /// Creates an empty ledger in a new directory under `parent` (the system's temporary
    /// directory when `None`).
    pub fn create(parent: Option<&Path>) -> Result<Self> {
        let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
        let dir = tempfile::Builder::new()
            .prefix("tally-reconcile-")
            .tempdir_in(&parent)
            .with_context(|| {
                format!(
                    "cannot create a work directory in `{}`; pick one with --work-dir",
                    parent.display()
                )
            })?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        // Written once, scanned once: no compaction (the scan merges the flushed tables, each
        // sorted, like an external merge sort) and no write stalls on their number.
        opts.prepare_for_bulk_load();
        opts.set_merge_operator_associative("tally.reconcile.add", add_counts);
        opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
        opts.set_max_write_buffer_number(MAX_WRITE_BUFFERS);
        opts.set_max_background_jobs(2);
        opts.set_max_open_files(256);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&Cache::new_lru_cache(CACHE_BYTES));
        table.set_cache_index_and_filter_blocks(true);
        opts.set_block_based_table_factory(&table);
        let db = DB::open(&opts, dir.path())
            .with_context(|| format!("cannot open the work database in `{}`", dir.path().display()))?;
        Ok(Self {
            db,
            batch: WriteBatch::default(),
            dir,
        })
    }

    /// A handle on the database that threads share, each writing through a [`Writer`] of its
    /// own.
    pub fn shared(&self) -> Shared<'_> {
        Shared {
            db: &self.db,
            dir: self.dir.path(),
        }
    }

    fn flush(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        self.shared().write(batch)
    }

    /// Hands every key with its counts to `each`, in byte order of the keys.
    pub fn scan(&mut self, each: &mut dyn FnMut(&[u8], Counts) -> Result<()>) -> Result<()> {
        self.flush()?;
        let mut read = rocksdb::ReadOptions::default();
        read.fill_cache(false);
        read.set_readahead_size(4 << 20);
        let mut it = self.db.raw_iterator_opt(read);
        it.seek_to_first();
        while let (Some(key), Some(value)) = (it.key(), it.value()) {
            each(key, Counts::decode(value))?;
            it.next();
        }
        it.status().context("cannot read the work database")
    }
}

/// Count updates, written in batches of `BATCH_OPS` through the ledger itself or a [`Writer`].
pub trait Counter {
    /// Adds `counts` to `key`'s.
    fn add(&mut self, key: &[u8], counts: Counts) -> Result<()>;

    /// Counts one sending of `key`.
    fn sent(&mut self, key: &[u8]) -> Result<()> {
        self.add(
            key,
            Counts {
                sent: 1,
                ..Counts::default()
            },
        )
    }

    /// Counts one processing of `key`.
    fn processed(&mut self, key: &[u8]) -> Result<()> {
        self.add(
            key,
            Counts {
                processed: 1,
                ..Counts::default()
            },
        )
    }

    /// Counts one settling of `key` without an output.
    fn settled(&mut self, key: &[u8], how: Settlement) -> Result<()> {
        let counts = match how {
            Settlement::Dropped => Counts {
                dropped: 1,
                ..Counts::default()
            },
            Settlement::DeadLettered => Counts {
                dead_lettered: 1,
                ..Counts::default()
            },
        };
        self.add(key, counts)
    }
}

impl Counter for Ledger {
    fn add(&mut self, key: &[u8], counts: Counts) -> Result<()> {
        self.batch.merge(key, counts.encode());
        if self.batch.len() >= BATCH_OPS {
            self.flush()?;
        }
        Ok(())
    }
}

/// The ledger's database, shared by threads that count into it at the same time.
#[derive(Clone, Copy)]
pub struct Shared<'a> {
    db: &'a DB,
    dir: &'a Path,
}

impl<'a> Shared<'a> {
    /// A writer with a batch of its own.
    pub fn writer(self) -> Writer<'a> {
        Writer {
            shared: self,
            batch: WriteBatch::default(),
        }
    }

    /// Writes without a write-ahead log: the database lives for one run, so a crash loses nothing
    /// worth one. A stalled write is tried again, so each attempt gets its own copy of the batch.
    fn write(self, batch: WriteBatch) -> Result<()> {
        write_batch(
            self.db,
            false,
            || Ok(WriteBatch::from_data(batch.data())),
            anyhow::Error::new,
        )
        .with_context(|| format!("cannot write to the work database in `{}`", self.dir.display()))
    }
}

/// One thread's count updates.
pub struct Writer<'a> {
    shared: Shared<'a>,
    batch: WriteBatch,
}

impl Writer<'_> {
    /// Writes the updates not written yet; a writer dropped without this loses them.
    pub fn finish(mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        self.shared.write(batch)
    }
}

impl Counter for Writer<'_> {
    fn add(&mut self, key: &[u8], counts: Counts) -> Result<()> {
        self.batch.merge(key, counts.encode());
        if self.batch.len() >= BATCH_OPS {
            let batch = std::mem::take(&mut self.batch);
            self.shared.write(batch)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(ledger: &mut Ledger) -> Vec<(String, Counts)> {
        let mut out = Vec::new();
        ledger
            .scan(&mut |k, c| {
                out.push((String::from_utf8_lossy(k).into_owned(), c));
                Ok(())
            })
            .expect("scan");
        out
    }

    fn counts(sent: u64, processed: u64) -> Counts {
        Counts {
            sent,
            processed,
            ..Counts::default()
        }
    }

    #[test]
    fn counts_add_up_per_key_and_scan_in_key_order() {
        let mut ledger = Ledger::create(None).expect("ledger");
        for k in ["b", "a", "c", "a"] {
            ledger.sent(k.as_bytes()).expect("sent");
        }
        for k in ["a", "d", "d", "c", "c", "c"] {
            ledger.processed(k.as_bytes()).expect("processed");
        }
        let got = scan(&mut ledger);
        let expected = vec![
            ("a".to_string(), counts(2, 1)),
            ("b".to_string(), counts(1, 0)),
            ("c".to_string(), counts(1, 3)),
            ("d".to_string(), counts(0, 2)),
        ];
        assert_eq!(got, expected);
        let verdicts: Vec<Verdict> = got.iter().map(|(_, c)| c.verdict()).collect();
        assert_eq!(
            verdicts,
            [
                Verdict::Reconciled,
                Verdict::Missing,
                Verdict::Duplicate,
                Verdict::Ghost
            ]
        );
    }

    #[test]
    fn a_key_settled_without_an_output_is_dropped_or_dead_lettered_never_missing() {
        let mut ledger = Ledger::create(None).expect("ledger");
        for k in ["stale", "dup", "dlq", "late", "lost"] {
            ledger.sent(k.as_bytes()).expect("sent");
        }
        ledger.settled(b"stale", Settlement::Dropped).expect("settled");
        ledger.settled(b"dup", Settlement::Dropped).expect("settled");
        ledger.settled(b"dlq", Settlement::DeadLettered).expect("settled");
        ledger.settled(b"late", Settlement::DeadLettered).expect("settled");
        ledger.processed(b"late").expect("processed");
        ledger.settled(b"unsent", Settlement::Dropped).expect("settled");
        let verdicts: Vec<(String, Verdict)> = scan(&mut ledger).into_iter().map(|(k, c)| (k, c.verdict())).collect();
        let expected = [
            ("dlq", Verdict::DeadLettered),
            ("dup", Verdict::Dropped),
            ("late", Verdict::Reconciled),
            ("lost", Verdict::Missing),
            ("stale", Verdict::Dropped),
            ("unsent", Verdict::Reconciled),
        ]
        .map(|(k, v)| (k.to_string(), v));
        assert_eq!(verdicts, expected);
    }

    #[test]
    fn more_updates_than_a_batch_and_across_flushes_are_all_counted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut ledger = Ledger::create(Some(dir.path())).expect("ledger");
        let n = BATCH_OPS * 2 + 17;
        for i in 0..n {
            ledger.sent(format!("k{:06}", i % 1000).as_bytes()).expect("sent");
        }
        // Reading in between flushes the open batch; later updates keep adding.
        assert_eq!(scan(&mut ledger).len(), 1000);
        for i in 0..1000 {
            ledger.processed(format!("k{i:06}").as_bytes()).expect("processed");
        }
        let got = scan(&mut ledger);
        let sent: u64 = got.iter().map(|(_, c)| c.sent).sum();
        assert_eq!(sent, n as u64);
        assert!(got.iter().all(|(_, c)| c.processed == 1));
    }

    #[test]
    fn an_empty_ledger_scans_nothing_and_its_directory_goes_when_dropped() {
        let parent = tempfile::tempdir().expect("tempdir");
        let mut ledger = Ledger::create(Some(parent.path())).expect("ledger");
        assert!(scan(&mut ledger).is_empty());
        let path = ledger.dir.path().to_path_buf();
        assert!(path.exists());
        drop(ledger);
        assert!(!path.exists());
    }

    #[test]
    fn writers_on_several_threads_add_to_the_same_counts() {
        let mut ledger = Ledger::create(None).expect("ledger");
        ledger.sent(b"k000").expect("sent");
        let shared = ledger.shared();
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(move || {
                    let mut writer = shared.writer();
                    for i in 0..BATCH_OPS + 5 {
                        writer
                            .processed(format!("k{:03}", i % 100).as_bytes())
                            .expect("processed");
                    }
                    writer.finish().expect("finish");
                });
            }
        });
        let got = scan(&mut ledger);
        assert_eq!(got.len(), 100);
        let processed: u64 = got.iter().map(|(_, c)| c.processed).sum();
        assert_eq!(processed, 3 * (BATCH_OPS as u64 + 5));
        assert_eq!(got[0].1.sent, 1);
    }

    #[test]
    fn counts_survive_their_encoding_at_any_size() {
        for n in [0, 1, 127, 128, 300, u64::from(u32::MAX) + 1, u64::MAX] {
            let c = Counts {
                sent: n,
                processed: 1,
                dropped: n / 3,
                dead_lettered: u64::MAX - n,
            };
            assert_eq!(Counts::decode(c.encode().as_ref()), c, "{n}");
        }
        let one = Counts {
            sent: 1,
            ..Counts::default()
        };
        assert_eq!(one.encode().as_ref(), [1, 0, 0, 0]);
    }
}
