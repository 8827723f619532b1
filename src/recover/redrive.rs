//! `tally redrive`: dead letters back to the topic they came from (or another), each exactly
//! once. Every redriven letter is recorded in a compacted redrive log, keyed by its dead-letter
//! coordinates, in the same transaction as its copy: a second run, or one that resumes after a
//! crash, skips what was already sent, whatever its filters.

use crate::engine::emit::now_ms;
use crate::engine::producer::record_size;
use crate::engine::{admin, clients, headers};
use crate::processors::correlation;
use crate::reconcile::progress::Progress;
use crate::reconcile::topic::{self, read_to_end};
use crate::topology::Topology;
use crate::trace::{self, Status, TraceRecord, FORMAT};
use crate::wire::{
    DEFAULT_CORRELATION_HEADER, PAYLOAD_OMITTED_HEADER, REASON_HEADER, REDRIVEN_FROM_HEADER, SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER, SOURCE_TOPIC_HEADER,
};
use anyhow::{bail, Context, Result};
use rdkafka::message::{BorrowedMessage, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

/// Dead letters per transaction.
const BATCH: usize = 500;
const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);

/// Which dead letters to send, and where.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only letters of this pipeline (by the source topic they name).
    pub pipeline: Option<String>,
    /// Only letters with one of these reasons (all when empty).
    pub reasons: Vec<String>,
    /// Only letters written at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Send every selected letter here instead of its source topic.
    pub to: Option<String>,
}

/// What a run found and did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Letters sent (or, in a dry run, that would be), per destination topic and reason.
    pub sent: BTreeMap<(String, String), u64>,
    /// Letters a filter left out.
    pub filtered: u64,
    /// Letters an earlier run already sent.
    pub already_redriven: u64,
    /// Letters that cannot be sent, with why (payload left out, no source topic), per reason.
    pub unsendable: BTreeMap<String, u64>,
}

impl Outcome {
    /// Letters sent in all.
    pub fn total_sent(&self) -> u64 {
        self.sent.values().sum()
    }

    /// A short report, one line per destination and reason.
    pub fn render(&self, dry_run: bool) -> String {
        let verb = if dry_run { "would send" } else { "sent" };
        let mut out = format!("{verb} {} dead letters\n", self.total_sent());
        for ((topic, reason), n) in &self.sent {
            out.push_str(&format!("  {n:>8}  {reason} → {topic}\n"));
        }
        out.push_str(&format!(
            "skipped: {} already redriven, {} not selected\n",
            self.already_redriven, self.filtered
        ));
        for (why, n) in &self.unsendable {
            out.push_str(&format!("cannot send {n}: {why}\n"));
        }
        out
    }
}

/// The redrive log of an application: compacted, one record per redriven dead letter.
pub fn log_topic(t: &Topology) -> String {
    format!("{}-redrive-log", t.application_id)
}

/// A dead letter chosen for sending.
struct Letter {
    coordinates: String,
    /// The failed event's trace event id and correlation id, when the letter names its source.
    event: Option<(String, String)>,
    to: String,
    reason: String,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl Letter {
    /// The headers it is sent with: its own, and where it was redriven from.
    fn sent_headers(&self) -> OwnedHeaders {
        let hs = self.headers.iter().fold(OwnedHeaders::new(), |h, (name, value)| {
            headers::add(h, name, value.as_deref())
        });
        headers::add(hs, REDRIVEN_FROM_HEADER.as_bytes(), Some(self.coordinates.as_bytes()))
    }

    /// Its size as sent, as the producer's and the broker's limits count it.
    fn size(&self) -> usize {
        record_size(self.key.as_deref(), Some(&self.payload), Some(&self.sent_headers()))
    }
}

/// Reads the dead-letter topic up to its end, selects letters, and sends them (not when
/// `dry_run`), with the topology's bootstrap servers and `kafka.properties`.
pub fn run(t: &Topology, selection: &Selection, dry_run: bool) -> Result<Outcome> {
    if let Some(p) = &selection.pipeline {
        if !t.pipelines.iter().any(|q| &q.name == p) {
            bail!("the topology has no pipeline `{p}`");
        }
    }
    let log = log_topic(t);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    admin::ensure_compacted(t, rt.handle(), &log, 1)?;
    let properties: Vec<(String, String)> = t.kafka.properties.clone().into_iter().collect();
    let reader = topic::client_config(&t.kafka.bootstrap_servers, &properties)?;
    let mut done: HashSet<String> = HashSet::new();
    read_to_end(&reader, &log, &mut |m| {
        if let Some(k) = m.key().and_then(|k| std::str::from_utf8(k).ok()) {
            // A tombstone would undo a record; nothing writes one, but honour it.
            match m.payload() {
                Some(_) => done.insert(k.to_string()),
                None => done.remove(k),
            };
        }
        Ok(())
    })
    .with_context(|| format!("reading the redrive log `{log}`"))?;

    // Letters are sent while the topic is read, a batch at a time: a dead-letter topic may hold
    // more than memory.
    let mut outcome = Outcome::default();
    let mut sender = Sender::new(t, log, dry_run);
    let mut limits: HashMap<String, (usize, String)> = HashMap::new();
    let progress = Progress::start("dead letters read", "records", true);
    read_to_end(&reader, &t.dead_letter_topic, &mut |m| {
        progress.inc();
        if let Some(letter) = select(t, selection, &done, m, &mut outcome) {
            // A record the destination refuses would fail its whole batch, in every run.
            let (limit, by) = match limits.get(&letter.to) {
                Some(known) => known.clone(),
                None => {
                    let found = admin::message_limit(t, rt.handle(), &letter.to)?;
                    limits.entry(letter.to.clone()).or_insert(found).clone()
                }
            };
            if letter.size() > limit {
                let why = format!(
                    "the record is over the {limit} bytes `{}` takes ({by}); raise it, or give --to a topic \
                     that takes it",
                    letter.to
                );
                *outcome.unsendable.entry(why).or_default() += 1;
                return Ok(());
            }
            *outcome
                .sent
                .entry((letter.to.clone(), letter.reason.clone()))
                .or_default() += 1;
            sender.push(letter)?;
        }
        Ok(())
    })
    .with_context(|| format!("reading the dead-letter topic `{}`", t.dead_letter_topic))?;
    progress.finish();
    sender.finish()?;
    Ok(outcome)
}

/// The letter `m` as it will be sent, or `None` (counted in `outcome`) when it is not.
fn select(
    t: &Topology,
    selection: &Selection,
    done: &HashSet<String>,
    m: &BorrowedMessage<'_>,
    outcome: &mut Outcome,
) -> Option<Letter> {
    let coordinates = format!("{}/{}/{}", m.topic(), m.partition(), m.offset());
    let header = |name: &str| headers::text(m, name).map(str::to_string);
    // Bounded like the ids below: the redrive log records it.
    let reason = header(REASON_HEADER).map_or_else(|| "unknown".to_string(), |r| correlation::carried(&r).into_owned());
    let source = header(SOURCE_TOPIC_HEADER);
    let pipeline = source
        .as_deref()
        .and_then(|s| t.stage_for_topic(s))
        .map(|(p, _)| p.name.clone());
    let selected = selection.pipeline.as_ref().is_none_or(|p| pipeline.as_ref() == Some(p))
        && (selection.reasons.is_empty() || selection.reasons.contains(&reason))
        && selection
            .since_ms
            .is_none_or(|since| m.timestamp().to_millis().is_some_and(|ts| ts >= since));
    if !selected {
        outcome.filtered += 1;
        return None;
    }
    if done.contains(&coordinates) {
        outcome.already_redriven += 1;
        return None;
    }
    let mut unsendable = |why: &str| {
        *outcome.unsendable.entry(why.to_string()).or_default() += 1;
        None
    };
    if header(PAYLOAD_OMITTED_HEADER).is_some() {
        return unsendable("the dead letter left out the payload (too large); resend it from upstream");
    }
    let Some(payload) = m.payload() else {
        return unsendable("the record had no value");
    };
    // The failed event this letter stands for, closed in the trace when its copy is sent.
    let event = match (&source, header(SOURCE_PARTITION_HEADER), header(SOURCE_OFFSET_HEADER)) {
        (Some(topic), Some(partition), Some(offset)) => {
            let correlation_header = t
                .stage_for_topic(topic)
                .map_or(DEFAULT_CORRELATION_HEADER, |(p, _)| p.correlation_header());
            // Bounded as the stream and the reconciler bound them: a letter written by anyone
            // may carry texts whose trace record would not fit, and would stop every later run.
            let event_id = format!("{topic}/{partition}/{offset}");
            let correlation_id = header(correlation_header).unwrap_or_default();
            Some((
                correlation::carried(&event_id).into_owned(),
                correlation::carried(&correlation_id).into_owned(),
            ))
        }
        _ => None,
    };
    let to = match (&selection.to, source, &pipeline) {
        (Some(to), _, _) => to.clone(),
        (None, Some(source), Some(_)) => source,
        // A dead-letter topic shared with other applications: their letters are not ours to send.
        (None, Some(_), None) => return unsendable("its source topic is not one of this topology's; give --to"),
        (None, None, _) => return unsendable("no tally.source.topic header; give --to"),
    };
    // The input's own headers, without what tally added when it dead-lettered the record.
    let kept = headers::entries(m)
        .filter(|h| !h.name.starts_with(b"tally.error.") && !h.name.starts_with(b"tally.source."))
        .map(|h| (h.name.to_vec(), h.value.map(<[u8]>::to_vec)))
        .collect();
    Some(Letter {
        coordinates,
        event,
        to,
        reason,
        key: m.key().map(<[u8]>::to_vec),
        payload: payload.to_vec(),
        headers: kept,
    })
}

/// Sends letters in transactions of [`BATCH`], each with its redrive log record and the trace
/// record that closes its failed event; a dry run sends nothing.
struct Sender<'a> {
    t: &'a Topology,
    log: String,
    dry_run: bool,
    /// Made on the first letter: a run with nothing to send starts no transactions.
    producer: Option<ThreadedProducer<rdkafka::producer::DefaultProducerContext>>,
    batch: Vec<Letter>,
    batches: usize,
}

impl<'a> Sender<'a> {
    fn new(t: &'a Topology, log: String, dry_run: bool) -> Self {
        Self {
            t,
            log,
            dry_run,
            producer: None,
            batch: Vec::new(),
            batches: 0,
        }
    }

    fn push(&mut self, letter: Letter) -> Result<()> {
        if self.dry_run {
            return Ok(());
        }
        self.batch.push(letter);
        if self.batch.len() >= BATCH {
            self.commit_batch()?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        if !self.batch.is_empty() {
            self.commit_batch()?;
        }
        Ok(())
    }

    fn producer(&mut self) -> Result<&ThreadedProducer<rdkafka::producer::DefaultProducerContext>> {
        if self.producer.is_none() {
            let producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext> = clients::base(self.t)
                .set("transactional.id", format!("{}-redrive", self.t.application_id))
                .set("enable.idempotence", "true")
                .set("allow.auto.create.topics", "false")
                .create()
                .context("cannot create the redrive producer")?;
            producer
                .init_transactions(KAFKA_TIMEOUT)
                .context("cannot start the redrive producer's transactions (is another `tally redrive` running?)")?;
            self.producer = Some(producer);
        }
        self.producer.as_ref().context("redrive producer missing")
    }

    fn commit_batch(&mut self) -> Result<()> {
        let letters = std::mem::take(&mut self.batch);
        let (t, log) = (self.t, self.log.clone());
        self.batches += 1;
        let n = self.batches;
        let producer = self.producer()?;
        producer
            .begin_transaction()
            .context("beginning a redrive transaction")?;
        for l in &letters {
            send_letter(t, producer, &log, l)?;
        }
        producer.commit_transaction(KAFKA_TIMEOUT).with_context(|| {
            format!("committing redrive batch {n} (its letters are sent again by the next run if it aborted)")
        })?;
        tracing::info!(batch = n, letters = letters.len(), "redrive batch committed");
        Ok(())
    }
}

/// Sends one letter, its redrive log record and the trace record closing its failed event, in
/// the open transaction.
fn send_letter(
    t: &Topology,
    producer: &ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
    log: &str,
    l: &Letter,
) -> Result<()> {
    let mut record = BaseRecord::to(&l.to).payload(&l.payload).headers(l.sent_headers());
    if let Some(k) = &l.key {
        record = record.key(k);
    }
    producer
        .send(record)
        .map_err(|(e, _)| e)
        .with_context(|| format!("sending dead letter {} to `{}`", l.coordinates, l.to))?;
    if let (Some(trace_settings), Some((event_id, correlation_id))) = (&t.trace, &l.event) {
        let node = format!("{}/redrive", t.application_id);
        let closing = TraceRecord {
            format: FORMAT,
            event_id,
            idempotency_key: None,
            idempotency_key_fields: None,
            correlation_id,
            node: &node,
            status: Status::Completed,
            outcome: Some(trace::Outcome::Redriven),
            timestamp_ms: now_ms(),
            reason: None,
        };
        let value = serde_json::to_vec(&closing).context("encoding a trace record")?;
        producer
            .send(BaseRecord::to(&trace_settings.topic).key(event_id).payload(&value))
            .map_err(|(e, _)| e)
            .with_context(|| format!("closing event {event_id} on the trace topic `{}`", trace_settings.topic))?;
    }
    let entry = serde_json::json!({"to": l.to, "reason": l.reason}).to_string();
    producer
        .send(BaseRecord::to(log).key(&l.coordinates).payload(&entry))
        .map_err(|(e, _)| e)
        .with_context(|| format!("recording dead letter {} in `{log}`", l.coordinates))?;
    Ok(())
}
