//! A guest task whose pollable is always ready while `done` stays `none`
//! (the `busy` mode of the `misbehave` fixture) must not keep a core busy:
//! the driver backs off. Measured as this process's CPU time (utime + stime
//! from `/proc/self/stat`) over a window, which a spinning driver fills.
//!
//! Its own test binary with a single test, so no other test's work counts
//! against the process's CPU time.

use std::time::Duration;

use serde_json::json;
use taskhost::plugin::{PluginEngine, PluginRuntimeConfig, WasmProducer};
use taskhost::tasks::TaskStatus;
use taskhost_tests::fixtures;
use taskhost_tests::registry_fixture::OwnedRegistry;

/// The window CPU time is measured over.
const WINDOW: Duration = Duration::from_secs(2);
/// `/proc` reports CPU time in USER_HZ ticks, 100 per second on Linux.
const TICKS_PER_SECOND: u64 = 100;

/// utime + stime of this process, in ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<u64> =
        stat.rsplit_once(')').unwrap().1.split_whitespace().skip(11).take(2).map(|f| f.parse().unwrap()).collect();
    fields[0] + fields[1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_is_always_ready_but_never_done_does_not_spin_a_core() {
    let _ = tracing_subscriber::fmt().with_env_filter("warn").with_test_writer().try_init();
    let engine = PluginEngine::new(PluginRuntimeConfig {
        cache_dir: Some(std::env::temp_dir().join(format!("taskhost-busy-cache-{}", std::process::id()))),
        pooling: false,
        ..PluginRuntimeConfig::default()
    })
    .unwrap();
    let version = engine.load_file(fixtures::MISBEHAVE_PATH).await.unwrap();
    let producer = WasmProducer::new(version, json!({})).await.unwrap();
    let owned = OwnedRegistry::new();
    let (registry, agent) = (&owned.registry, &owned.agent);
    let prepared = OwnedRegistry::prepare(&producer, json!({"fault": "busy"})).await;
    let id = owned.start(&producer, prepared).await;

    let before = cpu_ticks();
    tokio::time::sleep(WINDOW).await;
    let used = cpu_ticks() - before;
    let window_ticks = WINDOW.as_secs() * TICKS_PER_SECOND;
    eprintln!("CPU time of the process over the window: {used} of {window_ticks} ticks");
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
