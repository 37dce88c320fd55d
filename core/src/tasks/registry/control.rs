//! What a caller does to a running task: kill, wait, wait for any, input,
//! and the report of a terminal state these deliver.
//!
//! Invariants: every call passes the owner fence first; a kill or wait in
//! progress is a pending reporter that takes over reporting if the task
//! settles meanwhile; a wait aborted before the settlement never reports
//! (see [`AbortedWait`] for one aborted after it).

use super::guards::{HeldEnd, PendingReporter, release_reporter};
use super::settle::prune_history;
use super::state::{fenced, fenced_mut};
use super::*;

/// What a wait that was aborted owes its caller.
///
/// The abort cancels only the wait, never the task. Whether the answer of an
/// aborted wait reaches anyone is the caller's to say: a library caller
/// still receives what the wait returns, an MCP client drops the answer of a
/// request it cancelled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbortedWait {
    /// The behaviour contract's rule: a wait aborted after the task settled
    /// still delivers the terminal snapshot (the end counts as reported:
    /// settlement suppressed the notice on the waiter's behalf); a wait
    /// aborted before (or in the same tick, before settlement ran) fails with
    /// [`TaskError::WaitAborted`] and the completion notice stays due.
    #[default]
    DeliverSettled,
    /// The caller drops the answer of an aborted call: every aborted wait
    /// fails with [`TaskError::WaitAborted`] and reports nothing, so the
    /// completion notice stays due. The control tools wait this way.
    Fail,
}

impl TaskRegistry {
    /// The caller's response reports the end of the terminal task `id`:
    /// marks it reported (retracting an unread notice, telling the listeners
    /// of a held end), lets the history drop what that made droppable, and
    /// returns the reported snapshot (`None` if the record is gone).
    pub(super) fn report_terminal(&self, mut state: MutexGuard<'_, State>, id: &TaskId) -> Option<TaskSnapshot> {
        let record = state.tasks.get_mut(id)?;
        let held = record.mark_reported();
        self.shared.store_reporting(record);
        let snapshot = record.snapshot();
        let bucket = record.bucket_key();
        let held = HeldEnd::count(&self.shared, &mut state, held);
        let dropped = prune_history(&mut state, &self.shared, bucket);
        drop(state);
        self.tell_listeners(held);
        self.release_records(dropped);
        Some(snapshot)
    }

    /// Requests cancellation at the owner's request (the model's
    /// `task_kill`): the kill's answer reports the end, so no completion
    /// notice follows, and the task's [`StopCause`] is [`StopCause::Owner`].
    /// The producer's cancel runs first; if it fails, the error reaches the
    /// caller and the task is left untouched. An already-settled task is
    /// reported, not an error.
    pub async fn kill(
        &self,
        id: &TaskId,
        caller: Option<&Agent>,
        reason: Option<&str>,
    ) -> Result<KillResult, TaskError> {
        self.request_stop(id, Some(caller), StopCause::Owner, reason).await
    }

    /// Stops a task for someone other than its owner's model: a dashboard
    /// viewer, a time to live, a server limit, an operator. An operator's
    /// power, like [`Self::list_all`]: there is no owner fence, so the caller
    /// decides who may (the dashboard checks its viewer first).
    ///
    /// The stop does not report the end: the task records `cause` (the first
    /// cause asked for stands), and once it settles its owner is told with
    /// one completion notice naming the cause (`… was killed from the
    /// dashboard [status: killed, …]`), unless the owner's model collects or
    /// kills it first. A finished task is left as it is
    /// ([`KillResult::AlreadyTerminal`], still unreported). A failing
    /// producer cancel reaches the caller and leaves the task untouched.
    /// [`StopCause::Owner`] is the owner's own kill, reported as
    /// [`Self::kill`] reports it.
    pub async fn stop(&self, id: &TaskId, cause: StopCause, reason: Option<&str>) -> Result<KillResult, TaskError> {
        self.request_stop(id, None, cause, reason).await
    }

    /// A kill (`fence`: the caller to check) or a stop (no fence).
    async fn request_stop(
        &self,
        id: &TaskId,
        fence: Option<Option<&Agent>>,
        cause: StopCause,
        reason: Option<&str>,
    ) -> Result<KillResult, TaskError> {
        let reports = cause.is_owner();
        let (control, recorded_cause) = {
            let mut state = self.shared.lock();
            let record = match fence {
                Some(caller) => fenced_mut(&mut state, id, caller)?,
                None => state.tasks.get_mut(id).ok_or_else(|| TaskError::UnknownTask(id.clone()))?,
            };
            if record.status.is_terminal() {
                if !reports {
                    return Ok(KillResult::AlreadyTerminal(record.snapshot()));
                }
                let snapshot = self.report_terminal(state, id).ok_or_else(|| TaskError::UnknownTask(id.clone()))?;
                return Ok(KillResult::AlreadyTerminal(snapshot));
            }
            if reports {
                record.pending_reporters += 1;
            }
            tracing::info!(task = %id, cause = ?cause, reason = reason.unwrap_or("-"), "stop requested");
            let recorded_cause = record.stop_cause().is_none();
            if recorded_cause {
                record.set_stop_cause(Some(cause));
            }
            // Write-ahead: a stop requested before a crash is carried out
            // by the restart (the task is settled killed, never run again).
            self.shared.store_stop(id);
            (record.control.clone(), recorded_cause)
        };
        let ids = std::slice::from_ref(id);
        // Only a reporting stop (the owner's kill) holds the end.
        let mut pending = PendingReporter { registry: self, ids, wait: None, armed: reports };
        let cancelled = crate::panics::contained(control.cancel(reason)).await;

        let mut state = self.shared.lock();
        pending.armed = false;
        let Some(record) = state.tasks.get_mut(id) else {
            return Err(TaskError::UnknownTask(id.clone()));
        };
        if reports {
            record.pending_reporters -= 1;
        }
        match cancelled {
            Ok(()) => {
                let held = if reports { record.mark_reported() } else { None };
                if reports {
                    self.shared.store_reporting(record);
                }
                if record.status == TaskStatus::Running {
                    record.status = TaskStatus::Stopping;
                }
                let snapshot = record.snapshot();
                let held = HeldEnd::count(&self.shared, &mut state, held);
                drop(state);
                self.tell_listeners(held);
                Ok(KillResult::Requested(snapshot))
            }
            Err(_) if record.status.is_terminal() => {
                let held = if reports { record.mark_reported() } else { None };
                if reports {
                    self.shared.store_reporting(record);
                }
                let snapshot = record.snapshot();
                let held = HeldEnd::count(&self.shared, &mut state, held);
                drop(state);
                self.tell_listeners(held);
                Ok(KillResult::AlreadyTerminal(snapshot))
            }
            Err(source) => {
                // Untouched: nobody stopped it after all.
                if recorded_cause {
                    record.set_stop_cause(None);
                }
                let held = if reports { release_reporter(record) } else { None };
                let held = HeldEnd::count(&self.shared, &mut state, held);
                drop(state);
                self.tell_listeners(held);
                Err(TaskError::Producer {
                    context: format!("cancelling task {id} failed; it is still running"),
                    cause: source,
                })
            }
        }
    }

    /// Waits until the task settles, `timeout` passes, or `abort` fires,
    /// under the behaviour contract's abort rule
    /// ([`AbortedWait::DeliverSettled`]). See [`Self::wait_with`].
    pub async fn wait(
        &self,
        id: &TaskId,
        timeout: Duration,
        caller: Option<&Agent>,
        abort: Option<&CancellationToken>,
    ) -> Result<TaskSnapshot, TaskError> {
        self.wait_with(id, timeout, caller, abort, AbortedWait::DeliverSettled).await
    }

    /// Waits until the task settles, `timeout` passes, or `abort` fires.
    /// Returns the terminal snapshot (marked reported) or, on timeout, the
    /// live one. A zero timeout polls: it returns the current snapshot at
    /// once (terminal and reported, or live).
    ///
    /// Aborting cancels only the wait, never the task. What an aborted wait
    /// returns is `on_abort`'s rule; whichever it is, a wait aborted before
    /// the task settled (or in the same tick, before the settlement ran)
    /// fails with [`TaskError::WaitAborted`], holds nothing back, and the
    /// completion notice is delivered. The order is decided under the
    /// registry lock at settlement: a settlement that finds the wait's abort
    /// fired does not count the wait.
    pub async fn wait_with(
        &self,
        id: &TaskId,
        timeout: Duration,
        caller: Option<&Agent>,
        abort: Option<&CancellationToken>,
        on_abort: AbortedWait,
    ) -> Result<TaskSnapshot, TaskError> {
        let (settled, ticket) = {
            let mut state = self.shared.lock();
            fenced(&state, id, caller)?;
            let ticket = state.wait_ticket();
            let record = state.tasks.get_mut(id).ok_or_else(|| TaskError::UnknownTask(id.clone()))?;
            self.shared.renew_ttl(record);
            let aborted = abort.is_some_and(CancellationToken::is_cancelled);
            if record.status.is_terminal() && !(aborted && on_abort == AbortedWait::Fail) {
                return self.report_terminal(state, id).ok_or_else(|| TaskError::UnknownTask(id.clone()));
            }
            if aborted {
                return Err(TaskError::WaitAborted(id.clone()));
            }
            (record.begin_wait(ticket, abort), ticket)
        };
        let ids = std::slice::from_ref(id);
        let mut pending = PendingReporter { registry: self, ids, wait: Some(ticket), armed: true };
        let never = CancellationToken::new();
        let aborted = abort.unwrap_or(&never);
        tokio::select! {
            biased;
            _ = aborted.cancelled() => {}
            _ = settled.cancelled() => {}
            _ = tokio::time::sleep(timeout) => {}
        }

        let mut state = self.shared.lock();
        pending.armed = false;
        let Some(record) = state.tasks.get_mut(id) else {
            return Err(TaskError::UnknownTask(id.clone()));
        };
        let owed = record.end_wait(ticket);
        let aborted = aborted.is_cancelled();
        if record.status.is_terminal() && owed && !(aborted && on_abort == AbortedWait::Fail) {
            return self.report_terminal(state, id).ok_or_else(|| TaskError::UnknownTask(id.clone()));
        }
        let held = release_reporter(record);
        let snapshot = record.snapshot();
        let held = HeldEnd::count(&self.shared, &mut state, held);
        drop(state);
        self.tell_listeners(held);
        if aborted {
            return Err(TaskError::WaitAborted(id.clone()));
        }
        Ok(snapshot)
    }

    /// [`Self::wait_any_with`] under the behaviour contract's abort rule
    /// ([`AbortedWait::DeliverSettled`]).
    pub async fn wait_any(
        &self,
        ids: &[TaskId],
        timeout: Duration,
        caller: Option<&Agent>,
        abort: Option<&CancellationToken>,
    ) -> Result<(Option<TaskId>, Vec<TaskSnapshot>), TaskError> {
        self.wait_any_with(ids, timeout, caller, abort, AbortedWait::DeliverSettled).await
    }

    /// Waits until at least one of `ids` has finished, or `timeout` passed.
    /// Returns the id that finished first (`None` on timeout; among tasks
    /// already finished, the earliest) and every task's snapshot in the order
    /// given. Consumes no output; every task found finished counts as
    /// reported, so no completion notice follows for it. Refuses an unknown
    /// or foreign id before waiting. An abort follows `on_abort` as
    /// [`Self::wait_with`] does: an aborted wait that fails reports nothing.
    pub async fn wait_any_with(
        &self,
        ids: &[TaskId],
        timeout: Duration,
        caller: Option<&Agent>,
        abort: Option<&CancellationToken>,
        on_abort: AbortedWait,
    ) -> Result<(Option<TaskId>, Vec<TaskSnapshot>), TaskError> {
        let Some(first_id) = ids.first() else { return Ok((None, Vec::new())) };
        let mut distinct: Vec<TaskId> = Vec::with_capacity(ids.len());
        for id in ids {
            if !distinct.contains(id) {
                distinct.push(id.clone());
            }
        }
        let never = CancellationToken::new();
        let aborted = abort.unwrap_or(&never);
        // Every task already finished, or the ticket this wait holds the
        // live ones with and their settlement signals.
        let waiting = {
            let mut state = self.shared.lock();
            let mut earliest: Option<SystemTime> = None;
            for id in &distinct {
                let record = fenced(&state, id, caller)?;
                if let Some(at) = record.finished_at().filter(|_| record.status.is_terminal()) {
                    earliest = Some(earliest.map_or(at, |first| first.min(at)));
                }
            }
            if earliest.is_none() {
                if aborted.is_cancelled() {
                    return Err(TaskError::WaitAborted(first_id.clone()));
                }
                let ticket = state.wait_ticket();
                let mut signals = Vec::with_capacity(distinct.len());
                for id in &distinct {
                    if let Some(record) = state.tasks.get_mut(id) {
                        signals.push(record.begin_wait(ticket, abort));
                    }
                }
                Some((ticket, signals))
            } else {
                None
            }
        };
        let ticket = match waiting {
            None => None,
            Some((ticket, signals)) => {
                let mut pending = PendingReporter { registry: self, ids: &distinct, wait: Some(ticket), armed: true };
                let any_settled = futures::future::select_all(signals.iter().map(|s| Box::pin(s.cancelled())));
                tokio::select! {
                    biased;
                    _ = aborted.cancelled() => {}
                    _ = any_settled => {}
                    _ = tokio::time::sleep(timeout) => {}
                }
                pending.armed = false;
                Some(ticket)
            }
        };
        // One look under the lock decides: the tasks that finished and whose
        // end is owed to this wait (or that were finished before it began)
        // are reported; the wait leaves every other.
        let mut state = self.shared.lock();
        let aborted = aborted.is_cancelled();
        let mut owed: Vec<&TaskId> = Vec::new();
        let mut held = Vec::new();
        for id in &distinct {
            let Some(record) = state.tasks.get_mut(id) else { continue };
            let was_owed = match ticket {
                Some(ticket) => record.end_wait(ticket),
                None => true,
            };
            if record.status.is_terminal() && was_owed {
                owed.push(id);
            } else {
                held.extend(release_reporter(record));
            }
        }
        let fails = aborted && (on_abort == AbortedWait::Fail || owed.is_empty());
        let first = if fails {
            None
        } else {
            owed.iter()
                .filter_map(|id| state.tasks.get(id).and_then(|r| r.finished_at()).map(|at| (at, *id)))
                .min_by_key(|(at, _)| *at)
                .map(|(_, id)| id.clone())
        };
        let mut reported = Vec::new();
        for id in owed {
            let Some(record) = state.tasks.get_mut(id) else { continue };
            if fails {
                held.extend(release_reporter(record));
            } else {
                held.extend(record.mark_reported());
                self.shared.store_reporting(record);
                reported.push(record.bucket_key());
            }
        }
        let snapshots: Vec<TaskSnapshot> =
            ids.iter().filter_map(|id| state.tasks.get(id)).map(|record| record.snapshot()).collect();
        let mut dropped = Vec::new();
        reported.sort_unstable();
        reported.dedup();
        for bucket in reported {
            dropped.extend(prune_history(&mut state, &self.shared, bucket));
        }
        let held = HeldEnd::count(&self.shared, &mut state, held);
        drop(state);
        self.tell_listeners(held);
        self.release_records(dropped);
        if fails {
            return Err(TaskError::WaitAborted(first_id.clone()));
        }
        Ok((first, snapshots))
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
        crate::panics::contained(control.write_input(data, close))
            .await
            .map_err(|cause| TaskError::Producer { context: format!("sending input to task {id} failed"), cause })
    }
}
