//! The task store seam through the public API, on the in-memory backend: a
//! registry restored from a store (an earlier process's records) settles
//! what was live (`lost`, or `killed` when its stop was requested), never
//! runs it again, hands a stable owner's records to its next agent with one
//! notice per untold end, and continues the ids.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use taskhost_core::Host;
use taskhost_core::native::scripted::ScriptedTask;
use taskhost_core::settings::TasksSettings;
use taskhost_core::tasks::store::{MemoryStore, ReportState, TaskStore};
use taskhost_core::tasks::{KillResult, TaskStart, TaskStatus};

fn host(store: &Arc<MemoryStore>) -> Host {
    Host::with_store(&TasksSettings::default(), store.clone() as Arc<dyn TaskStore>).expect("store readable")
}

fn notices(agent: &taskhost_core::agents::Agent) -> Vec<String> {
    agent.take_unread().into_iter().map(|m| m.text).collect()
}

#[tokio::test]
async fn a_restart_settles_live_tasks_tells_a_stable_owner_once_and_continues_ids() {
    let store = Arc::new(MemoryStore::new());
    let first = host(&store);
    let alice = first.create_durable_agent("alice", "owner:alice").unwrap();
    let plain = first.create_agent("plain", "stdio-1").unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let start = |owner: &taskhost_core::agents::Agent, task: &Arc<ScriptedTask>| {
        let (runs, task) = (runs.clone(), task.clone());
        let runner: taskhost_core::tasks::TaskRunner = Box::new(move || {
            runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Ok(task.hooks()) })
        });
        TaskStart::new("job", "work", runner).with_owner(Some(owner.clone()))
    };
    let (running, stopping, plains) = (ScriptedTask::new(true), ScriptedTask::new(true), ScriptedTask::new(true));
    let lost_id = first.registry().start(start(&alice, &running)).await.unwrap();
    let killed_id = first.registry().start(start(&alice, &stopping)).await.unwrap();
    let plain_id = first.registry().start(start(&plain, &plains)).await.unwrap();
    // A stop requested (its producer never settles it): recorded first.
    stopping.set_cancel_mode(taskhost_core::native::scripted::CancelMode::Accept);
    let kill = first.registry().kill(&killed_id, Some(&alice), None).await.unwrap();
    assert!(matches!(kill, KillResult::Requested(_)));
    // The process "crashes": nothing is disposed, the store is what is left.
    drop((alice, plain));
    std::mem::forget(first);

    let second = host(&store);
    let alice = second.create_durable_agent("alice", "owner:alice").unwrap();
    let list = second.registry().list(Some(&alice));
    let statuses: Vec<(String, TaskStatus)> = list.iter().map(|s| (s.id.to_string(), s.status)).collect();
    assert_eq!(statuses, [(lost_id.to_string(), TaskStatus::Lost), (killed_id.to_string(), TaskStatus::Killed)]);
    // The lost end is told once; the kill the owner asked for was reported.
    let told = notices(&alice);
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].starts_with(&format!("background task {lost_id} (job: work) was lost [status: lost, ")),
        "{told:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3, "no restored task is run again");
    // The plain connection's task is not handed to anyone: its owner is gone.
    let plain = second.create_agent("plain", "stdio-1").unwrap();
    assert!(second.registry().list(Some(&plain)).is_empty());
    let stored = store.load().unwrap();
    let plain_record = stored.tasks.iter().find(|t| t.id == plain_id).expect("kept to say how it ended");
    assert_eq!((plain_record.status, plain_record.reporting), (TaskStatus::Lost, ReportState::Reported));
    // Ids continue past every number the store holds.
    let next = ScriptedTask::new(true);
    let next_id = second.registry().start(start(&alice, &next)).await.unwrap();
    assert_eq!(next_id.as_str(), "job-4");
    std::mem::forget(second);

    // A third process: nothing is told twice; the plain record is deleted.
    let third = host(&store);
    let alice = third.create_durable_agent("alice", "owner:alice").unwrap();
    let told = notices(&alice);
    assert_eq!(told.len(), 1, "only job-4's loss: {told:?}");
    assert!(told[0].contains("job-4"), "{told:?}");
    assert!(store.load().unwrap().tasks.iter().all(|t| t.id != plain_id));
    std::mem::forget(third);
}

/// A store whose writes of new records fail while `full` is set (a full
/// disk), and that otherwise is the in-memory store.
#[derive(Default)]
struct FullableStore {
    inner: MemoryStore,
    full: std::sync::atomic::AtomicBool,
}

impl TaskStore for FullableStore {
    fn load(&self) -> Result<taskhost_core::tasks::store::StoredState, taskhost_core::tasks::store::StoreError> {
        self.inner.load()
    }
    fn issue_number(&self, kind: &str, at_least: u64) -> Result<u64, taskhost_core::tasks::store::StoreError> {
        self.inner.issue_number(kind, at_least)
    }
    fn record_start(
        &self,
        task: &taskhost_core::tasks::store::StoredTask,
    ) -> Result<(), taskhost_core::tasks::store::StoreError> {
        if self.full.load(Ordering::SeqCst) {
            return Err(taskhost_core::tasks::store::StoreError::new("database or disk is full"));
        }
        self.inner.record_start(task)
    }
    fn request_stop(&self, id: &taskhost_core::ids::TaskId) -> Result<bool, taskhost_core::tasks::store::StoreError> {
        self.inner.request_stop(id)
    }
    fn settle(
        &self,
        id: &taskhost_core::ids::TaskId,
        end: &taskhost_core::tasks::store::StoredEnd,
    ) -> Result<bool, taskhost_core::tasks::store::StoreError> {
        self.inner.settle(id, end)
    }
    fn set_reporting(
        &self,
        id: &taskhost_core::ids::TaskId,
        reporting: ReportState,
    ) -> Result<(), taskhost_core::tasks::store::StoreError> {
        self.inner.set_reporting(id, reporting)
    }
    fn forget(&self, ids: &[taskhost_core::ids::TaskId]) -> Result<(), taskhost_core::tasks::store::StoreError> {
        self.inner.forget(ids)
    }
    fn describe(&self) -> String {
        "fullable test store".to_string()
    }
}

#[tokio::test]
async fn a_start_the_store_cannot_record_is_refused_and_its_work_stopped() {
    let store = Arc::new(FullableStore::default());
    let host = Host::with_store(&TasksSettings::default(), store.clone() as Arc<dyn TaskStore>).unwrap();
    let alice = host.create_durable_agent("alice", "owner:alice").unwrap();
    let start = |task: &Arc<ScriptedTask>| TaskStart::new("job", "work", task.runner()).with_owner(Some(alice.clone()));
    let first = ScriptedTask::new(true);
    let first_id = host.registry().start(start(&first)).await.unwrap();

    store.full.store(true, Ordering::SeqCst);
    let refused = ScriptedTask::new(true);
    refused.set_cancel_mode(taskhost_core::native::scripted::CancelMode::Accept);
    let error = host.registry().start(start(&refused)).await.expect_err("an unrecorded start is refused");
    assert!(matches!(error, taskhost_core::tasks::TaskError::NotRecorded { .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("could not be recorded") && text.contains("database or disk is full"), "{text}");
    // Its work is stopped (the runner ran: a producer's work cannot be un-run).
    let mut cancels = refused.cancel_requests();
    while cancels.is_empty() {
        tokio::task::yield_now().await;
        cancels = refused.cancel_requests();
    }
    assert_eq!(cancels, [Some("its start could not be recorded".to_string())]);
    // Nobody sees it, and the server keeps serving.
    let ids: Vec<String> = host.registry().list(Some(&alice)).iter().map(|s| s.id.to_string()).collect();
    assert_eq!(ids, [first_id.to_string()]);
    let read = host.registry().read(&first_id, Some(&alice)).await;
    assert!(read.is_ok(), "reads go on: {read:?}");

    store.full.store(false, Ordering::SeqCst);
    let next = ScriptedTask::new(true);
    let next_id = host.registry().start(start(&next)).await.unwrap();
    assert_eq!(next_id.as_str(), "job-3", "the refused number is never issued again");
}
