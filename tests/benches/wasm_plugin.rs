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
//! - plugin load: cold (compile) vs cached (deserialize from the compile cache);
//! - the floor of a wasm start, in the same run: a bare pooled instantiate of
//!   the same component (same engine, same pool) and one trivial call of it
//!   (`label`), through wasmtime alone: a `Store<()>`, every import a trap,
//!   no limiter, no deadline callback, no driver; and the floor of a live
//!   wasm task's memory: RSS per live bare instance (after its `label` call)
//!   with 10 000 of them held.

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
        .start(
            TaskStart::new(producer.descriptor().kind.clone(), prepared.label, prepared.run)
                .with_producer_info(prepared.producer_info),
        )
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

/// The floor of a wasm task, through wasmtime alone: a `Store<()>` with a
/// pooled instance of the same component (same engine, same pool) that has
/// answered one `label` call. No WASI context (every import of the component
/// traps, and `label` calls none), no limiter, no deadline callback, no
/// driver, no registry.
struct BareFloor {
    engine: wasmtime::Engine,
    pre: wasmtime::component::InstancePre<()>,
    label: wasmtime::component::ComponentExportIndex,
    args: String,
}

impl BareFloor {
    fn new(engine: &PluginEngine, component: &wasmtime::component::Component) -> Self {
        use wasmtime::component::Linker;
        let mut linker = Linker::<()>::new(engine.engine());
        linker.define_unknown_imports_as_traps(component).expect("stub imports");
        let pre = linker.instantiate_pre(component).expect("instance pre");
        let (_, iface) = component.get_export(None, "taskhost:producer/producer@0.2.0").expect("producer export");
        let (_, label) = component.get_export(Some(&iface), "label").expect("label export");
        let args = json!({"count": 1, "interval_ms": 0}).to_string();
        Self { engine: engine.engine().clone(), pre, label, args }
    }

    /// A new store, its pooled instance, and one `label` call.
    async fn instance(&self) -> wasmtime::Store<()> {
        let mut store = wasmtime::Store::new(&self.engine, ());
        store.set_epoch_deadline(u64::MAX / 2);
        let instance = self.pre.instantiate_async(&mut store).await.expect("instantiate");
        let func = instance
            .get_typed_func::<(&str, &str), (Result<String, String>,)>(&mut store, &self.label)
            .expect("label signature");
        let (labelled,) = func.call_async(&mut store, ("{}", &self.args)).await.expect("label call");
        labelled.expect("label");
        store
    }
}

/// The floor of a wasm start: [`BareFloor::instance`], timed. Returns the
/// sorted samples.
async fn bare_floor(floor: &BareFloor) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
    for i in 0..LATENCY_SAMPLES + BATCH {
        let began = Instant::now();
        let store = floor.instance().await;
        let elapsed = began.elapsed();
        drop(store);
        if i >= BATCH {
            samples.push(elapsed);
        }
    }
    samples.sort();
    samples
}

async fn latency(wasm: &WasmProducer, native: &TickerProducer, floor: &BareFloor) {
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
    let floor = bare_floor(floor).await;
    let (w50, w99, n50, n99) = (percentile(&w, 0.5), percentile(&w, 0.99), percentile(&n, 0.5), percentile(&n, 0.99));
    let (f50, f99) = (percentile(&floor, 0.5), percentile(&floor, 0.99));
    println!("start-to-registered latency ({LATENCY_SAMPLES} starts each, interleaved batches of {BATCH}):");
    println!("  native ticker: p50 {:8.1} µs  p99 {:8.1} µs", micros(n50), micros(n99));
    println!("  wasm ticker:   p50 {:8.1} µs  p99 {:8.1} µs", micros(w50), micros(w99));
    println!("  floor (bare pooled instantiate + label): p50 {:8.1} µs  p99 {:8.1} µs", micros(f50), micros(f99));
    println!(
        "  ratio wasm/native: p50 {:.2}x  p99 {:.2}x",
        w50.as_secs_f64() / n50.as_secs_f64(),
        w99.as_secs_f64() / n99.as_secs_f64()
    );
    println!(
        "  ratio wasm/floor:  p50 {:.2}x  p99 {:.2}x",
        w50.as_secs_f64() / f50.as_secs_f64(),
        w99.as_secs_f64() / f99.as_secs_f64()
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
    // The same prepare with no task ever started, so no driver competes for
    // the CPU: the like-for-like comparison with the floor.
    let mut alone = Vec::with_capacity(LATENCY_SAMPLES);
    for _ in 0..LATENCY_SAMPLES {
        let began = Instant::now();
        let prepared = wasm.prepare(args.clone(), RunMode::Background).await.expect("prepare");
        alone.push(began.elapsed());
        drop(prepared);
    }
    alone.sort();
    println!(
        "  wasm breakdown p50: prepare (store + instantiate + label) {:.1} µs, run (run + driver spawn) {:.1} µs",
        micros(percentile(&prep, 0.5)),
        micros(percentile(&run, 0.5))
    );
    println!(
        "  prepare alone (no task running, store dropped): p50 {:.1} µs  p99 {:.1} µs; ratio to the floor p50 {:.2}x",
        micros(percentile(&alone, 0.5)),
        micros(percentile(&alone, 0.99)),
        percentile(&alone, 0.5).as_secs_f64() / f50.as_secs_f64()
    );
}

/// Resident bytes of this process by kind of mapping, from
/// `/proc/self/smaps`: where the memory of live tasks is. Kinds: `memfd`
/// (linear-memory slots with the module's initial image mapped), `pool`
/// (other anonymous mappings of 1 GiB and more: the pool's memory and table
/// slots), `stack` (anonymous mappings of the fiber stack size, 2 MiB +
/// 4 KiB guard, as the stack pool's guard pages split it), `heap` (the
/// allocator: `[heap]` and other anonymous mappings), `other`.
fn rss_by_kind() -> std::collections::BTreeMap<&'static str, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return out };
    let mut kind = "other";
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && first.chars().next().is_some_and(|c| c.is_ascii_hexdigit()) {
            let (start, end) = first.split_once('-').unwrap();
            let size = u64::from_str_radix(end, 16).unwrap_or(0) - u64::from_str_radix(start, 16).unwrap_or(0);
            let path = line.split_whitespace().nth(5).unwrap_or("");
            kind = if path.starts_with("/memfd:") {
                "memfd"
            } else if path == "[heap]" {
                "heap"
            } else if path.is_empty() && size >= 1 << 30 {
                "pool"
            } else if path.is_empty() && size == (2 << 20) {
                "stack"
            } else if path.is_empty() {
                "heap"
            } else {
                "other"
            };
        } else if first == "Rss:" {
            let kib: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *out.entry(kind).or_default() += kib * 1024;
        }
    }
    out
}

/// Resident memory now, in all and by kind of mapping: the point to measure
/// growth from.
struct RssMark {
    total: u64,
    kinds: std::collections::BTreeMap<&'static str, u64>,
}

impl RssMark {
    fn now() -> Self {
        Self { total: rss_bytes().expect("rss"), kinds: rss_by_kind() }
    }

    /// Prints the growth since this mark per live item, in all and by kind
    /// of mapping, and returns it in bytes.
    fn report_growth(&self, label: &str, live: usize, starts_per_s: f64) -> f64 {
        let after = rss_bytes().expect("rss");
        let per_item = after.saturating_sub(self.total) as f64 / live as f64;
        println!(
            "  {label:<14} {:7.1} KiB RSS per live task ({live} live; {starts_per_s:.0} starts/s)",
            per_item / 1024.0
        );
        let by_kind: Vec<String> = rss_by_kind()
            .iter()
            .map(|(kind, bytes)| {
                let grown = bytes.saturating_sub(self.kinds.get(kind).copied().unwrap_or(0));
                format!("{kind} {:.1}", grown as f64 / live as f64 / 1024.0)
            })
            .collect();
        println!("  {label:<14} per live task by mapping, KiB: {}", by_kind.join(", "));
        per_item
    }
}

/// RSS growth per live task with `LIVE` live (hour-long) tickers.
async fn memory(label: &str, producer: &dyn Producer) -> f64 {
    let args = json!({"count": 1000, "interval_ms": 3_600_000});
    let (registry, _surface) = registry();
    // Warm up allocator and pool state outside the measurement.
    start(&registry, producer, args.clone()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mark = RssMark::now();
    let began = Instant::now();
    for _ in 0..LIVE {
        start(&registry, producer, args.clone()).await;
    }
    let elapsed = began.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let per_task = mark.report_growth(label, LIVE, LIVE as f64 / elapsed.as_secs_f64());
    let began = Instant::now();
    registry.dispose().await;
    println!("  {label:<14} disposal of {LIVE} live tasks (cancel + await quiescence): {:?}", began.elapsed());
    per_task
}

/// The memory floor of a live wasm task: RSS growth per live bare instance
/// ([`BareFloor::instance`]: the store and instance wasmtime itself keeps,
/// and the guest memory its `label` call touched), with `LIVE` of them held.
/// Measured in a process of its own (`WASM_BENCH_ONLY=floor-memory`): in
/// this one the pool slots and the heap the tickers left are already
/// resident, and a bare instance would reuse them for free.
fn floor_memory_in_child() -> f64 {
    let out = std::process::Command::new(std::env::current_exe().expect("current exe"))
        .arg("--bench")
        .env("WASM_BENCH_ONLY", "floor-memory")
        .output()
        .expect("run the floor memory probe");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the floor memory probe failed ({}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut per_instance = None;
    for line in stdout.lines() {
        match line.strip_prefix(FLOOR_BYTES_LINE) {
            Some(bytes) => per_instance = bytes.trim().parse().ok(),
            None if line.starts_with("  floor") => println!("{line}"),
            None => {}
        }
    }
    per_instance.unwrap_or_else(|| panic!("the floor memory probe printed no result: {stdout}"))
}

/// How the floor memory probe hands its result to the parent.
const FLOOR_BYTES_LINE: &str = "floor bytes per instance:";

async fn floor_memory(floor: &BareFloor) -> f64 {
    drop(floor.instance().await);
    let mark = RssMark::now();
    let began = Instant::now();
    let mut live = Vec::with_capacity(LIVE);
    for _ in 0..LIVE {
        live.push(floor.instance().await);
    }
    let elapsed = began.elapsed();
    let per_instance = mark.report_growth("floor", LIVE, LIVE as f64 / elapsed.as_secs_f64());
    println!("{FLOOR_BYTES_LINE} {per_instance}");
    drop(live);
    per_instance
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

/// Whether `part` runs: all of them unless `WASM_BENCH_ONLY` names some
/// (comma-separated: `loads`, `latency`, `memory`), for profiling one part.
/// (`floor-memory` alone is the child process `memory` starts.)
fn part(part: &str) -> bool {
    match std::env::var("WASM_BENCH_ONLY") {
        Ok(only) => only.split(',').any(|p| p.trim() == part),
        Err(_) => true,
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let wasm_bytes = taskhost::builtin::TICKER_WASM;
        if part("loads") {
            loads(wasm_bytes).await;
        }

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
        let floor = BareFloor::new(wasm.version().engine(), wasm.version().component());

        // The child process the `memory` part starts: named alone, never
        // part of a run of everything.
        if std::env::var("WASM_BENCH_ONLY").is_ok_and(|only| only == "floor-memory") {
            floor_memory(&floor).await;
            return;
        }
        if part("latency") {
            latency(&wasm, &native, &floor).await;
        }
        if part("memory") {
            println!("memory with {LIVE} live ticker tasks:");
            let native_per = memory("native ticker", &native).await;
            let wasm_per = memory("wasm ticker", &wasm).await;
            let floor_per = floor_memory_in_child();
            println!("  ratio wasm/native: {:.1}x", wasm_per / native_per.max(1.0));
            println!(
                "  ratio wasm/floor:  {:.2}x (the floor: live bare instances, each after one `label` call)",
                wasm_per / floor_per.max(1.0)
            );
        }
    });
}
