//! Starts, kills and the end of owners and of the registry: atomic starts,
//! first-wins outcomes, teardown that never deadlocks, contained panics.

use super::*;

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
    settle_tick().await;
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

/// A listener of one task's end that holds the thread telling it until the
/// test lets go, and the order of what happened.
struct HeldListener {
    _guard: ListenerGuard,
    entered: tokio::sync::oneshot::Receiver<()>,
    let_go: std::sync::mpsc::Sender<()>,
    order: Arc<Mutex<Vec<&'static str>>>,
}

fn held_listener(registry: &TaskRegistry, id: &TaskId) -> HeldListener {
    let (entered, listener_entered) = tokio::sync::oneshot::channel::<()>();
    let (let_go, held_open) = std::sync::mpsc::channel::<()>();
    let order = Arc::new(Mutex::new(Vec::<&str>::new()));
    let guard = registry.on_task_done(Arc::new({
        let (id, order) = (id.clone(), order.clone());
        let entered = Mutex::new(Some(entered));
        let held_open = Mutex::new(held_open);
        move |done: &TaskDone| {
            if done.snapshot.id == id {
                let _ = entered.lock().unwrap().take().expect("told once").send(());
                let _ = held_open.lock().unwrap().recv();
                order.lock().unwrap().push("listener heard the end");
            }
        }
    }));
    HeldListener { _guard: guard, entered: listener_entered, let_go, order }
}

/// Once `listener` runs, disposes `agent` (`owned`) or the registry and
/// checks the disposal returns only after the listener was let go. This
/// runtime runs on paused time: the disposal either returns at once
/// (nothing left for it to await) or parks until the listener is let go,
/// and only a parked disposal lets paused time reach the hour-long bound.
async fn assert_disposal_waits_for(listener: HeldListener, registry: &TaskRegistry, agent: &Agent, owned: bool) {
    let HeldListener { _guard, entered, let_go, order } = listener;
    entered.await.unwrap();
    let disposal = {
        let (agent, registry, order) = (agent.clone(), registry.clone(), order.clone());
        tokio::spawn(async move {
            if owned {
                agent.dispose().await;
            } else {
                registry.dispose().await;
            }
            order.lock().unwrap().push("disposal returned");
        })
    };
    let mut disposal = std::pin::pin!(disposal);
    let early = tokio::time::timeout(Duration::from_secs(3600), &mut disposal).await;
    assert!(early.is_err(), "owned {owned}: the disposal returned while the listener was still running");
    let_go.send(()).unwrap();
    disposal.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["listener heard the end", "disposal returned"], "owned {owned}");
}

/// A settlement whose listeners are still running when an owner's disposal
/// (or the registry's) looks: the task is already terminal, so nothing is
/// torn down, yet the disposal returns only once those listeners heard of
/// the end (the stress test's rare "must settle exactly once": its listener
/// ran after the disposals had returned). The task's watcher lives on a
/// second runtime, where its listener is held open.
#[tokio::test(start_paused = true)]
async fn disposal_returns_only_after_a_settlement_told_its_listeners() {
    let producers = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    for owned in [true, false] {
        let owner = owned.then_some(&agent);
        let task = ScriptedTask::new(false);
        let start = spec("job", owner, &task);
        let registry = f.registry.clone();
        let id = producers.spawn(async move { registry.start(start).await }).await.unwrap().unwrap();
        let listener = held_listener(&f.registry, &id);
        task.settle(TaskOutcome::completed(None));
        assert_disposal_waits_for(listener, &f.registry, &agent, owned).await;
        assert!(f.registry.list(None).is_empty());
    }
    producers.shutdown_background();
}

/// The same for an end held for a wait pending at settlement: the wait
/// delivers it and tells the listeners; a disposal that starts while they
/// run returns only after them (it used to return at once, and the
/// listener's completion notice came after the owner was gone).
#[tokio::test(start_paused = true)]
async fn disposal_returns_only_after_a_held_end_told_its_listeners() {
    let waiters = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let f = fixture();
    let agent = f.agents.create("a", "s-a").unwrap();
    for owned in [true, false] {
        let owner = owned.then_some(&agent);
        let task = ScriptedTask::new(false);
        let id = f.registry.start(spec("job", owner, &task)).await.unwrap();
        let listener = held_listener(&f.registry, &id);
        // The wait is pending once its first poll took its ticket; it then
        // runs on a runtime of its own, where the listener it calls blocks.
        let mut wait = Box::pin({
            let (registry, id, agent) = (f.registry.clone(), id.clone(), agent.clone());
            async move { registry.wait(&id, Duration::from_secs(3600), owned.then_some(&agent), None).await }
        });
        assert!(futures::poll!(&mut wait).is_pending());
        let wait = waiters.spawn(wait);
        task.settle(TaskOutcome::completed(None));
        assert_disposal_waits_for(listener, &f.registry, &agent, owned).await;
        assert_eq!(wait.await.unwrap().unwrap().status, TaskStatus::Completed, "owned {owned}");
    }
    waiters.shutdown_background();
}
