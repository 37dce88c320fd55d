//! The registry's table: task records, owners' buckets and scopes, the
//! owner fence, and the queries that read them (`get`, `list`, `list_all`).
//!
//! Invariants: every read, kill, wait and get passes the owner fence
//! ([`fenced`]): an owned task is reachable only by a caller of the same
//! session; unowned tasks are open. Who was told of a task's end is one
//! [`Reporting`] per record (its transitions are documented there); a
//! pending reporter that goes away without delivering hands the notice back,
//! and an aborted wait never reports. A record stays small (every live task
//! holds one): what only a finished task has is in [`Ended`].

use super::*;
use crate::tasks::store::ReportState;

#[derive(Default)]
pub(super) struct State {
    pub(super) tasks: Tasks,
    /// Per-kind id counters: the last number issued.
    pub(super) next_id_by_kind: HashMap<String, u64>,
    /// Start order, for stable listings.
    pub(super) next_seq: u64,
    /// Live-task accounting of unowned tasks (owners keep theirs in their scope).
    pub(super) unowned: Bucket,
    pub(super) owner_scopes: HashMap<u64, OwnerScope>,
    pub(super) surfaces: usize,
    pub(super) starts_in_flight: usize,
    /// Settlements still telling of their end, in every bucket (see
    /// [`Bucket::telling`]): disposal waits for none.
    pub(super) telling: usize,
    pub(super) disposed: bool,
    /// The last wait ticket issued (see [`Waits`]).
    pub(super) last_wait_ticket: u64,
    /// Live records of handed-over trees, restored and waiting for
    /// [`super::TaskRegistry::readopt`].
    pub(super) awaiting_adoption: Vec<crate::tasks::store::StoredTask>,
    /// Restored ended records of handed-over trees: their unread output is
    /// still in the trees' logs ([`super::TaskRegistry::readopt`]).
    pub(super) ended_trees: Vec<(TaskId, crate::tasks::store::StoredTree)>,
    /// The process is going away ([`super::TaskRegistry::begin_shutdown`]):
    /// stable owners' handed-over trees are left running, not torn down.
    pub(super) shutting_down: bool,
}

impl State {
    /// A ticket naming one wait in the [`Waits`] of the tasks it waits on.
    pub(super) fn wait_ticket(&mut self) -> u64 {
        self.last_wait_ticket += 1;
        self.last_wait_ticket
    }
}

/// Every record, found by its id. A table of boxed records keyed by the id
/// each holds, next to the id's hash: a slot is 16 bytes (no copy of the
/// key, no record-sized empty slots), growing the table moves slots, not
/// records, and neither growth nor a probe reads a record whose hash differs.
#[derive(Default)]
pub(super) struct Tasks(hashbrown::HashTable<(u64, Box<Record>)>);

impl Tasks {
    pub(super) fn hash(id: &TaskId) -> u64 {
        use std::hash::BuildHasher as _;
        rustc_hash::FxBuildHasher.hash_one(id.as_str())
    }

    pub(super) fn get(&self, id: &TaskId) -> Option<&Record> {
        let hash = Self::hash(id);
        self.0.find(hash, |(h, r)| *h == hash && &r.id == id).map(|(_, r)| &**r)
    }

    pub(super) fn get_mut(&mut self, id: &TaskId) -> Option<&mut Record> {
        let hash = Self::hash(id);
        self.0.find_mut(hash, |(h, r)| *h == hash && &r.id == id).map(|(_, r)| &mut **r)
    }

    /// Adds a record whose id is not in the table (ids are issued once).
    pub(super) fn insert(&mut self, record: Box<Record>) {
        let hash = Self::hash(&record.id);
        self.0.insert_unique(hash, (hash, record), |(h, _)| *h);
    }

    pub(super) fn remove(&mut self, id: &TaskId) -> Option<Record> {
        let hash = Self::hash(id);
        match self.0.find_entry(hash, |(h, r)| *h == hash && &r.id == id) {
            Ok(entry) => Some(*entry.remove().0.1),
            Err(_) => None,
        }
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Record> {
        self.0.iter().map(|(_, r)| &**r)
    }

    pub(super) fn drain(&mut self) -> impl Iterator<Item = Record> {
        self.0.drain().map(|(_, r)| *r)
    }
}

/// Task accounting for one owner instance (or `None`: unowned).
#[derive(Default)]
pub(super) struct Bucket {
    pub(super) live: usize,
    pub(super) starting: usize,
    /// Finished tasks still held, oldest settlement first.
    pub(super) finished: VecDeque<TaskId>,
    /// Finished tasks dropped from the history so far.
    pub(super) dropped: u64,
    /// Settlements whose record is terminal but whose listeners, events and
    /// waiters are still being told (outside the lock): an owner cleanup
    /// waits for none before it drops the owner's records and returns.
    pub(super) telling: usize,
}

/// The registry's registration in one owner's disposal scope.
pub(super) struct OwnerScope {
    /// Shared by every record of this owner instance.
    pub(super) owner: Arc<Owner>,
    pub(super) cleanup: CleanupKey,
    pub(super) closing: bool,
    pub(super) bucket: Bucket,
    pub(super) starts_drained: Arc<Notify>,
    pub(super) tasks: Vec<TaskId>,
}

/// Who owns a task: one per owner instance, shared by its records.
pub(super) struct Owner {
    pub(super) session: SessionId,
    pub(super) instance: u64,
    pub(super) agent: WeakAgent,
    /// A stable owner: its records outlive the process (see [`crate::tasks::store`]).
    pub(super) durable: bool,
}

impl Owner {
    pub(super) fn of(agent: &Agent) -> Self {
        Self {
            session: agent.session().clone(),
            instance: agent.instance(),
            agent: agent.downgrade(),
            durable: agent.is_durable(),
        }
    }
}

/// One task. Kept small, since every live task holds one: what only a
/// finished task has is in [`Ended`], and only stream kinds have an output log.
pub(super) struct Record {
    pub(super) seq: u64,
    pub(super) id: TaskId,
    /// The kind is the id's first `kind_len` bytes (`<kind>-N`).
    pub(super) kind_len: u8,
    pub(super) label: Box<str>,
    pub(super) owner: Option<Arc<Owner>>,
    pub(super) status: TaskStatus,
    /// Set at settlement (with a terminal status), never before.
    pub(super) ended: Option<Box<Ended>>,
    /// Nanoseconds since the Unix epoch (half a `SystemTime`).
    pub(super) started_at: u64,
    /// Who was told of the task's end, and how.
    pub(super) reporting: Reporting,
    /// Waits and kills in progress that would report the end: the kills
    /// pending, and the waits in [`Waits::entries`]. At settlement they take
    /// over reporting ([`Reporting::Held`]).
    pub(super) pending_reporters: u32,
    pub(super) producer_info: Option<Box<str>>,
    /// Whether `task_input` may write to it.
    pub(super) input: TaskInput,
    pub(super) control: Arc<dyn TaskControl>,
    /// Stream kinds: every pull of output goes through it (see
    /// [`output_ops`]). `None` for final-output kinds, whose one output is
    /// [`Ended::output`].
    pub(super) output_log: Option<Arc<StreamOutput>>,
    /// The task awaiting the producer's `done`; aborted on force-fail.
    /// `None` for a record restored from the store (it has no producer).
    pub(super) watcher: Option<tokio::task::AbortHandle>,
    /// The settlement signal and the waits in progress; made on first
    /// demand, since most tasks are never waited on.
    pub(super) waits: Option<Box<Waits>>,
    /// Who asked the task to stop and its time to live, once either is
    /// set (one box: most tasks have neither, and a record stays small).
    pub(super) lifetime: Option<Box<Lifetime>>,
}

/// A live task's time to live.
#[derive(Debug)]
pub(super) struct Ttl {
    pub(super) ttl: Duration,
    pub(super) deadline: tokio::time::Instant,
    /// The deadline the store holds (see `ttl::STORED_EXPIRY_STEP`).
    pub(super) stored: tokio::time::Instant,
    /// The warning for the current deadline was injected.
    pub(super) warned: bool,
    pub(super) watcher: Option<tokio::task::AbortHandle>,
}

impl Ttl {
    /// When the deadline falls, on the wall clock (for snapshots).
    pub(super) fn expires_at(&self) -> SystemTime {
        SystemTime::now() + self.deadline.saturating_duration_since(tokio::time::Instant::now())
    }
}

/// What bounds or ends a task's life besides its own work.
#[derive(Debug, Default)]
pub(super) struct Lifetime {
    /// Who asked the task to stop (the first to ask), once anyone did.
    pub(super) stop_cause: Option<StopCause>,
    /// The time to live, for a task started with one ([`super::ttl`]).
    pub(super) ttl: Option<Ttl>,
}

/// What waits on one task: the signal that fires after its settlement, and
/// every wait in progress with its abort token.
///
/// A wait is an entry from the moment it begins until it leaves, or until a
/// settlement finds its abort already fired: such a wait was aborted first,
/// so it does not hold the end (the seeds' "an aborted waiter un-counts
/// itself synchronously"), and the settlement removes it. A wait whose entry
/// is still there when it finds the task settled was waiting when the task
/// settled: the end is owed to it.
#[derive(Default)]
pub(super) struct Waits {
    pub(super) settled: CancellationToken,
    pub(super) entries: Vec<WaitEntry>,
}

/// One wait in progress on a task.
pub(super) struct WaitEntry {
    pub(super) ticket: u64,
    pub(super) abort: Option<CancellationToken>,
}

impl Waits {
    /// Removes the entry of wait `ticket`; true if it was there.
    pub(super) fn take(&mut self, ticket: u64) -> bool {
        match self.entries.iter().position(|entry| entry.ticket == ticket) {
            Some(at) => {
                self.entries.swap_remove(at);
                true
            }
            None => false,
        }
    }

    /// Removes the entries whose abort already fired; returns how many.
    pub(super) fn drop_aborted(&mut self) -> u32 {
        let before = self.entries.len();
        self.entries.retain(|entry| !entry.abort.as_ref().is_some_and(CancellationToken::is_cancelled));
        (before - self.entries.len()) as u32
    }
}

/// Who was told of a task's end: the one state that decides whether a
/// completion notice may go out and whether the record may age out.
///
/// Transitions (all under the registry lock):
/// - `Untold` → `Reported`: an explicit response delivered the end (a
///   terminal read, a wait, a kill), or nobody is left to tell (owner
///   teardown, registry disposal). A kill's accepted request reports too,
///   while the task still stops.
/// - `Untold` → `Held`: the task settled while waits or kills were pending
///   (`pending_reporters > 0`); they are to report it.
/// - `Held` → `Reported`: one of them delivered; `Held` → `Untold`: the last
///   one left without delivering, and the notice goes out after all. The
///   task-done listeners of a held end run at one of these two transitions,
///   not at settlement, so they hear the end once, with the final `reported`.
/// - `Untold` → `Noticed`: the completion notice was injected into the
///   owner's session (only once terminal); `Noticed` → `Reported`: a later
///   report retracts the unread notice.
///
/// `Reported` is final. A notice and an explicit report of the same end are
/// never both delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reporting {
    /// Nobody has been told of the end (or the task has not ended).
    Untold,
    /// Ended while reporters were pending; the notice waits for them.
    Held,
    /// The completion notice is in the owner's session.
    Noticed,
    /// An explicit response delivered the end, or nobody is left to tell.
    Reported,
}

impl Reporting {
    /// The state as a store records it.
    pub(super) fn stored(self) -> ReportState {
        match self {
            Reporting::Untold => ReportState::Untold,
            Reporting::Held => ReportState::Held,
            Reporting::Noticed => ReportState::Noticed,
            Reporting::Reported => ReportState::Reported,
        }
    }

    /// What a snapshot shows as `reported`: a held end counts, since a
    /// pending reporter is about to deliver it.
    pub(super) fn is_reported(self) -> bool {
        matches!(self, Reporting::Reported | Reporting::Held)
    }
}

/// `at` in nanoseconds since the Unix epoch (0 before it; saturating
/// past the year 2554).
pub(super) fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// What a task has once it settled.
pub(super) struct Ended {
    pub(super) finished_at: SystemTime,
    pub(super) detail: Option<String>,
    /// Final-output kinds: the output, read idempotently.
    pub(super) output: Option<String>,
}

impl Record {
    /// A stable owner's task whose work is a handed-over tree: it can go on
    /// without this process (see [`super::TaskRegistry::begin_shutdown`]).
    pub(super) fn outlives_the_process(&self) -> bool {
        self.owner.as_ref().is_some_and(|owner| owner.durable) && self.control.handed_over_tree().is_some()
    }

    pub(super) fn snapshot(&self) -> TaskSnapshot {
        TaskSnapshot {
            id: self.id.clone(),
            kind: self.kind().to_string(),
            label: self.label.to_string(),
            owner_session: self.owner.as_ref().map(|o| o.session.clone()),
            status: self.status,
            detail: self.ended.as_ref().and_then(|e| e.detail.clone()),
            started_at: SystemTime::UNIX_EPOCH + Duration::from_nanos(self.started_at),
            finished_at: self.finished_at(),
            reported: self.reporting.is_reported(),
            producer_info: self.producer_info.as_deref().map(str::to_string),
            stop_cause: self.stop_cause().cloned(),
            expires_at: self.ttl().filter(|_| !self.status.is_terminal()).map(|ttl| ttl.expires_at()),
        }
    }

    /// Who asked the task to stop, once anyone did.
    pub(super) fn stop_cause(&self) -> Option<&StopCause> {
        self.lifetime.as_ref().and_then(|l| l.stop_cause.as_ref())
    }

    pub(super) fn set_stop_cause(&mut self, cause: Option<StopCause>) {
        self.lifetime.get_or_insert_default().stop_cause = cause;
    }

    pub(super) fn ttl(&self) -> Option<&Ttl> {
        self.lifetime.as_ref().and_then(|l| l.ttl.as_ref())
    }

    pub(super) fn ttl_mut(&mut self) -> Option<&mut Ttl> {
        self.lifetime.as_mut().and_then(|l| l.ttl.as_mut())
    }

    pub(super) fn kind(&self) -> &str {
        &self.id.as_str()[..usize::from(self.kind_len)]
    }

    pub(super) fn finished_at(&self) -> Option<SystemTime> {
        self.ended.as_ref().map(|e| e.finished_at)
    }

    /// Where reads find the output: the log of a stream kind, or a
    /// final-output kind's output (empty while live).
    pub(super) fn output_source(&self) -> output_ops::OutputSource {
        match &self.output_log {
            Some(log) => output_ops::OutputSource::Log(log.clone()),
            None => {
                output_ops::OutputSource::Final(self.ended.as_ref().and_then(|e| e.output.clone()).unwrap_or_default())
            }
        }
    }

    pub(super) fn done_event(&self) -> TaskDone {
        TaskDone { snapshot: self.snapshot(), owner: self.owner.as_ref().and_then(|o| o.agent.upgrade()) }
    }

    pub(super) fn settled_signal(&mut self) -> CancellationToken {
        self.waits_mut().settled.clone()
    }

    pub(super) fn waits_mut(&mut self) -> &mut Waits {
        self.waits.get_or_insert_with(Default::default)
    }

    /// Registers wait `ticket` (counted as a pending reporter) and returns
    /// the settlement signal it waits for.
    pub(super) fn begin_wait(&mut self, ticket: u64, abort: Option<&CancellationToken>) -> CancellationToken {
        self.pending_reporters += 1;
        let waits = self.waits_mut();
        waits.entries.push(WaitEntry { ticket, abort: abort.cloned() });
        waits.settled.clone()
    }

    /// Wait `ticket` leaves: its entry goes, and it no longer counts as a
    /// pending reporter. True if the entry was still there (for a settled
    /// task: the end is owed to this wait).
    pub(super) fn end_wait(&mut self, ticket: u64) -> bool {
        let owed = self.waits.as_mut().is_some_and(|waits| waits.take(ticket));
        if owed {
            self.pending_reporters -= 1;
        }
        owed
    }

    pub(super) fn bucket_key(&self) -> Option<u64> {
        self.owner.as_ref().map(|o| o.instance)
    }

    /// A reporter delivered the terminal state. A notice of the same end
    /// still unread by the owner is retracted: the report replaces it.
    /// Called under the registry lock, which orders it with
    /// [`TaskRegistry::inject_completion_notice`]. Returns the settlement the
    /// task-done listeners are still owed (the end was held), to be told
    /// once the lock is released.
    #[must_use = "a held end owes its listeners: pass it to TaskRegistry::tell_listeners"]
    pub(super) fn mark_reported(&mut self) -> Option<TaskDone> {
        let before = self.reporting;
        self.reporting = Reporting::Reported;
        match before {
            Reporting::Noticed => {
                if let Some(owner) = self.owner.as_ref().and_then(|o| o.agent.upgrade()) {
                    owner.retract_unread_about(&self.id);
                }
                None
            }
            Reporting::Held => Some(self.done_event()),
            Reporting::Untold | Reporting::Reported => None,
        }
    }

    /// May age out of the history: nobody still waits to be told of its end.
    pub(super) fn droppable(&self, reported_only: bool) -> bool {
        match self.reporting {
            // A wait or kill pending at settlement may still hand the notice
            // back, so nobody has been told of the end for sure.
            Reporting::Held => false,
            Reporting::Reported => true,
            _ if reported_only => false,
            Reporting::Noticed => true,
            Reporting::Untold => self.owner.as_ref().is_none_or(|o| o.agent.upgrade().is_none_or(|a| !a.is_live())),
        }
    }
}

impl TaskRegistry {
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

    /// Every live owner's tasks and the unowned ones, in start order: the
    /// view of an operator, not of a model (no owner fence).
    pub fn list_all(&self) -> Vec<TaskSnapshot> {
        let state = self.shared.lock();
        let mut all: Vec<&Record> = state.tasks.values().collect();
        all.sort_by_key(|r| r.seq);
        all.into_iter().map(Record::snapshot).collect()
    }

    /// How many tasks are live (running or stopping) now.
    pub fn live_count(&self) -> usize {
        self.shared.lock().tasks.values().filter(|r| !r.status.is_terminal()).count()
    }

    /// The caller-visible tasks (owned by the caller's session, or unowned),
    /// in start order.
    pub fn list(&self, caller: Option<&Agent>) -> Vec<TaskSnapshot> {
        let state = self.shared.lock();
        let mut visible: Vec<&Record> = state.tasks.values().filter(|r| visible_to(r, caller)).collect();
        visible.sort_by_key(|r| r.seq);
        visible.into_iter().map(Record::snapshot).collect()
    }
}

/// The live-task accounting of an owner instance (`None`: unowned tasks).
pub(super) fn bucket_mut(state: &mut State, bucket_key: Option<u64>) -> Option<&mut Bucket> {
    match bucket_key {
        None => Some(&mut state.unowned),
        Some(instance) => state.owner_scopes.get_mut(&instance).map(|scope| &mut scope.bucket),
    }
}

pub(super) fn visible_to(record: &Record, caller: Option<&Agent>) -> bool {
    match &record.owner {
        None => true,
        Some(owner) => caller.is_some_and(|c| c.session() == &owner.session),
    }
}

pub(super) fn fenced<'a>(state: &'a State, id: &TaskId, caller: Option<&Agent>) -> Result<&'a Record, TaskError> {
    let record = state.tasks.get(id).ok_or_else(|| TaskError::UnknownTask(id.clone()))?;
    if !visible_to(record, caller) {
        return Err(TaskError::ForeignTask(id.clone()));
    }
    Ok(record)
}

pub(super) fn fenced_mut<'a>(
    state: &'a mut State,
    id: &TaskId,
    caller: Option<&Agent>,
) -> Result<&'a mut Record, TaskError> {
    let record = state.tasks.get_mut(id).ok_or_else(|| TaskError::UnknownTask(id.clone()))?;
    if !visible_to(record, caller) {
        return Err(TaskError::ForeignTask(id.clone()));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every live task holds one record (boxed: malloc rounds to 16 bytes
    /// with 8 of its own). What grows it belongs in [`Ended`] or in the
    /// stream output, unless every live task needs it.
    #[test]
    fn a_record_stays_small() {
        assert!(std::mem::size_of::<Record>() <= 136, "{} bytes", std::mem::size_of::<Record>());
    }
}
