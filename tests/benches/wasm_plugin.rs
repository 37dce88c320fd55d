//! Wasm plugin benchmark: the `ticker` plugin against its native twin.
//!
//! Run: `cargo bench -p taskhost-tests --bench wasm_plugin`
//!
//! Measures, in one run so the ratios are fair on a noisy machine:
//! - start-to-registered latency (prepare + `TaskRegistry::start` until the id
//!   is returned), p50/p99, wasm `ticker` vs `native::ticker`, interleaved in
//!   batches so drift hits both alike;
//! - RSS per live task with 10 000 live ticker tasks, wasm vs native, and the
//!   address space the instance pool reserves;
//! - plugin load: cold (compile) vs cached (deserialize from the compile cache).

use std::time::{Duration, Instant};

use serde_json::json;
use taskhost::agents::AgentRegistry;
use taskhost::native::ticker::TickerProducer;
use taskhost::plugin::engine::rss_bytes;
use taskhost::plugin::{CompileSource, PluginEngine, PluginRuntimeConfig, WasmProducer};
use taskhost::producer::{Producer, RunMode};
use taskhost::tasks::{RegistryConfig, SurfaceGuard, TaskRegistry, TaskStart};

const LIVE: usize = 10_000;
const LATENCY_SAMPLES: usize = 4_000;
const BATCH: usize = 200;
const LOADS: usize = 10;

fn registry() -> (TaskRegistry, SurfaceGuard) {
    let registry = TaskRegistry::new(
        AgentRegistry::new(),
        RegistryConfig {
            max_live_tasks_per_owner: usize::MAX,
            teardown_timeout: Some(Duration::from_secs(30)),
            max_finished_tasks_per_owner: usize::MAX,
            ..RegistryConfig::default()
        },
    );
    let surface = registry.attach_surface("bench");
    (registry, surface)
}

async fn start(registry: &TaskRegistry, producer: &dyn Producer, args: serde_json::Value) -> Duration {
    let began = Instant::now();
    let prepared = producer.prepare(args, RunMode::Background).await.expect("prepare");
    registry
        .start(TaskStart {
            kind: producer.descriptor().kind.clone(),
            label: prepared.label,
            owner: None,
            producer_info: prepared.producer_info,
            options: Default::default(),
            run: prepared.run,
        })
        .await
        .expect("start");
    began.elapsed()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn latency(wasm: &WasmProducer, native: &TickerProducer) {
    // Short tasks (one immediate tick) so the live set stays small.
    let args = json!({"count": 1, "interval_ms": 0});
    let (registry, _surface) = registry();
    for _ in 0..BATCH {
        start(&registry, wasm, args.clone()).await;
        start(&registry, native, args.clone()).await;
    }
    let (mut w, mut n) = (Vec::with_capacity(LATENCY_SAMPLES), Vec::with_capacity(LATENCY_SAMPLES));
    while w.len() < LATENCY_SAMPLES {
        for _ in 0..BATCH {
            w.push(start(&registry, wasm, args.clone()).await);
        }
        for _ in 0..BATCH {
            n.push(start(&registry, native, args.clone()).await);
        }
        // Let the short tasks settle so both kinds start from the same state.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w.sort();
    n.sort();
    let (w50, w99, n50, n99) = (percentile(&w, 0.5), percentile(&w, 0.99), percentile(&n, 0.5), percentile(&n, 0.99));
    println!("start-to-registered latency ({LATENCY_SAMPLES} starts each, interleaved batches of {BATCH}):");
    println!("  native ticker: p50 {:8.1} µs  p99 {:8.1} µs", micros(n50), micros(n99));
    println!("  wasm ticker:   p50 {:8.1} µs  p99 {:8.1} µs", micros(w50), micros(w99));
    println!(
        "  ratio wasm/native: p50 {:.2}x  p99 {:.2}x",
        w50.as_secs_f64() / n50.as_secs_f64(),
        w99.as_secs_f64() / n99.as_secs_f64()
    );
    registry.dispose().await;

    // Where a wasm start's time goes (no registry): prepare = new store +
    // pooled instantiation + `label`; run = `run` + spawning the driver.
    let (mut prep, mut run) = (Vec::new(), Vec::new());
    let mut held = Vec::new();
    for i in 0..LATENCY_SAMPLES {
        let began = Instant::now();
        let prepared = wasm.prepare(args.clone(), RunMode::Background).await.expect("prepare");
        let mid = Instant::now();
        let hooks = (prepared.run)().await.expect("run");
        run.push(mid.elapsed());
        prep.push(mid - began);
        held.push(hooks);
        if i % BATCH == BATCH - 1 {
            for hooks in held.drain(..) {
                let _ = hooks.done.await;
            }
        }
    }
    prep.sort();
    run.sort();
    println!(
        "  wasm breakdown p50: prepare (store + instantiate + label) {:.1} µs, run (run + driver spawn) {:.1} µs",
        micros(percentile(&prep, 0.5)),
        micros(percentile(&run, 0.5))
    );
}

/// RSS growth per live task with `LIVE` live (hour-long) tickers.
async fn memory(label: &str, producer: &dyn Producer) -> f64 {
    let args = json!({"count": 1000, "interval_ms": 3_600_000});
    let (registry, _surface) = registry();
    // Warm up allocator and pool state outside the measurement.
    start(&registry, producer, args.clone()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = rss_bytes().expect("rss");
    let began = Instant::now();
    for _ in 0..LIVE {
        start(&registry, producer, args.clone()).await;
    }
    let elapsed = began.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = rss_bytes().expect("rss");
    let per_task = (after.saturating_sub(before)) as f64 / LIVE as f64;
    println!(
        "  {label:<14} {:7.1} KiB RSS per live task ({} live; {:.0} starts/s)",
        per_task / 1024.0,
        LIVE,
        LIVE as f64 / elapsed.as_secs_f64()
    );
    let began = Instant::now();
    registry.dispose().await;
    println!("  {label:<14} disposal of {LIVE} live tasks (cancel + await quiescence): {:?}", began.elapsed());
    per_task
}

async fn loads(bytes: &[u8]) {
    let dir = std::env::temp_dir().join(format!("taskhost-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cold_engine =
        PluginEngine::new(PluginRuntimeConfig { cache: false, pooling: false, ..Default::default() }).unwrap();
    let cached_engine =
        PluginEngine::new(PluginRuntimeConfig { cache_dir: Some(dir.clone()), pooling: false, ..Default::default() })
            .unwrap();
    // Fill the cache once.
    let first = cached_engine.load_bytes("ticker", bytes.to_vec()).await.unwrap();
    assert_eq!(first.compile_source(), CompileSource::Compiled);
    let (mut cold, mut cached) = (Vec::new(), Vec::new());
    for _ in 0..LOADS {
        let began = Instant::now();
        let v = cold_engine.load_bytes("ticker", bytes.to_vec()).await.unwrap();
        cold.push(began.elapsed());
        assert_eq!(v.compile_source(), CompileSource::Compiled);
        let began = Instant::now();
        let v = cached_engine.load_bytes("ticker", bytes.to_vec()).await.unwrap();
        cached.push(began.elapsed());
        assert_eq!(v.compile_source(), CompileSource::Cache);
    }
    cold.sort();
    cached.sort();
    let (c, h) = (percentile(&cold, 0.5), percentile(&cached, 0.5));
    println!("plugin load ({} KiB component, median of {LOADS}, validation included):", bytes.len() / 1024);
    println!("  cold (compile):             {:8.2} ms", c.as_secs_f64() * 1e3);
    println!("  cached (deserialize):       {:8.2} ms", h.as_secs_f64() * 1e3);
    println!("  ratio cached/cold:          {:.3}x", h.as_secs_f64() / c.as_secs_f64());
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let wasm_bytes = taskhost::builtin::TICKER_WASM;
        loads(wasm_bytes).await;

        let vm_before = taskhost::plugin::engine::vm_size_bytes();
        // Room for every live task of the memory measurement (the default
        // pool is smaller: see `max_live_stores`).
        let engine =
            PluginEngine::new(PluginRuntimeConfig { max_live_stores: 10_240, ..PluginRuntimeConfig::default() })
                .expect("engine");
        println!(
            "engine: pooling {} (max_live_stores {}), reserved address space {:.1} GiB (VmSize before {:.1} GiB)",
            engine.is_pooling(),
            engine.config().max_live_stores,
            engine.reserved_virtual_bytes().unwrap_or(0) as f64 / (1u64 << 30) as f64,
            vm_before.unwrap_or(0) as f64 / (1u64 << 30) as f64,
        );
        let version = engine.load_bytes("ticker", wasm_bytes.to_vec()).await.expect("load");
        let wasm = WasmProducer::new(version, json!({})).await.expect("describe");
        let native = TickerProducer::new(&json!({})).expect("native ticker");
        assert_eq!(wasm.descriptor().kind, native.descriptor().kind);

        latency(&wasm, &native).await;

        println!("memory with {LIVE} live ticker tasks:");
        let native_per = memory("native ticker", &native).await;
        let wasm_per = memory("wasm ticker", &wasm).await;
        println!("  ratio wasm/native: {:.1}x", wasm_per / native_per.max(1.0));
    });
}
