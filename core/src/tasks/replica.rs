//! Copying stream tasks' output out of the process as it is logged (a
//! cluster's output stream), so that another registry can take an ended
//! task in with its output and its consuming cursor once this one is gone.
//!
//! Model: a registry given an [`OutputReplica`] hands it, for each stable
//! owner's stream task, every byte it logs and every cursor a consuming read
//! leaves, addressed by [`ReplicaPosition`]: the task, the log's incarnation
//! (`epoch`: a restarted process logs a re-adopted tree's output afresh)
//! and the byte offset in that log. [`ReplayedOutput`] is what comes back.
//!
//! Invariants:
//! - Bytes are handed once, in order, up to the log file's bound
//!   ([`crate::tasks::OutputLimits::spill_bytes`], at least the memory
//!   window); a consuming read's cursor is handed after the bytes it covered,
//!   and the read is answered only once [`OutputReplica::flushed`] resolved.
//! - The replica's calls are made under the task's output lock: they must
//!   not block (a replica queues, and its queue has a bound of its own).
//! - A plain owner's tasks are not replicated: its connection ends with the
//!   process, and nobody would be left to read them.

use std::future::Future;
use std::pin::Pin;

use crate::ids::TaskId;
use crate::tasks::SectionLabel;

/// Where logged output goes as it is logged (see the module docs).
pub trait OutputReplica: Send + Sync {
    /// `text`, labelled `label`, was logged at `at`.
    fn appended(&self, at: ReplicaPosition<'_>, text: &str, label: SectionLabel);
    /// A consuming read took everything before `at`.
    fn consumed(&self, at: ReplicaPosition<'_>);
    /// Resolves once everything handed so far about `task` is kept (or the
    /// replica gave up waiting: it says so in its logs). The default is at
    /// once.
    fn flushed(&self, task: &TaskId) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let _ = task;
        Box::pin(std::future::ready(()))
    }
}

/// Where in which task's log a replicated change happened.
#[derive(Clone, Copy, Debug)]
pub struct ReplicaPosition<'a> {
    pub task: &'a TaskId,
    /// The log's incarnation: new for each log the registry makes.
    pub epoch: u64,
    /// The byte offset in that log.
    pub offset: u64,
}

/// A task's output as a replica kept it: the pieces of one log incarnation
/// from byte 0, in order, and how far its owner's consuming reads took it.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ReplayedOutput {
    pub epoch: u64,
    pub pieces: Vec<(String, SectionLabel)>,
    pub read_to: u64,
}

impl ReplayedOutput {
    pub fn new(epoch: u64, pieces: Vec<(String, SectionLabel)>, read_to: u64) -> Self {
        Self { epoch, pieces, read_to }
    }
}

/// The section labels a log may carry, so a replayed label is the same one.
const SECTION_LABELS: &[&str] = &["[stderr]"];

/// The section label named `name`, when it is one a log carries.
pub fn section_label(name: &str) -> SectionLabel {
    SECTION_LABELS.iter().copied().find(|label| *label == name)
}

/// A fresh log incarnation: distinct across logs of this process and,
/// by the clock, across processes.
pub(crate) fn new_epoch() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 44) ^ COUNT.fetch_add(1, Ordering::Relaxed)
}
