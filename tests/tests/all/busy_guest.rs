//! A guest task whose pollable is always ready while `done` stays `none`
//! (the `busy` mode of the `misbehave` fixture) must not keep a core busy:
//! the driver backs off. Measured as the CPU time (utime + stime from
//! `/proc/self/task/<tid>/stat`) of the threads of this test's own runtime
//! over a window, which a spinning driver fills. Other suites share the
//! process but not these threads, so their work does not count.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use taskhost::plugin::WasmProducer;
use taskhost::tasks::TaskStatus;
use taskhost_tests::fixtures;
use taskhost_tests::registry_fixture::OwnedRegistry;

/// The window CPU time is measured over.
const WINDOW: Duration = Duration::from_secs(2);
/// `/proc` reports CPU time in USER_HZ ticks, 100 per second on Linux.
const TICKS_PER_SECOND: u64 = 100;

/// utime + stime of the thread `tid` of this process, in ticks (0 once it
/// is gone).
fn thread_ticks(tid: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else { return 0 };
    let fields: Vec<u64> =
        stat.rsplit_once(')').unwrap().1.split_whitespace().skip(11).take(2).map(|f| f.parse().unwrap()).collect();
    fields[0] + fields[1]
}

/// The id of the calling thread (`/proc/thread-self` is `<pid>/task/<tid>`).
fn current_tid() -> String {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    link.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn a_task_that_is_always_ready_but_never_done_does_not_spin_a_core() {
    // A runtime of its own, whose every thread (workers and blocking pool)
    // is recorded: the driver of the task runs on them.
    let threads: Arc<Mutex<Vec<String>>> = Arc::default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start({
            let threads = threads.clone();
            move || threads.lock().unwrap().push(current_tid())
        })
        .build()
        .unwrap();
    let cpu_ticks = || threads.lock().unwrap().iter().map(|tid| thread_ticks(tid)).sum::<u64>();
    runtime.block_on(busy_task_backs_off(&cpu_ticks));
}

async fn busy_task_backs_off(cpu_ticks: &dyn Fn() -> u64) {
    taskhost_tests::logs::init();
    let engine = taskhost_tests::engine(|config| {
        config.pooling = false;
    });
    let version = engine.load_file(fixtures::MISBEHAVE_PATH).await.unwrap();
    let producer = WasmProducer::new(version, json!({})).await.unwrap();
    let owned = OwnedRegistry::new();
    let (registry, agent) = (&owned.registry, &owned.agent);
    let prepared = OwnedRegistry::prepare(&producer, json!({"fault": "busy"})).await;
    let id = owned.start(&producer, prepared).await;

    let before = cpu_ticks();
    tokio::time::sleep(WINDOW).await;
    let used = cpu_ticks().saturating_sub(before);
    let window_ticks = WINDOW.as_secs() * TICKS_PER_SECOND;
    eprintln!("CPU time of the runtime's threads over the window: {used} of {window_ticks} ticks");
    // A driver that polls without pause uses a whole core: the full window.
    assert!(
        used * 10 < window_ticks,
        "the busy task used {used} ticks of CPU in a {window_ticks}-tick window (bound: a tenth of it)"
    );
    assert_eq!(registry.get(&id, Some(agent)).unwrap().status, TaskStatus::Running);

    // Backed off, it still answers a kill at once.
    registry.kill(&id, Some(agent), None).await.unwrap();
    let snapshot = registry.wait(&id, Duration::from_secs(5), Some(agent), None).await.unwrap();
    assert_eq!(snapshot.status, TaskStatus::Killed, "{snapshot:?}");
}
