//! The task store seam: where the registry records what must outlive the
//! process (task records, their ends, who was told, the id counters), and
//! the in-memory backend ([`MemoryStore`]); the host's SQLite backend and
//! its NATS JetStream cluster backend implement the same [`TaskStore`].
//!
//! Invariants every backend keeps:
//! - **Synchronous and short.** The registry calls the store under its own
//!   lock, which is never held across an `.await`: a call is a local write
//!   (an in-memory map, a SQLite transaction in WAL mode), or for the
//!   host's cluster store a bounded wait for replies from a client running
//!   on a thread of its own (never a `block_on` on the caller's runtime).
//! - **Ids are never reused.** [`TaskStore::record_start`] refuses an id it
//!   holds, and raises the kind's counter to at least the id's number; the
//!   counters survive every record's deletion.
//! - **First wins.** [`TaskStore::settle`] and [`TaskStore::request_stop`]
//!   are compare-and-set transitions on the stored status: a settlement of a
//!   record already terminal changes nothing and says so; a stop request
//!   moves only `running` to `stopping`.
//! - **Write-ahead.** A start's record, a stop request and a settlement are
//!   committed when the call returns (they decide what happens after a
//!   crash); the reporting state may lag by a crash, which at worst repeats
//!   no notice (a record noticed but not yet marked is told again once).
//! - **Refused when unrecorded.** A start whose [`TaskStore::record_start`]
//!   fails is refused ([`crate::tasks::TaskError::NotRecorded`]) and its
//!   work stopped: no id is returned for a task a restart would not know.
//!   With [`TaskStore::fences_launches`], the start is recorded before its
//!   work runs, so a refused start ran nothing.

mod memory;

use std::time::{Duration, SystemTime};

use crate::ids::{SessionId, TaskId};
use crate::tasks::{NotifyOn, TaskInput, TaskOptions, TaskStatus};

pub use memory::MemoryStore;

/// Who owns a stored task.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredOwner {
    pub session: SessionId,
    /// A stable owner (an HTTP token, `serve --owner`): its records outlive
    /// the process and are handed to its next instance. Other owners'
    /// records are kept only to say how they ended.
    pub durable: bool,
}

impl StoredOwner {
    pub fn new(session: SessionId, durable: bool) -> Self {
        Self { session, durable }
    }
}

/// Who was told of a task's end (the registry's reporting state as stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReportState {
    /// Nobody was told yet (or the task has not ended).
    Untold,
    /// Ended while a wait or kill was pending; after a restart none is, so
    /// it counts as untold.
    Held,
    /// The completion notice was put in the owner's session.
    Noticed,
    /// The end was delivered, or nobody is left to tell.
    Reported,
}

impl ReportState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Untold => "untold",
            Self::Held => "held",
            Self::Noticed => "noticed",
            Self::Reported => "reported",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "untold" => Self::Untold,
            "held" => Self::Held,
            "noticed" => Self::Noticed,
            "reported" => Self::Reported,
            _ => return None,
        })
    }
}

/// One task as the store holds it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StoredTask {
    pub id: TaskId,
    pub kind: String,
    pub label: String,
    pub owner: Option<StoredOwner>,
    pub status: TaskStatus,
    pub detail: Option<String>,
    pub started_at: SystemTime,
    pub finished_at: Option<SystemTime>,
    pub producer_info: Option<String>,
    pub reporting: ReportState,
    /// A final-output kind's output (stream kinds keep theirs in their log).
    pub output: Option<String>,
    /// The durable process tree whose outcome is the task's (a plugin
    /// handed it over): a later process re-adopts it.
    pub tree: Option<StoredTree>,
    /// How its start asked for it to be served: restored with a re-adopted
    /// task (its input, its milestones, its time to live).
    pub options: StoredOptions,
}

/// A start's [`crate::tasks::TaskOptions`] as the store keeps them, and the
/// deadline of its time to live.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct StoredOptions {
    pub input: TaskInput,
    /// `notify_on.pattern`, as the owner wrote it.
    pub notify_pattern: Option<String>,
    /// `notify_on.stalled`.
    pub notify_stalled: Option<Duration>,
    pub ttl: Option<Duration>,
    /// When the time to live runs out unless the owner reads the task
    /// first (renewed by [`TaskStore::set_expiry`]).
    pub expires_at: Option<SystemTime>,
}

impl StoredOptions {
    /// What a start with `options` stores; `ttl` is the one in effect (its
    /// own or the server's default), running out at `expires_at`.
    pub fn of(options: &TaskOptions, ttl: Option<Duration>, expires_at: Option<SystemTime>) -> Self {
        let notify = options.notify_on.as_ref();
        Self {
            input: options.input,
            notify_pattern: notify.and_then(|n| n.pattern.as_ref()).map(|p| p.as_str().to_string()),
            notify_stalled: notify.and_then(|n| n.stalled),
            ttl,
            expires_at,
        }
    }

    /// The options to serve a restored task with. A pattern that no longer
    /// compiles (a newer writer's syntax) is dropped, with a log line.
    pub fn to_options(&self) -> TaskOptions {
        let pattern = self.notify_pattern.as_deref().and_then(|text| {
            regex::Regex::new(text)
                .inspect_err(|error| tracing::warn!(%error, "a stored notify_on pattern does not compile; dropped"))
                .ok()
        });
        let notify_on = (pattern.is_some() || self.notify_stalled.is_some())
            .then(|| NotifyOn { pattern, stalled: self.notify_stalled });
        TaskOptions::default().with_input(self.input).with_notify_on(notify_on).with_ttl(self.ttl)
    }
}

/// The store's word for a [`TaskInput`].
pub fn input_name(input: TaskInput) -> &'static str {
    match input {
        TaskInput::Unsupported => "unsupported",
        TaskInput::NotRequested => "not-requested",
        TaskInput::Open => "open",
    }
}

/// The [`TaskInput`] a store's word names; an unknown word takes none.
pub fn parse_input(word: &str) -> TaskInput {
    match word {
        "not-requested" => TaskInput::NotRequested,
        "open" => TaskInput::Open,
        _ => TaskInput::Unsupported,
    }
}

/// A durable process tree a task's outcome is, as the store holds it. The
/// texts are the host's (opaque here): how to prove and reach the tree,
/// which is as secret as a token, and where its output stood when its
/// owner last took it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredTree {
    pub record: String,
    /// `None`: nothing was taken yet (the output resumes from its start).
    pub cursor: Option<String>,
}

impl StoredTree {
    pub fn new(record: String) -> Self {
        Self { record, cursor: None }
    }
}

impl StoredTask {
    /// A task just started: running, untold.
    pub fn new(id: TaskId, kind: impl Into<String>, label: impl Into<String>, started_at: SystemTime) -> Self {
        Self {
            id,
            kind: kind.into(),
            label: label.into(),
            owner: None,
            status: TaskStatus::Running,
            detail: None,
            started_at,
            finished_at: None,
            producer_info: None,
            reporting: ReportState::Untold,
            output: None,
            tree: None,
            options: StoredOptions::default(),
        }
    }

    /// The number in `<kind>-<n>`.
    pub fn number(&self) -> Option<u64> {
        self.id.as_str().strip_prefix(self.kind.as_str())?.strip_prefix('-')?.parse().ok()
    }
}

/// How a task ended, as [`TaskStore::settle`] records it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StoredEnd {
    pub status: TaskStatus,
    pub detail: Option<String>,
    pub finished_at: SystemTime,
    pub reporting: ReportState,
    pub output: Option<String>,
}

impl StoredEnd {
    pub fn new(status: TaskStatus, detail: Option<String>, finished_at: SystemTime, reporting: ReportState) -> Self {
        Self { status, detail, finished_at, reporting, output: None }
    }
}

/// Everything a store holds, as read at start-up.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct StoredState {
    /// The last number issued per kind.
    pub counters: Vec<(String, u64)>,
    /// Every record, oldest start first.
    pub tasks: Vec<StoredTask>,
}

/// A store that cannot do what was asked. The text names the store (its
/// file) and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

impl StoreError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// Where the registry records tasks. See the module invariants.
pub trait TaskStore: Send + Sync + 'static {
    /// What this registry takes over: the counters and every record no
    /// other live registry holds (a store shared by several processes
    /// claims a dead one's records here, atomically, so two never restore
    /// the same record).
    fn load(&self) -> Result<StoredState, StoreError>;

    /// The number of the next id of `kind`: one the store never issued or
    /// recorded before for it, and at least `at_least` (what the registry
    /// would issue on its own). Committed when it returns. A store shared
    /// by several processes may hand each process blocks of numbers, so
    /// numbers rise within a process, not necessarily across them.
    fn issue_number(&self, kind: &str, at_least: u64) -> Result<u64, StoreError>;

    /// Records a start (the task running, untold) and raises its kind's
    /// counter. Refuses an id already held.
    fn record_start(&self, task: &StoredTask) -> Result<(), StoreError>;

    /// True when a start is recorded *before* its work runs (the launch
    /// fence: a start the store cannot record never runs, so a client that
    /// asks again after a refusal cannot make it run twice). The registry
    /// then calls [`Self::record_start`] without a tree before the runner,
    /// and [`Self::record_tree`] once the runner handed one over. Default:
    /// false (the record is written once the work runs, with its tree).
    fn fences_launches(&self) -> bool {
        false
    }

    /// Adds the tree a fenced start's work handed over to its record
    /// ([`Self::fences_launches`]). Default: not kept.
    fn record_tree(&self, id: &TaskId, tree: &StoredTree) -> Result<(), StoreError> {
        let _ = (id, tree);
        Ok(())
    }

    /// `running` → `stopping`: a stop was requested. False when the record
    /// is not running (already stopping, ended, or unknown).
    fn request_stop(&self, id: &TaskId) -> Result<bool, StoreError>;

    /// Records the end unless the record already ended (first wins). True
    /// if this call settled it.
    fn settle(&self, id: &TaskId, end: &StoredEnd) -> Result<bool, StoreError>;

    /// Records who was told of the end.
    fn set_reporting(&self, id: &TaskId, reporting: ReportState) -> Result<(), StoreError>;

    /// Records where a handed-over tree's output stood when its owner last
    /// took it ([`StoredTree::cursor`]). Default: not kept (a store that
    /// keeps no tree).
    fn set_tree_cursor(&self, id: &TaskId, cursor: &str) -> Result<(), StoreError> {
        let _ = (id, cursor);
        Ok(())
    }

    /// Records when a task's time to live runs out now (a read renewed
    /// it). Default: not kept (the deadline a restart restores is then the
    /// one recorded at the start).
    fn set_expiry(&self, id: &TaskId, expires_at: SystemTime) -> Result<(), StoreError> {
        let _ = (id, expires_at);
        Ok(())
    }

    /// Deletes records (the counters stay).
    fn forget(&self, ids: &[TaskId]) -> Result<(), StoreError>;

    /// A short name for logs and errors (`memory`, the SQLite file's path).
    fn describe(&self) -> String;

    /// True when what it records outlives this process (a file, a
    /// cluster): only then is work made to outlive it too. Default: false.
    fn outlives_process(&self) -> bool {
        false
    }
}
