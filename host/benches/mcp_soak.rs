//! MCP soak benchmark: `cargo bench -p taskhost --bench mcp_soak [-- --clients N --seconds S]`.
//!
//! N HTTP clients, each with its own token (its own owner), run against the
//! real `taskhost serve --http` binary for S seconds (defaults: 50 clients,
//! 120 s). Each client loops: start a background `bash` task printing
//! numbered lines (`seq 1 LINES`), collect it with `task_output(wait: true)`
//! until it settles, and check every line arrived exactly once and in
//! order. Reports throughput, tools/call latency p50/p99, the server's RSS
//! after warm-up and at the end, and the processes left once the server is
//! stopped with SIGTERM (must be 0).
//!
//! Baseline (same run): the same loop through the in-process library with
//! N agents, for a quarter of the time.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RoleClient};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use taskhost::config::Config;
use taskhost::tools::CallContext;

#[path = "../tests/all/common.rs"]
mod common;

use common::BIN;
use common::procfs::ProcessMark;

/// Numbered lines per task.
const LINES: u64 = 1000;

struct Options {
    clients: usize,
    seconds: u64,
}

fn options() -> Options {
    let mut options = Options { clients: 50, seconds: 120 };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let value = || args.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match args[i].as_str() {
            "--clients" => options.clients = value().expect("--clients N") as usize,
            "--seconds" => options.seconds = value().expect("--seconds S"),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    options
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(run(options()));
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).unwrap().parse().unwrap()
}

fn token(i: usize) -> String {
    format!("soak-token-{i:04}-0123456789abcdef")
}

fn config_text(clients: usize) -> String {
    let mut text = String::from("[tasks]\nmax_live_tasks_per_owner = 10\n");
    for i in 0..clients {
        text.push_str(&format!("[[serve.http.tokens]]\nname = \"client{i}\"\ntoken = \"{}\"\n", token(i)));
    }
    text
}

/// What one loop of one client did.
#[derive(Default)]
struct Tally {
    tasks: u64,
    lines: u64,
    latencies: Vec<Duration>,
}

/// Checks the collected body holds exactly `1..=LINES`, each once, in order.
fn check_lines(body: &str, task: &str) -> u64 {
    let mut expected = 1u64;
    for line in body.lines() {
        assert_eq!(line, expected.to_string(), "task {task}: line {expected} missing, duplicated or out of order");
        expected += 1;
    }
    assert_eq!(expected - 1, LINES, "task {task}: {} of {LINES} lines", expected - 1);
    LINES
}

/// Splits a task_output answer into its body and status line.
fn body_and_status(text: &str) -> (&str, &str) {
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", text));
    (if body == "(no new output)" { "" } else { body }, status)
}

async fn mcp_call(peer: &Peer<RoleClient>, tool: &str, arguments: Value, tally: &mut Tally) -> String {
    let begun = Instant::now();
    let result: CallToolResult = peer
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(arguments.as_object().cloned().unwrap()))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    tally.latencies.push(begun.elapsed());
    assert_ne!(result.is_error, Some(true), "{tool} failed: {:?}", result.content);
    // The first block is the answer; notices may follow.
    result.content[0].as_text().map(|t| t.text.clone()).unwrap_or_default()
}

/// One client's loop until `deadline`, whatever carries its calls: start a
/// background `bash` printing `1..=LINES`, collect it with
/// `task_output(wait: true)` until it settles, check every line.
async fn client_loop(
    mark: &str,
    deadline: Instant,
    mut call: impl AsyncFnMut(&str, Value, &mut Tally) -> String,
) -> Tally {
    let mut tally = Tally::default();
    while Instant::now() < deadline {
        let command = format!("{mark}seq 1 {LINES}");
        let started = call("bash", json!({"command": command, "run_in_background": true}), &mut tally).await;
        let id = started.rsplit(' ').next().unwrap().to_string();
        let mut collected = String::new();
        loop {
            let text = call("task_output", json!({"task_id": id, "wait": true}), &mut tally).await;
            let (body, status) = body_and_status(&text);
            if !body.is_empty() {
                collected.push_str(body);
                collected.push('\n');
            }
            if !status.starts_with("[status: running") {
                assert!(status.starts_with("[status: completed"), "task {id}: {status}");
                break;
            }
        }
        tally.lines += check_lines(&collected, &id);
        tally.tasks += 1;
    }
    tally
}

/// One client's loop over MCP.
async fn mcp_client(peer: Peer<RoleClient>, mark: String, deadline: Instant) -> Tally {
    client_loop(&mark, deadline, async |tool: &str, arguments: Value, tally: &mut Tally| {
        mcp_call(&peer, tool, arguments, tally).await
    })
    .await
}

/// The same loop through the library.
async fn library_client(
    host: taskhost::Host,
    agent: taskhost::agents::Agent,
    mark: String,
    deadline: Instant,
) -> Tally {
    let context = CallContext::for_agent(&agent);
    client_loop(&mark, deadline, async |tool: &str, arguments: Value, tally: &mut Tally| {
        let begun = Instant::now();
        let output = host.call_tool(tool, arguments, &context).await.unwrap();
        tally.latencies.push(begun.elapsed());
        assert!(!output.is_error, "{tool}: {}", output.text);
        output.text
    })
    .await
}

struct Summary {
    tasks: u64,
    lines: u64,
    calls: usize,
    wall: Duration,
    p50: Duration,
    p99: Duration,
}

fn summarize(tallies: Vec<Tally>, wall: Duration) -> Summary {
    let mut latencies: Vec<Duration> = tallies.iter().flat_map(|t| t.latencies.iter().copied()).collect();
    latencies.sort();
    Summary {
        tasks: tallies.iter().map(|t| t.tasks).sum(),
        lines: tallies.iter().map(|t| t.lines).sum(),
        calls: latencies.len(),
        wall,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
    }
}

async fn run(options: Options) {
    let Options { clients, seconds } = options;
    let dir = std::env::temp_dir().join(format!("taskhost-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("soak.toml");
    std::fs::write(&config_path, config_text(clients)).unwrap();
    common::trust(&dir, &config_path);
    let mark = ProcessMark::new("soak");

    let mut command = tokio::process::Command::new(BIN);
    command
        .args(["serve", "--http", "127.0.0.1:0", "--config"])
        .arg(&config_path)
        .current_dir(&dir)
        .env("XDG_STATE_HOME", common::state_home(&dir))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null());
    let (mut server, url) = common::spawn_http_server(command, None).await;
    let pid = server.id().unwrap();
    let mut peers = Vec::new();
    for i in 0..clients {
        let transport = StreamableHttpClientTransport::with_client(
            taskhost::http_client::client(),
            StreamableHttpClientTransportConfig::with_uri(url.clone()).auth_header(token(i)),
        );
        peers.push(().serve(transport).await.unwrap());
    }
    // Warm-up: one task per client, then the RSS the soak starts from.
    let warm = Instant::now() + Duration::from_millis(1);
    futures::future::join_all(peers.iter().map(|p| mcp_client(p.peer().clone(), mark.export(), warm))).await;
    let rss_before = rss_kib(pid);

    let progress = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let runs = peers.iter().map(|p| {
        let progress = progress.clone();
        let run = mcp_client(p.peer().clone(), mark.export(), deadline);
        async move {
            let tally = run.await;
            progress.fetch_add(tally.tasks, Ordering::Relaxed);
            tally
        }
    });
    let tallies = futures::future::join_all(runs).await;
    let soak = summarize(tallies, started.elapsed());
    let rss_after = rss_kib(pid);
    for peer in peers {
        let _ = peer.cancel().await;
    }
    let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    let status = server.wait().await.unwrap();
    assert!(status.success(), "the server exits cleanly on SIGTERM: {status}");
    let left = mark.pids();

    // Baseline: the same loop in process, N agents, a quarter of the time.
    let config = Config::load(&config_path).unwrap();
    let host = taskhost::setup::host_from_config(&config, &dir).await.unwrap();
    let agents: Vec<_> =
        (0..clients).map(|i| host.create_agent(format!("lib{i}"), format!("lib{i}")).unwrap()).collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds.div_ceil(4));
    let runs = agents.into_iter().map(|agent| library_client(host.clone(), agent, mark.export(), deadline));
    let library = summarize(futures::future::join_all(runs).await, started.elapsed());
    host.dispose().await;

    let rate = |s: &Summary| s.tasks as f64 / s.wall.as_secs_f64();
    let line_rate = |s: &Summary| s.lines as f64 / s.wall.as_secs_f64();
    println!("## MCP soak\n");
    // `cargo bench --profile dev` builds with debug assertions: say which.
    let (flag, build) = if cfg!(debug_assertions) { (" --profile dev", "dev profile") } else { ("", "release build") };
    println!(
        "Command: `cargo bench -p taskhost --bench mcp_soak{flag} -- --clients {clients} --seconds {seconds}` \
         ({build}, loopback HTTP, one token per client).\n"
    );
    println!("| metric | taskhost serve --http | baseline: library in process, same run | ratio |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| tasks (`bash seq 1 {LINES}`, background, collected with task_output) | {} in {:.0} s | {} in {:.0} s | |",
        soak.tasks,
        soak.wall.as_secs_f64(),
        library.tasks,
        library.wall.as_secs_f64()
    );
    println!(
        "| throughput | {:.1} tasks/s, {:.0} lines/s | {:.1} tasks/s, {:.0} lines/s | {:.2}× |",
        rate(&soak),
        line_rate(&soak),
        rate(&library),
        line_rate(&library),
        rate(&soak) / rate(&library)
    );
    println!(
        "| tools/call latency p50 / p99 ({} / {} calls) | {} / {} | {} / {} | {:.1}× (p99) |",
        soak.calls,
        library.calls,
        ms(soak.p50),
        ms(soak.p99),
        ms(library.p50),
        ms(library.p99),
        soak.p99.as_secs_f64() / library.p99.as_secs_f64()
    );
    println!("| numbered lines checked (each exactly once, in order) | {} | {} | |", soak.lines, library.lines);
    println!(
        "| server RSS after warm-up → at the end | {:.1} MiB → {:.1} MiB | | {:.2}× |",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        rss_after as f64 / rss_before as f64
    );
    println!("| processes left after SIGTERM | {} | | |", left.len());
    assert!(left.is_empty(), "processes outlived the server: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
