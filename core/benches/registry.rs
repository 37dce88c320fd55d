//! Registry benchmark: start → read → settle for the native ticker kind.
//!
//! Run: `cargo bench -p taskhost-core --bench registry`
//!
//! Measures, in one run so the ratios are fair on a noisy machine:
//! - starts/s of 10 000 background ticker tasks through `TaskRegistry::start`,
//!   against a bare baseline (a mutex-guarded map insert plus a spawned timer
//!   per task), and through the whole tool path (`Host::call_tool`);
//! - start cost at 1 000, 10 000 and 50 000 live tasks (flat = O(1));
//! - RSS per live task with 10 000 live tasks, registry vs baseline.
//!
//! `-- --only registry|baseline` runs one side's starts alone (for `perf record`,
//! or for instructions per start, which the machine's load cannot change:
//! `REGISTRY_BENCH_ROUNDS=2 valgrind --tool=callgrind --toggle-collect='*registry_starts*'
//! --toggle-collect='*baseline_starts*' <bench binary> --only registry`, then the
//! collected total over 20 000);
//! `REGISTRY_BENCH_ROUNDS=n` sets the rounds (5 by default), and the
//! registry/baseline ratio is also printed per round with its median (each
//! round runs both sides back to back, the first side alternating).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use taskhost_core::Host;
use taskhost_core::agents::AgentRegistry;
use taskhost_core::native::ticker::TickerProducer;
use taskhost_core::producer::runner;
use taskhost_core::settings::TasksSettings;
use taskhost_core::tasks::{RegistryConfig, TaskControl, TaskHooks, TaskOutcome, TaskRegistry, TaskStart};
use taskhost_core::tools::CallContext;

const N: usize = 10_000;

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// CPU time of every thread of this process so far (ns, from each thread's
/// `schedstat`): what a side cost, whatever share of the cores it was given.
fn process_cpu_ns() -> u64 {
    let mut total = 0;
    for thread in std::fs::read_dir("/proc/self/task").expect("/proc/self/task").flatten() {
        if let Ok(stat) = std::fs::read_to_string(thread.path().join("schedstat")) {
            total += stat.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    total
}

fn registry() -> (TaskRegistry, taskhost_core::tasks::SurfaceGuard) {
    let registry = TaskRegistry::new(
        AgentRegistry::new(),
        // No history bound either: every finished task stays readable until
        // the round reads it (the default keeps 100, so a round's first
        // tasks would be gone before they are waited for).
        RegistryConfig {
            max_live_tasks_per_owner: usize::MAX,
            max_finished_tasks_per_owner: usize::MAX,
            ..Default::default()
        },
    );
    let surface = registry.attach_surface("bench");
    (registry, surface)
}

/// The trivial native kind: a timer that completes after `interval`.
struct Timer(tokio::sync::Notify);

#[async_trait::async_trait]
impl TaskControl for Timer {
    async fn cancel(&self, _reason: Option<&str>) -> anyhow::Result<()> {
        self.0.notify_one();
        Ok(())
    }

    fn streams_output(&self) -> bool {
        false
    }
}

fn timer_start(interval: Duration) -> TaskStart {
    let run = runner(async move {
        let timer = Arc::new(Timer(tokio::sync::Notify::new()));
        let control = timer.clone();
        let done = async move {
            tokio::select! {
                _ = tokio::time::sleep(interval) => Ok(TaskOutcome::completed(None)),
                _ = timer.0.notified() => Ok(TaskOutcome::killed(None)),
            }
        };
        Ok(TaskHooks::new(control, Box::pin(done)))
    });
    TaskStart::new("timer", "timer", run)
}

/// Starts `n` timer tasks settling after `interval_ms`; returns starts/s.
async fn registry_starts(
    registry: &TaskRegistry,
    n: usize,
    interval_ms: u64,
) -> (f64, Vec<taskhost_core::ids::TaskId>) {
    let mut ids = Vec::with_capacity(n);
    let interval = Duration::from_millis(interval_ms);
    let started = Instant::now();
    for _ in 0..n {
        ids.push(registry.start(timer_start(interval)).await.unwrap());
    }
    (n as f64 / started.elapsed().as_secs_f64(), ids)
}

/// The bare baseline: what any registry must do at least — a map insert and a timer.
struct Baseline {
    map: Arc<Mutex<HashMap<u64, (String, bool)>>>,
}

impl Baseline {
    fn start(&self, id: u64, interval: Duration) {
        self.map.lock().unwrap().insert(id, (format!("ticker-{id}"), false));
        let map = self.map.clone();
        tokio::spawn(async move {
            tokio::time::sleep(interval).await;
            if let Some(entry) = map.lock().unwrap().get_mut(&id) {
                entry.1 = true;
            }
        });
    }
}

fn baseline_starts(n: usize, interval: Duration) -> (f64, Baseline) {
    let baseline = Baseline { map: Arc::new(Mutex::new(HashMap::new())) };
    let started = Instant::now();
    for id in 0..n as u64 {
        baseline.start(id, interval);
    }
    (n as f64 / started.elapsed().as_secs_f64(), baseline)
}

async fn wait_all_settled(registry: &TaskRegistry, ids: &[taskhost_core::ids::TaskId]) {
    for id in ids {
        registry.wait(id, Duration::from_secs(60), None, None).await.unwrap();
        registry.read(id, None).await.unwrap();
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(pos) = args.iter().position(|a| a == "--memory") {
        return memory_probe(&args[pos + 1]).await;
    }
    if let Some(pos) = args.iter().position(|a| a == "--only") {
        let what = args[pos + 1].clone();
        return tokio::spawn(async move { starts_only(&what).await }).await.unwrap();
    }
    // Run on a worker thread, as tool calls do in a server: spawns go to the
    // worker's local queue instead of waking the runtime from outside.
    tokio::spawn(run_benchmarks()).await.unwrap();
}

/// `REGISTRY_BENCH_ROUNDS`, or `default` when it is unset or not a number.
fn rounds_or(default: usize) -> usize {
    std::env::var("REGISTRY_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(default)
}

async fn run_benchmarks() {
    // Rounds interleave registry and baseline, so each round's ratio is
    // measured under the same load; the median of those ratios is the
    // figure to quote on a busy machine. The side that goes first alternates
    // from round to round, so neither always runs right after the tool path.
    let rounds = rounds_or(5);
    println!("registry benchmark: {N} tasks per round, {rounds} rounds, median reported");

    // Throughput: registry vs baseline vs full tool path, interleaved per round.
    let (mut reg, mut base, mut tool, mut cycle) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // CPU per side during its starts (all threads: the settles of timers
    // that fire meanwhile included), baseline over registry: a cost ratio
    // the share of the cores a side was given cannot skew (printed beside
    // the wall-clock figures, which remain the goal's measure).
    let mut cpu_ratios = Vec::new();
    let mut cpu = [0u64; 2];
    for round in 0..rounds {
        for side in [round % 2, 1 - round % 2] {
            if side == 0 {
                let (registry, _surface) = registry();
                let cpu_before = process_cpu_ns();
                let started = Instant::now();
                let (rate, ids) = registry_starts(&registry, N, 1).await;
                cpu[0] = process_cpu_ns() - cpu_before;
                wait_all_settled(&registry, &ids).await;
                cycle.push(N as f64 / started.elapsed().as_secs_f64());
                reg.push(rate);
                registry.dispose().await;
            } else {
                let cpu_before = process_cpu_ns();
                let (rate, baseline) = baseline_starts(N, Duration::from_millis(1));
                cpu[1] = process_cpu_ns() - cpu_before;
                base.push(rate);
                tokio::time::sleep(Duration::from_millis(20)).await;
                drop(baseline);
            }
        }
        cpu_ratios.push(cpu[1] as f64 / cpu[0] as f64);

        let host = Host::new(&TasksSettings { max_live_tasks_per_owner: usize::MAX, ..Default::default() }).unwrap();
        host.add_producer_named("ticker", Arc::new(TickerProducer::new(&json!({})).unwrap()))
            .expect("tool name is valid");
        let context = CallContext::default();
        let args = json!({"count": 1, "interval_ms": 1, "run_in_background": true});
        let started = Instant::now();
        for _ in 0..N {
            host.call_tool("ticker", args.clone(), &context).await.unwrap();
        }
        tool.push(N as f64 / started.elapsed().as_secs_f64());
        host.dispose().await;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let mut round_ratios: Vec<f64> = reg.iter().zip(&base).map(|(r, b)| r / b).collect();
    let (reg, base, tool, cycle) = (median(&mut reg), median(&mut base), median(&mut tool), median(&mut cycle));
    println!("starts/s  registry.start          {reg:>10.0}");
    println!("starts/s  baseline map + timer    {base:>10.0}");
    println!("starts/s  Host::call_tool (full)  {tool:>10.0}");
    println!("tasks/s   start → read → settle   {cycle:>10.0}");
    println!("ratio     registry / baseline     {:>10.2}", reg / base);
    println!("ratio     tool path / baseline    {:>10.2}", tool / base);
    let per_round: Vec<String> = round_ratios.iter().map(|r| format!("{r:.2}")).collect();
    println!(
        "ratio     registry / baseline per round: {} (median {:.2})",
        per_round.join(" "),
        median(&mut round_ratios)
    );
    let per_round: Vec<String> = cpu_ratios.iter().map(|r| format!("{r:.2}")).collect();
    println!(
        "ratio     CPU per start, baseline / registry, per round: {} (median {:.2})",
        per_round.join(" "),
        median(&mut cpu_ratios)
    );

    // O(1) start: cost per start with many tasks already live.
    for live in [1_000usize, 10_000, 50_000] {
        let (registry, _surface) = registry();
        registry_starts(&registry, live, 600_000).await;
        let (rate, _) = registry_starts(&registry, 2_000, 600_000).await;
        println!("start cost with {live:>6} live: {:>7.2} µs", 1e6 / rate);
        registry.dispose().await;
    }

    // Memory per live task, each measured in a fresh process so freed memory
    // of earlier phases cannot hide growth.
    let measure = |what: &str| -> usize {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--memory", what])
            .output()
            .expect("run the memory probe");
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("probe prints bytes per task")
    };
    let (reg_bytes, base_bytes) = (measure("registry"), measure("baseline"));
    println!("RSS per live task  registry {reg_bytes} B, baseline {base_bytes} B");
}

/// `--only registry|baseline`: 50 rounds (`REGISTRY_BENCH_ROUNDS` sets them)
/// of 10 000 starts of one side alone, for `perf record` or callgrind.
async fn starts_only(what: &str) {
    let rounds = rounds_or(50);
    for _ in 0..rounds {
        if what == "registry" {
            let (registry, _surface) = registry();
            let (_, ids) = registry_starts(&registry, N, 1).await;
            wait_all_settled(&registry, &ids).await;
            registry.dispose().await;
        } else {
            let (_, baseline) = baseline_starts(N, Duration::from_millis(1));
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(baseline);
        }
    }
}

/// `--memory registry|baseline`: prints RSS bytes per live task for N live tasks.
async fn memory_probe(what: &str) {
    // Warm the runtime and allocator so the delta is the tasks alone.
    let (registry, _surface) = registry();
    registry_starts(&registry, 100, 1).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = rss_bytes();
    let keep: Box<dyn std::any::Any> = match what {
        "registry" => Box::new(registry_starts(&registry, N, 600_000).await),
        _ => Box::new(baseline_starts(N, Duration::from_secs(600)).1),
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    println!("{}", rss_bytes().saturating_sub(before) / N);
    drop(keep);
}
