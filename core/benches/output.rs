//! Output benchmark: the per-task output log (`tasks::output`) under a
//! 64 MiB stream, against in-memory baselines measured in the same run.
//!
//! Run: `cargo bench -p taskhost-core --bench output`
//!
//! - Ingest: 64 MiB of 70-byte lines pushed by a scripted stream task in
//!   64 KiB chunks and taken by consuming `TaskRegistry::read`s as fast as
//!   they come (the host drains each chunk into the log as its signal fires;
//!   the first 64 MiB also go to the task's spill file), against copying
//!   the same chunks into one `Vec` (the floor: every byte moved once).
//! - Views of the finished 64 MiB output: `tail` (40 lines, from memory),
//!   `head` (40 lines, from the spill file) and `grep` for one line (every
//!   line of the spill file scanned), p50 of repeated calls; `grep` against
//!   the same regex over the same lines held in memory.
//! - Peak RSS growth of the process across the whole run (`VmHWM`).

use std::time::{Duration, Instant};

use taskhost_core::agents::AgentRegistry;
use taskhost_core::native::scripted::ScriptedTask;
use taskhost_core::tasks::{
    DEFAULT_OUTPUT_MEMORY_BYTES, DEFAULT_OUTPUT_SPILL_BYTES, OutputLimits, RegistryConfig, TaskOutcome, TaskRegistry,
    TaskStart, ViewKind, ViewRequest,
};

const TOTAL: usize = 64 << 20;
const CHUNK: usize = 64 * 1024;

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// 64 MiB of 70-byte lines in 64 KiB chunks, built chunk by chunk (no
/// whole copy, so the peak RSS after it is the input itself).
fn chunks() -> Vec<String> {
    let mut chunks = Vec::new();
    let mut chunk = String::with_capacity(CHUNK + 128);
    let (mut n, mut total) = (0u64, 0usize);
    while total < TOTAL {
        n += 1;
        let line = format!("line {n:>10}: the quick brown fox jumps over the lazy dog {:06}\n", n % 997);
        total += line.len();
        chunk.push_str(&line);
        if chunk.len() >= CHUNK {
            chunks.push(std::mem::replace(&mut chunk, String::with_capacity(CHUNK + 128)));
        }
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    chunks
}

fn p50(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::main]
async fn main() {
    tokio::spawn(run()).await.unwrap();
}

async fn run() {
    let hwm_start = status_kib("VmHWM:");
    let chunks = chunks();
    let bytes: usize = chunks.iter().map(String::len).sum();
    let hwm_with_input = status_kib("VmHWM:");
    println!(
        "output benchmark: {:.0} MiB in {} chunks of {} KiB",
        bytes as f64 / (1 << 20) as f64,
        chunks.len(),
        CHUNK / 1024
    );

    let spill_parent = std::env::temp_dir().join(format!("taskhost-output-bench-{}", std::process::id()));
    let registry = TaskRegistry::new(
        AgentRegistry::new(),
        RegistryConfig {
            output: OutputLimits::new(DEFAULT_OUTPUT_MEMORY_BYTES, DEFAULT_OUTPUT_SPILL_BYTES, 1 << 20)
                .with_spill_dir(Some(spill_parent.clone())),
            ..RegistryConfig::default()
        },
    );
    let _surface = registry.attach_surface("bench");
    let task = ScriptedTask::new(true);
    let id = registry.start(TaskStart::new("stream", "64 MiB", task.runner())).await.unwrap();
    let t = Instant::now();
    let mut delivered = 0usize;
    let mut skipped_reads = 0;
    for chunk in &chunks {
        task.push_output(chunk);
        // Let the drain run as it would between a producer's chunks.
        tokio::task::yield_now().await;
        let read = registry.read(&id, None).await.unwrap();
        if read.text.starts_with('[') {
            skipped_reads += 1;
        }
        delivered += read.text.len();
    }
    let ingest = t.elapsed();
    let rss_after_ingest = status_kib("VmRSS:");
    task.settle(TaskOutcome::completed(None));
    registry.wait(&id, Duration::from_secs(10), None, None).await.unwrap();
    println!(
        "ingest + consuming reads  {ingest:>10.1?}  ({:.0} MiB/s, {:.1}% delivered, {skipped_reads} reads with a skip note)",
        bytes as f64 / (1 << 20) as f64 / ingest.as_secs_f64(),
        100.0 * delivered as f64 / bytes as f64
    );

    let view = |kind, lines, grep: Option<&str>| ViewRequest {
        kind,
        lines,
        grep: grep.map(|g| regex::Regex::new(g).unwrap()),
    };
    let time_view = async |request: ViewRequest, rounds: usize| {
        let mut samples = Vec::new();
        let mut text = String::new();
        for _ in 0..rounds {
            let t = Instant::now();
            text = registry.view(&id, None, &request).await.unwrap().0;
            samples.push(t.elapsed());
        }
        (p50(&mut samples), text)
    };
    let (tail, text) = time_view(view(ViewKind::Tail, 40, None), 200).await;
    assert_eq!(text.lines().count(), 40);
    let (head, text) = time_view(view(ViewKind::Head, 40, None), 200).await;
    assert!(text.starts_with("line          1:"));
    let needle = "^line     500000:";
    let (grep, text) = time_view(view(ViewKind::All, 40, Some(needle)), 5).await;
    assert!(text.starts_with("500000: line     500000:"), "{text}");

    // Baseline for grep: the same regex over the same lines, in memory.
    let regex = regex::Regex::new(needle).unwrap();
    let mut in_memory = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mut found = 0;
        for chunk in &chunks {
            for line in chunk.split('\n') {
                if regex.is_match(line) {
                    found += 1;
                }
            }
        }
        std::hint::black_box(found);
        in_memory.push(t.elapsed());
    }
    let in_memory = p50(&mut in_memory);
    println!("view tail 40 lines        {tail:>10.1?}  (p50 of 200)");
    println!("view head 40 lines        {head:>10.1?}  (p50 of 200, from the spill file)");
    println!(
        "view grep, whole output   {grep:>10.1?}  (p50 of 5, spill file scanned); same regex over the lines in memory {in_memory:.1?}: ratio {:.2}x",
        grep.as_secs_f64() / in_memory.as_secs_f64()
    );
    // Measured before the baselines below allocate.
    let hwm_end = status_kib("VmHWM:");
    // Baseline: every byte copied once.
    let mut floor = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let mut sink: Vec<u8> = Vec::with_capacity(bytes);
        for chunk in &chunks {
            sink.extend_from_slice(chunk.as_bytes());
        }
        std::hint::black_box(&sink);
        floor.push(t.elapsed());
    }
    let floor = p50(&mut floor);

    println!(
        "copy into one Vec (floor) {floor:>10.1?}  ratio ours/floor in throughput {:.2}x",
        floor.as_secs_f64() / ingest.as_secs_f64()
    );
    println!(
        "peak RSS growth beyond the benchmark's own 64 MiB input: {:.1} MiB (RSS after ingest: +{:.1} MiB)",
        hwm_end.saturating_sub(hwm_with_input) as f64 / 1024.0,
        rss_after_ingest.saturating_sub(hwm_with_input) as f64 / 1024.0
    );
    let _ = hwm_start;
    registry.dispose().await;
    drop(registry);
    let _ = std::fs::remove_dir_all(&spill_parent);
}
