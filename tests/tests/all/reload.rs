//! Hot reload under load, with the real `ticker` plugin through the whole
//! host (tool calls, registry, control surface, notices).
//!
//! Hundreds of live ticker tasks stream output while new starts arrive
//! continuously and the plugin is reloaded again and again, with broken
//! builds (a truncated file, a component of another world) in the middle.
//! Required: no start fails, no task is killed or lost, every task's output
//! is every tick exactly once, every notice arrives exactly once, the broken
//! builds are reported and the previous version keeps serving, and once the
//! tasks settled no old version is kept alive by anything.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::json;
use taskhost::Host;
use taskhost::agents::Agent;
use taskhost::ids::TaskId;
use taskhost::plugin::{PluginEngine, PluginVersion, ServingVersion};
use taskhost::reload::{ReloadEvent, ReloadablePlugin};
use taskhost::settings::TasksSettings;
use taskhost::tasks::{TaskDone, TaskStatus};
use taskhost::tools::producer_tool::ProducerToolOptions;
use taskhost::tools::{CallContext, ToolError};
use taskhost_tests::{TICKER_WASM, fixtures, rebuilt, truncated};

const COUNT: u32 = 30;
const INTERVAL_MS: u64 = 60;
const STARTERS: usize = 4;
/// Reload steps; `None` entries are the broken builds.
const STEPS: usize = 7;

fn engine() -> PluginEngine {
    taskhost_tests::engine(|config| {
        config.max_live_stores = 2048;
        config.call_deadline_ms = 5000;
    })
}

fn host() -> (Host, Agent) {
    // Every task is read at the end, so none may age out of the history.
    let settings = TasksSettings {
        max_live_tasks_per_owner: 100_000,
        max_finished_tasks_per_owner: 100_000,
        ..TasksSettings::default()
    };
    let host = Host::new(&settings).expect("host");
    let agent = host.create_agent("agent", "session-1").expect("agent");
    (host, agent)
}

fn options() -> ProducerToolOptions {
    ProducerToolOptions::new("ticker").with_foreground_timeout(Duration::from_secs(60)).with_promote_after(None)
}

fn ticks(count: u32) -> String {
    (1..=count).map(|i| format!("tick {i}\n")).collect()
}

async fn start(host: &Host, agent: &Agent) -> Result<TaskId, ToolError> {
    let out = host
        .call_tool(
            "ticker",
            json!({"count": COUNT, "interval_ms": INTERVAL_MS, "run_in_background": true}),
            &CallContext::for_agent(agent),
        )
        .await?;
    Ok(out.started.unwrap_or_else(|| panic!("reply {:?}", out.text)))
}

/// Consuming reads until the terminal state; returns the whole output.
async fn stream_to_end(host: Host, agent: Agent, id: TaskId) -> (String, TaskStatus) {
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let read = host.registry().read(&id, Some(&agent)).await.expect("read");
        text.push_str(&read.text);
        if read.snapshot.status.is_terminal() {
            return (text, read.snapshot.status);
        }
        assert!(Instant::now() < deadline, "{id} never settled; read {text:?}");
        // The pace of a reader streaming a running task: the workload under
        // test (reads racing reloads), not a wait for a state.
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_loses_nothing_and_a_broken_build_keeps_the_old_version() {
    let engine = engine();
    let (host, agent) = host();
    let v1 = engine.load_bytes("ticker", TICKER_WASM.to_vec()).await.expect("load v1");
    let plugin = ReloadablePlugin::serve(&host, &engine, v1.clone(), json!({}), options()).await.expect("serve");
    let mut events = plugin.subscribe();
    let mut versions: Vec<Weak<PluginVersion>> = vec![Arc::downgrade(&v1)];
    drop(v1);

    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    // Even tasks are streamed with consuming reads while they run; odd ones
    // are left alone until their notice arrives, then read once.
    let streamed = Arc::new(Mutex::new(Vec::new()));
    let quiet = Arc::new(Mutex::new(Vec::<TaskId>::new()));
    // Starts so far, and a wake-up per start: the load is awaited, not
    // slept on.
    let started = Arc::new((AtomicUsize::new(0), tokio::sync::Notify::new()));
    // Settled tasks, told by a listener registered after the host's notice
    // listener: once an id is here, its notice is in the owner's session.
    let settled = Arc::new((Mutex::new(BTreeSet::<String>::new()), tokio::sync::Notify::new()));
    let _settled_listener = host.registry().on_task_done(Arc::new({
        let settled = settled.clone();
        move |done: &TaskDone| {
            settled.0.lock().unwrap().insert(done.snapshot.id.to_string());
            settled.1.notify_waiters();
        }
    }));
    let mut starters = Vec::new();
    for s in 0..STARTERS {
        let (host, agent, stop, failures, streamed, quiet, started) = (
            host.clone(),
            agent.clone(),
            stop.clone(),
            failures.clone(),
            streamed.clone(),
            quiet.clone(),
            started.clone(),
        );
        starters.push(tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                match start(&host, &agent).await {
                    Ok(id) if (n + s).is_multiple_of(2) => {
                        let reader = tokio::spawn(stream_to_end(host.clone(), agent.clone(), id.clone()));
                        streamed.lock().unwrap().push((id, reader));
                    }
                    Ok(id) => quiet.lock().unwrap().push(id),
                    Err(error) => failures.lock().unwrap().push(error.to_string()),
                }
                started.0.fetch_add(1, Ordering::Relaxed);
                started.1.notify_waiters();
                n += 1;
                // The load's pace (a workload, not a wait for a state).
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }));
    }

    // Let load build up (100 starts; each task runs 1.8 s), then reload
    // repeatedly while it runs.
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let next = started.1.notified();
            if started.0.load(Ordering::Relaxed) >= 100 {
                break;
            }
            next.await;
        }
    })
    .await
    .expect("100 starts within 60 s");
    let mut expected_seq = 1;
    let mut broken_reported = 0;
    let mut peak_live = 0;
    for step in 0..STEPS {
        let live: usize = plugin.live_tasks_by_version().values().sum();
        peak_live = peak_live.max(live);
        let before: ServingVersion = plugin.serving();
        match step {
            // A rebuild that was copied half-way, then one of another world.
            2 => {
                let failed = plugin.reload_bytes("ticker", truncated(TICKER_WASM)).await.expect_err("truncated");
                assert!(failed.reason.contains("truncated"), "{failed}");
                broken_reported += 1;
            }
            4 => {
                let failed = plugin
                    .reload_file(std::path::Path::new(fixtures::WRONG_WORLD_PATH))
                    .await
                    .expect_err("wrong world");
                assert!(failed.reason.contains("taskhost:producer/producer"), "{failed}");
                broken_reported += 1;
            }
            _ => {
                let reloaded = plugin
                    .reload_bytes("ticker", rebuilt(TICKER_WASM, &format!("step {step} pid {}", std::process::id())))
                    .await
                    .unwrap_or_else(|failed| panic!("reload {step}: {failed}"));
                expected_seq += 1;
                assert_eq!(reloaded.to.seq, expected_seq);
                assert_eq!(reloaded.from.seq, before.seq);
                assert!(!reloaded.schema_changed);
                assert!(!reloaded.still_running.is_empty(), "reloaded with no live tasks: the test lost its load");
                versions.push(Arc::downgrade(&reloaded.to.version));
            }
        }
        // Whatever happened, some version serves, and a failure changed nothing.
        assert_eq!(plugin.serving().seq, expected_seq);
        // The reloads' pace, while the load runs (a workload, not a wait).
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for starter in starters {
        starter.await.expect("starter");
    }
    assert!(failures.lock().unwrap().is_empty(), "failed starts: {:?}", failures.lock().unwrap());
    assert!(peak_live >= 100, "only {peak_live} live tasks at a reload; the load is too light to mean anything");

    // Every reload attempt was broadcast, failures included.
    let mut seen = (0, 0);
    while let Ok(event) = events.try_recv() {
        match event {
            ReloadEvent::Reloaded(_) => seen.0 += 1,
            ReloadEvent::Failed(_) => seen.1 += 1,
        }
    }
    assert_eq!(seen, (STEPS - broken_reported, broken_reported));

    // Every streamed task: every tick exactly once, completed.
    let streamed = std::mem::take(&mut *streamed.lock().unwrap());
    let quiet = std::mem::take(&mut *quiet.lock().unwrap());
    let mut on_seq = BTreeMap::<u64, usize>::new();
    let mut streamed_ids = BTreeSet::new();
    for (id, reader) in streamed {
        let (text, status) = reader.await.expect("reader");
        assert_eq!(status, TaskStatus::Completed, "{id}");
        assert_eq!(text, ticks(COUNT), "{id}");
        streamed_ids.insert(id.to_string());
    }
    // Every quiet task: exactly one notice, then its whole output in one read.
    // Waits until every quiet task settled (its notice is then in place).
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let next = settled.1.notified();
            if quiet.iter().all(|id| settled.0.lock().unwrap().contains(id.as_str())) {
                break;
            }
            next.await;
        }
    })
    .await
    .expect("every quiet task settled within 60 s");
    let notices = {
        let mut notices = HashMap::<String, usize>::new();
        for message in agent.session_log() {
            let id = message.text.strip_prefix("background task ").and_then(|t| t.split(' ').next()).expect("notice");
            assert!(
                message.text.ends_with(&format!(
                    "finished [status: completed, ticks: {COUNT}]. Read its output with task_output."
                )),
                "{}",
                message.text
            );
            *notices.entry(id.to_string()).or_default() += 1;
        }
        notices
    };
    for id in &quiet {
        assert_eq!(notices.get(id.as_str()), Some(&1), "{id}");
        let read = host.registry().read(id, Some(&agent)).await.expect("read");
        assert_eq!(read.snapshot.status, TaskStatus::Completed, "{id}");
        assert_eq!(read.text, ticks(COUNT), "{id}");
    }
    // A streamed task may have settled (and been noticed) before the read
    // that reported it; it never gets two.
    for (id, n) in &notices {
        assert!(*n == 1, "{id} got {n} notices");
        assert!(streamed_ids.contains(id) || quiet.iter().any(|q| q.as_str() == id), "notice for unknown {id}");
    }

    // Tasks ran on every served version, and nothing is left running.
    for snapshot in host.registry().list(Some(&agent)) {
        assert_eq!(snapshot.status, TaskStatus::Completed, "{}", snapshot.id);
        let info = snapshot.producer_info.expect("producer_info");
        *on_seq.entry(ServingVersion::seq_of_info(&info).expect("seq in producer_info")).or_default() += 1;
    }
    let total = streamed_ids.len() + quiet.len();
    assert_eq!(on_seq.values().sum::<usize>(), total);
    assert_eq!(on_seq.keys().copied().collect::<Vec<_>>(), (1..=expected_seq).collect::<Vec<_>>(), "{on_seq:?}");
    assert!(plugin.live_tasks_by_version().is_empty(), "{:?}", plugin.live_tasks_by_version());
    // No orphaned store: every replaced version was released with its last task.
    let serving = plugin.serving().version;
    for weak in &versions {
        if let Some(version) = weak.upgrade() {
            assert!(Arc::ptr_eq(&version, &serving), "{} is still alive with no task on it", version.version());
        }
    }
    eprintln!("reload under load: {total} tasks over versions {on_seq:?}, peak {peak_live} live at a reload");
    host.dispose().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unloading_stops_new_starts_and_running_tasks_finish() {
    let engine = engine();
    let (host, agent) = host();
    let v1 = engine.load_bytes("ticker", TICKER_WASM.to_vec()).await.expect("load");
    let plugin = ReloadablePlugin::serve(&host, &engine, v1, json!({}), options()).await.expect("serve");
    let running = start(&host, &agent).await.expect("start");
    let doomed = start(&host, &agent).await.expect("start");
    let reader = tokio::spawn(stream_to_end(host.clone(), agent.clone(), running.clone()));
    assert!(plugin.unload());
    assert!(!host.tool_definitions().iter().any(|d| d.name == "ticker"));
    let refused = start(&host, &agent).await.expect_err("unloaded");
    assert!(matches!(refused, ToolError::UnknownTool { .. }), "{refused}");
    // Still killable and readable through the control tools.
    let listed = host.call_tool("task_list", json!({}), &CallContext::for_agent(&agent)).await.expect("list");
    assert!(listed.text.contains(&format!("{running} [ticker] running")), "{}", listed.text);
    let killed = host
        .call_tool("task_kill", json!({"task_id": doomed.as_str()}), &CallContext::for_agent(&agent))
        .await
        .expect("kill");
    assert_eq!(killed.text, format!("requested cancellation of task {doomed}"));
    let (_, status) = stream_to_end(host.clone(), agent.clone(), doomed).await;
    assert_eq!(status, TaskStatus::Killed);
    let (text, status) = reader.await.expect("reader");
    assert_eq!(status, TaskStatus::Completed);
    assert_eq!(text, ticks(COUNT));
    host.dispose().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_change_shows_in_the_next_tool_listing_and_old_tasks_keep_theirs() {
    let engine = engine();
    let (host, agent) = host();
    let v1 = engine.load_bytes("ticker", TICKER_WASM.to_vec()).await.expect("load");
    let plugin = ReloadablePlugin::serve(&host, &engine, v1, json!({}), options()).await.expect("serve");
    let schema = |host: &Host| {
        host.tool_definitions().into_iter().find(|d| d.name == "ticker").expect("ticker tool").input_schema
    };
    assert!(schema(&host)["properties"].get("interval_ms").is_some());
    let old = start(&host, &agent).await.expect("start on v1");

    let reloaded =
        plugin.reload_file(std::path::Path::new(fixtures::TICKER_NEXT_PATH)).await.unwrap_or_else(|f| panic!("{f}"));
    assert!(reloaded.schema_changed);
    assert_eq!(reloaded.to.tag(), "v2");
    let properties = schema(&host)["properties"].clone();
    assert!(properties.get("shout").is_some() && properties.get("interval_ms").is_none(), "{properties}");
    assert!(properties.get("run_in_background").is_some(), "the host's flag stays");

    // New calls are validated against the new schema...
    let refused = start(&host, &agent).await.expect_err("interval_ms is gone");
    assert!(matches!(refused, ToolError::InvalidArguments { .. }), "{refused}");
    let ctx = CallContext::for_agent(&agent);
    let out = host.call_tool("ticker", json!({"count": 2, "shout": true}), &ctx).await.expect("call v2");
    assert_eq!(out.text, "TICK 1\nTICK 2\n[status: completed, ticks: 2]");
    // ...while the task started on v1 finishes on v1, output intact.
    let (text, status) = stream_to_end(host.clone(), agent.clone(), old).await;
    assert_eq!((text, status), (ticks(COUNT), TaskStatus::Completed));
    host.dispose().await;
}
