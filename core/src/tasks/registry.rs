//! The task registry: every background task, its owner, output and end.
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
//! Invariants:
//! - `start` runs every failable check first (surface fence, kind, exact live
//!   owner, owner-cleanup attach, per-owner cap), then the producer's runner
//!   exactly once, then commits under the lock; the commit cannot fail. A
//!   failed start allocates no id.
//! - Settlement is first-wins: the first outcome (or force-fail) is final;
//!   later outcomes are logged and dropped, and listeners fire once per task.
//! - Every read, kill, wait and get passes the owner fence: an owned task is
//!   reachable only by a caller of the same session; unowned tasks are open.
//! - `reported` is set when an explicit response delivered the terminal
//!   state (kill, terminal read, wait, or a wait/kill pending at settlement).
//!   A pending reporter that goes away without delivering hands the notice
//!   back, so a notice is never suppressed on behalf of nobody.
//!   An aborted wait never reports: it fails, and the notice stays due.
//! - A completion notice and an explicit report of the same end are mutually
//!   exclusive: the notice is injected under the registry lock only while the
//!   task is unreported, and a later report retracts it from the owner's
//!   unread messages, so it never accompanies the read that reported the end.
//! - Owner cleanup cancels the owner's live tasks, awaits their quiescence
//!   (bounded by the teardown timeout, then force-fails with a possible-orphan
//!   detail), waits for starts still in flight, and drops the owner's records.
//!   Its settlements count as reported (nobody is left to tell); settlements
//!   caused by registry disposal are silent (no listener runs).
//! - Each owner (and the unowned bucket) keeps at most
//!   `max_finished_tasks_per_owner` finished records: the oldest reported ones
//!   go first, then the oldest whose notice was delivered; a finished task
//!   whose end nobody was told of yet is never dropped. Dropping a record
//!   drops its producer handle (and with it its output and spill files).

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use futures::FutureExt;
// Ids are generated here, never chosen by a caller for insertion, so a fast
// non-keyed hash is safe and keeps starts cheap.
use rustc_hash::FxHashMap as HashMap;
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::output::{OutputLimits, OutputLog};
use super::types::*;
use crate::agents::{Agent, AgentRegistry, CleanupKey, WeakAgent};
use crate::ids::{SessionId, TaskId, is_valid_kind};
use crate::panics::panic_message;

mod output_ops;

pub use output_ops::{NOTICE_LINE_LIMIT, seconds};
use output_ops::{StreamOutput, TaskOutput};

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
    events: broadcast::Sender<TaskEvent>,
    /// Set once anyone subscribed to `events`: until then, no event is made
    /// (asking the channel for its receivers takes its lock).
    subscribed: std::sync::atomic::AtomicBool,
    output_limits: Arc<OutputLimits>,
    /// The registry's private directory of output spill files, once set.
    output_dir: std::sync::OnceLock<std::path::PathBuf>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(dir) = self.output_dir.get() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[derive(Default)]
struct State {
    tasks: Tasks,
    /// Per-kind id counters: the last number issued.
    next_id_by_kind: HashMap<String, u64>,
    /// Start order, for stable listings.
    next_seq: u64,
    /// Live-task accounting of unowned tasks (owners keep theirs in their scope).
    unowned: Bucket,
    owner_scopes: HashMap<u64, OwnerScope>,
    surfaces: usize,
    starts_in_flight: usize,
    disposed: bool,
}

/// Every record, found by its id. A table of boxed records keyed by the id
/// each holds, next to the id's hash: a slot is 16 bytes (no copy of the
/// key, no record-sized empty slots), growing the table moves slots, not
/// records, and neither growth nor a probe reads a record whose hash differs.
#[derive(Default)]
struct Tasks(hashbrown::HashTable<(u64, Box<Record>)>);

impl Tasks {
    fn hash(id: &TaskId) -> u64 {
        use std::hash::BuildHasher as _;
        rustc_hash::FxBuildHasher.hash_one(id.as_str())
    }

    fn get(&self, id: &TaskId) -> Option<&Record> {
        let hash = Self::hash(id);
        self.0.find(hash, |(h, r)| *h == hash && &r.id == id).map(|(_, r)| &**r)
    }

    fn get_mut(&mut self, id: &TaskId) -> Option<&mut Record> {
        let hash = Self::hash(id);
        self.0.find_mut(hash, |(h, r)| *h == hash && &r.id == id).map(|(_, r)| &mut **r)
    }

    /// Adds a record whose id is not in the table (ids are issued once).
    fn insert(&mut self, record: Box<Record>) {
        let hash = Self::hash(&record.id);
        self.0.insert_unique(hash, (hash, record), |(h, _)| *h);
    }

    fn remove(&mut self, id: &TaskId) -> Option<Record> {
        let hash = Self::hash(id);
        match self.0.find_entry(hash, |(h, r)| *h == hash && &r.id == id) {
            Ok(entry) => Some(*entry.remove().0.1),
            Err(_) => None,
        }
    }

    fn values(&self) -> impl Iterator<Item = &Record> {
        self.0.iter().map(|(_, r)| &**r)
    }

    fn drain(&mut self) -> impl Iterator<Item = Record> {
        self.0.drain().map(|(_, r)| *r)
    }
}

/// Task accounting for one owner instance (or `None`: unowned).
#[derive(Default)]
struct Bucket {
    live: usize,
    starting: usize,
    /// Finished tasks still held, oldest settlement first.
    finished: VecDeque<TaskId>,
    /// Finished tasks dropped from the history so far.
    dropped: u64,
}

/// The registry's registration in one owner's disposal scope.
struct OwnerScope {
    /// Shared by every record of this owner instance.
    owner: Arc<Owner>,
    cleanup: CleanupKey,
    closing: bool,
    bucket: Bucket,
    starts_drained: Arc<Notify>,
    tasks: Vec<TaskId>,
}

/// Who owns a task: one per owner instance, shared by its records.
struct Owner {
    session: SessionId,
    instance: u64,
    agent: WeakAgent,
}

/// One task. Kept small, since every live task holds one: what only a
/// finished task has is in [`Ended`], and only stream kinds have an output log.
struct Record {
    seq: u64,
    id: TaskId,
    /// The kind is the id's first `kind_len` bytes (`<kind>-N`).
    kind_len: u8,
    label: Box<str>,
    owner: Option<Arc<Owner>>,
    status: TaskStatus,
    /// Set at settlement (with a terminal status), never before.
    ended: Option<Box<Ended>>,
    /// Nanoseconds since the Unix epoch (half a `SystemTime`).
    started_at: u64,
    reported: bool,
    /// Waits and kills in progress; at settlement they take over reporting.
    pending_reporters: u32,
    /// Settled while reporters were pending, and none has delivered yet.
    notice_held: bool,
    /// The completion notice was injected into the owner's session.
    notice_delivered: bool,
    producer_info: Option<Box<str>>,
    /// Whether `task_input` may write to it.
    input: TaskInput,
    control: Arc<dyn TaskControl>,
    /// Stream kinds: every pull of output goes through it (see
    /// [`output_ops`]). `None` for final-output kinds, whose one output is
    /// [`Ended::output`].
    output_log: Option<Arc<StreamOutput>>,
    /// The task awaiting the producer's `done`; aborted on force-fail.
    watcher: tokio::task::AbortHandle,
    /// Fires after settlement (and its listeners); made on first demand,
    /// since most tasks are never waited on.
    settled: Option<CancellationToken>,
}

/// `at` in nanoseconds since the Unix epoch (0 before it; saturating
/// past the year 2554).
fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// What a task has once it settled.
struct Ended {
    finished_at: SystemTime,
    detail: Option<String>,
    /// Final-output kinds: the output, read idempotently.
    output: Option<String>,
}

impl Record {
    fn snapshot(&self) -> TaskSnapshot {
        TaskSnapshot {
            id: self.id.clone(),
            kind: self.kind().to_string(),
            label: self.label.to_string(),
            owner_session: self.owner.as_ref().map(|o| o.session.clone()),
            status: self.status,
            detail: self.ended.as_ref().and_then(|e| e.detail.clone()),
            started_at: SystemTime::UNIX_EPOCH + Duration::from_nanos(self.started_at),
            finished_at: self.finished_at(),
            reported: self.reported,
            producer_info: self.producer_info.as_deref().map(str::to_string),
        }
    }

    fn kind(&self) -> &str {
        &self.id.as_str()[..usize::from(self.kind_len)]
    }

    fn finished_at(&self) -> Option<SystemTime> {
        self.ended.as_ref().map(|e| e.finished_at)
    }

    /// Where reads find the output: the log of a stream kind, or a
    /// final-output kind's output (empty while live).
    fn output_source(&self) -> output_ops::OutputSource {
        match &self.output_log {
            Some(log) => output_ops::OutputSource::Log(log.clone()),
            None => {
                output_ops::OutputSource::Final(self.ended.as_ref().and_then(|e| e.output.clone()).unwrap_or_default())
            }
        }
    }

    fn done_event(&self) -> TaskDone {
        TaskDone { snapshot: self.snapshot(), owner: self.owner.as_ref().and_then(|o| o.agent.upgrade()) }
    }

    fn settled_signal(&mut self) -> CancellationToken {
        self.settled.get_or_insert_with(CancellationToken::new).clone()
    }

    fn bucket_key(&self) -> Option<u64> {
        self.owner.as_ref().map(|o| o.instance)
    }

    /// A reporter delivered the terminal state. A notice of the same end
    /// still unread by the owner is retracted: the report replaces it.
    /// Called under the registry lock, which orders it with
    /// [`TaskRegistry::inject_completion_notice`].
    fn mark_reported(&mut self) {
        self.reported = true;
        self.notice_held = false;
        if self.notice_delivered
            && let Some(owner) = self.owner.as_ref().and_then(|o| o.agent.upgrade())
        {
            owner.retract_unread_about(&self.id);
        }
    }

    /// May age out of the history: nobody still waits to be told of its end.
    fn droppable(&self, reported_only: bool) -> bool {
        // A held notice: a wait or kill pending at settlement may still hand
        // it back, so nobody has been told of the end for sure.
        if self.notice_held {
            return false;
        }
        if self.reported {
            return true;
        }
        if reported_only {
            return false;
        }
        self.notice_delivered || self.owner.as_ref().is_none_or(|o| o.agent.upgrade().is_none_or(|a| !a.is_live()))
    }
}

struct ListenerSlot {
    active: std::sync::atomic::AtomicBool,
    listener: TaskDoneListener,
}

/// Keeps a listener registered; dropping it unregisters the listener, after
/// which it never fires again.
#[must_use = "dropping the guard unregisters the listener"]
pub struct ListenerGuard {
    registry: Weak<Shared>,
    slot: Arc<ListenerSlot>,
}

impl Drop for ListenerGuard {
    fn drop(&mut self) {
        self.slot.active.store(false, std::sync::atomic::Ordering::SeqCst);
        if let Some(shared) = self.registry.upgrade() {
            shared.listeners.lock().expect("listeners poisoned").retain(|s| !Arc::ptr_eq(s, &self.slot));
        }
    }
}

/// Keeps a control surface attached; see [`TaskRegistry::attach_surface`].
#[must_use = "dropping the guard detaches the surface"]
pub struct SurfaceGuard {
    registry: Weak<Shared>,
    name: String,
}

impl Drop for SurfaceGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.registry.upgrade() {
            shared.lock().surfaces -= 1;
            tracing::debug!(surface = %self.name, "control surface detached");
        }
    }
}

/// What ends a wait early.
enum WaitEnd {
    Settled,
    TimedOut,
    Aborted,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("task registry state poisoned")
    }

    /// Whether an event sent now would reach a subscriber.
    fn has_subscribers(&self) -> bool {
        self.subscribed.load(std::sync::atomic::Ordering::SeqCst) && self.events.receiver_count() > 0
    }
}

impl TaskRegistry {
    pub fn new(agents: AgentRegistry, config: RegistryConfig) -> Self {
        let registry = Self {
            shared: Arc::new(Shared {
                output_limits: Arc::new(config.output.clone()),
                output_dir: std::sync::OnceLock::new(),
                agents,
                config,
                state: Mutex::new(State::default()),
                listeners: Mutex::new(Vec::new()),
                starts_drained: Notify::new(),
                events: broadcast::channel(TASK_EVENT_BUFFER).0,
                subscribed: false.into(),
            }),
        };
        if let Some(parent) = registry.shared.config.output.spill_dir.clone()
            && let Err(error) = registry.set_output_spill_dir(&parent)
        {
            tracing::warn!(dir = %parent.display(), %error, "cannot create the task output directory; output beyond memory is not kept");
        }
        registry
    }

    /// The private directory of output spill files, once set.
    pub fn output_spill_dir(&self) -> Option<&std::path::Path> {
        self.shared.output_dir.get().map(std::path::PathBuf::as_path)
    }

    /// Makes the private directory (mode 0700) stream tasks' output spills to
    /// once it outgrows memory, inside `parent`; tasks started from now on
    /// use it. Set once: a later call changes nothing. Choose a parent the
    /// tasks' own processes cannot see (the host puts it in the process
    /// capability's hidden spill directory).
    pub fn set_output_spill_dir(&self, parent: &std::path::Path) -> std::io::Result<()> {
        if self.shared.output_dir.get().is_some() {
            return Ok(());
        }
        let dir = super::output::create_private_dir(parent)?;
        if let Err(dir) = self.shared.output_dir.set(dir) {
            let _ = std::fs::remove_dir(dir);
        }
        Ok(())
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

    /// Declares that a control surface (something that can read and stop
    /// tasks) is loaded. `start` refuses while none is attached, so no work
    /// can start that nobody could collect.
    pub fn attach_surface(&self, name: impl Into<String>) -> SurfaceGuard {
        let name = name.into();
        self.shared.lock().surfaces += 1;
        tracing::debug!(surface = %name, "control surface attached");
        SurfaceGuard { registry: Arc::downgrade(&self.shared), name }
    }

    /// Registers background work: preflight, then `spec.run` exactly once,
    /// then an atomic commit. Returns the new task's id.
    ///
    /// Preflight refuses, before anything runs: an invalid kind, an empty
    /// label, a registry without a control surface or already disposed, an
    /// owner that is not this registry's live agent, and an owner at its cap
    /// of live tasks. A runner that fails or panics registers nothing.
    pub async fn start(&self, spec: TaskStart) -> Result<TaskId, TaskError> {
        let TaskStart { kind, label, owner, producer_info, options, run } = spec;
        let span = tracing::info_span!(
            "task_start",
            kind = %kind,
            owner = owner.as_ref().map(|o| o.session().as_str()).unwrap_or("-"),
            task = tracing::field::Empty,
        );
        let reservation = self.preflight(&kind, &label, owner.as_ref()).inspect_err(|error| {
            span.in_scope(|| tracing::debug!(%error, "start refused in preflight"));
        })?;

        let started = AssertUnwindSafe(run()).catch_unwind().instrument(span.clone()).await;
        let hooks = match started {
            Ok(Ok(hooks)) => hooks,
            Ok(Err(source)) => {
                return Err(TaskError::Producer { context: format!("starting {kind} task failed"), source });
            }
            Err(panic) => {
                return Err(TaskError::Producer {
                    context: format!("starting {kind} task failed"),
                    source: anyhow::anyhow!("the producer panicked: {}", panic_message(panic)),
                });
            }
        };

        let id = self.register(reservation, Identity { kind, label, owner, producer_info, options }, hooks);
        span.record("task", id.as_str());
        span.in_scope(|| tracing::info!("task started"));
        Ok(id)
    }

    /// Registers work that is already running (a foreground call promoted to
    /// the background): the same preflight as [`Self::start`], then the
    /// commit; `spec.run` is never called. A refusal hands the hooks back
    /// untouched, so the caller keeps running the work.
    #[allow(clippy::result_large_err)]
    pub fn adopt(&self, spec: TaskStart, hooks: TaskHooks) -> Result<TaskId, (TaskError, TaskHooks)> {
        let TaskStart { kind, label, owner, producer_info, options, run: _ } = spec;
        let reservation = match self.preflight(&kind, &label, owner.as_ref()) {
            Ok(reservation) => reservation,
            Err(error) => return Err((error, hooks)),
        };
        let id = self.register(reservation, Identity { kind, label, owner, producer_info, options }, hooks);
        tracing::info!(task = %id, "foreground run adopted as a background task");
        Ok(id)
    }

    /// Commits running work and wires it up: the output signal (drains and
    /// events), and a teardown when its owner began disposing meanwhile.
    fn register(&self, reservation: Reservation, identity: Identity, hooks: TaskHooks) -> TaskId {
        let control = hooks.control.clone();
        let owner_session = identity.owner.as_ref().map(|agent| agent.session().clone());
        let (id, cancel_now) = self.commit(reservation, identity, hooks);
        control.watch_output(self.output_signal(&id, owner_session));
        if cancel_now {
            // The owner (or the registry) began disposing while this start
            // was in flight; its cleanup is waiting for this task to settle.
            let registry = self.clone();
            let id = id.clone();
            tokio::spawn(async move { registry.teardown(&id, "owner disposed").await });
        }
        id
    }

    fn preflight(&self, kind: &str, label: &str, owner: Option<&Agent>) -> Result<Reservation, TaskError> {
        if !is_valid_kind(kind) {
            return Err(TaskError::InvalidKind(kind.to_string()));
        }
        if label.trim().is_empty() {
            return Err(TaskError::EmptyLabel { kind: kind.to_string() });
        }
        if let Some(owner) = owner
            && !self.shared.agents.owns(owner)
        {
            return Err(TaskError::ForeignAgent(owner.id().to_string()));
        }
        let mut state = self.shared.lock();
        if state.disposed {
            return Err(TaskError::Disposed);
        }
        if state.surfaces == 0 {
            return Err(TaskError::NoControlSurface);
        }
        let bucket_key = owner.map(Agent::instance);
        if let Some(owner) = owner {
            if !self.shared.agents.is_current(owner) || !owner.is_live() {
                return Err(TaskError::OwnerNotLive(owner.id().to_string()));
            }
            if state.owner_scopes.get(&owner.instance()).is_some_and(|scope| scope.closing) {
                return Err(TaskError::OwnerNotLive(owner.id().to_string()));
            }
        }
        let limit = self.shared.config.max_live_tasks_per_owner;
        let in_use = bucket_mut(&mut state, bucket_key).map_or(0, |b| b.live + b.starting);
        if in_use >= limit {
            let owner = match owner {
                Some(agent) => format!("agent {} (session {})", agent.id(), agent.session()),
                None => "unowned tasks".to_string(),
            };
            return Err(TaskError::TooManyTasks { owner, limit });
        }
        if let Some(owner) = owner
            && !state.owner_scopes.contains_key(&owner.instance())
        {
            let cleanup = self.owner_cleanup(owner);
            let key = owner.add_cleanup(cleanup).map_err(|_| TaskError::OwnerNotLive(owner.id().to_string()))?;
            state.owner_scopes.insert(
                owner.instance(),
                OwnerScope {
                    owner: Arc::new(Owner {
                        session: owner.session().clone(),
                        instance: owner.instance(),
                        agent: owner.downgrade(),
                    }),
                    cleanup: key,
                    closing: false,
                    bucket: Bucket::default(),
                    starts_drained: Arc::new(Notify::new()),
                    tasks: Vec::new(),
                },
            );
        }
        if let Some(bucket) = bucket_mut(&mut state, bucket_key) {
            bucket.starting += 1;
        }
        state.starts_in_flight += 1;
        Ok(Reservation { registry: Arc::downgrade(&self.shared), bucket_key, armed: true })
    }

    fn commit(&self, mut reservation: Reservation, identity: Identity, hooks: TaskHooks) -> (TaskId, bool) {
        let Identity { kind, label, owner, producer_info, options } = identity;
        let TaskHooks { control, done } = hooks;
        // Whatever needs no id is made before the lock is taken.
        let started_at = unix_nanos(SystemTime::now());
        let label = label.into_boxed_str();
        let producer_info = producer_info.map(String::into_boxed_str);
        let streams_output = control.streams_output();
        reservation.armed = false;
        let mut state = self.shared.lock();
        let bucket_key = reservation.bucket_key;
        release_start(&mut state, &self.shared, bucket_key);
        if let Some(bucket) = bucket_mut(&mut state, bucket_key) {
            bucket.live += 1;
        }

        let counter = match state.next_id_by_kind.get_mut(kind.as_str()) {
            Some(next) => {
                *next += 1;
                *next
            }
            None => 1,
        };
        let id = TaskId::issue(&kind, counter);
        // A valid kind has at most 64 bytes.
        let kind_len = u8::try_from(kind.len()).expect("a valid kind is at most 64 bytes");
        if counter == 1 {
            state.next_id_by_kind.insert(kind, 1);
        }
        let seq = state.next_seq;
        state.next_seq += 1;

        let mut cancel_now = state.disposed;
        let mut owner_ref = None;
        if let Some(scope) = bucket_key.and_then(|k| state.owner_scopes.get_mut(&k)) {
            scope.tasks.push(id.clone());
            cancel_now |= scope.closing;
            owner_ref = Some(scope.owner.clone());
        }
        // The scope outlives every start in flight (its cleanup waits for
        // them), so this is only a fallback.
        let owner = owner.map(|agent| {
            owner_ref.unwrap_or_else(|| {
                Arc::new(Owner {
                    session: agent.session().clone(),
                    instance: agent.instance(),
                    agent: agent.downgrade(),
                })
            })
        });
        // Spawned under the lock so the record can hold its abort handle; the
        // watcher's first settle simply waits for this commit to finish.
        let task = Box::new(WatchedTask { registry: Arc::downgrade(&self.shared), id: id.clone() });
        let watcher = tokio::spawn(Watcher { done, task }).abort_handle();
        let output_log = streams_output.then(|| {
            let spill_path = self.shared.output_dir.get().map(|dir| dir.join(format!("{id}.out")));
            Arc::new(StreamOutput::new(TaskOutput::new(
                OutputLog::new(self.shared.output_limits.clone(), spill_path),
                &options,
            )))
        });
        if let Some(log) = &output_log {
            self.watch_stalls(&id, log);
        }
        state.tasks.insert(Box::new(Record {
            seq,
            id: id.clone(),
            kind_len,
            label,
            owner,
            status: TaskStatus::Running,
            ended: None,
            started_at,
            reported: false,
            pending_reporters: 0,
            notice_held: false,
            notice_delivered: false,
            producer_info,
            input: options.input,
            control,
            output_log,
            watcher,
            settled: None,
        }));
        if self.shared.has_subscribers()
            && let Some(record) = state.tasks.get(&id)
        {
            let _ = self.shared.events.send(TaskEvent::Started { task: record.snapshot() });
        }
        (id, cancel_now)
    }

    /// A non-consuming snapshot. Fails for unknown ids and foreign callers.
    pub fn get(&self, id: &TaskId, caller: Option<&Agent>) -> Result<TaskSnapshot, TaskError> {
        let state = self.shared.lock();
        Ok(fenced(&state, id, caller)?.snapshot())
    }

    /// How many finished tasks visible to `caller` were dropped from the
    /// history (see [`RegistryConfig::max_finished_tasks_per_owner`]).
    pub fn dropped_from_history(&self, caller: Option<&Agent>) -> u64 {
        let state = self.shared.lock();
        let owned: u64 = match caller {
            Some(caller) => state
                .owner_scopes
                .values()
                .filter(|s| &s.owner.session == caller.session())
                .map(|s| s.bucket.dropped)
                .sum(),
            None => 0,
        };
        owned + state.unowned.dropped
    }

    /// Every task-change event from now on: starts, new output, settlements
    /// and records released. A subscriber that falls more than
    /// [`TASK_EVENT_BUFFER`] events behind gets `RecvError::Lagged` and should
    /// re-read [`TaskRegistry::list`]. Events carry no output text.
    pub fn subscribe(&self) -> broadcast::Receiver<TaskEvent> {
        self.shared.subscribed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.shared.events.subscribe()
    }

    /// Every live owner's tasks and the unowned ones, in start order: the
    /// view of an operator, not of a model (no owner fence).
    pub fn list_all(&self) -> Vec<TaskSnapshot> {
        let state = self.shared.lock();
        let mut all: Vec<&Record> = state.tasks.values().collect();
        all.sort_by_key(|r| r.seq);
        all.into_iter().map(Record::snapshot).collect()
    }

    /// The caller-visible tasks (owned by the caller's session, or unowned),
    /// in start order.
    pub fn list(&self, caller: Option<&Agent>) -> Vec<TaskSnapshot> {
        let state = self.shared.lock();
        let mut visible: Vec<&Record> = state.tasks.values().filter(|r| visible_to(r, caller)).collect();
        visible.sort_by_key(|r| r.seq);
        visible.into_iter().map(Record::snapshot).collect()
    }

    /// Settles a task whose read ended it (first wins, so an outcome that
    /// got there first stands) and returns the read as the terminal report.
    fn settle_by_read(&self, id: &TaskId, ended: ReadEndedTask, before: TaskSnapshot) -> TaskRead {
        let ReadEndedTask { text, outcome } = ended;
        let status: TaskStatus = outcome.status.into();
        let detail = outcome.detail.clone();
        self.settle_record(
            id,
            Settlement { status, detail: outcome.detail, output: outcome.output, forced: false, reported: true },
        );
        let state = self.shared.lock();
        let snapshot = self.report_terminal(state, id).unwrap_or(
            // Dropped meanwhile (its owner was disposed): report what the read saw.
            TaskSnapshot { status, detail, finished_at: Some(SystemTime::now()), reported: true, ..before },
        );
        TaskRead { text, snapshot }
    }

    /// The caller's response reports the end of the terminal task `id`:
    /// marks it reported (retracting an unread notice), lets the history
    /// drop what that made droppable, and returns the reported snapshot
    /// (`None` if the record is gone).
    fn report_terminal(&self, mut state: MutexGuard<'_, State>, id: &TaskId) -> Option<TaskSnapshot> {
        let record = state.tasks.get_mut(id)?;
        record.mark_reported();
        let snapshot = record.snapshot();
        let bucket = record.bucket_key();
        let dropped = prune_history(&mut state, &self.shared, bucket);
        drop(state);
        self.release_records(dropped);
        Some(snapshot)
    }

    /// Requests cancellation. The producer's cancel runs first; if it fails,
    /// the error reaches the caller and the task is left untouched. An
    /// already-settled task is reported, not an error.
    pub async fn kill(
        &self,
        id: &TaskId,
        caller: Option<&Agent>,
        reason: Option<&str>,
    ) -> Result<KillResult, TaskError> {
        let control = {
            let mut state = self.shared.lock();
            let record = fenced_mut(&mut state, id, caller)?;
            if record.status.is_terminal() {
                let snapshot = self.report_terminal(state, id).ok_or_else(|| TaskError::UnknownTask(id.clone()))?;
                return Ok(KillResult::AlreadyTerminal(snapshot));
            }
            record.pending_reporters += 1;
            record.control.clone()
        };
        let mut pending = PendingReporter { registry: self, id, armed: true };
        tracing::info!(task = %id, reason = reason.unwrap_or("-"), "kill requested");
        let cancelled = AssertUnwindSafe(control.cancel(reason))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(anyhow::anyhow!("the producer panicked: {}", panic_message(panic))));

        let mut state = self.shared.lock();
        pending.armed = false;
        let Some(record) = state.tasks.get_mut(id) else {
            return Err(TaskError::UnknownTask(id.clone()));
        };
        record.pending_reporters -= 1;
        match cancelled {
            Ok(()) => {
                record.mark_reported();
                if record.status == TaskStatus::Running {
                    record.status = TaskStatus::Stopping;
                }
                Ok(KillResult::Requested(record.snapshot()))
            }
            Err(_) if record.status.is_terminal() => {
                record.mark_reported();
                Ok(KillResult::AlreadyTerminal(record.snapshot()))
            }
            Err(source) => {
                let held = release_reporter(record);
                drop(state);
                self.deliver_held_notice(held);
                Err(TaskError::Producer {
                    context: format!("cancelling task {id} failed; it is still running"),
                    source,
                })
            }
        }
    }

    /// Waits until the task settles, `timeout` passes, or `abort` fires.
    /// Returns the terminal snapshot (marked reported) or, on timeout, the
    /// live one. A zero timeout polls: it returns the current snapshot at
    /// once (terminal and reported, or live).
    ///
    /// Aborting cancels only the wait, never the task, and always fails with
    /// [`TaskError::WaitAborted`], even when the task settled meanwhile: the
    /// caller threw the answer away, so the end stays unreported and its
    /// completion notice is delivered.
    pub async fn wait(
        &self,
        id: &TaskId,
        timeout: Duration,
        caller: Option<&Agent>,
        abort: Option<&CancellationToken>,
    ) -> Result<TaskSnapshot, TaskError> {
        let settled = {
            let mut state = self.shared.lock();
            let record = fenced_mut(&mut state, id, caller)?;
            if record.status.is_terminal() {
                return self.report_terminal(state, id).ok_or_else(|| TaskError::UnknownTask(id.clone()));
            }
            record.pending_reporters += 1;
            record.settled_signal()
        };
        let mut pending = PendingReporter { registry: self, id, armed: true };
        let never = CancellationToken::new();
        let abort = abort.unwrap_or(&never);
        let end = tokio::select! {
            biased;
            _ = abort.cancelled() => WaitEnd::Aborted,
            _ = settled.cancelled() => WaitEnd::Settled,
            _ = tokio::time::sleep(timeout) => WaitEnd::TimedOut,
        };
        // An abort that fired while another branch won still wins: the
        // caller is gone either way.
        let aborted = matches!(end, WaitEnd::Aborted) || abort.is_cancelled();
        if aborted {
            // The pending reporter's drop un-counts it and hands back a
            // notice held for it.
            drop(pending);
            return Err(TaskError::WaitAborted(id.clone()));
        }

        let mut state = self.shared.lock();
        pending.armed = false;
        let Some(record) = state.tasks.get_mut(id) else {
            return Err(TaskError::UnknownTask(id.clone()));
        };
        record.pending_reporters -= 1;
        if !record.status.is_terminal() {
            return Ok(record.snapshot());
        }
        self.report_terminal(state, id).ok_or_else(|| TaskError::UnknownTask(id.clone()))
    }

    /// Waits until at least one of `ids` has finished, or `timeout` passed.
    /// Returns the id that finished first (`None` on timeout; among tasks
    /// already finished, the earliest) and every task's snapshot in the order
    /// given. Consumes no output; every task found finished counts as
    /// reported, so no completion notice follows for it. Refuses an unknown
    /// or foreign id before waiting. An abort fails with
    /// [`TaskError::WaitAborted`] and reports nothing.
    pub async fn wait_any(
        &self,
        ids: &[TaskId],
        timeout: Duration,
        caller: Option<&Agent>,
        abort: Option<&CancellationToken>,
    ) -> Result<(Option<TaskId>, Vec<TaskSnapshot>), TaskError> {
        let Some(first_id) = ids.first() else { return Ok((None, Vec::new())) };
        let already = {
            let state = self.shared.lock();
            let mut earliest: Option<(SystemTime, &TaskId)> = None;
            for id in ids {
                let record = fenced(&state, id, caller)?;
                if let Some(at) = record.finished_at().filter(|_| record.status.is_terminal())
                    && earliest.is_none_or(|(first, _)| at < first)
                {
                    earliest = Some((at, id));
                }
            }
            earliest.map(|(_, id)| id.clone())
        };
        let first = match already {
            Some(id) => Some(id),
            None => {
                let local = abort.map_or_else(CancellationToken::new, CancellationToken::child_token);
                let mut waits: futures::stream::FuturesUnordered<_> = ids
                    .iter()
                    .map(|id| {
                        let local = &local;
                        async move { (id, self.wait(id, timeout, caller, Some(local)).await) }
                    })
                    .collect();
                let mut first = None;
                while let Some((id, result)) = futures::StreamExt::next(&mut waits).await {
                    match result {
                        Ok(snapshot) if snapshot.status.is_terminal() => {
                            first = Some(id.clone());
                            break;
                        }
                        // Every wait shares the timeout: the first to time out ends it.
                        Ok(_) => break,
                        // Released meanwhile (its owner went away): the others still count.
                        Err(TaskError::UnknownTask(_)) => {}
                        Err(error) => return Err(error),
                    }
                }
                // The other waits end without reporting.
                local.cancel();
                drop(waits);
                if abort.is_some_and(CancellationToken::is_cancelled) {
                    return Err(TaskError::WaitAborted(first_id.clone()));
                }
                first
            }
        };
        let mut tasks = Vec::with_capacity(ids.len());
        for id in ids {
            let state = self.shared.lock();
            let snapshot = match state.tasks.get(id) {
                Some(record) if record.status.is_terminal() => self.report_terminal(state, id),
                Some(record) => Some(record.snapshot()),
                None => None,
            };
            tasks.extend(snapshot);
        }
        Ok((first, tasks))
    }

    /// Writes `data` to a live interactive task's input (and closes it when
    /// `close` is set). Refused, naming the task and why: a kind that takes
    /// no input, a task started without `interactive`, a finished task, a
    /// foreign or unknown id. The producer's own refusal (input already
    /// closed) comes back as [`TaskError::Producer`].
    pub async fn input(&self, id: &TaskId, caller: Option<&Agent>, data: &[u8], close: bool) -> Result<(), TaskError> {
        let control = {
            let state = self.shared.lock();
            let record = fenced(&state, id, caller)?;
            match record.input {
                TaskInput::Unsupported => {
                    return Err(TaskError::NoInput { id: id.clone(), kind: record.kind().to_string() });
                }
                TaskInput::NotRequested => return Err(TaskError::NotInteractive(id.clone())),
                TaskInput::Open => {}
            }
            if record.status.is_terminal() {
                return Err(TaskError::InputToFinished {
                    id: id.clone(),
                    status_line: record.snapshot().status_line(),
                });
            }
            record.control.clone()
        };
        AssertUnwindSafe(control.write_input(data, close))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(anyhow::anyhow!("the producer panicked: {}", panic_message(panic))))
            .map_err(|source| TaskError::Producer { context: format!("sending input to task {id} failed"), source })
    }

    /// Registers a listener called once per settled task with its terminal
    /// snapshot. Listeners are contained: a panicking listener is logged and
    /// the others still run. Dropping the guard unregisters it for good.
    pub fn on_task_done(&self, listener: TaskDoneListener) -> ListenerGuard {
        let slot = Arc::new(ListenerSlot { active: true.into(), listener });
        self.shared.listeners.lock().expect("listeners poisoned").push(slot.clone());
        ListenerGuard { registry: Arc::downgrade(&self.shared), slot }
    }

    /// Cancels every live task, awaits their quiescence (bounded by the
    /// teardown timeout), detaches from live owners and drops every record.
    ///
    /// Guarantees, once it returns: no task of this registry is live (each
    /// settled, or was force-failed with a possible-orphan detail), every
    /// start that was in flight has settled too, no task can start, and no
    /// listener was called for these settlements (disposal is silent: an
    /// owner still alive is not told of kills it never asked for). Waits
    /// still pending wake with the terminal state. Idempotent.
    pub async fn dispose(&self) {
        {
            let mut state = self.shared.lock();
            if state.disposed {
                return;
            }
            state.disposed = true;
        }
        tracing::info!("disposing task registry");
        loop {
            let drained = self.shared.starts_drained.notified();
            let live: Vec<TaskId> = {
                let state = self.shared.lock();
                if state.starts_in_flight == 0 {
                    state.tasks.values().filter(|r| !r.status.is_terminal()).map(|r| r.id.clone()).collect()
                } else {
                    Vec::new()
                }
            };
            futures::future::join_all(live.iter().map(|id| self.teardown(id, "task registry disposed"))).await;
            if self.shared.lock().starts_in_flight == 0 {
                break;
            }
            drained.await;
        }
        let scopes = std::mem::take(&mut self.shared.lock().owner_scopes);
        for scope in scopes.into_values() {
            if let Some(agent) = scope.owner.agent.upgrade() {
                agent.remove_cleanup(scope.cleanup);
            }
        }
        let records: Vec<Record> = self.shared.lock().tasks.drain().collect();
        self.release_records(records);
        self.shared.listeners.lock().expect("listeners poisoned").clear();
    }

    /// Injects `text` into the owner's session as the completion notice of
    /// task `id`, unless its end was already reported, a notice for it was
    /// already injected (several surfaces may listen), or its owner is gone.
    /// Returns whether it was injected.
    ///
    /// Atomic with every reporting path (reads, waits and kills run their
    /// check under the same lock), so a notice never joins the explicit
    /// report of the same end: either the report came first and there is no
    /// notice, or the report retracts the notice from the owner's unread
    /// messages.
    pub fn inject_completion_notice(&self, id: &TaskId, text: String) -> bool {
        let mut state = self.shared.lock();
        let Some(record) = state.tasks.get_mut(id) else {
            return false;
        };
        if record.reported || record.notice_delivered || !record.status.is_terminal() {
            return false;
        }
        let Some(owner) = record.owner.as_ref().and_then(|o| o.agent.upgrade()) else {
            return false;
        };
        if owner.inject_about(id, text).is_err() {
            return false;
        }
        record.notice_delivered = true;
        true
    }

    /// Records the outcome unless the task already settled (first wins), then
    /// fans out to the listeners.
    fn settle(&self, id: &TaskId, outcome: TaskOutcome) {
        self.settle_record(
            id,
            Settlement {
                status: outcome.status.into(),
                detail: outcome.detail,
                output: outcome.output,
                forced: false,
                reported: false,
            },
        );
    }

    fn settle_record(&self, id: &TaskId, settlement: Settlement) {
        let Settlement { status, detail, output, forced, reported } = settlement;
        let (done, settled, silent, bucket_key) = {
            let mut state = self.shared.lock();
            let silent = state.disposed;
            let owner_closing = {
                let Some(record) = state.tasks.get(id) else {
                    return;
                };
                record.bucket_key().and_then(|k| state.owner_scopes.get(&k)).is_some_and(|scope| scope.closing)
            };
            let Some(record) = state.tasks.get_mut(id) else {
                return;
            };
            if record.status.is_terminal() {
                tracing::debug!(task = %id, late = %status, "late outcome ignored: the task already settled");
                return;
            }
            record.status = status;
            record.ended = Some(Box::new(Ended { finished_at: SystemTime::now(), detail, output }));
            if record.pending_reporters > 0 {
                record.reported = true;
                record.notice_held = true;
            }
            // Reported by the caller that settled it, or nobody is left to
            // tell (owner teardown, registry disposal).
            if reported || owner_closing || silent {
                record.reported = true;
            }
            if let Some(output) = &record.output_log {
                output.stop_stall_watcher();
            }
            let done = record.done_event();
            let settled = record.settled.take();
            if forced {
                record.watcher.abort();
            }
            let bucket_key = record.bucket_key();
            if let Some(bucket) = bucket_mut(&mut state, bucket_key) {
                bucket.live -= 1;
                bucket.finished.push_back(id.clone());
            }
            (done, settled, silent, bucket_key)
        };
        let snapshot = &done.snapshot;
        tracing::info!(task = %id, status = %snapshot.status, detail = snapshot.detail.as_deref().unwrap_or(""), forced, "task settled");
        if !silent {
            self.notify_listeners(&done);
        }
        // Subscribers and waiters (waits, teardown, disposal) hear of it only
        // after the listeners ran, so whoever saw the settlement also sees
        // its notice, and a disposal that returned has none in flight.
        if self.shared.has_subscribers() {
            let _ = self.shared.events.send(TaskEvent::Settled { task: snapshot.clone() });
        }
        // History is pruned before waiters wake: whoever saw the settlement
        // also sees the records (and their files) it aged out gone.
        let dropped = prune_history(&mut self.shared.lock(), &self.shared, bucket_key);
        self.release_records(dropped);
        if let Some(settled) = settled {
            settled.cancel();
        }
    }

    /// Drops records taken out of the table (outside the lock: dropping a
    /// producer handle may kill processes and remove files) and tells
    /// subscribers.
    fn release_records(&self, records: Vec<Record>) {
        if records.is_empty() {
            return;
        }
        let subscribed = self.shared.has_subscribers();
        for record in records {
            tracing::debug!(task = %record.id, "task record released");
            if subscribed {
                let owner_session = record.owner.as_ref().map(|o| o.session.clone());
                let _ = self.shared.events.send(TaskEvent::Released { id: record.id.clone(), owner_session });
            }
            drop(record);
        }
    }

    fn notify_listeners(&self, done: &TaskDone) {
        let listeners: Vec<Arc<ListenerSlot>> = self.shared.listeners.lock().expect("listeners poisoned").clone();
        for slot in listeners {
            if !slot.active.load(std::sync::atomic::Ordering::SeqCst) {
                continue;
            }
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| (slot.listener)(done))) {
                tracing::error!(task = %done.snapshot.id, message = %panic_message(panic), "a task-done listener panicked; the others still run");
            }
        }
    }

    /// A pending reporter left without delivering: if it was the last one
    /// holding back a notice, the notice goes out after all.
    fn deliver_held_notice(&self, held: Option<TaskDone>) {
        if let Some(done) = held {
            self.notify_listeners(&done);
        }
    }

    /// Cancels a task for disposal and awaits it. A cancel that fails, or a
    /// task that does not settle within the teardown timeout, is force-failed
    /// with a detail saying the work may be orphaned.
    async fn teardown(&self, id: &TaskId, reason: &str) {
        let (control, settled) = {
            let mut state = self.shared.lock();
            let Some(record) = state.tasks.get_mut(id) else {
                return;
            };
            if record.status.is_terminal() {
                return;
            }
            record.status = TaskStatus::Stopping;
            (record.control.clone(), record.settled_signal())
        };
        let cancelled = AssertUnwindSafe(control.cancel(Some(reason)))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(anyhow::anyhow!("the producer panicked: {}", panic_message(panic))));
        if let Err(error) = cancelled {
            tracing::error!(task = %id, error = %format!("{error:#}"), "teardown cancel failed; the work may be orphaned");
            self.force_fail(
                id,
                &control,
                format!("cancel failed during teardown ({error:#}); the work may be orphaned"),
            );
            return;
        }
        match self.shared.config.teardown_timeout {
            None => settled.cancelled().await,
            Some(limit) => {
                if tokio::time::timeout(limit, settled.cancelled()).await.is_err() {
                    tracing::error!(task = %id, ?limit, "task did not stop after cancellation; the work may be orphaned");
                    self.force_fail(
                        id,
                        &control,
                        format!(
                            "did not stop within {} ms of cancellation; the work may be orphaned",
                            limit.as_millis()
                        ),
                    );
                }
            }
        }
    }

    fn force_fail(&self, id: &TaskId, control: &Arc<dyn TaskControl>, detail: String) {
        self.settle_record(
            id,
            Settlement {
                status: TaskStatus::Failed,
                detail: Some(detail),
                output: None,
                forced: true,
                reported: false,
            },
        );
        control.abandon();
    }

    /// The cleanup registered in an owner's disposal scope.
    fn owner_cleanup(&self, owner: &Agent) -> crate::agents::Cleanup {
        let registry = Arc::downgrade(&self.shared);
        let instance = owner.instance();
        let session = owner.session().clone();
        Box::new(move || {
            Box::pin(
                async move {
                    let Some(shared) = registry.upgrade() else {
                        return;
                    };
                    TaskRegistry { shared }.cleanup_owner(instance).await;
                }
                .instrument(tracing::info_span!("owner_cleanup", owner = %session)),
            )
        })
    }

    async fn cleanup_owner(&self, instance: u64) {
        loop {
            let (live, starting, drained) = {
                let mut state = self.shared.lock();
                let State { owner_scopes, tasks, .. } = &mut *state;
                let Some(scope) = owner_scopes.get_mut(&instance) else {
                    return;
                };
                scope.closing = true;
                let live: Vec<TaskId> = scope
                    .tasks
                    .iter()
                    .filter(|id| tasks.get(id).is_some_and(|r| !r.status.is_terminal()))
                    .cloned()
                    .collect();
                (live, scope.bucket.starting, scope.starts_drained.clone())
            };
            tracing::debug!(live = live.len(), starting, "cancelling the owner's tasks");
            futures::future::join_all(live.iter().map(|id| self.teardown(id, "owner disposed"))).await;
            if starting == 0 {
                break;
            }
            drained.notified().await;
        }
        let records: Vec<Record> = {
            let mut state = self.shared.lock();
            match state.owner_scopes.remove(&instance) {
                Some(scope) => scope.tasks.iter().filter_map(|id| state.tasks.remove(id)).collect(),
                None => Vec::new(),
            }
        };
        self.release_records(records);
    }
}

/// How a task ends, as [`TaskRegistry::settle_record`] records it.
struct Settlement {
    status: TaskStatus,
    detail: Option<String>,
    output: Option<String>,
    /// The registry gave up on the task (abort its watcher).
    forced: bool,
    /// The caller that settles it reports the end itself (no notice).
    reported: bool,
}

/// Drops the oldest finished records of a bucket beyond the history cap:
/// reported ones first, then those whose end was noticed; never one whose
/// end nobody was told of yet. Returns the records taken out of the table.
fn prune_history(state: &mut State, shared: &Shared, bucket_key: Option<u64>) -> Vec<Record> {
    let cap = shared.config.max_finished_tasks_per_owner;
    let State { tasks, owner_scopes, unowned, .. } = state;
    let (bucket, mut scope_tasks) = match bucket_key {
        None => (unowned, None),
        Some(key) => match owner_scopes.get_mut(&key) {
            Some(scope) => (&mut scope.bucket, Some(&mut scope.tasks)),
            None => return Vec::new(),
        },
    };
    let mut taken = Vec::new();
    while bucket.finished.len() > cap {
        // Ids whose record is already gone count as droppable: forgotten here.
        let victim = [true, false].into_iter().find_map(|reported_only| {
            bucket.finished.iter().position(|id| tasks.get(id).is_none_or(|r| r.droppable(reported_only)))
        });
        let Some(id) = victim.and_then(|position| bucket.finished.remove(position)) else { break };
        if let Some(scope_tasks) = scope_tasks.as_deref_mut() {
            scope_tasks.retain(|t| t != &id);
        }
        if let Some(record) = tasks.remove(&id) {
            bucket.dropped += 1;
            taken.push(record);
        }
    }
    taken
}

/// Awaits a producer's `done` and settles its task; contains errors and
/// panics as `failed` outcomes. Every live task is one of these.
///
/// Written by hand to be the producer's future and one pointer (24 bytes):
/// a tokio task around it then fits one 128-byte cell, where an `async fn`
/// holding the registry and the id needed two (see `watcher_fits_one_tokio_cell`).
struct Watcher {
    done: futures::future::BoxFuture<'static, anyhow::Result<TaskOutcome>>,
    task: Box<WatchedTask>,
}

/// Whose `done` a [`Watcher`] awaits.
struct WatchedTask {
    registry: Weak<Shared>,
    id: TaskId,
}

impl std::future::Future for Watcher {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let this = &mut *self;
        let outcome = match std::panic::catch_unwind(AssertUnwindSafe(|| this.done.as_mut().poll(cx))) {
            Ok(std::task::Poll::Pending) => return std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(result)) => Ok(result),
            Err(panic) => Err(panic),
        };
        // Not polled again: tokio never polls a finished task.
        settle_watched(&this.task, outcome);
        std::task::Poll::Ready(())
    }
}

fn settle_watched(task: &WatchedTask, outcome: std::thread::Result<anyhow::Result<TaskOutcome>>) {
    let Some(shared) = task.registry.upgrade() else { return };
    let id = &task.id;
    let _span = tracing::info_span!("task", task = %id).entered();
    let outcome = match outcome {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(error)) => {
            tracing::warn!(error = %format!("{error:#}"), "producer's done failed; contained as failed");
            TaskOutcome::failed(format!("producer error: {error:#}"))
        }
        Err(panic) => {
            let message = panic_message(panic);
            tracing::warn!(%message, "producer's done panicked; contained as failed");
            TaskOutcome::failed(format!("producer panicked: {message}"))
        }
    };
    TaskRegistry { shared }.settle(id, outcome);
}

/// What a start says about its task, kept for the commit.
struct Identity {
    kind: String,
    label: String,
    owner: Option<Agent>,
    producer_info: Option<String>,
    options: TaskOptions,
}

/// A start that passed preflight. Dropped without commit (the runner failed
/// or the start future was dropped), it gives its reservation back.
struct Reservation {
    registry: Weak<Shared>,
    bucket_key: Option<u64>,
    armed: bool,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(shared) = self.registry.upgrade() {
            let mut state = shared.lock();
            release_start(&mut state, &shared, self.bucket_key);
        }
    }
}

/// The live-task accounting of an owner instance (`None`: unowned tasks).
fn bucket_mut(state: &mut State, bucket_key: Option<u64>) -> Option<&mut Bucket> {
    match bucket_key {
        None => Some(&mut state.unowned),
        Some(instance) => state.owner_scopes.get_mut(&instance).map(|scope| &mut scope.bucket),
    }
}

/// A start in flight ended (committed or given back). Only a cleanup or a
/// disposal waits for starts to drain, and each marks its scope closing (or
/// the registry disposed) before it looks, so nobody else is woken.
fn release_start(state: &mut State, shared: &Shared, bucket_key: Option<u64>) {
    match bucket_key {
        None => state.unowned.starting -= 1,
        Some(key) => {
            if let Some(scope) = state.owner_scopes.get_mut(&key) {
                scope.bucket.starting -= 1;
                if scope.closing && scope.bucket.starting == 0 {
                    scope.starts_drained.notify_one();
                }
            }
        }
    }
    state.starts_in_flight -= 1;
    if state.disposed && state.starts_in_flight == 0 {
        shared.starts_drained.notify_waiters();
    }
}

/// A wait or kill in progress. If its future is dropped before it delivered
/// (the caller went away), it un-counts itself and releases a held notice.
struct PendingReporter<'a> {
    registry: &'a TaskRegistry,
    id: &'a TaskId,
    armed: bool,
}

impl Drop for PendingReporter<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let held = {
            let mut state = self.registry.shared.lock();
            let Some(record) = state.tasks.get_mut(self.id) else {
                return;
            };
            record.pending_reporters -= 1;
            release_reporter(record)
        };
        self.registry.deliver_held_notice(held);
    }
}

/// After a reporter left without delivering: if the task settled while
/// reporters were pending and none is left to deliver, un-suppress the notice.
fn release_reporter(record: &mut Record) -> Option<TaskDone> {
    if record.notice_held && record.pending_reporters == 0 {
        record.notice_held = false;
        record.reported = false;
        return Some(record.done_event());
    }
    None
}

fn visible_to(record: &Record, caller: Option<&Agent>) -> bool {
    match &record.owner {
        None => true,
        Some(owner) => caller.is_some_and(|c| c.session() == &owner.session),
    }
}

fn fenced<'a>(state: &'a State, id: &TaskId, caller: Option<&Agent>) -> Result<&'a Record, TaskError> {
    let record = state.tasks.get(id).ok_or_else(|| TaskError::UnknownTask(id.clone()))?;
    if !visible_to(record, caller) {
        return Err(TaskError::ForeignTask(id.clone()));
    }
    Ok(record)
}

fn fenced_mut<'a>(state: &'a mut State, id: &TaskId, caller: Option<&Agent>) -> Result<&'a mut Record, TaskError> {
    let record = state.tasks.get_mut(id).ok_or_else(|| TaskError::UnknownTask(id.clone()))?;
    if !visible_to(record, caller) {
        return Err(TaskError::ForeignTask(id.clone()));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tokio task is a 128-byte-aligned cell: header, scheduler, id and
    /// trailer take 96 bytes, the future's stage the rest. A watcher of 24
    /// bytes keeps every live task at one 128-byte cell; a byte more costs
    /// 128 per live task.
    #[test]
    fn watcher_fits_one_tokio_cell() {
        assert_eq!(std::mem::size_of::<Watcher>(), 24);
    }

    /// Every live task holds one record (boxed: malloc rounds to 16 bytes
    /// with 8 of its own). What grows it belongs in [`Ended`] or in the
    /// stream output, unless every live task needs it.
    #[test]
    fn a_record_stays_small() {
        assert!(std::mem::size_of::<Record>() <= 136, "{} bytes", std::mem::size_of::<Record>());
    }
}
