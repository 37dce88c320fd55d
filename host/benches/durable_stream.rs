//! Consuming reads of a durable task's output (issue 31's goal: a durable
//! task streaming 1 GiB read >= 0.8x a raw pipe).
//!
//! Run: `cargo bench -p taskhost --bench durable_stream` (`-- --quick`:
//! 256 MiB instead of 1 GiB; `-- --rounds R`, default 3; `-- --only raw`,
//! `durable`, `plain`, `drain` or `floor` runs one way alone, for a
//! profiler). Prints one
//! table; docs/benchmarks-log.md quotes it.
//!
//! One host built as `taskhost serve` builds it (`setup::served_on_state`:
//! SQLite in a fresh state directory, the default bash tool, its grant's
//! spill cap raised to hold the whole stream). Each round streams
//! `head -c <size> /dev/zero` three ways, in a rotating order:
//! 1. the baseline: its stdout read straight from a pipe by tokio (64 KiB
//!    reads);
//! 2. a stable owner's background bash task: a durable tree whose keeper
//!    writes the log, a follower reads it into the task's sink (no guest
//!    call, no host hop per chunk), and the reader takes it with
//!    `TaskRegistry::read` (default 64 KiB read limit) until the task ended,
//!    waiting for the registry's next event after a read that found nothing;
//! 3. for comparison, the same as a plain owner's task (the plugin forwards
//!    the output to the host, as in the `stream` bench);
//! 4. the stable owner's task with nobody reading until it ended (the
//!    keeper, the follower and the registry's drain alone);
//! 5. the floor of any design that keeps the stream in a file of the state
//!    directory: `head -c <size> /dev/zero | cat > <state dir>/floor`, no
//!    taskhost at all (the file is removed after each round).
//!
//! Reported: median MiB/s from the start call to the end, the host's CPU
//! time per GiB (this process: the tree's processes are not in it), the share of
//! bytes the reader received (a read returns at most 64 KiB, the latest: a
//! reader further behind is told what it skipped, and the log keeps it for
//! views, as in the `stream` bench), and the ratio to the baseline.

#[path = "common/raw_pipe.rs"]
mod raw_pipe;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use taskhost::Host;
use taskhost::agents::Agent;
use taskhost::config::Config;
use taskhost::plugin::producer::LoadGate;
use taskhost::setup::served_on_state;
use taskhost::tools::CallContext;

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

struct Run {
    time: Duration,
    delivered: u64,
    reads: u64,
    /// CPU time (user + system) of this process, all threads, over the run:
    /// the host's share (the tree's processes and `head` are not in it).
    cpu: Duration,
}

/// CPU time (user + system) this process used so far, all threads.
fn own_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

async fn raw_pipe(size: u64) -> Run {
    let (t, cpu) = (Instant::now(), own_cpu());
    let (delivered, reads) = raw_pipe::stream(size).await;
    Run { time: t.elapsed(), delivered, reads, cpu: own_cpu() - cpu }
}

/// Starts the stream as `agent`'s background bash task and reads it to its
/// end, waiting for the registry's next event after a read that found
/// nothing.
async fn registry(host: &Host, agent: &Agent, size: u64) -> Run {
    let mut events = host.registry().subscribe();
    let (t, cpu) = (Instant::now(), own_cpu());
    let args = json!({"command": format!("head -c {size} /dev/zero"), "run_in_background": true});
    let reply = host.call_tool("bash", args, &CallContext::for_agent(agent)).await.unwrap();
    let id = reply.started.expect("a background start");
    let (mut delivered, mut reads) = (0u64, 0u64);
    loop {
        let read = host.registry().read(&id, Some(agent)).await.unwrap();
        reads += 1;
        // The output is NUL bytes; a notice (output skipped) is a line of
        // its own in front, counted out.
        let mut text = read.text.as_str();
        if text.starts_with('[') {
            text = text.split_once('\n').map_or("", |(_, rest)| rest);
        }
        delivered += text.len() as u64;
        if read.snapshot.status.is_terminal() {
            break;
        }
        if read.text.is_empty() {
            // Any event will do: the next read tells whether it was ours.
            let _ = events.recv().await;
        }
    }
    Run { time: t.elapsed(), delivered, reads, cpu: own_cpu() - cpu }
}

/// Starts the stream as `agent`'s background bash task and reads nothing
/// until it ended (one read then): the keeper, the follower and the
/// registry's drain alone.
async fn drain_only(host: &Host, agent: &Agent, size: u64) -> Run {
    let (t, cpu) = (Instant::now(), own_cpu());
    let args = json!({"command": format!("head -c {size} /dev/zero"), "run_in_background": true});
    let reply = host.call_tool("bash", args, &CallContext::for_agent(agent)).await.unwrap();
    let id = reply.started.expect("a background start");
    let end = host.registry().wait(&id, Duration::from_secs(300), Some(agent), None).await.unwrap();
    assert!(end.status.is_terminal(), "the stream did not end within 300 s");
    let (time, cpu) = (t.elapsed(), own_cpu() - cpu);
    let read = host.registry().read(&id, Some(agent)).await.unwrap();
    let kept = read.text.split_once('\n').map_or(0, |(_, rest)| rest.len()) as u64;
    Run { time, delivered: kept, reads: 1, cpu }
}

/// The file floor: the same bytes piped into a file of the state
/// directory by `cat`.
async fn file_floor(state: &Path, size: u64) -> Run {
    std::fs::create_dir_all(state).unwrap();
    let file = state.join("floor");
    let (t, cpu) = (Instant::now(), own_cpu());
    let status = tokio::process::Command::new("sh")
        .args(["-c", &format!("head -c {size} /dev/zero | cat > '{}'", file.display())])
        .status()
        .await
        .unwrap();
    let time = t.elapsed();
    assert!(status.success());
    let delivered = std::fs::metadata(&file).unwrap().len();
    std::fs::remove_file(&file).unwrap();
    Run { time, delivered, reads: 0, cpu: own_cpu() - cpu }
}

fn main() {
    // Process trees start as this binary in keeper mode, as in `taskhost`.
    taskhost::process::keeper::run_if_keeper();
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime").block_on(run());
}

async fn run() {
    let args: Vec<String> = std::env::args().collect();
    let size: u64 = if args.iter().any(|a| a == "--quick") { 256 << 20 } else { 1 << 30 };
    let only = args.iter().position(|a| a == "--only").and_then(|at| args.get(at + 1)).map(|way| {
        ["raw", "durable", "plain", "drain", "floor"].iter().position(|name| name == way).unwrap_or_else(|| {
            panic!("--only takes raw, durable, plain, drain or floor, not {way:?}");
        })
    });
    let rounds: usize =
        args.iter().position(|a| a == "--rounds").and_then(|at| args.get(at + 1)).map_or(3, |n| n.parse().unwrap());
    let dir = tempfile::Builder::new().prefix("taskhost-durable-stream-").tempdir().unwrap();
    let mut config = Config::default();
    config.state.dir = Some(dir.path().join("state"));
    config.plugins.cache_dir = Some(dir.path().join("cache"));
    // A durable tree's logs hold the grant's spill cap at most (64 MiB by
    // default): room for the whole stream, for both owners alike.
    config.process.spill_bytes_per_owner = 4 * size;
    let mut producers = Config::default_producers();
    let bash = producers.iter_mut().find(|p| p.tool == "bash").unwrap();
    bash.grants.process.as_mut().unwrap().limits.spill_cap_bytes = 2 * size;
    config.producers = producers;

    let served = served_on_state(&config, Path::new("."), LoadGate::open_now(), None).await.unwrap();
    let (host, plugins) = (served.host, served.plugins);
    for served in plugins {
        served.plugin.await.unwrap();
    }
    let stable = host.create_durable_agent("owner:bench", "owner:bench").unwrap();
    let plain = host.create_agent("stdio-bench", "stdio-bench").unwrap();

    const NAMES: [&str; 5] = [
        "tokio pipe read (baseline)",
        "durable task, registry reads",
        "  plain task, registry reads",
        "  durable task, nobody reading",
        "  floor: pipe | cat > state file",
    ];
    let mut throughput: [Vec<f64>; 5] = Default::default();
    let mut delivered: [Vec<f64>; 5] = Default::default();
    let mut last: [Option<Run>; 5] = Default::default();
    let mut cpu: [Vec<f64>; 5] = Default::default();
    for round in 0..rounds {
        for k in 0..NAMES.len() {
            let way = (round + k) % NAMES.len();
            if only.is_some_and(|only| only != way) {
                continue;
            }
            let run = match way {
                0 => raw_pipe(size).await,
                1 => registry(&host, &stable, size).await,
                2 => registry(&host, &plain, size).await,
                3 => drain_only(&host, &stable, size).await,
                _ => file_floor(&dir.path().join("state"), size).await,
            };
            throughput[way].push(mib(size) / run.time.as_secs_f64());
            delivered[way].push(100.0 * run.delivered as f64 / size as f64);
            cpu[way].push(run.cpu.as_secs_f64() * 1000.0 / mib(size) * 1024.0);
            last[way] = Some(run);
        }
    }
    if let Some(way) = only {
        let rate = median(&mut throughput[way]);
        println!(
            "{}: {rate:.0} MiB/s, median of {rounds} rounds; host CPU {:.0} ms per GiB",
            NAMES[way],
            median(&mut cpu[way])
        );
        host.dispose().await;
        return;
    }
    let base = median(&mut throughput[0].clone());
    println!("stream {} MiB of stdout, median of {rounds} rounds (rotating order):", size >> 20);
    for way in 0..NAMES.len() {
        let mut all = throughput[way].clone();
        all.sort_by(f64::total_cmp);
        let rate = median(&mut throughput[way]);
        let run = last[way].as_ref().unwrap();
        println!(
            "  {:<30} {:>7.0} MiB/s (rounds {all:.0?}; last {:>6.2?}, {:>6} reads)  delivered {:>5.1}%  \
             host CPU {:>5.0} ms/GiB  ratio {:.2}x",
            NAMES[way],
            rate,
            run.time,
            run.reads,
            median(&mut delivered[way]),
            median(&mut cpu[way]),
            rate / base
        );
    }
    host.dispose().await;
}
