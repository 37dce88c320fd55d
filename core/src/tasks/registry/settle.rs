//! How a task ends: first-wins settlement, the listeners and events it
//! fans out to, the history bound, the completion notice, and teardown
//! (owner cleanup, registry disposal, force-fail).
//!
//! Invariants:
//! - Settlement is first-wins: the first outcome (or force-fail) is final;
//!   later outcomes are logged and dropped. First-wins includes the store:
//!   a stable owner's end the store refuses because it already holds
//!   another (recorded by another cluster node, which tells it) is told to
//!   nobody here. Listeners hear each end once,
//!   with its final `reported`, outside the lock: at settlement, before
//!   waiters and subscribers hear of it, or, for an end held for the waits
//!   and kills pending at settlement, once one of them delivers it or the
//!   last hands it back.
//! - A completion notice and an explicit report of the same end are mutually
//!   exclusive: the notice is injected under the registry lock only while
//!   the task is untold, and a later report retracts it from the owner's
//!   unread messages.
//! - Owner cleanup cancels the owner's live tasks, awaits their quiescence
//!   (bounded by the teardown timeout, then force-fails with a
//!   possible-orphan detail), waits for starts still in flight, and drops the
//!   owner's records; its settlements count as reported. Settlements caused
//!   by registry disposal are silent (no listener runs).
//! - A settlement is counted as telling from the moment its record turns
//!   terminal until its listeners, subscribers and waiters were told, and a
//!   held end from its delivery or hand-back until its listeners were told:
//!   an owner cleanup and a disposal return only once none of theirs is, so
//!   a task that ended by itself just before they looked is heard of first.
//! - Each owner (and the unowned bucket) keeps at most
//!   `max_finished_tasks_per_owner` finished records: the oldest reported
//!   go first, then the oldest noticed; a finished task whose end nobody was
//!   told of is never dropped. Dropping a record drops its producer handle
//!   (and with it its output and spill files).

use super::guards::{HeldEnd, Telling};
use super::state::{Ended, Record, Reporting, bucket_mut};
use super::*;
use crate::tasks::store::StoredEnd;

impl TaskRegistry {
    /// Settles a task whose read ended it (first wins, so an outcome that
    /// got there first stands) and returns the read as the terminal report.
    pub(super) fn settle_by_read(&self, id: &TaskId, ended: ReadEndedTask, before: TaskSnapshot) -> TaskRead {
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
            TaskSnapshot {
                status,
                detail,
                finished_at: Some(SystemTime::now()),
                reported: true,
                expires_at: None,
                ..before
            },
        );
        TaskRead { text, snapshot }
    }

    /// The process is going away (a server's shutdown, before its owners
    /// and the registry are disposed): from now on a live task of a stable
    /// owner whose control holds a handed-over tree
    /// ([`TaskControl::handed_over_tree`]) is not torn down by a disposal.
    /// Its tree runs on under its keeper, its record stays live in the
    /// store, and the next process re-adopts it ([`Self::readopt`]), as after
    /// a crash. Everything else ends as before.
    pub fn begin_shutdown(&self) {
        self.shared.lock().shutting_down = true;
    }

    /// Cancels every live task, awaits their quiescence (bounded by the
    /// teardown timeout), detaches from live owners and drops every record.
    ///
    /// Guarantees, once it returns: no task of this registry is live (each
    /// settled, or was force-failed with a possible-orphan detail), every
    /// start that was in flight has settled too, every settlement before it
    /// has told its listeners, no task can start, and no listener was called
    /// for these settlements (disposal is silent: an owner still alive is not
    /// told of kills it never asked for). Waits still pending wake with the
    /// terminal state. Idempotent.
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
                    let shutting_down = state.shutting_down;
                    state
                        .tasks
                        .values()
                        .filter(|r| !(r.status.is_terminal() || shutting_down && r.outlives_the_process()))
                        .map(|r| r.id.clone())
                        .collect()
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
        // A settlement that ended a task before the loop above looked may be
        // telling of it still (its listeners ran before disposal began).
        let scopes =
            self.settlements_told(|state| state.telling, |state| std::mem::take(&mut state.owner_scopes)).await;
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
        if record.reporting != Reporting::Untold || !record.status.is_terminal() {
            return false;
        }
        let Some(owner) = record.owner.as_ref().and_then(|o| o.agent.upgrade()) else {
            return false;
        };
        if owner.inject_about(id, text).is_err() {
            return false;
        }
        record.reporting = Reporting::Noticed;
        self.shared.store_reporting(record);
        true
    }

    /// Records the outcome unless the task already settled (first wins), then
    /// fans out to the listeners.
    pub(super) fn settle(&self, id: &TaskId, outcome: TaskOutcome) {
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

    pub(super) fn settle_record(&self, id: &TaskId, settlement: Settlement) {
        let Settlement { status, detail, output, forced, reported } = settlement;
        // `quiet`: no listener runs now (disposal, or a held end).
        let (done, settled, quiet, bucket_key, telling) = {
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
            record.stop_ttl_watcher();
            let detail = match record.stop_cause() {
                Some(StopCause::TimeToLive { ttl_ms }) if status == TaskStatus::Killed => {
                    Some(ttl_expired_detail(*ttl_ms, detail.as_deref()))
                }
                _ => detail,
            };
            record.ended = Some(Box::new(Ended { finished_at: SystemTime::now(), detail, output }));
            // A wait whose abort fired before this settlement was aborted
            // first: it holds nothing (and will fail).
            if let Some(waits) = record.waits.as_mut() {
                let aborted = waits.drop_aborted();
                record.pending_reporters -= aborted;
            }
            // Reported by the caller that settled it, or nobody is left to
            // tell (owner teardown, registry disposal), except a stable
            // owner, whose next instance is told (the store keeps the end
            // untold); else pending waits and kills take over reporting. An
            // end already reported (a kill's accepted request) stays reported.
            let durable = record.owner.as_ref().is_some_and(|owner| owner.durable);
            if reported || ((owner_closing || silent) && !durable) {
                record.reporting = Reporting::Reported;
            } else if record.pending_reporters > 0 && record.reporting == Reporting::Untold {
                record.reporting = Reporting::Held;
            }
            // Write-ahead: the end is committed before anyone hears of it.
            let ended = record.ended.as_deref().expect("set just above");
            let mut end = StoredEnd::new(status, ended.detail.clone(), ended.finished_at, record.reporting.stored());
            end.output = ended.output.clone();
            match self.shared.store.settle(id, &end) {
                // The store holds an end recorded first by someone else (a
                // cluster node that settled this node's tasks while it was
                // silent). A stable owner is told that end where it is kept,
                // so this one is told to nobody; a plain owner's connection
                // is here, and only here can it be told.
                Ok(false) if durable => {
                    tracing::warn!(task = %id, store = %self.shared.store.describe(), "the store already holds another end of this task; this one is not told");
                    record.reporting = Reporting::Reported;
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::error!(task = %id, store = %self.shared.store.describe(), %error, "cannot record the task's end in the store");
                }
            }
            if let Some(output) = &record.output_log {
                output.stop_stall_watcher();
                self.shared.output_memory.finished(output);
            }
            let done = record.done_event();
            // A held end's listeners run when it is delivered or handed back.
            let held = record.reporting == Reporting::Held;
            let settled = record.waits.as_ref().map(|waits| waits.settled.clone());
            if forced && let Some(watcher) = &record.watcher {
                watcher.abort();
            }
            let bucket_key = record.bucket_key();
            if let Some(bucket) = bucket_mut(&mut state, bucket_key) {
                bucket.live -= 1;
                bucket.finished.push_back(id.clone());
            }
            // Counted until everything below ran (even if a step panics): a
            // cleanup or disposal that saw this record terminal waits for it.
            let telling = Telling::count(&self.shared, &mut state, Some(bucket_key));
            (done, settled, silent || held, bucket_key, telling)
        };
        let snapshot = &done.snapshot;
        tracing::info!(task = %id, status = %snapshot.status, detail = snapshot.detail.as_deref().unwrap_or(""), forced, "task settled");
        if !quiet {
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
        // A finished task's output is the first to leave memory.
        self.enforce_output_memory();
        if let Some(settled) = settled {
            settled.cancel();
        }
        drop(telling);
    }

    /// Returns once no settlement `telling` counts (of one bucket, or of the
    /// whole registry) is still telling of its end: each one's listeners,
    /// subscribers and waiters were told. The count is read under the lock,
    /// so `then` runs atomically with the check that it is zero.
    async fn settlements_told<T>(&self, telling: impl Fn(&State) -> usize, then: impl FnOnce(&mut State) -> T) -> T {
        loop {
            let told = self.shared.settlements_told.notified();
            {
                let mut state = self.shared.lock();
                if telling(&state) == 0 {
                    return then(&mut state);
                }
            }
            told.await;
        }
    }

    /// Drops records taken out of the table (outside the lock: dropping a
    /// producer handle may kill processes and remove files) and tells
    /// subscribers.
    pub(super) fn release_records(&self, records: Vec<Record>) {
        if records.is_empty() {
            return;
        }
        let subscribed = self.shared.has_subscribers();
        let disposed = self.shared.lock().disposed;
        for mut record in records {
            // An end still held for waits that never came back: nobody is
            // left to tell, and its listeners hear it now, once (disposal
            // stays silent).
            if record.reporting == Reporting::Held
                && let Some(done) = record.mark_reported()
                && !disposed
            {
                self.notify_listeners(&done);
            }
            tracing::debug!(task = %record.id, "task record released");
            if subscribed {
                let owner_session = record.owner.as_ref().map(|o| o.session.clone());
                let _ = self.shared.events.send(TaskEvent::Released { id: record.id.clone(), owner_session });
            }
            drop(record);
        }
    }

    pub(super) fn notify_listeners(&self, done: &TaskDone) {
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

    /// Tells the listeners of held ends, once delivered or handed back (see
    /// [`Reporting::Held`]), each counted as telling until told. Called
    /// outside the registry lock.
    pub(super) fn tell_listeners(&self, held: Vec<HeldEnd<'_>>) {
        for end in held {
            self.notify_listeners(&end.done);
        }
    }

    /// Cancels a task for disposal and awaits it. A cancel that fails, or a
    /// task that does not settle within the teardown timeout, is force-failed
    /// with a detail saying the work may be orphaned.
    pub(super) async fn teardown(&self, id: &TaskId, reason: &str) {
        let (control, settled) = {
            let mut state = self.shared.lock();
            let Some(record) = state.tasks.get_mut(id) else {
                return;
            };
            if record.status.is_terminal() {
                return;
            }
            record.status = TaskStatus::Stopping;
            self.shared.store_stop(id);
            (record.control.clone(), record.settled_signal())
        };
        let cancelled = crate::panics::contained(control.cancel(Some(reason))).await;
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

    pub(super) fn force_fail(&self, id: &TaskId, control: &Arc<dyn TaskControl>, detail: String) {
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
    pub(super) fn owner_cleanup(&self, owner: &Agent) -> crate::agents::Cleanup {
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

    pub(super) async fn cleanup_owner(&self, instance: u64) {
        loop {
            let (live, starting, drained) = {
                let mut state = self.shared.lock();
                let State { owner_scopes, tasks, shutting_down, .. } = &mut *state;
                let Some(scope) = owner_scopes.get_mut(&instance) else {
                    return;
                };
                scope.closing = true;
                let live: Vec<TaskId> = scope
                    .tasks
                    .iter()
                    .filter(|id| {
                        tasks
                            .get(id)
                            .is_some_and(|r| !(r.status.is_terminal() || *shutting_down && r.outlives_the_process()))
                    })
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
        // A task that settled by itself just before the cleanup looked is
        // terminal, but its listeners may not have heard of it yet: the
        // cleanup returns only once they did (the owner's completion notice
        // included), and drops the records in the same look.
        let telling = |state: &State| state.owner_scopes.get(&instance).map_or(0, |scope| scope.bucket.telling);
        let records: Vec<Record> = self
            .settlements_told(telling, |state| match state.owner_scopes.remove(&instance) {
                Some(scope) => {
                    // A stable owner's records stay in the store for its
                    // next instance; anyone else's leave with the owner.
                    if !scope.owner.durable {
                        self.shared.store_forget(&scope.tasks);
                    }
                    scope.tasks.iter().filter_map(|id| state.tasks.remove(id)).collect()
                }
                None => Vec::new(),
            })
            .await;
        self.release_records(records);
    }
}

/// How a task ends, as [`TaskRegistry::settle_record`] records it.
pub(super) struct Settlement {
    pub(super) status: TaskStatus,
    pub(super) detail: Option<String>,
    pub(super) output: Option<String>,
    /// The registry gave up on the task (abort its watcher).
    pub(super) forced: bool,
    /// The caller that settles it reports the end itself (no notice).
    pub(super) reported: bool,
}

/// Drops the oldest finished records of a bucket beyond the history cap:
/// reported ones first, then those whose end was noticed; never one whose
/// end nobody was told of yet. Returns the records taken out of the table.
pub(super) fn prune_history(state: &mut State, shared: &Shared, bucket_key: Option<u64>) -> Vec<Record> {
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
    let forgotten: Vec<TaskId> = taken.iter().map(|r| r.id.clone()).collect();
    shared.store_forget(&forgotten);
    taken
}

/// Awaits a producer's `done` and settles its task; contains errors and
/// panics as `failed` outcomes. Every live task is one of these.
///
/// Written by hand to be the producer's future and one pointer (24 bytes):
/// a tokio task around it then fits one 128-byte cell, where an `async fn`
/// holding the registry and the id needed two (see `watcher_fits_one_tokio_cell`).
pub(super) struct Watcher {
    pub(super) done: futures::future::BoxFuture<'static, anyhow::Result<TaskOutcome>>,
    pub(super) task: Box<WatchedTask>,
}

/// Whose `done` a [`Watcher`] awaits.
pub(super) struct WatchedTask {
    pub(super) registry: Weak<Shared>,
    pub(super) id: TaskId,
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

pub(super) fn settle_watched(task: &WatchedTask, outcome: std::thread::Result<anyhow::Result<TaskOutcome>>) {
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

/// The detail of a task stopped by its time to live: `reason: ttl expired
/// after <N> s`, then the producer's own (`signal: SIGTERM`).
fn ttl_expired_detail(ttl_ms: u64, producer: Option<&str>) -> String {
    let reason = format!("reason: ttl expired after {} s", super::seconds(Duration::from_millis(ttl_ms)));
    match producer {
        Some(detail) if !detail.is_empty() => format!("{reason}, {detail}"),
        _ => reason,
    }
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
}
