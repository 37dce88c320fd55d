//! Where the host keeps stream tasks' output log files: in each owner's own
//! spill directory of the process capability, next to its processes' spill
//! files.
//!
//! So the `full output: <path>` a skipped read names is a path the owner's
//! own later commands can read: their trees see that directory read-only,
//! another owner's trees and plugins without the grant see nothing of it
//! (see `taskhost_process::ProcessHost::spawn_for`). And the logs of
//! finished tasks count against the owner's disk budget
//! (`[process] spill_bytes_per_owner`) with its spill files: a log stops
//! growing once the budget is spent, and gives its bytes back when its task
//! leaves the registry.
//!
//! Invariant: a log file is made with `OwnerSpill::create_file` (new, 0600,
//! never through a link) and holds its owner's directory alive.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use taskhost_core::ids::{SessionId, TaskId};
use taskhost_core::tasks::{OutputFile, OutputFiles};
use taskhost_process::{ProcessHost, SpillFile};

/// The host's [`OutputFiles`]: one `task-<id>.log` per stream task, in its
/// owner's spill directory (the host-level one for unowned tasks).
pub struct OwnerLogFiles {
    process: Arc<ProcessHost>,
}

impl OwnerLogFiles {
    pub fn new(process: Arc<ProcessHost>) -> Arc<Self> {
        Arc::new(Self { process })
    }
}

impl OutputFiles for OwnerLogFiles {
    fn create(&self, owner: Option<&SessionId>, task: &TaskId) -> std::io::Result<Box<dyn OutputFile>> {
        // The owner key the process capability files an owner's spills under.
        let spill = self.process.owner_spill(owner.map_or("", SessionId::as_str))?;
        let (file, guard) = spill.create_file(&format!("task-{task}"))?;
        Ok(Box::new(OwnerLogFile { file, guard }))
    }
}

struct OwnerLogFile {
    file: File,
    /// Removes the file (and gives its bytes back) when dropped.
    guard: Arc<SpillFile>,
}

impl OutputFile for OwnerLogFile {
    fn file(&self) -> &File {
        &self.file
    }

    fn path(&self) -> &Path {
        self.guard.path()
    }

    fn reserve(&self, bytes: u64) -> u64 {
        self.guard.reserve(bytes)
    }
}
