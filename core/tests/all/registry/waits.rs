//! Waits: timeouts, aborts at every moment around a settlement, and who
//! reports the end when a wait goes away.

use super::*;

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
