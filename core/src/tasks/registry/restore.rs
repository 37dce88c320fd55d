//! Records a store kept from an earlier process: restored at construction,
//! and handed to their owner's next instance when it appears.
//!
//! Invariants:
//! - A task the store says was live is settled in the store first (write-
//!   ahead, first wins): `lost` when it was running, `killed` when its stop
//!   was requested. It is never run again: a restored record has no producer.
//! - Only stable owners' records ([`crate::agents::AgentRegistry::create_durable`])
//!   come back; others' were live only for a connection that is gone: the
//!   lost ones stay in the store (to say how they ended) until the next
//!   restart, when every ended record of a non-stable owner is deleted.
//! - The id counters continue from the highest number the store holds.
//! - A restored record belongs to no owner instance until
//!   [`TaskRegistry::attach_owner`] hands it to the session's next durable
//!   agent; an end nobody was told of is then told once, by a notice.

use super::settle::{WatchedTask, Watcher};
use super::state::{Ended, Owner, Record, Reporting, State, bucket_mut, unix_nanos};
use super::*;
use crate::agents::WeakAgent;
use crate::ids::SessionId;
use crate::tasks::store::{ReportState, StoreError, StoredEnd, StoredTask};

/// The owner instance of a restored record until its owner appears (no
/// agent instance has it: instances count up from 0).
const NO_INSTANCE_YET: u64 = u64::MAX;

/// Why a task that was running when its host stopped was not carried on.
pub const LOST_DETAIL: &str = "the server stopped (a crash or a restart) while the task ran; \
its work stopped with the server and was not run again";

/// Why a task whose stop was requested before its host stopped is killed.
pub const KILLED_BY_RESTART_DETAIL: &str =
    "its stop was requested before the server stopped, and it stopped with the server";

/// A restored record's control: its work is gone, so there is nothing to cancel.
pub(super) struct NoProducer;

#[async_trait::async_trait]
impl TaskControl for NoProducer {
    async fn cancel(&self, _reason: Option<&str>) -> anyhow::Result<()> {
        Ok(())
    }

    fn streams_output(&self) -> bool {
        false
    }
}

impl TaskRegistry {
    /// Reads the store and restores what it kept (see the module invariants).
    pub(super) fn restore(&self) -> Result<(), StoreError> {
        let store = &self.shared.store;
        let stored = store.load()?;
        let now = SystemTime::now();
        let mut forget = Vec::new();
        let mut owners: HashMap<SessionId, Arc<Owner>> = HashMap::default();
        let (mut restored, mut lost) = (0usize, 0usize);
        let mut state = self.shared.lock();
        for (kind, last) in stored.counters {
            let counter = state.next_id_by_kind.entry(kind).or_default();
            *counter = (*counter).max(last);
        }
        for mut task in stored.tasks {
            let Some(number) = task.number().filter(|_| is_valid_kind(&task.kind)) else {
                tracing::warn!(task = %task.id, kind = %task.kind, "a stored record with a malformed id is left alone");
                continue;
            };
            let counter = state.next_id_by_kind.entry(task.kind.clone()).or_default();
            *counter = (*counter).max(number);
            let durable = task.owner.as_ref().is_some_and(|owner| owner.durable);
            if !task.status.is_terminal() && durable && task.tree.is_some() {
                // A handed-over tree: re-adopted (or told lost) by `readopt`.
                state.awaiting_adoption.push(task);
                continue;
            }
            if let Some(tree) = task.tree.clone().filter(|_| durable && task.status.is_terminal()) {
                // Ended: what its owner did not read yet is in its logs.
                state.ended_trees.push((task.id.clone(), tree));
            }
            if !task.status.is_terminal() {
                let (status, detail) = if task.status == TaskStatus::Stopping {
                    (TaskStatus::Killed, KILLED_BY_RESTART_DETAIL)
                } else {
                    (TaskStatus::Lost, LOST_DETAIL)
                };
                // Nobody is left to tell of a non-stable owner's task; an
                // end already reported (an owner's accepted kill) stays so.
                let reporting = match task.reporting {
                    _ if !durable => ReportState::Reported,
                    told @ (ReportState::Reported | ReportState::Noticed) => told,
                    _ => ReportState::Untold,
                };
                let end = StoredEnd::new(status, Some(detail.to_string()), now, reporting);
                store.settle(&task.id, &end)?;
                lost += 1;
                tracing::warn!(
                    task = %task.id,
                    owner = task.owner.as_ref().map(|o| o.session.as_str()).unwrap_or("-"),
                    status = %status,
                    "a task live when the server stopped is settled; it is not run again"
                );
                (task.status, task.detail, task.finished_at, task.reporting) =
                    (status, Some(detail.to_string()), Some(now), reporting);
            } else if !durable {
                forget.push(task.id.clone());
                continue;
            }
            let Some(stored_owner) = task.owner.take().filter(|owner| owner.durable) else {
                continue;
            };
            let owner = owners
                .entry(stored_owner.session.clone())
                .or_insert_with(|| {
                    Arc::new(Owner {
                        session: stored_owner.session,
                        instance: NO_INSTANCE_YET,
                        agent: WeakAgent::none(),
                        durable: true,
                    })
                })
                .clone();
            if insert_ended(&mut state, task, owner, now) {
                restored += 1;
            }
        }
        drop(state);
        store.forget(&forget)?;
        tracing::info!(store = %store.describe(), restored, lost, forgotten = forget.len(), "task store restored");
        Ok(())
    }

    /// Re-adopts the handed-over trees of the records [`Self::with_store`]
    /// restored live, through `adopter`: each goes on under its id, status
    /// and owner, its output resuming where its owner last read it, and
    /// ends with its tree's outcome; a stop requested before the restart is
    /// carried out now. A tree that cannot be carried on (its keeper died,
    /// its proof failed) settles the task `lost` (or `killed`, for a
    /// requested stop) with the reason, told once. Call it once, after the
    /// output files are set ([`Self::set_output_files`]); records it is
    /// never called for stay live in the store for the next start-up.
    pub fn readopt(&self, adopter: &dyn TreeAdopter) {
        let ended = std::mem::take(&mut self.shared.lock().ended_trees);
        for (id, tree) in ended {
            // The output its owner did not read before the restart.
            match adopter.adopt(&tree.record, tree.cursor.as_deref(), false) {
                Ok(hooks) => self.attach_output(&id, hooks.control),
                Err(why) => tracing::debug!(task = %id, %why, "an ended tree's unread output is gone"),
            }
        }
        let awaiting = std::mem::take(&mut self.shared.lock().awaiting_adoption);
        let awaiting: Vec<StoredTask> =
            awaiting.into_iter().filter(|task| task.tree.is_some() && task.owner.is_some()).collect();
        let adopted = adopt_all(adopter, &awaiting);
        let mut owners: HashMap<SessionId, Arc<Owner>> = HashMap::default();
        for (task, adopted) in awaiting.into_iter().zip(adopted) {
            let Some(stored_owner) = task.owner.clone() else { continue };
            let owner = owners
                .entry(stored_owner.session.clone())
                .or_insert_with(|| self.restored_owner(&stored_owner.session))
                .clone();
            let kill = task.status == TaskStatus::Stopping;
            match adopted {
                Ok(hooks) => {
                    tracing::info!(task = %task.id, owner = %stored_owner.session, kill, "a handed-over tree is re-adopted");
                    self.insert_adopted(task, owner, hooks);
                }
                Err(why) => {
                    let (status, detail) = if kill {
                        (TaskStatus::Killed, KILLED_BY_RESTART_DETAIL.to_string())
                    } else {
                        (
                            TaskStatus::Lost,
                            format!(
                                "the server stopped while the task ran, and its process tree could not be carried on ({why}); it was not run again"
                            ),
                        )
                    };
                    tracing::warn!(task = %task.id, owner = %stored_owner.session, %why, %status, "a handed-over tree cannot be re-adopted");
                    self.insert_lost(task, owner, status, detail);
                }
            }
        }
    }

    /// The owner of restored records until the session's next instance
    /// appears: the one already restored for it, else a new one.
    pub(super) fn restored_owner(&self, session: &SessionId) -> Arc<Owner> {
        let state = self.shared.lock();
        let found = state
            .tasks
            .values()
            .find_map(|r| r.owner.as_ref().filter(|o| o.instance == NO_INSTANCE_YET && &o.session == session).cloned());
        found.unwrap_or_else(|| {
            Arc::new(Owner {
                session: session.clone(),
                instance: NO_INSTANCE_YET,
                agent: WeakAgent::none(),
                durable: true,
            })
        })
    }

    /// Gives a restored ended record the output `control` still holds.
    fn attach_output(&self, id: &TaskId, control: Arc<dyn TaskControl>) {
        let session = {
            let mut state = self.shared.lock();
            let Some(record) = state.tasks.get_mut(id).filter(|r| r.output_log.is_none()) else { return };
            let Some(owner) = record.owner.clone() else { return };
            let session = owner.session.clone();
            record.output_log = Some(self.new_stream_output(id, Some(&owner), &TaskOptions::default()));
            record.control = control.clone();
            session
        };
        control.watch_output(self.output_signal(id, Some(session)));
    }

    /// A re-adopted task: live again, as a commit makes one.
    fn insert_adopted(&self, task: StoredTask, owner: Arc<Owner>, hooks: TaskHooks) {
        let TaskHooks { control, done } = hooks;
        let Ok(kind_len) = u8::try_from(task.kind.len()) else { return };
        let id = task.id.clone();
        let session = owner.session.clone();
        // Served as its start asked: its input, milestones and time to live.
        let options = task.options.to_options();
        let output_log = control.streams_output().then(|| self.new_stream_output(&id, Some(&owner), &options));
        if let Some(log) = &output_log {
            self.watch_stalls(&id, log);
        }
        {
            let mut state = self.shared.lock();
            let seq = state.next_seq;
            state.next_seq += 1;
            let watched = Box::new(WatchedTask { registry: Arc::downgrade(&self.shared), id: id.clone() });
            let watcher = Some(tokio::spawn(Watcher { done, task: watched }).abort_handle());
            state.tasks.insert(Box::new(Record {
                seq,
                id: id.clone(),
                kind_len,
                label: task.label.into_boxed_str(),
                owner: Some(owner),
                status: task.status,
                ended: None,
                started_at: unix_nanos(task.started_at),
                reporting: Reporting::Untold,
                pending_reporters: 0,
                producer_info: task.producer_info.map(String::into_boxed_str),
                input: options.input,
                control: control.clone(),
                output_log,
                watcher,
                waits: None,
                lifetime: None,
            }));
        }
        if let Some(ttl) = options.ttl {
            // The deadline the store holds (renewed by reads before the
            // restart); one already past stops the task at once.
            let left =
                task.options.expires_at.map_or(ttl, |at| at.duration_since(SystemTime::now()).unwrap_or_default());
            self.arm_ttl_until(&id, ttl, tokio::time::Instant::now() + left);
        }
        control.watch_output(self.output_signal(&id, Some(session)));
    }

    /// A task whose tree could not be carried on: settled in the store
    /// (write-ahead), restored ended, told once to its owner's next instance.
    fn insert_lost(&self, mut task: StoredTask, owner: Arc<Owner>, status: TaskStatus, detail: String) {
        let now = SystemTime::now();
        let reporting = match task.reporting {
            told @ (ReportState::Reported | ReportState::Noticed) => told,
            _ => ReportState::Untold,
        };
        if let Err(error) =
            self.shared.store.settle(&task.id, &StoredEnd::new(status, Some(detail.clone()), now, reporting))
        {
            tracing::error!(task = %task.id, %error, "cannot record the task's end in the store");
        }
        (task.status, task.detail, task.finished_at, task.output, task.reporting) =
            (status, Some(detail), Some(now), None, reporting);
        insert_ended(&mut self.shared.lock(), task, owner, now);
    }

    /// Hands the records restored for `owner`'s session to `owner` (a
    /// durable agent just created): they join its history (and its bound),
    /// and each end nobody was told of is returned, so the caller can inject
    /// its completion notice ([`Self::inject_completion_notice`]) once.
    /// Does nothing for an agent that is not durable.
    pub fn attach_owner(&self, owner: &Agent) -> Vec<TaskSnapshot> {
        if !owner.is_durable() {
            return Vec::new();
        }
        let (untold, dropped) = {
            let mut state = self.shared.lock();
            let mut mine: Vec<(u64, TaskId)> = state
                .tasks
                .values()
                .filter(|r| {
                    r.owner.as_ref().is_some_and(|o| o.instance == NO_INSTANCE_YET && &o.session == owner.session())
                })
                .map(|r| (r.seq, r.id.clone()))
                .collect();
            if mine.is_empty() || self.ensure_scope(&mut state, owner).is_err() {
                return Vec::new();
            }
            mine.sort();
            let scope_owner = state.owner_scopes[&owner.instance()].owner.clone();
            let mut untold = Vec::new();
            for (_, id) in &mine {
                if let Some(record) = state.tasks.get_mut(id) {
                    record.owner = Some(scope_owner.clone());
                    if record.reporting == Reporting::Untold {
                        untold.push(record.snapshot());
                    }
                }
            }
            if let Some(scope) = state.owner_scopes.get_mut(&owner.instance()) {
                scope.tasks.extend(mine.iter().map(|(_, id)| id.clone()));
            }
            // Re-adopted trees still run: they count as live.
            let (ended, live): (Vec<_>, Vec<_>) = mine
                .into_iter()
                .map(|(_, id)| id)
                .partition(|id| state.tasks.get(id).is_none_or(|r| r.status.is_terminal()));
            if let Some(bucket) = bucket_mut(&mut state, Some(owner.instance())) {
                bucket.finished.extend(ended);
                bucket.live += live.len();
            }
            let dropped = settle::prune_history(&mut state, &self.shared, Some(owner.instance()));
            (untold, dropped)
        };
        self.release_records(dropped);
        untold
    }
}

/// Inserts an ended record the store kept, owned by `owner` (a restored
/// owner, until its session's next instance appears), with nothing to
/// cancel and no output but what the record holds. False for a kind too
/// long to keep (never issued by a registry).
pub(super) fn insert_ended(state: &mut State, task: StoredTask, owner: Arc<Owner>, now: SystemTime) -> bool {
    let Ok(kind_len) = u8::try_from(task.kind.len()) else { return false };
    let seq = state.next_seq;
    state.next_seq += 1;
    state.tasks.insert(Box::new(Record {
        seq,
        id: task.id,
        kind_len,
        label: task.label.into_boxed_str(),
        owner: Some(owner),
        status: task.status,
        ended: Some(Box::new(Ended {
            finished_at: task.finished_at.unwrap_or(now),
            detail: task.detail,
            output: task.output,
        })),
        started_at: unix_nanos(task.started_at),
        reporting: match task.reporting {
            ReportState::Noticed => Reporting::Noticed,
            ReportState::Reported => Reporting::Reported,
            // A held end's reporters died with the old process.
            _ => Reporting::Untold,
        },
        pending_reporters: 0,
        producer_info: task.producer_info.map(String::into_boxed_str),
        input: TaskInput::Unsupported,
        control: Arc::new(NoProducer),
        output_log: None,
        watcher: None,
        waits: None,
        lifetime: None,
    }));
    true
}

/// Trees adopted side by side when there are many: each adoption waits on
/// its keeper's answer (a socket round trip to a process that must be
/// scheduled), so a thousand in a row spend most of their time waiting.
const ADOPTING_THREADS: usize = 8;

/// Adopts each task's tree through `adopter`, in `tasks`' order; in
/// [`ADOPTING_THREADS`] scoped threads (each inside the caller's tokio
/// runtime, where the followers are spawned) once there are more than that.
fn adopt_all(adopter: &dyn TreeAdopter, tasks: &[StoredTask]) -> Vec<Result<TaskHooks, String>> {
    let adopt = |task: &StoredTask| {
        let tree = task.tree.as_ref().expect("only tasks with a tree are adopted");
        adopter.adopt(&tree.record, tree.cursor.as_deref(), task.status == TaskStatus::Stopping)
    };
    if tasks.len() <= ADOPTING_THREADS {
        return tasks.iter().map(adopt).collect();
    }
    let runtime = tokio::runtime::Handle::try_current().ok();
    let chunk = tasks.len().div_ceil(ADOPTING_THREADS);
    std::thread::scope(|scope| {
        let workers: Vec<_> = tasks
            .chunks(chunk)
            .map(|part| {
                let runtime = runtime.clone();
                let worker = scope.spawn(move || {
                    let _entered = runtime.as_ref().map(tokio::runtime::Handle::enter);
                    part.iter().map(adopt).collect::<Vec<_>>()
                });
                (part.len(), worker)
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|(len, worker)| {
                worker.join().unwrap_or_else(|_| (0..len).map(|_| Err("its adoption panicked".to_string())).collect())
            })
            .collect()
    })
}
