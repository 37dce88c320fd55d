//! Benchmarks of the `process` capability against plain tokio/std baselines. Run:
//! `cargo bench -p taskhost --bench process` (`-- --quick` for a short run: still 500 rounds of
//! the start measurements, so their p99 rests on 500 samples). Prints one table, which
//! docs/benchmarks-log.md quotes.
//!
//! 1. Start latency of `bash -c true` from the spawn call until a handle is returned (when a
//!    task id can be registered), p50/p90/p99, through `ProcessHost::spawn`, each interleaved
//!    in one run with `tokio::process::Command::spawn` of the same command:
//!    - fully confined, with the default tree limits in a cgroup where the host can create
//!      one, through the warm keeper;
//!    - the same with the keeper exec'd on demand (the warm keeper off);
//!    - the same warm, waiting for the zygote's acknowledgement (off by default);
//!    - the same without limits; PID namespace only; process group only.
//!
//!    Each warm start waits until the replacement zygote of the previous one is ready, as a
//!    start that is not back to back with another finds it. Then the anchor a user would
//!    otherwise pick: `bwrap --unshare-all --die-with-parent --ro-bind / / bash -c true`
//!    against bare `bash -c true`, each run to completion, interleaved (skipped with a note
//!    when `bwrap` is missing).
//! 2. The full tool path: `Host::call_tool("bash", {command: "true", run_in_background: true})`
//!    through the built-in wasm bash plugin (schema validation, a fresh store, `label`, `run`,
//!    the spawn, the registry commit) until the task id is returned, vs the same tokio spawn,
//!    interleaved. `PROCESS_BENCH_ONLY=tool` runs this part only.
//!
//! Output throughput (raw pipe, capability, registry) is `benches/stream.rs`.

mod common;

use std::time::{Duration, Instant};

use serde_json::json;
use taskhost::process::{ProcessGrant, ProcessHost, ProcessHostConfig, SpawnRequest, zygote};
use taskhost::tools::CallContext;

/// CPU time (µs) of this process's threads and of its reaped descendants.
#[derive(Clone, Copy, Default)]
struct Cpu {
    host_us: f64,
    trees_us: f64,
}

impl Cpu {
    fn now() -> Self {
        let used = |who| {
            // SAFETY: rusage is plain data, all zeroes a valid value.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: getrusage fills the struct it is given.
            unsafe { libc::getrusage(who, &mut usage) };
            let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
            us(usage.ru_utime) + us(usage.ru_stime)
        };
        Self { host_us: used(libc::RUSAGE_SELF), trees_us: used(libc::RUSAGE_CHILDREN) }
    }

    fn since(self, earlier: Self) -> Self {
        Self { host_us: self.host_us - earlier.host_us, trees_us: self.trees_us - earlier.trees_us }
    }

    fn add(&mut self, other: Self) {
        self.host_us += other.host_us;
        self.trees_us += other.trees_us;
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

fn request(argv: &[&str]) -> SpawnRequest {
    SpawnRequest { argv: argv.iter().map(|s| s.to_string()).collect(), ..Default::default() }
}

/// `bwrap … bash -c true` against bare `bash -c true`, run to completion.
fn bwrap_anchor(iterations: usize) {
    let bwrap = ["--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "bash", "-c", "true"];
    if std::process::Command::new("bwrap").args(bwrap).status().map(|s| !s.success()).unwrap_or(true) {
        println!("anchor: bwrap is missing or cannot run here (apt-get install bubblewrap); row skipped");
        return;
    }
    let mut bare = Vec::new();
    let mut wrapped = Vec::new();
    for i in 0..iterations + 5 {
        let t = Instant::now();
        std::process::Command::new("bash").args(["-c", "true"]).status().unwrap();
        let b = t.elapsed();
        let t = Instant::now();
        std::process::Command::new("bwrap").args(bwrap).status().unwrap();
        let w = t.elapsed();
        if i >= 5 {
            bare.push(b);
            wrapped.push(w);
        }
    }
    let (b, w) = (percentile(&mut bare, 0.5), percentile(&mut wrapped, 0.5));
    println!("anchor, run to completion, {iterations} rounds interleaved:");
    println!("  {:<34} p50 {b:>10.1?}  baseline", "bash -c true");
    println!(
        "  {:<34} p50 {w:>10.1?}  p50 ratio {:.2}x",
        "bwrap --unshare-all … bash -c true",
        w.as_secs_f64() / b.as_secs_f64()
    );
}

fn main() {
    // Process trees start as this binary in keeper mode, as in `taskhost`.
    taskhost::process::keeper::run_if_keeper();
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime").block_on(run());
}

async fn run() {
    let quick = std::env::args().any(|a| a == "--quick");
    let host = ProcessHost::new(&ProcessHostConfig::default()).unwrap();
    let unlimited_host = ProcessHost::new(&ProcessHostConfig {
        max_pids_per_tree: 0,
        max_memory_bytes_per_tree: 0,
        ..ProcessHostConfig::default()
    })
    .unwrap();
    let grant = ProcessGrant { programs: vec!["bash".into(), "head".into()], ..ProcessGrant::default() };
    let plain = ProcessGrant { pid_namespace: false, network: true, ..grant.clone() };
    println!("confinement: {}", host.support().describe());
    println!("tree limits: {:?} by {}", host.tree_limits(), host.limit_mechanism());

    if !std::env::var("PROCESS_BENCH_ONLY").is_ok_and(|only| only == "tool") {
        start_latency(&host, &unlimited_host, &grant, &plain, quick).await;
        bwrap_anchor(if quick { 20 } else { 100 });
    }
    tool_path(&host, &grant, quick).await;
}

/// Part 1: the capability's start against tokio's.
async fn start_latency(
    host: &ProcessHost,
    unlimited_host: &ProcessHost,
    grant: &ProcessGrant,
    plain: &ProcessGrant,
    quick: bool,
) {
    let span = tracing::Span::none();
    let pid_only = ProcessGrant { network: true, ..grant.clone() };
    let variants: [(&str, Option<(&ProcessHost, &ProcessGrant)>); 7] = [
        ("tokio::process", None),
        ("process cap, full confinement", Some((host, grant))),
        ("  same, keeper exec'd on demand", Some((host, grant))),
        ("  same, warm, waiting for the ack", Some((host, grant))),
        ("  same, no tree limits", Some((unlimited_host, grant))),
        ("process cap, PID namespace", Some((host, &pid_only))),
        ("process cap, process group only", Some((host, plain))),
    ];
    // Starts: at least 500 samples per variant, so a p99 means something
    // (issue 16), also in `--quick`.
    let iterations = if quick { 500 } else { 1000 };
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut order: Vec<usize> = (0..variants.len()).collect();
    let mut seed = 0x9e37_79b9_u32;
    for i in 0..iterations + 10 {
        // A shuffled order per round, and a pause after each start so the
        // previous tree's teardown (network namespaces are destroyed by a
        // kernel worker) does not land on the next variant.
        for k in (1..order.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            order.swap(k, seed as usize % (k + 1));
        }
        for &v in &order {
            // Variant 2 is the start before the warm keeper: the exec'd
            // keeper, spawned on demand (a replacement zygote spawned in
            // the background is left unused meanwhile).
            zygote::set_enabled(v != 2);
            // Variant 3: the warm keeper, waiting for its acknowledgement
            // (`zygote::set_await_ack`; the default does not wait).
            zygote::set_await_ack(v == 3);
            if v != 2 {
                // The replacement of the previous warm start is ready, as it
                // is for a start that is not back to back with another.
                zygote::wait_ready(Duration::from_secs(5));
            }
            let t = Instant::now();
            let elapsed = match variants[v].1 {
                Some((h, g)) => {
                    let process = h.spawn(g, request(&["bash", "-c", "true"]), &span).await.unwrap();
                    let elapsed = t.elapsed();
                    process.finished().await;
                    elapsed
                }
                None => {
                    let mut child = tokio::process::Command::new("bash").args(["-c", "true"]).spawn().unwrap();
                    let elapsed = t.elapsed();
                    child.wait().await.unwrap();
                    elapsed
                }
            };
            if i >= 10 {
                samples[v].push(elapsed);
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }
    // Back to the defaults for the rest of the run.
    zygote::set_enabled(true);
    zygote::set_await_ack(false);
    println!("start `bash -c true`, {iterations} rounds (spawn call -> handle; shuffled, interleaved):");
    let base = percentile(&mut samples[0], 0.5);
    let base99 = percentile(&mut samples[0], 0.99);
    for (v, (name, _)) in variants.iter().enumerate() {
        let (p50, p90, p99) =
            (percentile(&mut samples[v], 0.5), percentile(&mut samples[v], 0.9), percentile(&mut samples[v], 0.99));
        println!(
            "  {name:<34} p50 {p50:>10.1?}  p90 {p90:>10.1?}  p99 {p99:>10.1?}  p50 ratio {:.2}x  p99 ratio {:.2}x",
            p50.as_secs_f64() / base.as_secs_f64(),
            p99.as_secs_f64() / base99.as_secs_f64()
        );
    }
}

/// Part 2: the whole tool path, and where its time goes.
async fn tool_path(host: &std::sync::Arc<ProcessHost>, grant: &ProcessGrant, quick: bool) {
    let iterations = if quick { 500 } else { 1000 };
    let span = tracing::Span::none();
    let (engine, producer) = common::bash_producer(host, grant).await;
    // Where the tool path's time goes: the plugin's `label` in a fresh store
    // (prepare) and its `run`, which spawns through the capability.
    let (mut prepare, mut run_call) = (Vec::new(), Vec::new());
    for i in 0..iterations + 10 {
        use taskhost::producer::{Producer, RunMode};
        let t = Instant::now();
        let prepared = producer.prepare(json!({"command": "true"}), RunMode::Background).await.unwrap();
        let prepared_at = t.elapsed();
        let t = Instant::now();
        let hooks = (prepared.run)().await.unwrap();
        let ran = t.elapsed();
        hooks.done.await.unwrap();
        if i >= 10 {
            prepare.push(prepared_at);
            run_call.push(ran);
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let tools = common::bash_tool(producer.clone());
    let agent = tools.create_agent("bench", "bench").unwrap();
    let context = CallContext::for_agent(&agent);
    // The capability alone, now that the engine's pool is mapped (its own
    // loop: interleaved with the tool path, each disturbed the other).
    let mut direct = Vec::new();
    for i in 0..iterations + 10 {
        let t = Instant::now();
        let process = host.spawn(grant, request(&["bash", "-c", "true"]), &span).await.unwrap();
        let elapsed = t.elapsed();
        process.finished().await;
        if i >= 10 {
            direct.push(elapsed);
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let (mut tool_path, mut raw) = (Vec::new(), Vec::new());
    // CPU per start, whatever share of the cores each side got: the host's
    // threads, and the reaped trees (keepers, inits, bash; tokio's bash).
    let (mut tool_cpu, mut raw_cpu) = (Cpu::default(), Cpu::default());
    for i in 0..iterations + 10 {
        for k in 0..2 {
            let before = Cpu::now();
            let t = Instant::now();
            if (i + k) % 2 == 0 {
                let args = json!({"command": "true", "run_in_background": true});
                let reply = tools.call_tool("bash", args, &context).await.unwrap();
                let elapsed = t.elapsed();
                let id = reply.started.expect("a background start");
                tools.registry().wait(&id, Duration::from_secs(10), Some(&agent), None).await.unwrap();
                if i >= 10 {
                    tool_path.push(elapsed);
                    tool_cpu.add(Cpu::now().since(before));
                }
            } else {
                let mut child = tokio::process::Command::new("bash").args(["-c", "true"]).spawn().unwrap();
                let elapsed = t.elapsed();
                child.wait().await.unwrap();
                if i >= 10 {
                    raw.push(elapsed);
                    raw_cpu.add(Cpu::now().since(before));
                }
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }
    let (t50, t90, t99) =
        (percentile(&mut tool_path, 0.5), percentile(&mut tool_path, 0.9), percentile(&mut tool_path, 0.99));
    let (r50, r90, r99) = (percentile(&mut raw, 0.5), percentile(&mut raw, 0.9), percentile(&mut raw, 0.99));
    println!("background `bash -c true` through Host::call_tool (call -> task id), {iterations} rounds:");
    println!("  tokio::process                     p50 {r50:>10.1?}  p90 {r90:>10.1?}  p99 {r99:>10.1?}");
    println!(
        "  bash tool (wasm plugin)            p50 {t50:>10.1?}  p90 {t90:>10.1?}  p99 {t99:>10.1?}  p50 ratio {:.2}x  p99 ratio {:.2}x",
        t50.as_secs_f64() / r50.as_secs_f64(),
        t99.as_secs_f64() / r99.as_secs_f64()
    );
    let n = iterations as f64;
    println!(
        "  CPU per start (host threads + reaped trees): tokio {:.0} µs + {:.0} µs, bash tool {:.0} µs + {:.0} µs; host threads {:.2}x, total {:.2}x",
        raw_cpu.host_us / n,
        raw_cpu.trees_us / n,
        tool_cpu.host_us / n,
        tool_cpu.trees_us / n,
        tool_cpu.host_us / raw_cpu.host_us,
        (tool_cpu.host_us + tool_cpu.trees_us) / (raw_cpu.host_us + raw_cpu.trees_us)
    );
    println!(
        "  breakdown: prepare (fresh store, label) p50 {:>10.1?}; run (spawn included) p50 {:>10.1?}",
        percentile(&mut prepare, 0.5),
        percentile(&mut run_call, 0.5)
    );
    let (d50, d90, d99) = (percentile(&mut direct, 0.5), percentile(&mut direct, 0.9), percentile(&mut direct, 0.99));
    let mappings = std::fs::read_to_string("/proc/self/maps").map_or(0, |maps| maps.lines().count());
    println!(
        "  process cap with the engine mapped p50 {d50:>10.1?}  p90 {d90:>10.1?}  p99 {d99:>10.1?}  p50 ratio {:.2}x  p99 ratio {:.2}x  ({mappings} mappings, pool of {} stores)",
        d50.as_secs_f64() / r50.as_secs_f64(),
        d99.as_secs_f64() / r99.as_secs_f64(),
        engine.config().max_live_stores
    );

    tools.dispose().await;
}
