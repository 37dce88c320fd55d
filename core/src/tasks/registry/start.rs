//! Starting a task: the preflight that reserves a slot, the producer's
//! runner run once, and the commit that issues the id and spawns the watcher.
//!
//! Invariants: `start` runs every failable check first (surface fence, kind,
//! exact live owner, owner-cleanup attach, per-owner cap), then the
//! producer's runner exactly once, then commits under the lock. The commit
//! fails only when the store cannot record the task (write-ahead: no id is
//! returned for a task a restart would not know); the work the runner
//! started is then stopped, and the refused id is never issued again.
//! A start refused before its runner allocates no id, except with a store
//! that fences launches ([`TaskStore::fences_launches`](crate::tasks::store::TaskStore::fences_launches)): there the id is
//! issued and the start recorded *before* the runner, so a start the store
//! cannot record never runs; a runner that then fails has its record
//! deleted (the id is never issued again).

use super::guards::{Reservation, release_start};
use super::settle::{WatchedTask, Watcher};
use super::state::{Bucket, Owner, OwnerScope, Record, Reporting, State, bucket_mut, unix_nanos};
use super::*;
use crate::tasks::store::{StoredOptions, StoredOwner, StoredTask, StoredTree};

impl TaskRegistry {
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
        let identity = Identity { kind, label, owner, producer_info, options };
        let launch = if self.shared.store.fences_launches() {
            let launch = self.launch(&identity).inspect_err(|error| {
                span.in_scope(|| tracing::error!(%error, "start refused: the store cannot record it; nothing ran"));
            })?;
            span.record("task", launch.id.as_str());
            Some(launch)
        } else {
            None
        };

        let hooks = match crate::panics::contained(run()).instrument(span.clone()).await {
            Ok(hooks) => hooks,
            Err(cause) => {
                if let Some(launch) = &launch {
                    self.unlaunch(launch);
                }
                return Err(TaskError::Producer { context: format!("starting {} task failed", identity.kind), cause });
            }
        };

        let id = match self.register_launched(reservation, identity, hooks, launch) {
            Ok(id) => id,
            Err((error, hooks)) => {
                span.in_scope(
                    || tracing::error!(%error, "start refused: the store cannot record it; its work is stopped"),
                );
                stop_unrecorded(hooks);
                return Err(error);
            }
        };
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
        let id = self.register(reservation, Identity { kind, label, owner, producer_info, options }, hooks)?;
        tracing::info!(task = %id, "foreground run adopted as a background task");
        Ok(id)
    }

    /// Commits running work and wires it up: the output signal (drains and
    /// events), and a teardown when its owner began disposing meanwhile. A
    /// store that cannot record it hands the hooks back untouched.
    #[allow(clippy::result_large_err)]
    pub(super) fn register(
        &self,
        reservation: Reservation,
        identity: Identity,
        hooks: TaskHooks,
    ) -> Result<TaskId, (TaskError, TaskHooks)> {
        self.register_launched(reservation, identity, hooks, None)
    }

    /// As [`Self::register`], for a start already recorded by `launch`.
    #[allow(clippy::result_large_err)]
    fn register_launched(
        &self,
        reservation: Reservation,
        identity: Identity,
        hooks: TaskHooks,
        launch: Option<Launch>,
    ) -> Result<TaskId, (TaskError, TaskHooks)> {
        let control = hooks.control.clone();
        let owner_session = identity.owner.as_ref().map(|agent| agent.session().clone());
        let stable_owner = identity.owner.as_ref().is_some_and(Agent::is_durable);
        let ttl = identity.options.ttl.or(self.shared.config.default_ttl_for(stable_owner));
        let (id, cancel_now) = self.commit(reservation, identity, hooks, launch)?;
        if let Some(ttl) = ttl {
            self.arm_ttl(&id, ttl);
        }
        control.watch_output(self.output_signal(&id, owner_session));
        if cancel_now {
            // The owner (or the registry) began disposing while this start
            // was in flight; its cleanup is waiting for this task to settle.
            let registry = self.clone();
            let id = id.clone();
            tokio::spawn(async move { registry.teardown(&id, "owner disposed").await });
        }
        Ok(id)
    }

    pub(super) fn preflight(&self, kind: &str, label: &str, owner: Option<&Agent>) -> Result<Reservation, TaskError> {
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
        if let Some(owner) = owner {
            self.ensure_scope(&mut state, owner)?;
        }
        if let Some(bucket) = bucket_mut(&mut state, bucket_key) {
            bucket.starting += 1;
        }
        state.starts_in_flight += 1;
        Ok(Reservation { registry: Arc::downgrade(&self.shared), bucket_key, armed: true })
    }

    /// Registers the registry in `owner`'s disposal scope, once per instance.
    pub(super) fn ensure_scope(&self, state: &mut State, owner: &Agent) -> Result<(), TaskError> {
        if state.owner_scopes.contains_key(&owner.instance()) {
            return Ok(());
        }
        let cleanup = self.owner_cleanup(owner);
        let key = owner.add_cleanup(cleanup).map_err(|_| TaskError::OwnerNotLive(owner.id().to_string()))?;
        state.owner_scopes.insert(
            owner.instance(),
            OwnerScope {
                owner: Arc::new(Owner::of(owner)),
                cleanup: key,
                closing: false,
                bucket: Bucket::default(),
                starts_drained: Arc::new(Notify::new()),
                tasks: Vec::new(),
            },
        );
        Ok(())
    }

    #[allow(clippy::result_large_err)]
    pub(super) fn commit(
        &self,
        mut reservation: Reservation,
        identity: Identity,
        hooks: TaskHooks,
        launch: Option<Launch>,
    ) -> Result<(TaskId, bool), (TaskError, TaskHooks)> {
        // Whatever needs no id is made before the lock is taken.
        let started_at = launch.as_ref().map_or_else(|| unix_nanos(SystemTime::now()), |launch| launch.started_at);
        let durable_owner = identity.owner.as_ref().is_some_and(Agent::is_durable);
        let mut tree = hooks.control.handed_over_tree().filter(|_| durable_owner).map(StoredTree::new);
        let streams_output = hooks.control.streams_output();
        reservation.armed = false;
        let mut state = self.shared.lock();
        let bucket_key = reservation.bucket_key;
        release_start(&mut state, &self.shared, bucket_key);

        let id = match &launch {
            Some(launch) => launch.id.clone(),
            None => self.issue_id(&mut state, &identity.kind),
        };
        // Without a launch the tree goes in the start's record; with one, in its own write.
        let unrecorded = launch.is_none().then(|| self.stored_task(&id, &identity, started_at, tree.take()));
        let Identity { kind, label, owner, producer_info, options } = identity;
        let label = label.into_boxed_str();
        let producer_info = producer_info.map(String::into_boxed_str);
        // A valid kind has at most 64 bytes.
        let kind_len = u8::try_from(kind.len()).expect("a valid kind is at most 64 bytes");
        let mut owner_ref = None;
        if let Some(scope) = bucket_key.and_then(|k| state.owner_scopes.get_mut(&k)) {
            owner_ref = Some(scope.owner.clone());
        }
        // The scope outlives every start in flight (its cleanup waits for
        // them), so this is only a fallback.
        let owner = owner.map(|agent| owner_ref.unwrap_or_else(|| Arc::new(Owner::of(&agent))));

        // Write-ahead: the record is committed to the store before the id is
        // returned. A store that cannot write it refuses the start: a task
        // whose record is missing would vanish at a restart (its tree
        // unowned), and an MCP task must be durably created before it is
        // announced. The refused number is never issued again.
        if let Some(stored) = unrecorded {
            if let Err(error) = self.shared.store.record_start(&stored) {
                let error = TaskError::NotRecorded {
                    id: id.clone(),
                    store: self.shared.store.describe(),
                    cause: error.to_string(),
                };
                return Err((error, hooks));
            }
        } else if let Some(tree) = &tree
            && let Err(error) = self.shared.store.record_tree(&id, tree)
        {
            // The work runs and its start is recorded: it is kept; only a
            // restart would not find its tree (it then reports it lost).
            tracing::error!(task = %id, store = %self.shared.store.describe(), %error, "cannot record the started task's tree");
        }

        let TaskHooks { control, done } = hooks;
        if let Some(bucket) = bucket_mut(&mut state, bucket_key) {
            bucket.live += 1;
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let mut cancel_now = state.disposed;
        if let Some(scope) = bucket_key.and_then(|k| state.owner_scopes.get_mut(&k)) {
            scope.tasks.push(id.clone());
            cancel_now |= scope.closing;
        }
        // Spawned under the lock so the record can hold its abort handle; the
        // watcher's first settle simply waits for this commit to finish.
        let task = Box::new(WatchedTask { registry: Arc::downgrade(&self.shared), id: id.clone() });
        let watcher = Some(tokio::spawn(Watcher { done, task }).abort_handle());
        let output_log = streams_output.then(|| self.new_stream_output(&id, owner.as_deref(), &options));
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
            reporting: Reporting::Untold,
            pending_reporters: 0,
            producer_info,
            input: options.input,
            control,
            output_log,
            watcher,
            waits: None,
            lifetime: None,
        }));
        if self.shared.has_subscribers()
            && let Some(record) = state.tasks.get(&id)
        {
            let _ = self.shared.events.send(TaskEvent::Started { task: record.snapshot() });
        }
        Ok((id, cancel_now))
    }
}

/// A start recorded before its runner ran (a store that fences launches).
pub(super) struct Launch {
    id: TaskId,
    started_at: u64,
}

impl TaskRegistry {
    /// Issues the next id of `kind`: above every number this registry and
    /// the store issued (an earlier process, another sharing the store).
    fn issue_id(&self, state: &mut State, kind: &str) -> TaskId {
        let mut counter = match state.next_id_by_kind.get_mut(kind) {
            Some(next) => {
                *next += 1;
                *next
            }
            None => 1,
        };
        match self.shared.store.issue_number(kind, counter) {
            Ok(issued) if issued > counter => counter = issued,
            Ok(_) => {}
            Err(error) => {
                tracing::error!(kind = %kind, store = %self.shared.store.describe(), %error, "cannot issue an id through the store; issuing from memory");
            }
        }
        state.next_id_by_kind.insert(kind.to_string(), counter);
        TaskId::issue(kind, counter)
    }

    /// The record of a start of `identity` as id `id`.
    fn stored_task(&self, id: &TaskId, identity: &Identity, started_at: u64, tree: Option<StoredTree>) -> StoredTask {
        let started = SystemTime::UNIX_EPOCH + Duration::from_nanos(started_at);
        let mut stored = StoredTask::new(id.clone(), &identity.kind, &identity.label, started);
        let durable = identity.owner.as_ref().is_some_and(Agent::is_durable);
        stored.owner = identity.owner.as_ref().map(|agent| StoredOwner::new(agent.session().clone(), durable));
        stored.producer_info.clone_from(&identity.producer_info);
        // Kept only for a stable owner: nobody else's task outlives this process.
        let ttl = identity.options.ttl.or(self.shared.config.default_ttl_for(durable));
        let expires_at = ttl.map(|ttl| started + ttl);
        stored.options = StoredOptions::of(&identity.options, ttl, expires_at);
        stored.tree = tree;
        stored
    }

    /// Issues the start's id and records it before anything runs.
    fn launch(&self, identity: &Identity) -> Result<Launch, TaskError> {
        let started_at = unix_nanos(SystemTime::now());
        let id = self.issue_id(&mut self.shared.lock(), &identity.kind);
        let stored = self.stored_task(&id, identity, started_at, None);
        self.shared.store.record_start(&stored).map_err(|error| TaskError::NotRecorded {
            id: id.clone(),
            store: self.shared.store.describe(),
            cause: error.to_string(),
        })?;
        Ok(Launch { id, started_at })
    }

    /// Deletes the record of a launch whose runner failed (nothing runs).
    fn unlaunch(&self, launch: &Launch) {
        if let Err(error) = self.shared.store.forget(std::slice::from_ref(&launch.id)) {
            tracing::error!(task = %launch.id, store = %self.shared.store.describe(), %error, "cannot delete the record of a start whose runner failed; a restart reports it lost");
        }
    }
}

/// Stops the work of a start the store refused: its runner ran, nobody
/// will ever hold its id. The cancel and the end are awaited in the
/// background (bounded by the producer's own grace), so the refusal is
/// answered at once.
fn stop_unrecorded(hooks: TaskHooks) {
    let TaskHooks { control, done } = hooks;
    tokio::spawn(async move {
        if let Err(error) = control.cancel(Some("its start could not be recorded")).await {
            tracing::warn!(%error, "stopping the work of an unrecorded start failed");
        }
        let _ = tokio::time::timeout(UNRECORDED_STOP_BOUND, done).await;
    });
}

/// How long the end of an unrecorded start's work is awaited after its
/// cancel (its tree's kill grace is shorter).
const UNRECORDED_STOP_BOUND: Duration = Duration::from_secs(30);

/// What a start says about its task, kept for the commit.
pub(super) struct Identity {
    pub(super) kind: String,
    pub(super) label: String,
    pub(super) owner: Option<Agent>,
    pub(super) producer_info: Option<String>,
    pub(super) options: TaskOptions,
}
