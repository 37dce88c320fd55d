//! The cluster's roster: one key (`nodes`) in the registry's bucket naming
//! every node that joined, the process serving it and its heartbeat count,
//! and whether the others declared it gone (fenced).
//!
//! Invariants:
//! - Every change is a compare-and-set on the bucket ([`Bucket::update`]),
//!   so a beat, a claim and a fence racing on one entry have one winner: a
//!   node fenced is never renewed by its late beat, and a fence never lands
//!   on a beat it did not see.
//! - A node's entry is only ever renewed by the process that holds it (its
//!   `session`); a fenced entry is taken again only by a new claim, after
//!   the fenced node's live records were settled (`swept`).
//! - The roster holds at most [`MAX_NODES`] entries; a value that does not
//!   parse is an error, never an empty roster (that would let a name be
//!   claimed twice).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use taskhost_core::tasks::store::StoreError;

use super::bucket::{Bucket, Change};

/// The roster's key.
pub const ROSTER_KEY: &str = "nodes";
/// The most nodes one roster names (a claim beyond it is refused).
pub const MAX_NODES: usize = 1_024;

/// One node's entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    /// The serving process's token: new at each claim.
    pub session: String,
    /// The machine (its host name) and boot (`/proc/sys/kernel/random/boot_id`).
    pub host: String,
    pub boot_id: String,
    /// The serving process and its start time (clock ticks since boot).
    pub pid: u32,
    pub pid_start: u64,
    /// Heartbeats written by this session so far.
    pub beat: u64,
    /// The node's labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Its live tasks at its last beat.
    #[serde(default)]
    pub live: u64,
    /// The tools it serves, at its last beat.
    #[serde(default)]
    pub tools: Vec<String>,
    /// The node that declared this one gone, when one did.
    #[serde(default)]
    pub fenced_by: Option<String>,
    /// The fenced node's live records were all settled.
    #[serde(default)]
    pub swept: bool,
}

impl NodeEntry {
    /// The entry of this process, at its first beat.
    pub fn of_this_process(session: &str, labels: &BTreeMap<String, String>) -> Self {
        let pid = std::process::id();
        Self {
            session: session.to_string(),
            host: read_trimmed("/proc/sys/kernel/hostname"),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            pid,
            pid_start: taskhost_process::durable::start_time(pid).unwrap_or(0),
            beat: 0,
            labels: labels.clone(),
            live: 0,
            tools: Vec::new(),
            fenced_by: None,
            swept: false,
        }
    }

    /// The process that wrote this entry is known to be gone: it ran on
    /// this machine since its last boot, and no process with its pid and
    /// start time runs now.
    pub fn process_is_gone(&self) -> bool {
        self.boot_id == read_trimmed("/proc/sys/kernel/random/boot_id")
            && !self.boot_id.is_empty()
            && taskhost_process::durable::start_time(self.pid) != Some(self.pid_start)
    }

    /// What a watcher compares between two reads to see a node alive.
    pub fn pulse(&self) -> (&str, u64) {
        (&self.session, self.beat)
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map(|text| text.trim().to_string()).unwrap_or_default()
}

/// The roster: node name → entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roster {
    pub nodes: BTreeMap<String, NodeEntry>,
}

impl Roster {
    fn parse(value: Option<&bytes::Bytes>) -> Result<Self, StoreError> {
        match value {
            None => Ok(Self::default()),
            Some(value) => serde_json::from_slice(value).map_err(|error| {
                StoreError::new(format!("cluster: the roster ({ROSTER_KEY}) is not readable: {error}"))
            }),
        }
    }

    fn to_bytes(&self) -> bytes::Bytes {
        serde_json::to_vec(self).expect("a roster serializes").into()
    }
}

/// Reads the roster.
pub async fn read(bucket: &Bucket) -> Result<Roster, String> {
    let value = bucket.read(ROSTER_KEY).await?;
    Roster::parse(value.as_ref().map(|(value, _)| value)).map_err(|error| error.0)
}

/// Changes the roster with `change` (compare-and-set, read again after a
/// lost race): `Some(answer)` writes the changed roster, `None` leaves it.
pub async fn update<T>(
    bucket: &Bucket,
    doing: &str,
    mut change: impl FnMut(&mut Roster) -> Result<Option<T>, StoreError>,
) -> Result<Option<T>, StoreError> {
    bucket
        .update(ROSTER_KEY, doing, |value| {
            let mut roster = Roster::parse(value)?;
            Ok(match change(&mut roster)? {
                Some(answer) => {
                    if roster.nodes.len() > MAX_NODES {
                        return Err(StoreError::new(format!(
                            "cluster: the roster names {MAX_NODES} nodes already; no more may join"
                        )));
                    }
                    Change::Write(roster.to_bytes(), Some(answer))
                }
                None => Change::Keep(None),
            })
        })
        .await
}
