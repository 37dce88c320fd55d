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

/// The seeds' rule, first order: the task settled, then the wait was
/// aborted before it ran again. The settlement held the end for this live
/// waiter, so the wait still delivers the terminal snapshot, the end counts
/// as reported, and no notice follows; the listener hears the end once,
/// reported.
#[tokio::test(start_paused = true)]
async fn an_abort_after_settlement_still_delivers_the_snapshot() {
    let f = fixture();
    let (_listener, heard) = recording_listener(&f.registry);
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    let abort = CancellationToken::new();
    let mut wait = Box::pin(f.registry.wait(&id, Duration::from_secs(10), Some(&agent), Some(&abort)));
    assert!(futures::poll!(&mut wait).is_pending());
    task.settle(TaskOutcome::completed("exit code: 0".to_string()));
    settled(&f.registry, &id, Some(&agent)).await;
    assert!(heard.lock().unwrap().is_empty(), "held for the waiter: no listener yet");
    abort.cancel();
    let snapshot = wait.await.expect("settled before the abort: the snapshot is owed");
    assert_eq!(snapshot.status_line(), "[status: completed, exit code: 0]");
    assert!(snapshot.reported);
    assert!(f.registry.get(&id, Some(&agent)).unwrap().reported);
    settle_tick().await;
    assert!(notices(&agent).is_empty(), "the wait reported the end: {:?}", notices(&agent));
    assert_eq!(*heard.lock().unwrap(), [(id, true)], "heard once, with the final reported");
}

/// The seeds' rule, second order: the wait was aborted (and ran: it left)
/// before the task settled. The wait fails, the end is untold, the notice
/// goes out, and the listener hears it once, unreported.
#[tokio::test(start_paused = true)]
async fn an_abort_before_settlement_fails_the_wait_and_the_notice_goes_out() {
    let f = fixture();
    let (_listener, heard) = recording_listener(&f.registry);
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    let abort = CancellationToken::new();
    let waiting = tokio::spawn({
        let (registry, id, agent, abort) = (f.registry.clone(), id.clone(), agent.clone(), abort.clone());
        async move { registry.wait(&id, Duration::from_secs(10), Some(&agent), Some(&abort)).await }
    });
    settle_tick().await;
    abort.cancel();
    assert!(matches!(waiting.await.unwrap(), Err(TaskError::WaitAborted(_))));
    task.settle(TaskOutcome::completed(None));
    settled(&f.registry, &id, Some(&agent)).await;
    assert!(!f.registry.get(&id, Some(&agent)).unwrap().reported, "nobody was told of the end");
    assert_eq!(notices(&agent).len(), 1, "so the notice goes out: {:?}", notices(&agent));
    assert_eq!(*heard.lock().unwrap(), [(id, false)]);
}

/// The same-tick race: the abort fires, then the task settles, before the
/// aborted wait runs again. The aborted waiter does not hold the end (the
/// settlement finds its abort fired), so the notice goes out at once; the
/// wait then fails; the listener hears the end once, unreported.
#[tokio::test(start_paused = true)]
async fn an_abort_in_the_tick_of_the_settlement_fails_the_wait_and_the_notice_goes_out() {
    let f = fixture();
    let (_listener, heard) = recording_listener(&f.registry);
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    let abort = CancellationToken::new();
    let mut wait = Box::pin(f.registry.wait(&id, Duration::from_secs(10), Some(&agent), Some(&abort)));
    assert!(futures::poll!(&mut wait).is_pending());
    abort.cancel();
    task.settle(TaskOutcome::completed(None));
    settled(&f.registry, &id, Some(&agent)).await;
    assert_eq!(notices(&agent).len(), 1, "the notice is not held for an aborted waiter: {:?}", notices(&agent));
    assert_eq!(*heard.lock().unwrap(), [(id.clone(), false)]);
    assert!(matches!(wait.await, Err(TaskError::WaitAborted(_))), "aborted first: the wait fails");
    settle_tick().await;
    assert!(!f.registry.get(&id, Some(&agent)).unwrap().reported);
    assert_eq!(notices(&agent).len(), 1, "still exactly one notice");
    assert_eq!(heard.lock().unwrap().len(), 1, "the listener heard the end once");
}

/// A caller that drops the answers of aborted calls (the control tools, for
/// MCP clients): a wait aborted even after the settlement fails, reports
/// nothing, and hands the notice back; the listener hears the end once,
/// unreported. The same holds for a wait for any.
#[tokio::test(start_paused = true)]
async fn a_caller_that_drops_aborted_answers_never_reports_through_an_aborted_wait() {
    let f = fixture();
    let (_listener, heard) = recording_listener(&f.registry);
    let agent = f.agents.create("a", "s-a").unwrap();
    for any in [false, true] {
        let task = ScriptedTask::new(true);
        let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
        let abort = CancellationToken::new();
        let timeout = Duration::from_secs(10);
        let ids = [id.clone()];
        let mut wait: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), TaskError>>>> = if any {
            Box::pin(
                f.registry.wait_any_with(&ids, timeout, Some(&agent), Some(&abort), AbortedWait::Fail).map(drop_ok),
            )
        } else {
            Box::pin(f.registry.wait_with(&id, timeout, Some(&agent), Some(&abort), AbortedWait::Fail).map(drop_ok))
        };
        assert!(futures::poll!(&mut wait).is_pending());
        task.settle(TaskOutcome::completed(None));
        settled(&f.registry, &id, Some(&agent)).await;
        abort.cancel();
        assert!(matches!(wait.await, Err(TaskError::WaitAborted(_))), "any: {any}");
        settle_tick().await;
        assert!(!f.registry.get(&id, Some(&agent)).unwrap().reported, "any: {any}");
        assert_eq!(agent.take_unread().len(), 1, "any: {any}: the notice is due");
        assert_eq!(heard.lock().unwrap().drain(..).collect::<Vec<_>>(), [(id, false)], "any: {any}");
    }
}

fn drop_ok<T>(result: Result<T, TaskError>) -> Result<(), TaskError> {
    result.map(drop)
}

/// A wait for any under the contract's rule: a task that settled before the
/// abort is delivered and reported, the others are left untouched.
#[tokio::test(start_paused = true)]
async fn a_wait_for_any_aborted_after_a_settlement_delivers_it() {
    let f = fixture();
    let (_listener, heard) = recording_listener(&f.registry);
    let agent = f.agents.create("a", "s-a").unwrap();
    let (one, two) = (ScriptedTask::new(true), ScriptedTask::new(true));
    let first = f.registry.start(spec("bash", Some(&agent), &one)).await.unwrap();
    let second = f.registry.start(spec("bash", Some(&agent), &two)).await.unwrap();
    let abort = CancellationToken::new();
    let ids = [first.clone(), second.clone()];
    let mut wait = Box::pin(f.registry.wait_any(&ids, Duration::from_secs(10), Some(&agent), Some(&abort)));
    assert!(futures::poll!(&mut wait).is_pending());
    one.settle(TaskOutcome::completed(None));
    settled(&f.registry, &first, Some(&agent)).await;
    abort.cancel();
    let (finished, tasks) = wait.await.expect("settled before the abort");
    assert_eq!(finished, Some(first.clone()));
    assert!(tasks[0].reported && tasks[0].status.is_terminal());
    assert_eq!(tasks[1].status, TaskStatus::Running);
    two.settle(TaskOutcome::completed(None));
    settled(&f.registry, &second, Some(&agent)).await;
    assert_eq!(notices(&agent).len(), 1, "only the second end is noticed: {:?}", notices(&agent));
    assert_eq!(*heard.lock().unwrap(), [(first, true), (second, false)]);
}

/// An end the model did not ask for (here: a kill from the dashboard) is
/// not reported by whoever stopped it: its owner is told with exactly one
/// notice that names the cause, and the cause is data on the task.
#[tokio::test(start_paused = true)]
async fn a_stop_the_owner_did_not_ask_for_is_told_once_with_its_cause() {
    let f = fixture();
    let (_listener, heard) = recording_listener(&f.registry);
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    let cause = StopCause::Dashboard { viewer: "ops".into() };
    let stopped = f.registry.stop(&id, cause.clone(), Some("killed from the dashboard by ops")).await.unwrap();
    let KillResult::Requested(snapshot) = stopped else { panic!("{stopped:?}") };
    assert!(!snapshot.reported, "the stop reports nothing");
    assert_eq!(task.cancel_requests(), [Some("killed from the dashboard by ops".to_string())]);
    let snapshot = settled(&f.registry, &id, Some(&agent)).await;
    assert_eq!((snapshot.status, snapshot.reported), (TaskStatus::Killed, false));
    assert_eq!(snapshot.stop_cause, Some(cause.clone()));
    assert_eq!(
        notices(&agent),
        [format!(
            "background task {id} (bash: bash work) was killed from the dashboard [status: killed]. \
             Read its output with task_output."
        )]
    );
    assert_eq!(*heard.lock().unwrap(), [(id.clone(), false)], "heard once");
    // Stopping a finished task leaves it as it is: still unreported.
    let again = f.registry.stop(&id, cause, None).await.unwrap();
    assert!(matches!(again, KillResult::AlreadyTerminal(ref s) if !s.reported), "{again:?}");
    assert_eq!(agent.take_unread().len(), 1, "the one notice, still due");

    // Any cause: a time to live, a limit, an operator.
    let cases = [
        (
            StopCause::TimeToLive { ttl_ms: 600_000 },
            "was stopped when its time to live (600 s) ran out",
            "killed, reason: ttl expired after 600 s",
        ),
        (
            StopCause::Limit { limit: "max_output_bytes".into() },
            "was stopped by a server limit (max_output_bytes)",
            "killed",
        ),
        (StopCause::Operator { action: "shutdown".into() }, "was stopped by an operator (shutdown)", "killed"),
    ];
    for (cause, phrase, status) in cases {
        let task = ScriptedTask::new(true);
        let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
        f.registry.stop(&id, cause, None).await.unwrap();
        settled(&f.registry, &id, Some(&agent)).await;
        let told = agent.take_unread();
        assert_eq!(told.len(), 1, "{phrase}");
        assert_eq!(
            told[0].text,
            format!(
                "background task {id} (bash: bash work) {phrase} [status: {status}]. Read its output with task_output."
            )
        );
    }
}

/// What the model asked for or collected stays silent, whoever else asked
/// for the stop: the owner's own kill after the dashboard's, a wait
/// pending at the end, a read of the end.
#[tokio::test(start_paused = true)]
async fn a_stop_the_model_also_asked_for_or_collected_stays_silent() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let dashboard = || StopCause::Dashboard { viewer: "ops".into() };
    for collect in ["kill", "wait", "read"] {
        let task = ScriptedTask::new(true);
        task.set_cancel_mode(CancelMode::Accept);
        let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
        f.registry.stop(&id, dashboard(), None).await.unwrap();
        let mut wait = Box::pin(f.registry.wait(&id, Duration::from_secs(10), Some(&agent), None));
        if collect == "kill" {
            f.registry.kill(&id, Some(&agent), None).await.unwrap();
        }
        if collect == "wait" {
            assert!(futures::poll!(&mut wait).is_pending());
        }
        task.settle(TaskOutcome::killed("signal: SIGTERM".to_string()));
        let snapshot = settled(&f.registry, &id, Some(&agent)).await;
        match collect {
            "wait" => assert!(wait.await.unwrap().reported),
            "read" => assert!(f.registry.read(&id, Some(&agent)).await.unwrap().snapshot.reported),
            _ => assert!(snapshot.reported),
        }
        assert_eq!(
            f.registry.get(&id, Some(&agent)).unwrap().stop_cause,
            Some(dashboard()),
            "{collect}: the first cause stands"
        );
        settle_tick().await;
        assert!(agent.take_unread().is_empty(), "{collect}: the model collected the end");
    }
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
async fn start_atomicity() {
    let f = fixture_with(RegistryConfig { max_live_tasks_per_owner: 2, ..Default::default() });
    let runs = Arc::new(AtomicUsize::new(0));
    assert!(matches!(f.registry.start(counted_spec("Bad Kind", None, &runs)).await, Err(TaskError::InvalidKind(_))));

    // A runner that fails registers nothing and allocates no id.
    let failing = TaskStart::new("bash", "x", Box::new(|| Box::pin(async { anyhow::bail!("spawn failed") })));
    let error = f.registry.start(failing).await.unwrap_err();
    assert!(error.to_string().contains("spawn failed"), "{error}");
    assert!(f.registry.list(None).is_empty());

    // The per-owner cap fails before any work starts.
    f.registry.start(counted_spec("bash", None, &runs)).await.unwrap();
    let second = f.registry.start(counted_spec("bash", None, &runs)).await.unwrap();
    assert_eq!(second.as_str(), "bash-2");
    let over = f.registry.start(counted_spec("bash", None, &runs)).await.unwrap_err();
    assert!(matches!(over, TaskError::TooManyTasks { limit: 2, .. }), "{over:?}");
    assert!(over.to_string().contains("task_kill"), "the error says what to do: {over}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // Settling frees a slot; owners have their own buckets.
    f.registry.kill(&second, None, None).await.unwrap();
    settled(&f.registry, &second, None).await;
    assert_eq!(f.registry.start(counted_spec("bash", None, &runs)).await.unwrap().as_str(), "bash-3");
    let agent = f.agents.create("a", "s-a").unwrap();
    f.registry.start(counted_spec("bash", Some(&agent), &runs)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failing_cancel_reaches_the_caller_and_leaves_the_task_untouched() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    task.set_cancel_mode(CancelMode::Fail("cannot signal the process".into()));
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    let error = f.registry.kill(&id, Some(&agent), None).await.unwrap_err();
    assert!(error.to_string().contains("cannot signal the process"), "{error}");
    let snapshot = f.registry.get(&id, Some(&agent)).unwrap();
    assert_eq!(snapshot.status, TaskStatus::Running);
    assert!(!snapshot.reported);
    task.settle(TaskOutcome::completed(None));
    settled(&f.registry, &id, Some(&agent)).await;
    settle_tick().await;
    assert_eq!(notices(&agent).len(), 1, "the notice was not suppressed by the failed kill");

    // Killing a settled task reports it.
    match f.registry.kill(&id, Some(&agent), None).await.unwrap() {
        KillResult::AlreadyTerminal(snapshot) => assert_eq!(snapshot.status, TaskStatus::Completed),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn kill_marks_stopping_until_settled() {
    let f = fixture();
    let task = ScriptedTask::new(true);
    task.set_cancel_mode(CancelMode::Accept);
    let id = f.registry.start(spec("bash", None, &task)).await.unwrap();
    f.registry.kill(&id, None, None).await.unwrap();
    assert_eq!(f.registry.get(&id, None).unwrap().status, TaskStatus::Stopping);
    task.settle(TaskOutcome::killed("signal: SIGTERM".to_string()));
    assert_eq!(settled(&f.registry, &id, None).await.status_line(), "[status: killed, signal: SIGTERM]");
}

#[tokio::test(start_paused = true)]
async fn first_outcome_wins_and_done_errors_are_contained() {
    let f = fixture();
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", None, &task)).await.unwrap();
    task.fail_done("lost the process handle");
    let snapshot = settled(&f.registry, &id, None).await;
    assert_eq!(snapshot.status, TaskStatus::Failed);
    assert!(snapshot.detail.unwrap().contains("lost the process handle"));
    task.settle(TaskOutcome::completed(None));
    settle_tick().await;
    assert_eq!(f.registry.get(&id, None).unwrap().status, TaskStatus::Failed, "a late outcome does not overwrite");
}

#[tokio::test(start_paused = true)]
async fn owner_disposal_awaits_quiescence_and_drops_records() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let slow = ScriptedTask::new(true);
    slow.set_cancel_mode(CancelMode::Accept);
    let id = f.registry.start(spec("bash", Some(&agent), &slow)).await.unwrap();
    let disposing = tokio::spawn({
        let agent = agent.clone();
        async move { agent.dispose().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!disposing.is_finished(), "dispose waits for the task to settle");
    assert_eq!(slow.cancel_requests(), [Some("owner disposed".to_string())]);
    slow.settle(TaskOutcome::killed(None));
    tokio::time::timeout(Duration::from_secs(5), disposing).await.unwrap().unwrap();
    assert!(f.registry.list(None).is_empty());
    assert!(matches!(f.registry.get(&id, Some(&agent)), Err(TaskError::UnknownTask(_))));
    assert!(matches!(
        f.registry.start(spec("bash", Some(&agent), &ScriptedTask::new(true))).await,
        Err(TaskError::OwnerNotLive(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_failing_teardown_cancel_force_fails_without_deadlock() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let broken = ScriptedTask::new(true);
    broken.set_cancel_mode(CancelMode::Fail("producer lost track".into()));
    f.registry.start(spec("bash", Some(&agent), &broken)).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let _listener = f.registry.on_task_done(Arc::new({
        let seen = seen.clone();
        move |done: &TaskDone| seen.lock().unwrap().push(done.snapshot.clone())
    }));
    tokio::time::timeout(Duration::from_secs(5), agent.dispose()).await.expect("dispose must not deadlock");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].status, TaskStatus::Failed);
    let detail = seen[0].detail.as_deref().unwrap();
    assert!(detail.contains("producer lost track") && detail.contains("may be orphaned"), "{detail}");
    assert!(broken.was_abandoned());
    // A late outcome changes nothing and fires nothing.
    broken.settle(TaskOutcome::completed(None));
}

#[tokio::test(start_paused = true)]
async fn a_task_that_never_stops_is_force_failed_after_the_teardown_timeout() {
    let f = fixture_with(RegistryConfig { teardown_timeout: Some(Duration::from_millis(100)), ..Default::default() });
    let stuck = ScriptedTask::new(true);
    stuck.set_cancel_mode(CancelMode::Accept);
    let id = f.registry.start(spec("bash", None, &stuck)).await.unwrap();
    let mut events = f.registry.subscribe();
    tokio::time::timeout(Duration::from_secs(5), f.registry.dispose()).await.expect("bounded disposal");
    let snapshot = loop {
        match events.try_recv().expect("a settled event was sent") {
            TaskEvent::Settled { task } => break task,
            _ => continue,
        }
    };
    assert_eq!(snapshot.id, id);
    assert!(snapshot.detail.unwrap().contains("did not stop within 100 ms"));
    assert!(stuck.was_abandoned());
}

#[tokio::test(start_paused = true)]
async fn registry_disposal_cancels_and_awaits_every_task() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let owned = ScriptedTask::new(true);
    let open = ScriptedTask::new(false);
    f.registry.start(spec("bash", Some(&agent), &owned)).await.unwrap();
    f.registry.start(spec("subagent", None, &open)).await.unwrap();
    f.registry.dispose().await;
    assert_eq!(owned.cancel_requests().len(), 1);
    assert_eq!(open.cancel_requests().len(), 1);
    assert!(f.registry.list(Some(&agent)).is_empty());
    assert!(matches!(f.registry.start(spec("bash", None, &ScriptedTask::new(true))).await, Err(TaskError::Disposed)));
    // The agent's scope no longer carries the registry's cleanup.
    tokio::time::timeout(Duration::from_secs(1), agent.dispose()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_start_in_flight_during_owner_disposal_is_cancelled_and_awaited() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    let release = Arc::new(tokio::sync::Notify::new());
    let start = TaskStart::new(
        "bash",
        "slow start",
        Box::new({
            let (task, release) = (task.clone(), release.clone());
            move || {
                Box::pin(async move {
                    release.notified().await;
                    Ok(task.hooks())
                })
            }
        }),
    )
    .with_owner(Some(agent.clone()));
    let starting = tokio::spawn({
        let registry = f.registry.clone();
        async move { registry.start(start).await }
    });
    settle_tick().await;
    let disposing = tokio::spawn({
        let agent = agent.clone();
        async move { agent.dispose().await }
    });
    settle_tick().await;
    assert!(!disposing.is_finished(), "disposal waits for the start in flight");
    release.notify_one();
    let id = starting.await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(5), disposing).await.unwrap().unwrap();
    assert_eq!(task.cancel_requests().len(), 1, "the late task was cancelled");
    assert!(matches!(f.registry.get(&id, None), Err(TaskError::UnknownTask(_))));
}

// ---------------------------------------------------------------------------
// Registry semantics found by embedders and by porting the contract's test list.

/// A producer whose every step can be told to panic with a message.
fn panicking_start(kind: &str, owner: Option<&Agent>, in_run: bool) -> TaskStart {
    TaskStart::new(
        kind,
        "panics",
        Box::new(move || {
            Box::pin(async move {
                let code = 7;
                if in_run {
                    panic!("run blew up {code}");
                }
                let done = async move {
                    tokio::task::yield_now().await;
                    panic!("done blew up {code}")
                };
                Ok(TaskHooks::new(ScriptedTask::new(true), Box::pin(done)))
            })
        }),
    )
    .with_owner(owner.cloned())
}

#[tokio::test(start_paused = true)]
async fn an_empty_label_is_refused_before_anything_runs() {
    let f = fixture();
    let runs = Arc::new(AtomicUsize::new(0));
    for label in ["", "   "] {
        let mut start = counted_spec("bash", None, &runs);
        start.label = label.into();
        let error = f.registry.start(start).await.unwrap_err();
        assert!(matches!(&error, TaskError::EmptyLabel { kind } if kind == "bash"), "{error}");
        assert!(error.to_string().contains("needs a label"), "{error}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the producer never ran");
    assert!(f.registry.list(None).is_empty());
}

#[tokio::test(start_paused = true)]
async fn caught_panics_keep_their_message() {
    let f = fixture();
    let error = f.registry.start(panicking_start("bash", None, true)).await.unwrap_err();
    assert!(error.to_string().contains("the producer panicked: run blew up 7"), "{error}");
    let id = f.registry.start(panicking_start("bash", None, false)).await.unwrap();
    let snapshot = settled(&f.registry, &id, None).await;
    assert_eq!(snapshot.status, TaskStatus::Failed);
    assert_eq!(snapshot.status_line(), "[status: failed, producer panicked: done blew up 7]");
}

#[tokio::test(start_paused = true)]
async fn owner_teardown_settlements_count_as_reported() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let _listener = f.registry.on_task_done(Arc::new({
        let seen = seen.clone();
        move |done: &TaskDone| seen.lock().unwrap().push(done.snapshot.clone())
    }));
    agent.dispose().await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "listeners still see the settlement");
    assert_eq!(seen[0].status, TaskStatus::Killed);
    assert!(seen[0].reported, "nobody is left to tell: {:?}", seen[0]);
}

#[tokio::test(start_paused = true)]
async fn registry_disposal_is_silent() {
    for cancel_mode in [CancelMode::Settle, CancelMode::Fail("cannot cancel".into())] {
        let f = fixture();
        let agent = f.agents.create("a", "s-a").unwrap();
        let task = ScriptedTask::new(true);
        task.set_cancel_mode(cancel_mode.clone());
        f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let _listener = f.registry.on_task_done(Arc::new({
            let calls = calls.clone();
            move |_: &TaskDone| {
                calls.fetch_add(1, Ordering::SeqCst);
            }
        }));
        f.registry.dispose().await;
        assert_eq!(task.cancel_requests().len(), 1, "{cancel_mode:?}: the task was cancelled");
        assert_eq!(calls.load(Ordering::SeqCst), 0, "{cancel_mode:?}: no listener ran");
        assert!(
            notices(&agent).is_empty(),
            "{cancel_mode:?}: the live owner was told of no kill: {:?}",
            notices(&agent)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn two_control_surfaces_deliver_one_notice() {
    let f = fixture();
    let _second = deliver_completion_notices(&f.registry);
    let agent = f.agents.create("a", "s-a").unwrap();
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    task.settle(TaskOutcome::completed(None));
    settled(&f.registry, &id, Some(&agent)).await;
    assert_eq!(notices(&agent).len(), 1, "{:?}", notices(&agent));
}

#[tokio::test(start_paused = true)]
async fn a_report_retracts_the_unread_notice_of_the_same_end() {
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    // Settled and noticed, then read before any surface delivered the notice.
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    task.settle(TaskOutcome::completed(None));
    settled(&f.registry, &id, Some(&agent)).await;
    assert_eq!(notices(&agent).len(), 1, "injected");
    let read = f.registry.read(&id, Some(&agent)).await.unwrap();
    assert!(read.snapshot.status.is_terminal());
    assert!(agent.take_unread().is_empty(), "the read reported the end: its notice is gone");

    // A notice a surface already delivered stays in the log.
    let task = ScriptedTask::new(true);
    let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
    task.settle(TaskOutcome::completed(None));
    settled(&f.registry, &id, Some(&agent)).await;
    assert_eq!(agent.take_unread().len(), 1, "delivered");
    f.registry.kill(&id, Some(&agent), None).await.unwrap();
    assert_eq!(notices(&agent).len(), 1, "the delivered notice stays in the log");

    // Kill and wait on a terminal task retract too.
    for report in ["kill", "wait"] {
        let task = ScriptedTask::new(true);
        let id = f.registry.start(spec("bash", Some(&agent), &task)).await.unwrap();
        task.settle(TaskOutcome::completed(None));
        settled(&f.registry, &id, Some(&agent)).await;
        match report {
            "kill" => drop(f.registry.kill(&id, Some(&agent), None).await.unwrap()),
            _ => drop(f.registry.wait(&id, Duration::ZERO, Some(&agent), None).await.unwrap()),
        }
        assert!(agent.take_unread().is_empty(), "{report} retracted the notice");
    }
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
