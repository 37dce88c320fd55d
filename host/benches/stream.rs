//! Output throughput: a command's stdout read raw, through the `process`
//! capability, and through the registry as a background bash task.
//!
//! Run: `cargo bench -p taskhost --bench stream` (add `-- --quick` for
//! 256 MiB per stream instead of 1 GiB; `-- --only registry` (or `raw`,
//! `capability`) runs one way alone, for a profiler). Prints one table;
//! docs/benchmarks-log.md quotes it.
//!
//! Each round streams `head -c <size> /dev/zero` three ways, in a shuffled
//! order, and the table gives the median of the rounds:
//! 1. the baseline: its stdout read straight from a pipe by tokio (64 KiB
//!    reads);
//! 2. the capability's consuming reads (a reader awaiting `ready` and
//!    taking every chunk);
//! 3. the whole model path: `Host::call_tool("bash", {command, run_in_background})`
//!    on the built-in wasm bash plugin, then the registry's consuming reads
//!    (`TaskRegistry::read`, the default 64 KiB read limit) until the task
//!    is finished: the plugin forwards the process's output to the host
//!    (`process.forward-output`, contract 0.2.1), whose reader task formats
//!    it into the task's sink, the registry drains that into the task's
//!    output log as it appears, the reader takes it. Two
//!    readers: one that waits for the registry's next event after a read
//!    that found nothing (as a UI does), one that polls in a loop;
//! 4. the same task with nobody reading until it finished (the drain alone).
//!
//! Reported: wall time from the start call to the last byte, throughput,
//! the share of bytes the reader received (a reader that falls more than
//! the read limit behind is told what it skipped; the log keeps it), and
//! the growth of the host's peak RSS (`VmHWM`).

mod common;

#[path = "common/raw_pipe.rs"]
mod raw_pipe;

use std::time::{Duration, Instant};

use serde_json::json;
use taskhost::Host;
use taskhost::process::{ProcessGrant, ProcessHost, ProcessHostConfig, SpawnRequest, Stream};
use taskhost::tools::CallContext;

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// One streamed run: wall time and the bytes the reader received.
struct Run {
    time: Duration,
    delivered: u64,
    /// Reads that said output was dropped or skipped.
    notices: u64,
    reads: u64,
}

async fn raw_pipe(size: u64) -> Run {
    let t = Instant::now();
    let (delivered, reads) = raw_pipe::stream(size).await;
    Run { time: t.elapsed(), delivered, notices: 0, reads }
}

async fn capability(host: &ProcessHost, grant: &ProcessGrant, size: u64) -> Run {
    let request = SpawnRequest {
        argv: vec!["head".into(), "-c".into(), size.to_string(), "/dev/zero".into()],
        ..Default::default()
    };
    let t = Instant::now();
    let process = host.spawn(grant, request, &tracing::Span::none()).await.unwrap();
    let (mut delivered, mut reads, mut notices) = (0u64, 0u64, 0u64);
    loop {
        process.ready().await;
        let done = process.exit_status().is_some();
        let chunk = process.read(Stream::Stdout);
        delivered += chunk.data.len() as u64;
        reads += 1;
        notices += chunk.dropped as u64;
        if done {
            break;
        }
    }
    Run { time: t.elapsed(), delivered, notices, reads }
}

/// Starts the task and reads nothing until it finished (one read then):
/// the registry's drain alone.
async fn drain_only(tools: &Host, context: &CallContext, agent: &taskhost::agents::Agent, size: u64) -> Run {
    let t = Instant::now();
    let args = json!({"command": format!("head -c {size} /dev/zero"), "run_in_background": true});
    let reply = tools.call_tool("bash", args, context).await.unwrap();
    let id = reply.started.expect("a background start");
    let finished = tools.registry().wait(&id, Duration::from_secs(120), Some(agent), None).await.unwrap();
    assert!(finished.status.is_terminal(), "the stream did not finish within 120 s");
    let time = t.elapsed();
    let read = tools.registry().read(&id, Some(agent)).await.unwrap();
    let kept = read.text.split_once('\n').map_or(0, |(_, rest)| rest.len()) as u64;
    Run { time, delivered: kept, notices: 1, reads: 1 }
}

/// Reads a background bash task to its end. `on_events`: between reads
/// that found nothing, wait for the registry's next event (as an embedder's
/// UI does); otherwise poll, yielding between reads.
async fn registry(
    tools: &Host,
    context: &CallContext,
    agent: &taskhost::agents::Agent,
    size: u64,
    on_events: bool,
) -> Run {
    let mut events = tools.registry().subscribe();
    let t = Instant::now();
    let args = json!({"command": format!("head -c {size} /dev/zero"), "run_in_background": true});
    let reply = tools.call_tool("bash", args, context).await.unwrap();
    let id = reply.started.expect("a background start");
    let (mut delivered, mut reads, mut notices) = (0u64, 0u64, 0u64);
    loop {
        let read = tools.registry().read(&id, Some(agent)).await.unwrap();
        reads += 1;
        // The output is NUL bytes; a notice is a line of its own in front.
        let mut text = read.text.as_str();
        if text.starts_with('[') {
            notices += 1;
            text = text.split_once('\n').map_or("", |(_, rest)| rest);
        }
        delivered += text.len() as u64;
        if read.snapshot.status.is_terminal() {
            break;
        }
        if read.text.is_empty() {
            if on_events {
                // Any event will do: a read tells whether it was ours.
                let _ = events.recv().await;
            } else {
                tokio::task::yield_now().await;
            }
        }
    }
    Run { time: t.elapsed(), delivered, notices, reads }
}

fn main() {
    // Process trees start as this binary in keeper mode, as in `taskhost`.
    taskhost::process::keeper::run_if_keeper();
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime").block_on(run());
}

async fn run() {
    let quick = std::env::args().any(|a| a == "--quick");
    let size: u64 = if quick { 256 << 20 } else { 1 << 30 };
    let rounds = 5;
    let args: Vec<String> = std::env::args().collect();
    let only = args.iter().position(|a| a == "--only").and_then(|at| args.get(at + 1)).map(|way| {
        ["raw", "capability", "registry", "polling", "drain"]
            .iter()
            .position(|name| name == way)
            .unwrap_or_else(|| panic!("--only takes raw, capability or registry, not {way:?}"))
    });
    let host = ProcessHost::new(&ProcessHostConfig::default()).unwrap();
    let grant = ProcessGrant { programs: vec!["bash".into(), "head".into()], ..ProcessGrant::default() };
    println!("confinement: {}", host.support().describe());

    let (_engine, producer) = common::bash_producer(&host, &grant).await;
    let tools = common::bash_tool(producer);
    let agent = tools.create_agent("bench", "bench").unwrap();
    let context = CallContext::for_agent(&agent);

    const NAMES: [&str; 5] = [
        "tokio pipe read (baseline)",
        "process capability reads",
        "registry reads, bash task",
        "  the same, polling reader",
        "  nobody reading (drain only)",
    ];
    let mut throughput: [Vec<f64>; 5] = Default::default();
    let mut delivered: [Vec<f64>; 5] = Default::default();
    let mut last: [Option<Run>; 5] = Default::default();
    let hwm_before = status_kib("VmHWM:").max(status_kib("VmRSS:"));
    let mut order = [0usize, 1, 2, 3, 4];
    let mut seed = 0x9e37_79b9_u32;
    for _ in 0..rounds {
        for k in (1..order.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            order.swap(k, seed as usize % (k + 1));
        }
        let ways = only.map_or(order.to_vec(), |way| vec![way]);
        for way in ways {
            let run = match way {
                0 => raw_pipe(size).await,
                1 => capability(&host, &grant, size).await,
                2 => registry(&tools, &context, &agent, size, true).await,
                3 => registry(&tools, &context, &agent, size, false).await,
                _ => drain_only(&tools, &context, &agent, size).await,
            };
            throughput[way].push(mib(size) / run.time.as_secs_f64());
            delivered[way].push(100.0 * run.delivered as f64 / size as f64);
            last[way] = Some(run);
        }
    }
    let hwm_after = status_kib("VmHWM:");
    if let Some(way) = only {
        let rate = median(&mut throughput[way]);
        let growth = hwm_after.saturating_sub(hwm_before) as f64 / 1024.0;
        println!("{}: {rate:.0} MiB/s, median of {rounds} rounds; host peak RSS growth {growth:.1} MiB", NAMES[way]);
        return;
    }
    let base = median(&mut throughput[0].clone());
    println!("stream {} MiB of stdout, median of {rounds} rounds (shuffled order per round):", size >> 20);
    for way in 0..NAMES.len() {
        let rate = median(&mut throughput[way]);
        let run = last[way].as_ref().unwrap();
        println!(
            "  {:<28} {:>7.0} MiB/s ({:>6.1?} last run)  delivered {:>5.1}%  {:>6} reads, {:>4} notices  ratio {:.2}x",
            NAMES[way],
            rate,
            run.time,
            median(&mut delivered[way]),
            run.reads,
            run.notices,
            rate / base
        );
    }
    println!("  host peak RSS growth over all rounds {:.1} MiB", hwm_after.saturating_sub(hwm_before) as f64 / 1024.0);
    tools.dispose().await;
}
