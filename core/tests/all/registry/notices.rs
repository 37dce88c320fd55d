//! Notices of ends the owner did not ask for: told once, with the cause,
//! never beside a report of the same end.

use super::*;

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
