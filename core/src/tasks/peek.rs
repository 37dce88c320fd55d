//! What a viewer (the web dashboard) gets from
//! [`crate::tasks::TaskRegistry::peek`]: the recent output of a task, never
//! consumed.
//!
//! Model: the registry keeps each stream task's output in its log
//! ([`super::output`]); a peek returns the part after an offset the viewer
//! last saw, as far as the last [`TAIL_LIMIT`] bytes reach, so the viewer
//! can follow a task without taking anything from its owner.

use super::types::TaskSnapshot;

/// The bytes of recent output one peek returns at most.
pub const TAIL_LIMIT: usize = 64 * 1024;

/// What a peek returns: the output between `start` and `end` (byte offsets
/// in everything the task produced), never consumed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct OutputPeek {
    pub text: String,
    pub start: u64,
    /// Pass it as the next peek's `since` to get only what is new.
    pub end: u64,
    /// Bytes after the requested offset that this peek does not show (older
    /// than the last [`TAIL_LIMIT`] bytes).
    pub skipped: u64,
    /// The task as it was before this peek pulled.
    pub snapshot: TaskSnapshot,
}

impl OutputPeek {
    /// The whole output of a final-output kind (empty while it runs).
    pub(crate) fn whole(text: String, snapshot: TaskSnapshot) -> Self {
        let end = text.len() as u64;
        Self { text, start: 0, end, skipped: 0, snapshot }
    }
}
