//! Completion notices: the message an owner receives when its task settles.
//!
//! A notice is durable context injected into the owning agent's session log,
//! not a wake-up. It goes to the exact agent instance that owns the task and
//! only while that instance lives; unowned tasks and disposed owners get none,
//! without error. A task whose terminal state was already reported to the
//! model (kill, terminal read, wait) gets none either, so the model never sees
//! a redundant "finished" for work it collected or ended.

use crate::tasks::{ListenerGuard, TaskDone, TaskRegistry, TaskSnapshot};

/// The notice text for a settled task.
pub fn completion_notice(snapshot: &TaskSnapshot) -> String {
    format!(
        "background task {} ({}: {}) finished {}. Read its output with task_output.",
        snapshot.id,
        snapshot.kind,
        snapshot.label,
        snapshot.status_line()
    )
}

/// Injects completion notices for as long as the returned guard lives.
pub fn deliver_completion_notices(registry: &TaskRegistry) -> ListenerGuard {
    registry.on_task_done(std::sync::Arc::new(|done: &TaskDone| {
        if done.snapshot.reported {
            return;
        }
        let Some(owner) = &done.owner else { return };
        match owner.inject(completion_notice(&done.snapshot)) {
            Ok(()) => tracing::debug!(task = %done.snapshot.id, owner = %owner.session(), "completion notice injected"),
            Err(error) => tracing::debug!(task = %done.snapshot.id, %error, "completion notice dropped: owner gone"),
        }
    }))
}
