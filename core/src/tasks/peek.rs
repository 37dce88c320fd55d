//! The output the registry keeps per stream task so a viewer (the web
//! dashboard) can watch it without taking it from the model
//! ([`crate::tasks::TaskRegistry::peek`]).
//!
//! Model: a producer hands each byte of output out once. Every pull from the
//! producer — the owner's consuming read or a viewer's peek — goes through
//! the task's [`OutputLog`]:
//! - `held` is what peeks pulled and the owner has not read yet. The owner's
//!   next consuming read returns it first, then what the producer has new,
//!   so the model reads exactly what it would have read without any viewer,
//!   in the same order.
//! - `tail` is the last [`TAIL_LIMIT`] bytes of everything pulled (by reads
//!   and peeks), with the running total, so a viewer can follow from the
//!   offset it last saw.
//!
//! Invariants:
//! - Pulls of one task are serialized by the log's async mutex (never held
//!   with the registry lock), so output is never reordered.
//! - Memory is bounded: `tail` keeps at most [`TAIL_LIMIT`] bytes; `held`
//!   stops growing at [`HELD_LIMIT`] — a peek then pulls nothing more (the
//!   rest stays with the producer, under its own bounds) and says so with
//!   `held_back`, so nothing meant for the model is ever dropped. One pull
//!   may overshoot `HELD_LIMIT` by at most one producer read.

use super::types::TaskSnapshot;

/// The bytes of recent output a viewer can see per task.
pub const TAIL_LIMIT: usize = 64 * 1024;

/// Output pulled by peeks and not yet read by the owner, per task, past
/// which peeks stop pulling from the producer.
pub const HELD_LIMIT: usize = 256 * 1024;

/// One task's pulled output (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct OutputLog {
    held: String,
    tail: String,
    /// Bytes pulled since the task started; `tail` ends at this offset.
    total: u64,
}

impl OutputLog {
    fn record(&mut self, fresh: &str) {
        self.total += fresh.len() as u64;
        self.tail.push_str(fresh);
        if self.tail.len() > TAIL_LIMIT {
            let mut cut = self.tail.len() - TAIL_LIMIT;
            while !self.tail.is_char_boundary(cut) {
                cut += 1;
            }
            self.tail.drain(..cut);
        }
    }

    /// The owner's consuming read: what peeks held back, then `fresh`.
    pub(crate) fn read(&mut self, fresh: String) -> String {
        self.record(&fresh);
        let mut text = std::mem::take(&mut self.held);
        if text.is_empty() {
            return fresh;
        }
        text.push_str(&fresh);
        text
    }

    /// Whether a peek may pull more from the producer.
    pub(crate) fn may_pull(&self) -> bool {
        self.held.len() < HELD_LIMIT
    }

    /// A peek pulled `fresh`: keep it for the owner's next read.
    pub(crate) fn hold(&mut self, fresh: &str) {
        self.record(fresh);
        self.held.push_str(fresh);
    }

    /// The output after `since` that the tail still has.
    pub(crate) fn since(&self, since: u64, snapshot: TaskSnapshot) -> OutputPeek {
        let start_of_tail = self.total - self.tail.len() as u64;
        // An offset from the future (another server's) starts over.
        let since = if since > self.total { 0 } else { since };
        let from = since.max(start_of_tail);
        let mut index = (from - start_of_tail) as usize;
        while !self.tail.is_char_boundary(index) {
            index += 1;
        }
        OutputPeek {
            text: self.tail[index..].to_string(),
            start: start_of_tail + index as u64,
            end: self.total,
            skipped: from - since,
            held_back: !self.may_pull(),
            snapshot,
        }
    }
}

/// What a peek returns: the output between `start` and `end` (byte offsets
/// in everything the task produced), never consumed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OutputPeek {
    pub text: String,
    pub start: u64,
    /// Pass it as the next peek's `since` to get only what is new.
    pub end: u64,
    /// Bytes after the requested offset that are no longer kept (older than
    /// the last [`TAIL_LIMIT`] bytes).
    pub skipped: u64,
    /// The owner has [`HELD_LIMIT`] bytes or more still unread: peeks pull
    /// nothing more until the owner reads.
    pub held_back: bool,
    /// The task as it was before this peek pulled.
    pub snapshot: TaskSnapshot,
}

impl OutputPeek {
    /// The whole output of a final-output kind (empty while it runs).
    pub(crate) fn whole(text: String, snapshot: TaskSnapshot) -> Self {
        let end = text.len() as u64;
        Self { text, start: 0, end, skipped: 0, held_back: false, snapshot }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> TaskSnapshot {
        TaskSnapshot {
            id: crate::ids::TaskId::new("t-1"),
            kind: "t".into(),
            label: "l".into(),
            owner_session: None,
            status: crate::tasks::TaskStatus::Running,
            detail: None,
            started_at: std::time::SystemTime::UNIX_EPOCH,
            finished_at: None,
            reported: false,
            producer_info: None,
        }
    }

    #[test]
    fn peeked_output_reaches_the_next_read_in_order() {
        let mut log = OutputLog::default();
        log.hold("one\n");
        let peek = log.since(0, snapshot());
        assert_eq!((peek.text.as_str(), peek.start, peek.end), ("one\n", 0, 4));
        assert_eq!(log.read("two\n".into()), "one\ntwo\n");
        assert_eq!(log.read("three\n".into()), "three\n", "held output is read once");
        let peek = log.since(4, snapshot());
        assert_eq!((peek.text.as_str(), peek.start, peek.end), ("two\nthree\n", 4, 14));
        assert_eq!(log.since(14, snapshot()).text, "");
    }

    #[test]
    fn the_tail_and_the_held_output_are_bounded() {
        let mut log = OutputLog::default();
        let chunk = "é".repeat(1000); // two bytes a character
        while log.may_pull() {
            log.hold(&chunk);
        }
        assert!(log.held.len() >= HELD_LIMIT && log.held.len() < HELD_LIMIT + chunk.len());
        assert!(log.tail.len() <= TAIL_LIMIT);
        let peek = log.since(0, snapshot());
        assert!(peek.held_back);
        assert_eq!(peek.skipped, peek.start);
        assert_eq!(peek.end, log.held.len() as u64);
        let read = log.read(String::new());
        assert_eq!(read.len() as u64, peek.end, "nothing meant for the owner was dropped");
        assert!(log.may_pull());
        // An offset inside a character or past the end is answered sensibly.
        let _ = log.since(peek.end - 1, snapshot());
        assert_eq!(log.since(u64::MAX, snapshot()).skipped, log.since(0, snapshot()).skipped);
    }
}
