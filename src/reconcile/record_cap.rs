//! A reader that gives one record of a sent file at most a set number of bytes, so a runaway
//! record (an unbalanced CSV quote, a JSON array element of gigabytes) ends the read with a
//! clear error instead of being held whole in memory.

use std::cell::Cell;
use std::fmt;
use std::io::{self, Read};
use std::rc::Rc;

/// The most bytes one record of a sent file may take (a JSON Lines line, a JSON array element,
/// a CSV row).
pub const MAX_RECORD_BYTES: usize = 16 << 20;

/// Reads through to `inner`, failing with [`OverCap`] once more than the cap was read since the
/// last [`RecordStart::now`]. A reader above it that buffers ahead (the CSV reader's 8 KiB) may
/// give a record up to its buffer more.
pub struct RecordCap<R> {
    inner: R,
    taken: Rc<Cell<usize>>,
    cap: usize,
}

/// Marks where a [`RecordCap`]'s next record starts.
#[derive(Clone)]
pub struct RecordStart(Rc<Cell<usize>>);

impl RecordStart {
    /// A new record starts here: its count begins at zero.
    pub fn now(&self) {
        self.0.set(0);
    }
}

impl<R: Read> RecordCap<R> {
    /// `inner`, each record given at most `cap` bytes, and the mark that starts a record.
    pub fn new(inner: R, cap: usize) -> (Self, RecordStart) {
        let taken = Rc::new(Cell::new(0));
        let start = RecordStart(Rc::clone(&taken));
        (Self { inner, taken, cap }, start)
    }
}

impl<R: Read> Read for RecordCap<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.cap.saturating_sub(self.taken.get());
        if left == 0 && !buf.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, OverCap { cap: self.cap }));
        }
        let room = buf.len().min(left);
        let n = self.inner.read(&mut buf[..room])?;
        self.taken.set(self.taken.get() + n);
        Ok(n)
    }
}

/// A record ran past the cap.
#[derive(Debug)]
pub struct OverCap {
    /// The cap it ran past, in bytes.
    pub cap: usize,
}

impl fmt::Display for OverCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a record runs past {} bytes, the most one record may hold", self.cap)
    }
}

impl std::error::Error for OverCap {}

/// The cap `e` reports, when it is a record running past one.
pub fn over_cap(e: &io::Error) -> Option<usize> {
    e.get_ref()?.downcast_ref::<OverCap>().map(|o| o.cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_record_gets_the_cap_and_no_more() {
        let (mut reader, start) = RecordCap::new(&b"abcdefghij"[..], 4);
        let mut buf = [0u8; 8];
        assert_eq!(reader.read(&mut buf).expect("read"), 4, "only the cap is handed out");
        let err = reader.read(&mut buf).expect_err("past the cap");
        assert_eq!(over_cap(&err), Some(4));
        assert!(err.to_string().contains("past 4 bytes"), "{err}");
        start.now();
        assert_eq!(reader.read(&mut buf[..3]).expect("read"), 3);
        assert_eq!(reader.read(&mut buf).expect("read"), 1, "the rest of this record's cap");
        assert_eq!(reader.read(&mut []).expect("an empty read"), 0);
        start.now();
        assert_eq!(reader.read(&mut buf).expect("read"), 2, "the end of the input");
        assert_eq!(reader.read(&mut buf).expect("read"), 0);
        assert_eq!(over_cap(&io::Error::other("other")), None);
    }
}
