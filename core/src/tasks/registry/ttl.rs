//! Time to live: a task nobody reads for its TTL is stopped, after one
//! warning notice that says when and how to keep it.
//!
//! Invariants: the deadline is `TTL` after the start or after the owner's
//! last read of the task (`task_output`, any view, a wait), whichever came
//! last: reading renews it. One warning per renewal, [`warning_lead`] before
//! the deadline; at the deadline the task is stopped with
//! [`StopCause::TimeToLive`], its end told once like every end its owner did
//! not ask for, and its status line says `reason: ttl expired after <N> s`.
//! A task without a TTL costs nothing here; one with a TTL costs its part
//! of the record's lifetime box and one tokio task, aborted when the task settles.

use std::time::Duration;

use tokio::time::Instant;

use super::TaskRegistry;
use super::output_ops::seconds;
use super::state::{Record, Ttl};
use crate::ids::TaskId;
use crate::tasks::types::StopCause;

/// Bounds of a time to live, in milliseconds (one second to thirty days).
pub const TTL_MS_RANGE: std::ops::RangeInclusive<u64> = 1_000..=2_592_000_000;

/// How long before the deadline the warning comes: a tenth of the TTL,
/// at most five minutes.
pub fn warning_lead(ttl: Duration) -> Duration {
    (ttl / 10).min(Duration::from_secs(300))
}

/// How far a renewal must move the deadline past the one last stored
/// before it is written again: a task read many times a second costs the
/// store one write a second, and a restart restores a deadline at most
/// this much early.
const STORED_EXPIRY_STEP: Duration = Duration::from_secs(1);

impl Record {
    /// A read by the owner: the deadline moves to `TTL` from now. Returns
    /// the new deadline on the wall clock when the store should hear of it.
    fn renew_ttl(&mut self) -> Option<std::time::SystemTime> {
        if self.status.is_terminal() {
            return None;
        }
        let ttl = self.ttl_mut()?;
        ttl.deadline = Instant::now() + ttl.ttl;
        ttl.warned = false;
        if ttl.deadline < ttl.stored + STORED_EXPIRY_STEP {
            return None;
        }
        ttl.stored = ttl.deadline;
        Some(ttl.expires_at())
    }

    /// Ends the watch (at settlement).
    pub(super) fn stop_ttl_watcher(&mut self) {
        if let Some(watcher) = self.ttl_mut().and_then(|ttl| ttl.watcher.take()) {
            watcher.abort();
        }
    }
}

/// What the watcher does next.
enum Step {
    Sleep(Instant),
    Warn { in_secs: Duration, ttl: Duration },
    Expire(Duration),
    Done,
}

impl super::Shared {
    /// A read by `record`'s owner renews its time to live (see
    /// [`Record::renew_ttl`]); the new deadline is recorded in the store,
    /// so a restart keeps it. A store that cannot write is logged.
    pub(super) fn renew_ttl(&self, record: &mut Record) {
        if let Some(expires_at) = record.renew_ttl()
            && let Err(error) = self.store.set_expiry(&record.id, expires_at)
        {
            tracing::error!(task = %record.id, store = %self.store.describe(), %error, "cannot record the renewed time to live");
        }
    }
}

impl TaskRegistry {
    /// Gives a just-started task its time to live and starts its watch.
    pub(super) fn arm_ttl(&self, id: &TaskId, ttl: Duration) {
        self.arm_ttl_until(id, ttl, Instant::now() + ttl);
    }

    /// As [`Self::arm_ttl`], running out at `deadline` (a restored task's
    /// stored deadline: it may be past, then the task is stopped at once).
    pub(super) fn arm_ttl_until(&self, id: &TaskId, ttl: Duration, deadline: Instant) {
        let mut state = self.shared.lock();
        let Some(record) = state.tasks.get_mut(id) else { return };
        if record.status.is_terminal() {
            return;
        }
        let registry = std::sync::Arc::downgrade(&self.shared);
        let watched = id.clone();
        let watcher = tokio::spawn(async move {
            loop {
                let Some(shared) = registry.upgrade() else { return };
                let registry = TaskRegistry { shared };
                match registry.ttl_step(&watched) {
                    Step::Sleep(until) => {
                        drop(registry);
                        tokio::time::sleep_until(until).await;
                    }
                    Step::Warn { in_secs, ttl } => registry.inject_milestone(&watched, |task| {
                        // Whole seconds, rounded up: "in 300 s", not "in 299.9 s".
                        let in_secs = Duration::from_secs(in_secs.as_secs_f64().ceil() as u64);
                        format!(
                            "background task {} ({}: {}) will be stopped in {} s: nobody read it for its time to \
                             live ({} s). Read it with task_output (any read or view renews it for another {} s), \
                             or stop it with task_kill.",
                            task.id,
                            task.kind,
                            task.label,
                            seconds(in_secs),
                            seconds(ttl),
                            seconds(ttl),
                        )
                    }),
                    Step::Expire(ttl) => {
                        let ttl_ms = ttl.as_millis() as u64;
                        tracing::info!(task = %watched, ttl_ms, "time to live ran out; stopping the task");
                        let reason = format!("ttl expired after {} s", seconds(ttl));
                        let _ = registry.stop(&watched, StopCause::TimeToLive { ttl_ms }, Some(&reason)).await;
                        return;
                    }
                    Step::Done => return,
                }
            }
        })
        .abort_handle();
        record.lifetime.get_or_insert_default().ttl =
            Some(Ttl { ttl, deadline, stored: deadline, warned: false, watcher: Some(watcher) });
    }

    /// Decides the watcher's next step under the lock (a warning is marked
    /// given before it is injected, so it is given once per deadline).
    fn ttl_step(&self, id: &TaskId) -> Step {
        let mut state = self.shared.lock();
        let Some(record) = state.tasks.get_mut(id) else { return Step::Done };
        if record.status.is_terminal() || record.stop_cause().is_some() {
            return Step::Done;
        }
        let Some(ttl) = record.ttl_mut() else { return Step::Done };
        let now = Instant::now();
        if now >= ttl.deadline {
            return Step::Expire(ttl.ttl);
        }
        let warn_at = ttl.deadline - warning_lead(ttl.ttl);
        if ttl.warned || now < warn_at {
            return Step::Sleep(if ttl.warned { ttl.deadline } else { warn_at });
        }
        ttl.warned = true;
        Step::Warn { in_secs: ttl.deadline - now, ttl: ttl.ttl }
    }
}
