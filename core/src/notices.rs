//! Completion notices: the message an owner receives when its task settles.
//!
//! A notice is durable context injected into the owning agent's session log,
//! not a wake-up. It goes to the exact agent instance that owns the task and
//! only while that instance lives; unowned tasks and disposed owners get none,
//! without error. A task whose terminal state was already reported to the
//! model (kill, terminal read, wait) gets none either, and a report that
//! comes after the notice was injected but before a surface delivered it
//! retracts it ([`TaskRegistry::inject_completion_notice`] holds the rule):
//! the model never sees a redundant "finished" for work it collected or
//! ended. Several control surfaces on one registry each listen, yet a task
//! gets at most one notice. An end the model did not ask for (a kill from
//! the dashboard, a time to live, a limit, an operator: a
//! [`StopCause`](crate::tasks::StopCause)
//! other than the owner) is not reported by whoever stopped it, so it gets
//! its notice, which names the cause.

use crate::tasks::{ListenerGuard, TaskDone, TaskRegistry, TaskSnapshot, TaskStatus};

/// The notice text for a settled task: `… finished [status: …]`, or, for
/// an end someone other than the owner caused (its
/// [`StopCause`](crate::tasks::StopCause)), what
/// ended it: `… was killed from the dashboard [status: killed, …]`.
pub fn completion_notice(snapshot: &TaskSnapshot) -> String {
    let ended = match &snapshot.stop_cause {
        Some(cause) if snapshot.status != TaskStatus::Completed => cause.ended_phrase(),
        _ if snapshot.status == TaskStatus::Lost => "was lost".to_string(),
        _ => "finished".to_string(),
    };
    format!(
        "background task {} ({}: {}) {ended} {}. Read its output with task_output.",
        snapshot.id,
        snapshot.kind,
        snapshot.label,
        snapshot.status_line()
    )
}

/// Injects completion notices for as long as the returned guard lives.
pub fn deliver_completion_notices(registry: &TaskRegistry) -> ListenerGuard {
    let weak = registry.downgrade();
    registry.on_task_done(std::sync::Arc::new(move |done: &TaskDone| {
        if done.snapshot.reported || done.owner.is_none() {
            return;
        }
        let Some(registry) = weak.upgrade() else { return };
        let id = &done.snapshot.id;
        if registry.inject_completion_notice(id, completion_notice(&done.snapshot)) {
            tracing::debug!(task = %id, "completion notice injected");
        } else {
            tracing::debug!(task = %id, "no completion notice: reported, already noticed, or owner gone");
        }
    }))
}
