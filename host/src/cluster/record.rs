//! A task record as the cluster's key-value bucket holds it: JSON under
//! `task.<id>`, naming the node that runs it and its plugin version.
//!
//! Invariants: a record read back is the [`StoredTask`] written (times in
//! nanoseconds since the epoch); an unknown status word (a newer node's)
//! reads as `running` (a live task, never a forged end), an unknown
//! reporting word as `reported` (an end never told twice).

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use taskhost_core::ids::{SessionId, TaskId};
use taskhost_core::tasks::TaskStatus;
use taskhost_core::tasks::store::{
    ReportState, StoredOptions, StoredOwner, StoredTask, StoredTree, input_name, parse_input,
};

/// The key of a task's record.
pub fn task_key(id: &TaskId) -> String {
    format!("task.{}", id.as_str())
}

/// One record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub kind: String,
    pub label: String,
    /// The node running the task.
    pub node: String,
    pub owner: Option<String>,
    #[serde(default)]
    pub owner_durable: bool,
    pub status: String,
    pub detail: Option<String>,
    pub started_at_ns: u128,
    pub finished_at_ns: Option<u128>,
    /// The plugin and its version.
    pub producer_info: Option<String>,
    pub reporting: String,
    /// The node whose write last made `reporting` noticed or reported: a
    /// node that returns after a fence keeps a notice waiting for the owner
    /// only when it told it itself (else the node that took the record
    /// over tells it). Absent in records older than it, and while untold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub told_by: Option<String>,
    pub output: Option<String>,
    pub tree: Option<String>,
    pub tree_cursor: Option<String>,
    pub input: String,
    pub notify_pattern: Option<String>,
    pub notify_stalled_ms: Option<u64>,
    pub ttl_ms: Option<u64>,
    pub expires_at_ns: Option<u128>,
    /// The token of the write that stored this version: a writer whose
    /// answer was lost (a NATS node died) reads it back to learn that its
    /// write was applied.
    #[serde(default)]
    pub write: String,
}

/// A fresh write token.
pub fn write_token() -> String {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).expect("the system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn nanos(at: SystemTime) -> u128 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

pub fn time(nanos: u128) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Record {
    /// Records `reporting` as written by `node` (see [`Self::told_by`]).
    pub fn set_reporting(&mut self, reporting: ReportState, node: &str) {
        self.reporting = reporting.as_str().to_string();
        self.told_by = match reporting {
            ReportState::Noticed | ReportState::Reported => Some(node.to_string()),
            _ => None,
        };
    }

    pub fn of(task: &StoredTask, node: &str) -> Self {
        let mut record = Self {
            id: task.id.as_str().to_string(),
            kind: task.kind.clone(),
            label: task.label.clone(),
            node: node.to_string(),
            owner: task.owner.as_ref().map(|owner| owner.session.as_str().to_string()),
            owner_durable: task.owner.as_ref().is_some_and(|owner| owner.durable),
            status: task.status.as_str().to_string(),
            detail: task.detail.clone(),
            started_at_ns: nanos(task.started_at),
            finished_at_ns: task.finished_at.map(nanos),
            producer_info: task.producer_info.clone(),
            reporting: task.reporting.as_str().to_string(),
            told_by: None,
            output: task.output.clone(),
            tree: task.tree.as_ref().map(|tree| tree.record.clone()),
            tree_cursor: task.tree.as_ref().and_then(|tree| tree.cursor.clone()),
            input: input_name(task.options.input).to_string(),
            notify_pattern: task.options.notify_pattern.clone(),
            notify_stalled_ms: task.options.notify_stalled.map(millis),
            ttl_ms: task.options.ttl.map(millis),
            expires_at_ns: task.options.expires_at.map(nanos),
            write: write_token(),
        };
        record.set_reporting(task.reporting, node);
        record
    }

    /// The record stored under `key`.
    pub fn parse(key: &str, value: &[u8]) -> Result<Self, taskhost_core::tasks::store::StoreError> {
        serde_json::from_slice(value).map_err(|error| {
            taskhost_core::tasks::store::StoreError::new(format!("cluster: the record {key} is not readable: {error}"))
        })
    }

    pub fn status(&self) -> TaskStatus {
        TaskStatus::parse(&self.status).unwrap_or(TaskStatus::Running)
    }

    pub fn to_task(&self) -> StoredTask {
        let mut task = StoredTask::new(TaskId::new(self.id.clone()), &self.kind, &self.label, time(self.started_at_ns));
        task.owner =
            self.owner.as_ref().map(|owner| StoredOwner::new(SessionId::new(owner.clone()), self.owner_durable));
        task.status = self.status();
        task.detail = self.detail.clone();
        task.finished_at = self.finished_at_ns.map(time);
        task.producer_info = self.producer_info.clone();
        task.reporting = ReportState::parse(&self.reporting).unwrap_or(ReportState::Reported);
        task.output = self.output.clone();
        task.tree = self.tree.as_ref().map(|record| {
            let mut tree = StoredTree::new(record.clone());
            tree.cursor = self.tree_cursor.clone();
            tree
        });
        let mut options = StoredOptions::default();
        options.input = parse_input(&self.input);
        options.notify_pattern = self.notify_pattern.clone();
        options.notify_stalled = self.notify_stalled_ms.map(Duration::from_millis);
        options.ttl = self.ttl_ms.map(Duration::from_millis);
        options.expires_at = self.expires_at_ns.map(time);
        task.options = options;
        task
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let mut task = StoredTask::new(TaskId::new("bash-7"), "bash", "sleep 1", SystemTime::now());
        task.owner = Some(StoredOwner::new(SessionId::new("alice"), true));
        task.producer_info = Some("bash 1.2.0".into());
        task.tree = Some(StoredTree::new("tree".into()));
        task.options.ttl = Some(Duration::from_secs(60));
        let record = Record::of(&task, "n1");
        let json = serde_json::to_vec(&record).unwrap();
        let back: Record = serde_json::from_slice(&json).unwrap();
        assert_eq!(back.node, "n1");
        assert_eq!(back.to_task(), task);
    }
}
