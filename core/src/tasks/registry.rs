//! The task registry: every background task, its owner, output and end.
//! This file holds the handle and its settings; the rest is by concern:
//! [`state`] (records, owner fence, queries), [`start`], [`control`] (kill,
//! wait, input), [`settle`] (settlement, notices, teardown), [`guards`],
//! [`output_ops`] (reads, views, milestones), [`memory`] (the host-wide
//! bound on output kept in memory), [`ttl`] (time to live), [`restore`]
//! (records a store kept from an earlier process, and their owners' next
//! instances) and [`handover`] (tasks changing hands between the nodes of
//! a cluster).
//!
//! Model: one table of task records behind one mutex that is never held
//! across an `.await` or a call into a producer. Records stay readable after
//! they settle, until their owner is disposed, the registry is, or they age
//! out of the owner's bounded history of finished tasks.
//!
//! What a live task costs, since a host may hold tens of thousands: one boxed
//! [`Record`] (the table keeps a pointer and the id's hash), the id, its
//! label, and one tokio task awaiting the producer's `done` (a [`Watcher`]
//! that fits one 128-byte cell). Stream kinds add their output log; what
//! only a finished task has is made at settlement. A start takes the lock
//! twice (preflight, commit) and spawns that one task.
//!
//! Each file states the invariants of its concern: the start's in [`start`],
//! settlement, notices, teardown and the history bound in [`settle`], the
//! owner fence and the reporting state in [`state`], the reads' in
//! [`output_ops`].

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

// Ids are generated here, never chosen by a caller for insertion, so a fast
// non-keyed hash is safe and keeps starts cheap.
use rustc_hash::FxHashMap as HashMap;
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::output::{OutputFiles, OutputLimits};
use super::store::{MemoryStore, StoreError, TaskStore};
use super::types::*;
use crate::agents::{Agent, AgentRegistry, CleanupKey, WeakAgent};
use crate::ids::{SessionId, TaskId, is_valid_kind};
use crate::panics::panic_message;

mod control;
mod guards;
mod handover;
mod memory;
mod output_ops;
mod restore;
mod settle;
mod start;
mod state;
mod ttl;

pub use control::AbortedWait;
use guards::ListenerSlot;
pub use guards::{ListenerGuard, SurfaceGuard};
use output_ops::StreamOutput;
pub use output_ops::{NOTICE_LINE_LIMIT, seconds};
use state::State;
pub use ttl::{TTL_MS_RANGE, warning_lead};

/// Registry settings.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// Live (running + stopping) tasks per owner; unowned tasks share one
    /// bucket. Starts over the cap fail before any work starts.
    pub max_live_tasks_per_owner: usize,
    /// How long teardown (owner or registry disposal) waits for a cancelled
    /// task to settle before force-failing its record. `None` waits forever,
    /// as the behaviour contract allows; a bound keeps a broken producer from hanging disposal.
    pub teardown_timeout: Option<Duration>,
    /// Finished records kept per owner (and for unowned tasks). Older ones
    /// are dropped once reported or noticed; see the module invariants.
    pub max_finished_tasks_per_owner: usize,
    /// How much output is kept per stream task, and where it spills.
    pub output: OutputLimits,
    /// The time to live of a task whose start names none (`None`: no
    /// bound). See [`ttl`].
    pub default_ttl: Option<Duration>,
    /// The same for a stable owner's task ([`crate::agents::Agent::is_durable`]),
    /// which outlives its owner's connection and the server: left unread
    /// this long, it is stopped (`None`: no bound but its producer's).
    pub stable_owner_ttl: Option<Duration>,
}

/// The default of [`RegistryConfig::stable_owner_ttl`]: a day.
pub const DEFAULT_STABLE_OWNER_TTL: Duration = Duration::from_secs(24 * 60 * 60);

impl RegistryConfig {
    /// The time to live of a task whose start names none, for its owner.
    pub fn default_ttl_for(&self, stable_owner: bool) -> Option<Duration> {
        if stable_owner { self.stable_owner_ttl } else { self.default_ttl }
    }
}

/// The default of [`RegistryConfig::max_finished_tasks_per_owner`].
pub const DEFAULT_MAX_FINISHED_TASKS_PER_OWNER: usize = 100;

/// Live tasks per owner unless `[tasks] max_live_tasks_per_owner` says otherwise.
pub const DEFAULT_MAX_LIVE_TASKS_PER_OWNER: usize = 10;

/// How long teardown waits for a cancelled task unless configured.
pub const DEFAULT_TEARDOWN_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            max_live_tasks_per_owner: DEFAULT_MAX_LIVE_TASKS_PER_OWNER,
            teardown_timeout: Some(DEFAULT_TEARDOWN_TIMEOUT),
            max_finished_tasks_per_owner: DEFAULT_MAX_FINISHED_TASKS_PER_OWNER,
            output: OutputLimits::default(),
            default_ttl: None,
            stable_owner_ttl: Some(DEFAULT_STABLE_OWNER_TTL),
        }
    }
}

/// How many task events a subscriber may fall behind before it misses some
/// (it then receives `RecvError::Lagged` and should re-read `list`).
pub const TASK_EVENT_BUFFER: usize = 1024;

/// A non-owning reference to a [`TaskRegistry`].
#[derive(Clone)]
pub struct WeakTaskRegistry(Weak<Shared>);

impl WeakTaskRegistry {
    pub fn upgrade(&self) -> Option<TaskRegistry> {
        self.0.upgrade().map(|shared| TaskRegistry { shared })
    }
}

/// Observes every settlement. See [`TaskRegistry::on_task_done`].
pub type TaskDoneListener = Arc<dyn Fn(&TaskDone) + Send + Sync>;

/// What a task-done listener receives.
#[non_exhaustive]
pub struct TaskDone {
    /// The terminal snapshot.
    pub snapshot: TaskSnapshot,
    /// The exact agent instance that owns the task, if it is still alive (a
    /// replacement agent with the same session is never this).
    pub owner: Option<Agent>,
}

/// The task registry. Cheap to clone; clones share one registry.
#[derive(Clone)]
pub struct TaskRegistry {
    shared: Arc<Shared>,
}

struct Shared {
    agents: AgentRegistry,
    config: RegistryConfig,
    state: Mutex<State>,
    listeners: Mutex<Vec<Arc<ListenerSlot>>>,
    /// Wakes disposal when the last in-flight start finished.
    starts_drained: Notify,
    /// Wakes an owner cleanup or a disposal waiting for settlements to
    /// finish telling of their end (see [`state::Bucket::telling`]).
    settlements_told: Notify,
    events: broadcast::Sender<TaskEvent>,
    /// Set once anyone subscribed to `events`: until then, no event is made
    /// (asking the channel for its receivers takes its lock).
    subscribed: std::sync::atomic::AtomicBool,
    output_limits: Arc<OutputLimits>,
    /// Where stream tasks' log files are made, once set.
    output_files: std::sync::OnceLock<Arc<dyn OutputFiles>>,
    /// Where stable owners' output is copied as it is logged (see
    /// [`TaskRegistry::replicate_output`]).
    output_replica: std::sync::OnceLock<Arc<dyn crate::tasks::replica::OutputReplica>>,
    /// The registry's private directory of log files, when that is where
    /// they are made (see [`TaskRegistry::set_output_spill_dir`]).
    output_dir: std::sync::OnceLock<std::path::PathBuf>,
    /// The output every log holds in memory, and who leaves memory first.
    output_memory: memory::OutputMemory,
    /// Where records are written at each transition (see [`super::store`]).
    store: Arc<dyn TaskStore>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("task registry state poisoned")
    }

    /// Records who was told of `record`'s end. A store that cannot write is
    /// logged: at worst a notice is told again after a restart.
    fn store_reporting(&self, record: &state::Record) {
        if let Err(error) = self.store.set_reporting(&record.id, record.reporting.stored()) {
            tracing::error!(task = %record.id, store = %self.store.describe(), %error, "cannot record who was told of the task's end");
        }
    }

    /// Records that a stop of `id` was requested: after a crash, the task is
    /// settled `killed`, never reported running again.
    fn store_stop(&self, id: &TaskId) {
        if let Err(error) = self.store.request_stop(id) {
            tracing::error!(task = %id, store = %self.store.describe(), %error, "cannot record the stop request in the store");
        }
    }

    /// Deletes records from the store (they left the history).
    fn store_forget(&self, ids: &[TaskId]) {
        if ids.is_empty() {
            return;
        }
        if let Err(error) = self.store.forget(ids) {
            tracing::error!(tasks = ids.len(), store = %self.store.describe(), %error, "cannot delete records from the store");
        }
    }

    /// Whether an event sent now would reach a subscriber.
    fn has_subscribers(&self) -> bool {
        self.subscribed.load(std::sync::atomic::Ordering::SeqCst) && self.events.receiver_count() > 0
    }
}

impl TaskRegistry {
    /// A registry recording in memory ([`MemoryStore`]).
    pub fn new(agents: AgentRegistry, config: RegistryConfig) -> Self {
        Self::build(agents, config, Arc::new(MemoryStore::new()))
    }

    /// A registry recording in `store`, with what the store kept from an
    /// earlier process restored (see [`restore`]): the id counters, every
    /// stable owner's records (a task that was live is settled `lost`, or
    /// `killed` when its kill was requested, and never run again), handed
    /// to the owner's next instance by [`Self::attach_owner`]. Fails when
    /// the store cannot be read.
    pub fn with_store(
        agents: AgentRegistry,
        config: RegistryConfig,
        store: Arc<dyn TaskStore>,
    ) -> Result<Self, StoreError> {
        let registry = Self::build(agents, config, store);
        registry.restore()?;
        Ok(registry)
    }

    fn build(agents: AgentRegistry, config: RegistryConfig, store: Arc<dyn TaskStore>) -> Self {
        let registry = Self {
            shared: Arc::new(Shared {
                output_limits: Arc::new(config.output.clone()),
                output_files: std::sync::OnceLock::new(),
                output_replica: std::sync::OnceLock::new(),
                output_dir: std::sync::OnceLock::new(),
                output_memory: memory::OutputMemory::new(config.output.memory_total_bytes),
                agents,
                config,
                state: Mutex::new(State::default()),
                listeners: Mutex::new(Vec::new()),
                starts_drained: Notify::new(),
                settlements_told: Notify::new(),
                events: broadcast::channel(TASK_EVENT_BUFFER).0,
                subscribed: false.into(),
                store,
            }),
        };
        if let Some(parent) = registry.shared.config.output.spill_dir.clone()
            && let Err(error) = registry.set_output_spill_dir(&parent)
        {
            tracing::warn!(dir = %parent.display(), %error, "cannot create the task output directory; output beyond memory is not kept");
        }
        registry
    }

    /// The private directory of log files, when that is where they go.
    pub fn output_spill_dir(&self) -> Option<&std::path::Path> {
        self.shared.output_dir.get().map(std::path::PathBuf::as_path)
    }

    /// Makes a private directory (mode 0700) inside `parent` and keeps
    /// stream tasks' log files there (once their output outgrows memory, a
    /// read skips some, or it leaves memory); tasks started from now on use
    /// it. Where log files go is set once (this, or
    /// [`Self::set_output_files`]): a later call changes nothing. Choose a
    /// parent the tasks' own processes cannot see.
    pub fn set_output_spill_dir(&self, parent: &std::path::Path) -> std::io::Result<()> {
        if self.shared.output_files.get().is_some() {
            return Ok(());
        }
        let dir = super::output::create_private_dir(parent)?;
        let files = Arc::new(super::output::PrivateOutputDir { dir: dir.clone() });
        if self.shared.output_files.set(files).is_ok() {
            let _ = self.shared.output_dir.set(dir);
        }
        Ok(())
    }

    /// Makes stream tasks' log files with `files` from now on (the host:
    /// in each owner's own directory, which that owner's commands see
    /// read-only, charged to the owner's disk budget). Set once: false (and
    /// nothing changes) when log files already have a place.
    pub fn set_output_files(&self, files: Arc<dyn OutputFiles>) -> bool {
        self.shared.output_files.set(files).is_ok()
    }

    /// Copies every stable owner's stream output started from now on to
    /// `replica` as it is logged (a cluster's output stream: see
    /// [`crate::tasks::replica`]). False when one was set already.
    pub fn replicate_output(&self, replica: Arc<dyn crate::tasks::replica::OutputReplica>) -> bool {
        self.shared.output_replica.set(replica).is_ok()
    }

    /// Bytes of output every stream task holds in memory now (bounded by
    /// [`OutputLimits::memory_total_bytes`]: see [`OutputLimits`]).
    pub fn output_memory_bytes(&self) -> usize {
        self.shared.output_memory.used()
    }

    pub fn agents(&self) -> &AgentRegistry {
        &self.shared.agents
    }

    /// A reference that does not keep the registry alive (for listeners the
    /// registry itself holds).
    pub fn downgrade(&self) -> WeakTaskRegistry {
        WeakTaskRegistry(Arc::downgrade(&self.shared))
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.shared.config
    }

    /// Every task-change event from now on: starts, new output, settlements
    /// and records released. A subscriber that falls more than
    /// [`TASK_EVENT_BUFFER`] events behind gets `RecvError::Lagged` and should
    /// re-read [`TaskRegistry::list`]. Events carry no output text.
    pub fn subscribe(&self) -> broadcast::Receiver<TaskEvent> {
        self.shared.subscribed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.shared.events.subscribe()
    }
}
