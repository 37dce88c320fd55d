//! Tasks that change hands between registries sharing one store (the
//! nodes of a cluster): the ends another node recorded for this one's
//! tasks, the tasks this one lost when the others declared it gone, and
//! the ended ones it lets go because another node holds them now.
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
use super::state::{Record, State};
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

    /// Drops the ended tasks among `ids` from this registry, leaving the
    /// store as it is: another registry holds their records now (a cluster
    /// node took them over while this one was declared gone), and calls
    /// about them belong there. Live tasks are left. Returns how many were
    /// dropped.
    pub fn release_ended(&self, ids: &[TaskId]) -> usize {
        let records: Vec<Record> = {
            let mut state = self.shared.lock();
            let State { tasks, owner_scopes, unowned, .. } = &mut *state;
            let mut taken = Vec::new();
            for id in ids {
                let Some(key) = tasks.get(id).filter(|r| r.status.is_terminal()).map(|r| r.bucket_key()) else {
                    continue;
                };
                match key {
                    Some(key) => {
                        if let Some(scope) = owner_scopes.get_mut(&key) {
                            scope.tasks.retain(|t| t != id);
                            scope.bucket.finished.retain(|t| t != id);
                        }
                    }
                    None => unowned.finished.retain(|t| t != id),
                }
                taken.extend(tasks.remove(id));
            }
            taken
        };
        let released = records.len();
        self.release_records(records);
        released
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
