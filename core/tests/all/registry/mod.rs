//! The registry's behaviour through its public API (the behaviour contract: see ARCHITECTURE.md, Words).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use taskhost_core::agents::{Agent, AgentRegistry};
use taskhost_core::ids::TaskId;
use taskhost_core::native::scripted::{CancelMode, ScriptedTask};
use taskhost_core::notices::deliver_completion_notices;
use taskhost_core::tasks::*;
use tokio_util::sync::CancellationToken;

mod notices;
mod teardown;
mod waits;

struct Fixture {
    agents: AgentRegistry,
    registry: TaskRegistry,
    _surface: SurfaceGuard,
    _notices: ListenerGuard,
}

fn fixture_with(config: RegistryConfig) -> Fixture {
    let agents = AgentRegistry::new();
    let registry = TaskRegistry::new(agents.clone(), config);
    let surface = registry.attach_surface("test");
    let notices = deliver_completion_notices(&registry);
    Fixture { agents, registry, _surface: surface, _notices: notices }
}

fn fixture() -> Fixture {
    fixture_with(RegistryConfig { teardown_timeout: Some(Duration::from_secs(5)), ..RegistryConfig::default() })
}

fn spec(kind: &str, owner: Option<&Agent>, task: &Arc<ScriptedTask>) -> TaskStart {
    TaskStart::new(kind, format!("{kind} work"), task.runner()).with_owner(owner.cloned())
}

/// A start whose runner counts how often it ran.
fn counted_spec(kind: &str, owner: Option<&Agent>, runs: &Arc<AtomicUsize>) -> TaskStart {
    let runs = runs.clone();
    let task = ScriptedTask::new(true);
    TaskStart::new(
        kind,
        "counted",
        Box::new(move || {
            runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Ok(task.hooks()) })
        }),
    )
    .with_owner(owner.cloned())
}

/// Awaits the task's settlement through the event stream (never polls) and
/// returns its snapshot, after the listeners ran.
async fn settled(registry: &TaskRegistry, id: &TaskId, caller: Option<&Agent>) -> TaskSnapshot {
    let events = registry.subscribe();
    let snapshot = registry.get(id, caller).unwrap();
    if snapshot.status.is_terminal() {
        return snapshot;
    }
    settlement(events, id).await;
    registry.get(id, caller).unwrap()
}

/// Awaits the `Settled` event of `id` on a stream subscribed before it
/// could settle. The event is sent after the listeners ran: notices are in
/// place.
async fn settlement(mut events: tokio::sync::broadcast::Receiver<TaskEvent>, id: &TaskId) {
    let wait = async {
        loop {
            match events.recv().await.expect("event stream open") {
                TaskEvent::Settled { task } if &task.id == id => return,
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait).await.unwrap_or_else(|_| panic!("task {id} did not settle"));
}

fn notices(agent: &Agent) -> Vec<String> {
    agent.session_log().into_iter().map(|m| m.text).collect()
}

/// Runs every spawned task (settlement continuations, waiters) until all
/// of them are blocked. The suite runs on paused time, where a sleep ends
/// only once nothing else can run: a synchronization point, not a guess at
/// how long the work takes.
async fn settle_tick() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// Every task-done listener call: the task and the `reported` it heard.
type Heard = Arc<Mutex<Vec<(TaskId, bool)>>>;

fn recording_listener(registry: &TaskRegistry) -> (ListenerGuard, Heard) {
    let heard = Arc::new(Mutex::new(Vec::new()));
    let guard = registry.on_task_done(Arc::new({
        let heard = heard.clone();
        move |done: &TaskDone| heard.lock().unwrap().push((done.snapshot.id.clone(), done.snapshot.reported))
    }));
    (guard, heard)
}

#[tokio::test(start_paused = true)]
async fn lifecycle_stream_kind() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    assert_eq!(id.as_str(), "bash-1");

    let listed = f.registry.list(Some(&agent));
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, TaskStatus::Running);
    assert_eq!(listed[0].owner_session.as_ref().unwrap().as_str(), "s-a");

    task.push_output("one\n");
    assert_eq!(f.registry.read(&id, Some(&agent)).await.unwrap().text, "one\n");
    assert_eq!(f.registry.read(&id, Some(&agent)).await.unwrap().text, "", "reads are consuming");
    task.push_output("two\n");
    task.settle(TaskOutcome::completed("exit code: 0".to_string()));
    let snapshot = settled(&f.registry, &id, Some(&agent)).await;
    assert_eq!(snapshot.status, TaskStatus::Completed);
    assert_eq!(snapshot.status_line(), "[status: completed, exit code: 0]");
    assert!(snapshot.finished_at.is_some());
    assert!(!snapshot.reported);

    let read = f.registry.read(&id, Some(&agent)).await.unwrap();
    assert_eq!(read.text, "two\n", "the tail stays readable after settlement");
    assert!(read.snapshot.status.is_terminal());
    assert!(f.registry.get(&id, Some(&agent)).unwrap().reported);
}

#[tokio::test(start_paused = true)]
async fn final_output_kind_reads_are_idempotent() {
    let f = fixture();
    let task = ScriptedTask::new(false);
    let id = f.registry.start(spec("subagent", None, &task)).await.unwrap();
    assert_eq!(f.registry.read(&id, None).await.unwrap().text, "");
    task.settle(TaskOutcome::completed(None).with_output("the answer"));
    settled(&f.registry, &id, None).await;
    assert_eq!(f.registry.read(&id, None).await.unwrap().text, "the answer");
    assert_eq!(f.registry.read(&id, None).await.unwrap().text, "the answer");
}

#[tokio::test(start_paused = true)]
async fn per_kind_counters() {
    let f = fixture_with(RegistryConfig { max_live_tasks_per_owner: 100, ..Default::default() });
    let mut ids = Vec::new();
    for kind in ["bash", "subagent", "bash", "ticker", "bash", "subagent"] {
        ids.push(f.registry.start(spec(kind, None, &ScriptedTask::new(true))).await.unwrap().to_string());
    }
    assert_eq!(ids, ["bash-1", "subagent-1", "bash-2", "ticker-1", "bash-3", "subagent-2"]);
}

#[tokio::test(start_paused = true)]
async fn owner_fence() {
    let f = fixture();
    let alice = f.agents.create("alice", "s-alice").unwrap();
    let bob = f.agents.create("bob", "s-bob").unwrap();
    let owned = f.registry.start(spec("bash", Some(&alice), &ScriptedTask::new(true))).await.unwrap();
    let open = f.registry.start(spec("bash", None, &ScriptedTask::new(true))).await.unwrap();

    for caller in [Some(&bob), None] {
        assert!(matches!(f.registry.get(&owned, caller), Err(TaskError::ForeignTask(_))));
        assert!(matches!(f.registry.read(&owned, caller).await, Err(TaskError::ForeignTask(_))));
        assert!(matches!(f.registry.kill(&owned, caller, None).await, Err(TaskError::ForeignTask(_))));
        assert!(matches!(
            f.registry.wait(&owned, Duration::from_millis(1), caller, None).await,
            Err(TaskError::ForeignTask(_))
        ));
        let visible: Vec<String> = f.registry.list(caller).into_iter().map(|s| s.id.to_string()).collect();
        assert_eq!(visible, [open.to_string()], "only the unowned task is visible");
        assert!(f.registry.get(&open, caller).is_ok(), "unowned tasks are open to every caller");
    }
    assert_eq!(f.registry.list(Some(&alice)).len(), 2);
    assert_eq!(
        f.registry.get(&owned, Some(&bob)).unwrap_err().to_string(),
        format!("task {owned} belongs to another session")
    );
    let unknown = TaskId::new("bash-99");
    assert!(matches!(f.registry.get(&unknown, Some(&alice)), Err(TaskError::UnknownTask(_))));
}

#[tokio::test(start_paused = true)]
async fn a_stale_owner_instance_cannot_start_after_id_reuse() {
    let f = fixture();
    let old = f.agents.create("a", "s-1").unwrap();
    old.dispose().await;
    let new = f.agents.create("a", "s-1").unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let refused = f.registry.start(counted_spec("bash", Some(&old), &runs)).await;
    assert!(matches!(refused, Err(TaskError::OwnerNotLive(_))), "{refused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the producer never ran");
    let id = f.registry.start(counted_spec("bash", Some(&new), &runs)).await.unwrap();
    assert_eq!(id.as_str(), "bash-1", "the refused start allocated no id");
}

#[tokio::test(start_paused = true)]
async fn notices_go_to_the_exact_owner_instance_only() {
    let f = fixture();
    let old = f.agents.create("a", "s-same").unwrap();
    let task = ScriptedTask::new(true);
    task.set_cancel_mode(CancelMode::Accept);
    let id = f.registry.start(spec("bash", Some(&old), &task)).await.unwrap();
    // Dispose the owner but keep its task from settling until a replacement
    // with the same session exists.
    let disposing = tokio::spawn({
        let old = old.clone();
        async move { old.dispose().await }
    });
    settle_tick().await;
    let replacement = f.agents.create("a", "s-same").unwrap();
    task.settle(TaskOutcome::killed(None));
    disposing.await.unwrap();
    assert!(notices(&replacement).is_empty(), "never routed to a same-session replacement");
    assert!(matches!(f.registry.get(&id, Some(&replacement)), Err(TaskError::UnknownTask(_))), "owner records dropped");
}

#[tokio::test(start_paused = true)]
async fn completion_notice_text_and_delivery() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    task.settle(TaskOutcome::completed("exit code: 0".to_string()));
    settled(&f.registry, &id, Some(&agent)).await;
    assert_eq!(
        notices(&agent),
        [format!(
            "background task {id} (bash: bash work) finished [status: completed, exit code: 0]. Read its output with task_output."
        )]
    );
    // Unowned: no notice anywhere, no error.
    let open = ScriptedTask::new(true);
    let open_id = f.registry.start(spec("bash", None, &open)).await.unwrap();
    open.settle(TaskOutcome::completed(None));
    settled(&f.registry, &open_id, None).await;
    assert_eq!(notices(&agent).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn notice_suppressed_after_kill_terminal_read_and_wait() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();

    // Killed by the model: no notice.
    let killed = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &killed)).await.unwrap();
    assert!(matches!(
        f.registry.kill(&id, Some(&agent), Some("done with it")).await.unwrap(),
        KillResult::Requested(_)
    ));
    assert_eq!(killed.cancel_requests(), [Some("done with it".to_string())]);
    settled(&f.registry, &id, Some(&agent)).await;

    // Terminal read before the notice could matter: the read reports it.
    let read = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &read)).await.unwrap();
    read.settle(TaskOutcome::completed(None));
    settle_tick().await;
    // Settled without a reporter: that notice is injected...
    assert_eq!(notices(&agent).len(), 1);
    let _ = f.registry.read(&id, Some(&agent)).await.unwrap();
    // ...and the terminal read that reports the end retracts it, unread.
    assert!(notices(&agent).is_empty(), "{:?}", notices(&agent));

    // A wait pending at settlement takes over reporting.
    let waited = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &waited)).await.unwrap();
    let waiter = tokio::spawn({
        let registry = f.registry.clone();
        let agent = agent.clone();
        let id = id.clone();
        async move { registry.wait(&id, Duration::from_secs(10), Some(&agent), None).await }
    });
    settle_tick().await;
    waited.settle(TaskOutcome::completed(None));
    let snapshot = waiter.await.unwrap().unwrap();
    assert_eq!(snapshot.status, TaskStatus::Completed);
    assert!(snapshot.reported);
    settle_tick().await;
    assert!(notices(&agent).is_empty(), "kill and wait suppressed their notices: {:?}", notices(&agent));
}

#[tokio::test(start_paused = true)]
async fn a_wait_dropped_at_settlement_hands_the_notice_back() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    task.set_cancel_mode(CancelMode::Accept);
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    // Settle while a wait is pending, then drop the wait before it delivers:
    // the notice must still reach the owner.
    let wait = f.registry.wait(&id, Duration::from_secs(10), Some(&agent), None);
    let mut wait = Box::pin(wait);
    assert!(futures::poll!(&mut wait).is_pending());
    let (_listener, heard) = recording_listener(&f.registry);
    task.settle(TaskOutcome::completed(None));
    settle_tick().await;
    assert!(heard.lock().unwrap().is_empty(), "held for the wait");
    drop(wait);
    assert_eq!(notices(&agent).len(), 1, "the notice was handed back");
    assert!(!f.registry.get(&id, Some(&agent)).unwrap().reported);
    assert_eq!(*heard.lock().unwrap(), [(id, false)], "the listener heard the end once");
}

/// A kill reports the end (the behaviour contract: never a redundant
/// "finished" for work the model ended), even when a wait pending at
/// settlement then leaves without delivering: only an end nobody was told of
/// is handed back as a notice.
#[tokio::test(start_paused = true)]
async fn a_killed_task_stays_reported_when_a_pending_wait_leaves() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    task.set_cancel_mode(CancelMode::Accept);
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    assert!(matches!(f.registry.kill(&id, Some(&agent), None).await.unwrap(), KillResult::Requested(_)));
    let mut wait = Box::pin(f.registry.wait(&id, Duration::from_secs(10), Some(&agent), None));
    assert!(futures::poll!(&mut wait).is_pending());
    task.settle(TaskOutcome::killed("signal: SIGTERM".to_string()));
    settle_tick().await;
    drop(wait);
    settle_tick().await;
    assert!(f.registry.get(&id, Some(&agent)).unwrap().reported, "the kill reported it");
    assert!(notices(&agent).is_empty(), "no notice after the kill: {:?}", notices(&agent));
}

#[tokio::test(start_paused = true)]
async fn wait_times_out_aborts_and_delivers() {
    let f = fixture();
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", None, &task)).await.unwrap();

    let snapshot = f.registry.wait(&id, Duration::from_millis(20), None, None).await.unwrap();
    assert_eq!(snapshot.status, TaskStatus::Running, "a timed-out wait returns the live snapshot");

    let abort = CancellationToken::new();
    let waiting = tokio::spawn({
        let (registry, id, abort) = (f.registry.clone(), id.clone(), abort.clone());
        async move { registry.wait(&id, Duration::from_secs(10), None, Some(&abort)).await }
    });
    settle_tick().await;
    abort.cancel();
    assert!(matches!(waiting.await.unwrap(), Err(TaskError::WaitAborted(_))));
    assert_eq!(f.registry.get(&id, None).unwrap().status, TaskStatus::Running, "aborting cancels only the wait");
    assert!(task.cancel_requests().is_empty());
}

#[tokio::test(start_paused = true)]
async fn listeners_are_contained_and_end_with_their_guard() {
    let f = fixture();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let panicking = f.registry.on_task_done(Arc::new(|_: &TaskDone| panic!("listener bug")));
    let counting = f.registry.on_task_done(Arc::new({
        let seen = seen.clone();
        move |done: &TaskDone| seen.lock().unwrap().push(done.snapshot.id.to_string())
    }));
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", None, &task)).await.unwrap();
    task.settle(TaskOutcome::completed(None));
    settled(&f.registry, &id, None).await;
    assert_eq!(*seen.lock().unwrap(), [id.to_string()], "a panicking listener did not starve the other");

    drop(counting);
    drop(panicking);
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", None, &task)).await.unwrap();
    task.settle(TaskOutcome::completed(None));
    settled(&f.registry, &id, None).await;
    assert_eq!(seen.lock().unwrap().len(), 1, "never fires after its guard dropped");
}

#[tokio::test(start_paused = true)]
async fn the_surface_fence() {
    let agents = AgentRegistry::new();
    let registry = TaskRegistry::new(agents, RegistryConfig::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let error = registry.start(counted_spec("bash", None, &runs)).await.unwrap_err();
    assert!(matches!(error, TaskError::NoControlSurface));
    assert!(error.to_string().starts_with("background tasks unavailable: no control surface is attached"));
    let surface = registry.attach_surface("tools");
    assert_eq!(registry.start(counted_spec("bash", None, &runs)).await.unwrap().as_str(), "bash-1");
    drop(surface);
    assert!(matches!(registry.start(counted_spec("bash", None, &runs)).await, Err(TaskError::NoControlSurface)));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "refused starts never ran the producer");
}

#[tokio::test(start_paused = true)]
async fn finished_tasks_are_released_beyond_the_history_cap() {
    let f = fixture_with(RegistryConfig { max_finished_tasks_per_owner: 2, ..RegistryConfig::default() });
    let agent = f.agents.create("a", "s-a").unwrap();
    let mut events = f.registry.subscribe();
    let mut ids = Vec::new();
    for n in 0..4 {
        let task = ScriptedTask::new(true);
        let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
        task.push_output(&format!("out {n}\n"));
        task.settle(TaskOutcome::completed(None));
        settled(&f.registry, &id, Some(&agent)).await;
        // Tasks 0 and 2 are read (reported); 1 and 3 were only noticed.
        if n % 2 == 0 {
            f.registry.read(&id, Some(&agent)).await.unwrap();
        }
        ids.push(id);
    }
    let listed: Vec<String> = f.registry.list(Some(&agent)).into_iter().map(|t| t.id.to_string()).collect();
    // Reported ones go first: 0 went when 2 settled (cap 2: 0, 1, 2), then 2
    // (reported) before 1 (only noticed) when 3 settled.
    assert_eq!(listed, [ids[1].to_string(), ids[3].to_string()]);
    assert_eq!(f.registry.dropped_from_history(Some(&agent)), 2);
    assert!(matches!(f.registry.get(&ids[0], Some(&agent)), Err(TaskError::UnknownTask(_))));
    let mut released = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let TaskEvent::Released { id, .. } = event {
            released.push(id);
        }
    }
    assert_eq!(released, [ids[0].clone(), ids[2].clone()]);
    // The notices of dropped tasks were delivered before they went.
    assert_eq!(notices(&agent).len(), 2, "{:?}", notices(&agent));
}

#[tokio::test(start_paused = true)]
async fn an_unreported_end_is_never_dropped() {
    let f = fixture_with(RegistryConfig { max_finished_tasks_per_owner: 1, ..RegistryConfig::default() });
    let agent = f.agents.create("a", "s-a").unwrap();
    // A wait pending at settlement holds the notice back; while it is held,
    // nobody has been told of the end, so the record must stay.
    let held = ScriptedTask::new(true);
    let held_id = f.registry.start(spec("bash", Some(&agent), &held)).await.unwrap();
    let mut wait = Box::pin(f.registry.wait(&held_id, Duration::from_secs(10), Some(&agent), None));
    assert!(futures::poll!(&mut wait).is_pending());
    held.settle(TaskOutcome::completed(None));
    settled(&f.registry, &held_id, Some(&agent)).await;
    for _ in 0..3 {
        let task = ScriptedTask::new(true);
        let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
        let events = f.registry.subscribe();
        task.settle(TaskOutcome::completed(None));
        settlement(events, &id).await;
        // Noticed, so it may go at once: the cap is 1 and the held one stays.
        assert!(f.registry.get(&id, Some(&agent)).is_err(), "{id} was dropped");
    }
    assert!(f.registry.get(&held_id, Some(&agent)).is_ok(), "the held end is still there");
    assert_eq!(f.registry.dropped_from_history(Some(&agent)), 3);
    drop(wait);
    let told: Vec<String> = notices(&agent).into_iter().filter(|n| n.contains(held_id.as_str())).collect();
    assert_eq!(told.len(), 1, "its notice went out when the wait left: {:?}", notices(&agent));
}

#[tokio::test(start_paused = true)]
async fn the_event_stream_tells_starts_output_and_settlements() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let mut events = f.registry.subscribe();
    let ticker = taskhost_core::native::ticker::TickerProducer::new(&serde_json::json!({})).unwrap();
    use taskhost_core::producer::{Producer, RunMode};
    let prepared =
        ticker.prepare(serde_json::json!({"count": 2, "interval_ms": 1}), RunMode::Background).await.unwrap();
    let id = f
        .registry
        .start(TaskStart::new("ticker", prepared.label, prepared.run).with_owner(Some(agent.clone())))
        .await
        .unwrap();
    let mut kinds = Vec::new();
    let settled_task = loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.recv()).await.unwrap().unwrap();
        kinds.push(serde_json::to_value(&event).unwrap()["event"].as_str().unwrap().to_string());
        if let TaskEvent::Settled { task } = event {
            break task;
        }
    };
    assert_eq!(kinds.first().map(String::as_str), Some("started"));
    assert!(kinds.iter().any(|k| k == "output"), "{kinds:?}");
    assert_eq!(settled_task.id, id);
    let json = serde_json::to_value(&settled_task).unwrap();
    assert_eq!(json["status"], "completed");
    assert_eq!(json["owner_session"], "s-a");
    assert!(json["started_at_ms"].as_u64().unwrap() > 1_600_000_000_000);
    assert!(json["finished_at_ms"].as_u64().is_some());
}

#[tokio::test(start_paused = true)]
async fn owners_of_another_registry_and_the_limit_are_named_right() {
    let f = fixture();
    let other = AgentRegistry::new().create("stranger", "s-x").unwrap();
    let error = f.registry.start(spec("bash", Some(&other), &ScriptedTask::new(true))).await.unwrap_err();
    assert!(matches!(error, TaskError::ForeignAgent(_)), "{error}");
    assert!(error.to_string().contains("another agent registry"), "{error}");

    let f = fixture_with(RegistryConfig { max_live_tasks_per_owner: 1, ..RegistryConfig::default() });
    let agent = f.agents.create("a", "s-a").unwrap();
    f.registry.start(spec("bash", Some(&agent), &ScriptedTask::new(true))).await.unwrap();
    let error = f.registry.start(spec("bash", Some(&agent), &ScriptedTask::new(true))).await.unwrap_err().to_string();
    assert!(error.contains("agent a (session s-a)"), "{error}");
    assert!(error.contains("a slot frees when one finishes"), "{error}");
    assert!(!error.contains("collect one"), "reading a running task frees no slot: {error}");
}
