//! Tasks that change hands between registries sharing one store (the
//! nodes of a cluster): the ends another node recorded for this one's
//! tasks, and the tasks this one lost when the others declared it gone.
//!
//! Invariants:
//! - Ends taken in are ended records of stable owners, kept for their
//!   owner's next instance (or handed at once to one that is live) and
//!   told once by a notice, as a restart's are ([`super::restore`]).
//! - Losing the live tasks settles each one `lost` and kills its work. A
//!   stable owner's end the store already holds from another node is told
//!   to nobody here (that node keeps it and tells it, [`super::settle`]); a
//!   plain owner's is told here, where its connection is: no end is told
//!   twice.

use super::restore::insert_ended;
use super::settle::Settlement;
use super::*;
use crate::tasks::replica::ReplayedOutput;
use crate::tasks::store::StoredTask;

impl TaskRegistry {
    /// Takes in `tasks`, ended records another registry settled for this
    /// one to keep (a cluster node that settled a silent node's tasks):
    /// each stable owner's joins the registry, owned by the session's next
    /// instance until one is handed them ([`Self::attach_owner`]); others
    /// are skipped (their connection is gone, nobody is left to tell).
    /// A task's output comes with it when its old registry's replica kept
    /// it ([`crate::tasks::replica`]): reads go on where its owner's last
    /// read ended, and views see it all.
    /// Returns the sessions that got records.
    pub fn take_in_ended(&self, tasks: Vec<StoredTask>) -> Vec<SessionId> {
        self.take_in_ended_with_output(tasks.into_iter().map(|task| (task, None)).collect())
    }

    /// As [`Self::take_in_ended`], each task with the output its old
    /// registry's replica kept, when it kept any.
    pub fn take_in_ended_with_output(&self, tasks: Vec<(StoredTask, Option<ReplayedOutput>)>) -> Vec<SessionId> {
        let now = SystemTime::now();
        let mut sessions: Vec<SessionId> = Vec::new();
        let mut replayed_any = false;
        for (mut task, replayed) in tasks {
            if !task.status.is_terminal() || self.shared.lock().tasks.get(&task.id).is_some() {
                continue;
            }
            let Some(stored_owner) = task.owner.take().filter(|owner| owner.durable) else { continue };
            let owner = self.restored_owner(&stored_owner.session);
            let mut state = self.shared.lock();
            if let Some(number) = task.number() {
                let counter = state.next_id_by_kind.entry(task.kind.clone()).or_default();
                *counter = (*counter).max(number);
            }
            tracing::info!(task = %task.id, owner = %stored_owner.session, status = %task.status, output = replayed.is_some(), "an end recorded by another node is taken in");
            let id = task.id.clone();
            if !insert_ended(&mut state, task, owner.clone(), now) {
                continue;
            }
            if let Some(replayed) = replayed
                && let Some(record) = state.tasks.get_mut(&id)
            {
                record.output_log = Some(self.replayed_stream_output(&id, &owner, replayed));
                replayed_any = true;
            }
            if !sessions.contains(&stored_owner.session) {
                sessions.push(stored_owner.session);
            }
        }
        if replayed_any {
            self.enforce_output_memory();
        }
        sessions
    }

    /// Settles every live task `lost` with `detail` and kills its work (the
    /// registry lost the right to run them: a cluster declared its node
    /// gone). Each end is told as any end is, unless the store already
    /// holds another one (the node that declared this one gone told it).
    /// Returns how many tasks were live.
    pub async fn lose_live_tasks(&self, detail: &str) -> usize {
        let live: Vec<(TaskId, Arc<dyn TaskControl>)> = {
            let state = self.shared.lock();
            state
                .tasks
                .values()
                .filter(|r| !r.status.is_terminal())
                .map(|r| (r.id.clone(), r.control.clone()))
                .collect()
        };
        for (id, control) in &live {
            self.settle_record(
                id,
                Settlement {
                    status: TaskStatus::Lost,
                    detail: Some(detail.to_string()),
                    output: None,
                    forced: true,
                    reported: false,
                },
            );
            if let Err(error) = crate::panics::contained(control.cancel(Some(detail))).await {
                tracing::error!(task = %id, error = %format!("{error:#}"), "a lost task's work could not be stopped");
            }
        }
        live.len()
    }
}
