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
//! gets at most one notice.

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
