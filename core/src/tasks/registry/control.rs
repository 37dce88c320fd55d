//! What a caller does to a running task: kill, wait, wait for any, input,
//! and the report of a terminal state these deliver.
//!
//! Invariants: every call passes the owner fence first; a kill or wait in
//! progress is a pending reporter that takes over reporting if the task
//! settles meanwhile; an aborted wait never reports.

use super::guards::{PendingReporter, release_reporter};
use super::settle::prune_history;
use super::state::{fenced, fenced_mut};
use super::*;

/// What ends a wait early.
pub(super) enum WaitEnd {
    Settled,
    TimedOut,
    Aborted,
}

impl TaskRegistry {
    /// The caller's response reports the end of the terminal task `id`:
    /// marks it reported (retracting an unread notice), lets the history
    /// drop what that made droppable, and returns the reported snapshot
    /// (`None` if the record is gone).
    pub(super) fn report_terminal(&self, mut state: MutexGuard<'_, State>, id: &TaskId) -> Option<TaskSnapshot> {
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
        let cancelled = crate::panics::contained(control.cancel(reason)).await;

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
                    cause: source,
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
        crate::panics::contained(control.write_input(data, close))
            .await
            .map_err(|cause| TaskError::Producer { context: format!("sending input to task {id} failed"), cause })
    }
}
