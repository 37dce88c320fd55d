//! The in-memory task store: what embedders and tests run with, and the
//! reference behaviour of the seam ([`super::TaskStore`]).
//!
//! Invariants: the same as every backend's (ids refused when held, counters
//! kept across deletions, first-wins settlement); nothing outlives the
//! process.

use std::collections::BTreeMap;
use std::sync::Mutex;

use rustc_hash::FxHashMap as HashMap;

use super::{ReportState, StoreError, StoredEnd, StoredState, StoredTask, TaskStore};
use crate::ids::TaskId;
use crate::tasks::TaskStatus;

/// Records in a map behind a mutex.
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    counters: BTreeMap<String, u64>,
    tasks: HashMap<TaskId, (u64, StoredTask)>,
    next_seq: u64,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("memory store poisoned")
    }
}

impl TaskStore for MemoryStore {
    fn load(&self) -> Result<StoredState, StoreError> {
        let inner = self.inner();
        let mut tasks: Vec<&(u64, StoredTask)> = inner.tasks.values().collect();
        tasks.sort_by_key(|(seq, _)| *seq);
        Ok(StoredState {
            counters: inner.counters.iter().map(|(kind, n)| (kind.clone(), *n)).collect(),
            tasks: tasks.into_iter().map(|(_, task)| task.clone()).collect(),
        })
    }

    fn issue_number(&self, kind: &str, at_least: u64) -> Result<u64, StoreError> {
        let mut inner = self.inner();
        let counter = inner.counters.entry(kind.to_string()).or_default();
        *counter = (*counter + 1).max(at_least);
        Ok(*counter)
    }

    fn record_start(&self, task: &StoredTask) -> Result<(), StoreError> {
        let mut inner = self.inner();
        if inner.tasks.contains_key(&task.id) {
            return Err(StoreError::new(format!("task id {} is already recorded (ids are never reused)", task.id)));
        }
        if let Some(number) = task.number() {
            let counter = inner.counters.entry(task.kind.clone()).or_default();
            *counter = (*counter).max(number);
        }
        let seq = inner.next_seq;
        inner.next_seq += 1;
        inner.tasks.insert(task.id.clone(), (seq, task.clone()));
        Ok(())
    }

    fn request_stop(&self, id: &TaskId) -> Result<bool, StoreError> {
        let mut inner = self.inner();
        Ok(match inner.tasks.get_mut(id) {
            Some((_, task)) if task.status == TaskStatus::Running => {
                task.status = TaskStatus::Stopping;
                true
            }
            _ => false,
        })
    }

    fn settle(&self, id: &TaskId, end: &StoredEnd) -> Result<bool, StoreError> {
        let mut inner = self.inner();
        Ok(match inner.tasks.get_mut(id) {
            Some((_, task)) if !task.status.is_terminal() => {
                task.status = end.status;
                task.detail = end.detail.clone();
                task.finished_at = Some(end.finished_at);
                task.reporting = end.reporting;
                task.output = end.output.clone();
                true
            }
            _ => false,
        })
    }

    fn set_reporting(&self, id: &TaskId, reporting: ReportState) -> Result<(), StoreError> {
        if let Some((_, task)) = self.inner().tasks.get_mut(id) {
            task.reporting = reporting;
        }
        Ok(())
    }

    fn set_tree_cursor(&self, id: &TaskId, cursor: &str) -> Result<(), StoreError> {
        if let Some((_, task)) = self.inner().tasks.get_mut(id)
            && let Some(tree) = &mut task.tree
        {
            tree.cursor = Some(cursor.to_string());
        }
        Ok(())
    }

    fn set_expiry(&self, id: &TaskId, expires_at: std::time::SystemTime) -> Result<(), StoreError> {
        if let Some((_, task)) = self.inner().tasks.get_mut(id) {
            task.options.expires_at = Some(expires_at);
        }
        Ok(())
    }

    fn forget(&self, ids: &[TaskId]) -> Result<(), StoreError> {
        let mut inner = self.inner();
        for id in ids {
            inner.tasks.remove(id);
        }
        Ok(())
    }

    fn describe(&self) -> String {
        "memory".to_string()
    }
}
