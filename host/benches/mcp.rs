//! MCP surface benchmark: `cargo bench -p taskhost --bench mcp`.
//!
//! Measures, against the real `taskhost serve` binary (release build):
//! - cold start: spawn to the first tools/list answer (stdio), against a
//!   baseline of spawning the same binary for `--version`, the two
//!   interleaved sample by sample (after one unmeasured start that fills the
//!   descriptor cache);
//! - tools/call round trip of `task_list` over stdio and over HTTP, against
//!   the same call through the in-process library, and against the floor
//!   rmcp itself sets: the same client calling a no-op tool of a minimal
//!   rmcp server in this process, over a Unix socket pair (stdio) or
//!   loopback HTTP;
//! - 50 concurrent HTTP clients (one token each) starting background
//!   tickers and collecting them with `task_output(wait: true)`: throughput
//!   and p99, against the same work by 50 agents through the library.
//!
//! `MCP_BENCH_ONLY=cold` measures the cold start only; `MCP_BENCH_BIN=PATH`
//! runs another `taskhost` binary (e.g. main's build, for a before/after in
//! one session) wherever this bench spawns `taskhost` for stdio.
//!
//! Prints a Markdown section for docs/benchmarks-log.md. Numbers vary with the
//! machine; the ratios are measured in one run.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{Peer, RequestContext, RoleClient};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};
use taskhost::config::Config;
use taskhost::tools::CallContext;

#[path = "../tests/all/common.rs"]
mod common;

use common::BIN;

/// The binary the cold-start row measures: `MCP_BENCH_BIN` when set (another
/// build, e.g. main's, for a before/after in one session), else this build's.
fn cold_bin() -> std::ffi::OsString {
    std::env::var_os("MCP_BENCH_BIN").unwrap_or_else(|| BIN.into())
}

/// Samples of each side of the cold-start row (interleaved).
const COLD_STARTS: usize = 60;
const ROUND_TRIPS: usize = 2000;
const CLIENTS: usize = 50;
const TASKS_PER_CLIENT: usize = 40;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(run());
}

struct Stats {
    p50: Duration,
    p99: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |p: f64| samples[((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
    Stats { p50: at(0.50), p99: at(0.99) }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.1}×", a.as_secs_f64() / b.as_secs_f64())
}

/// The table row of the cold start against `taskhost --version`, printed by
/// the whole bench and by `MCP_BENCH_ONLY=cold`.
fn cold_start_row(cold: &Stats, spawn: &Stats) -> String {
    format!(
        "| cold start to first tools/list answer (stdio, p50 / p99 of {COLD_STARTS}) | {} / {} | spawn + exit of `taskhost --version`: {} / {} | {} |",
        ms(cold.p50),
        ms(cold.p99),
        ms(spawn.p50),
        ms(spawn.p99),
        ratio(cold.p50, spawn.p50)
    )
}

fn args(value: Value) -> rmcp::model::JsonObject {
    value.as_object().cloned().unwrap()
}

async fn call(peer: &Peer<RoleClient>, tool: &str, arguments: Value) -> CallToolResult {
    let result = peer.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args(arguments))).await;
    let result = result.unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert_ne!(result.is_error, Some(true), "{tool} failed: {:?}", result.content);
    result
}

fn text(result: &CallToolResult) -> &str {
    &result.content[0].as_text().unwrap().text
}

/// The floor: a minimal rmcp server whose one tool answers at once.
#[derive(Clone)]
struct Noop;

impl ServerHandler for Noop {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object"}).as_object().cloned().unwrap();
        Ok(ListToolsResult::with_all_items(vec![Tool::new("task_list", "no-op", Arc::new(schema))]))
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text("(no background tasks)")]).into())
    }
}

async fn round_trips(peer: &Peer<RoleClient>) -> Stats {
    let mut samples = Vec::new();
    for _ in 0..ROUND_TRIPS {
        let started = Instant::now();
        let result = call(peer, "task_list", json!({})).await;
        samples.push(started.elapsed());
        assert_eq!(text(&result), "(no background tasks)");
    }
    stats(samples)
}

/// rmcp's own cost over a socket pair: the floor for stdio.
async fn floor_socket() -> Stats {
    let (server, client) = tokio::net::UnixStream::pair().unwrap();
    tokio::spawn(async move {
        if let Ok(running) = Noop.serve(server).await {
            let _ = running.waiting().await;
        }
    });
    let client = ().serve(client).await.unwrap();
    let stats = round_trips(client.peer()).await;
    let _ = client.cancel().await;
    stats
}

/// rmcp's own cost over loopback HTTP (stateless, JSON responses): the floor for HTTP.
async fn floor_http() -> Stats {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let config = StreamableHttpServerConfig::default().with_legacy_session_mode(false).with_json_response(true);
    let service = StreamableHttpService::new(|| Ok(Noop), Arc::new(LocalSessionManager::default()), config);
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let transport = StreamableHttpClientTransport::with_client(
        taskhost::http_client::client(),
        StreamableHttpClientTransportConfig::with_uri(url),
    );
    let client = ().serve(transport).await.unwrap();
    let stats = round_trips(client.peer()).await;
    let _ = client.cancel().await;
    server.abort();
    stats
}

/// taskhost's MCP surface (line guard included) in process over a socket
/// pair: the process boundary taken out.
async fn surface_socket(config: &Config) -> Stats {
    let host = taskhost::setup::host_from_config(config, std::path::Path::new(".")).await.unwrap();
    let server = taskhost::mcp::McpServer::new(host.clone(), config.serve.clone());
    let (server_end, client_end) = tokio::net::UnixStream::pair().unwrap();
    let (read, write) = server_end.into_split();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let serving = tokio::spawn(taskhost::mcp::stdio::serve_connection(server, read, write, shutdown.clone()));
    let client = ().serve(client_end).await.unwrap();
    let stats = round_trips(client.peer()).await;
    let _ = client.cancel().await;
    shutdown.cancel();
    serving.await.unwrap().unwrap();
    host.dispose().await;
    stats
}

fn config_text() -> String {
    let mut text = String::from("[tasks]\nmax_live_tasks_per_owner = 10\n");
    for i in 0..CLIENTS {
        text.push_str(&format!(
            "[[serve.http.tokens]]\nname = \"client{i}\"\ntoken = \"bench-token-{i:04}-0123456789abcdef\"\n"
        ));
    }
    text
}

/// `taskhost serve` over stdio with the bench's configuration, logging
/// warnings only (and nowhere), so its timing is the server's own.
fn serve_stdio(config_path: &std::path::Path, dir: &std::path::Path) -> tokio::process::Child {
    tokio::process::Command::new(cold_bin())
        .args(["serve", "--config"])
        .arg(config_path)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .env("XDG_STATE_HOME", common::state_home(dir))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn taskhost serve")
}

/// Spawn and exit of `taskhost --version`: the cold start's baseline.
async fn version_spawn() -> Duration {
    let started = Instant::now();
    let status =
        tokio::process::Command::new(cold_bin()).arg("--version").stdout(Stdio::null()).status().await.unwrap();
    assert!(status.success());
    started.elapsed()
}

/// One `taskhost serve` over stdio, from the spawn to the first `tools/list`
/// answer (then closed, and waited for outside the measurement).
async fn cold_start(config_path: &std::path::Path, dir: &std::path::Path) -> Duration {
    let started = Instant::now();
    let mut child = serve_stdio(config_path, dir);
    let client = ().serve((child.stdout.take().unwrap(), child.stdin.take().unwrap())).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(tools.len(), 7, "the default bash and ticker, and the five control tools");
    let _ = client.cancel().await;
    child.wait().await.unwrap();
    elapsed
}

async fn run() {
    let dir = std::env::temp_dir().join(format!("taskhost-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("bench.toml");
    std::fs::write(&config_path, config_text()).unwrap();
    // It lies in the servers' working directory: trusted, as its user would.
    common::trust(&dir, &config_path);
    let config = Config::load(&config_path).unwrap();

    // Cold start to the first tools/list answer over stdio, against the
    // process spawn baseline, interleaved sample by sample so load changes
    // hit both alike. One unmeasured start first: a new build's first start
    // describes the plugin and writes the descriptor cache every later start
    // lists from (what a user's second start sees).
    cold_start(&config_path, &dir).await;
    let mut spawns = Vec::new();
    let mut colds = Vec::new();
    for _ in 0..COLD_STARTS {
        spawns.push(version_spawn().await);
        colds.push(cold_start(&config_path, &dir).await);
    }
    let spawn = stats(spawns);
    let cold = stats(colds);
    if std::env::var("MCP_BENCH_ONLY").is_ok_and(|only| only == "cold") {
        // Only the cold start (`MCP_BENCH_ONLY=cold`), for a quick re-run.
        println!("{}", cold_start_row(&cold, &spawn));
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }

    // In-process baseline: task_list through the library.
    let host = taskhost::setup::host_from_config(&config, &dir).await.unwrap();
    let agent = host.create_agent("bench", "bench").unwrap();
    let context = CallContext::for_agent(&agent);
    let mut library = Vec::new();
    for _ in 0..ROUND_TRIPS {
        let started = Instant::now();
        let output = host.call_tool("task_list", json!({}), &context).await.unwrap();
        library.push(started.elapsed());
        assert_eq!(output.text, "(no background tasks)");
    }
    let library = stats(library);

    // task_list over stdio.
    let mut child = serve_stdio(&config_path, &dir);
    let client = ().serve((child.stdout.take().unwrap(), child.stdin.take().unwrap())).await.unwrap();
    let stdio = round_trips(client.peer()).await;
    let stdio_floor = floor_socket().await;
    let stdio_in_process = surface_socket(&config).await;
    let _ = client.cancel().await;
    child.wait().await.unwrap();

    // The HTTP server.
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(["serve", "--http", "127.0.0.1:0", "--config"])
        .arg(&config_path)
        .current_dir(&dir)
        .env("XDG_STATE_HOME", common::state_home(&dir))
        .env("RUST_LOG", "warn");
    let (mut server, url) = common::spawn_http_server(command, None).await;
    let connect = |i: usize| {
        let transport = StreamableHttpClientTransport::with_client(
            taskhost::http_client::client(),
            StreamableHttpClientTransportConfig::with_uri(url.clone())
                .auth_header(format!("bench-token-{i:04}-0123456789abcdef")),
        );
        async move { ().serve(transport).await.unwrap() }
    };

    let client = connect(0).await;
    let http = round_trips(client.peer()).await;
    let http_floor = floor_http().await;
    let _ = client.cancel().await;

    // 50 concurrent HTTP clients, start + collect.
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        clients.push(connect(i).await);
    }
    let started = Instant::now();
    let runs = clients.iter().map(|client| {
        let peer = client.peer().clone();
        async move {
            let mut latencies = Vec::new();
            for _ in 0..TASKS_PER_CLIENT {
                latencies.push(start_and_collect_mcp(&peer).await);
            }
            latencies
        }
    });
    let latencies: Vec<Duration> = futures::future::join_all(runs).await.into_iter().flatten().collect();
    let http_wall = started.elapsed();
    let http_many = stats(latencies);
    for client in clients {
        let _ = client.cancel().await;
    }
    let _ = std::process::Command::new("kill").args(["-TERM", &server.id().unwrap().to_string()]).status();
    server.wait().await.unwrap();

    // The same concurrent work through the library.
    let agents: Vec<_> =
        (0..CLIENTS).map(|i| host.create_agent(format!("lib{i}"), format!("lib{i}")).unwrap()).collect();
    let started = Instant::now();
    let runs = agents.iter().map(|agent| {
        let host = host.clone();
        let context = CallContext::for_agent(agent);
        async move {
            let mut latencies = Vec::new();
            for _ in 0..TASKS_PER_CLIENT {
                let begun = Instant::now();
                let reply = host
                    .call_tool("ticker", json!({"count": 1, "interval_ms": 0, "run_in_background": true}), &context)
                    .await
                    .unwrap();
                let id = reply.text.rsplit(' ').next().unwrap().to_string();
                let output =
                    host.call_tool("task_output", json!({"task_id": id, "wait": true}), &context).await.unwrap();
                assert!(output.text.ends_with("[status: completed, ticks: 1]"), "{}", output.text);
                latencies.push(begun.elapsed());
            }
            latencies
        }
    });
    let latencies: Vec<Duration> = futures::future::join_all(runs).await.into_iter().flatten().collect();
    let library_wall = started.elapsed();
    let library_many = stats(latencies);
    host.dispose().await;

    let total = (CLIENTS * TASKS_PER_CLIENT) as f64;
    let http_rate = total / http_wall.as_secs_f64();
    let library_rate = total / library_wall.as_secs_f64();
    println!("## MCP\n");
    println!("Command: `cargo bench -p taskhost --bench mcp` (release build, 2-core machine, loopback).\n");
    println!("| metric | taskhost serve | baseline (same run) | ratio |");
    println!("| --- | --- | --- | --- |");
    println!("{}", cold_start_row(&cold, &spawn));
    for (transport, ours, floor, floor_name) in [
        ("stdio", &stdio, &stdio_floor, "no-op tool of a minimal rmcp server, in process, Unix socket pair"),
        ("HTTP", &http, &http_floor, "no-op tool of a minimal rmcp server, in process, loopback HTTP"),
    ] {
        println!(
            "| task_list round trip over {transport} (p50 / p99 of {ROUND_TRIPS}) | {} / {} | {floor_name}: {} / {} | {} |",
            us(ours.p50),
            us(ours.p99),
            us(floor.p50),
            us(floor.p99),
            ratio(ours.p50, floor.p50)
        );
        if transport == "stdio" {
            println!(
                "| (same, against taskhost's MCP surface in process over a socket pair) | | {} / {} | {} |",
                us(stdio_in_process.p50),
                us(stdio_in_process.p99),
                ratio(ours.p50, stdio_in_process.p50)
            );
        }
        println!(
            "| (same, against the in-process library call) | | library `Host::call_tool(\"task_list\")`: {} / {} | {} |",
            us(library.p50),
            us(library.p99),
            ratio(ours.p50, library.p50)
        );
    }
    println!(
        "| {CLIENTS} concurrent HTTP clients × {TASKS_PER_CLIENT} background tickers, start + collect: throughput | {:.0} tasks/s | {CLIENTS} agents in process: {:.0} tasks/s | {:.2}× |",
        http_rate,
        library_rate,
        http_rate / library_rate
    );
    println!(
        "| same, start + collect latency p50 / p99 | {} / {} | {} / {} | {} (p99) |",
        ms(http_many.p50),
        ms(http_many.p99),
        ms(library_many.p50),
        ms(library_many.p99),
        ratio(http_many.p99, library_many.p99)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One background ticker started and collected over MCP; returns the latency.
async fn start_and_collect_mcp(peer: &Peer<RoleClient>) -> Duration {
    let begun = Instant::now();
    let started = call(peer, "ticker", json!({"count": 1, "interval_ms": 0, "run_in_background": true})).await;
    let id = text(&started).rsplit(' ').next().unwrap().to_string();
    let output = call(peer, "task_output", json!({"task_id": id, "wait": true})).await;
    assert!(text(&output).ends_with("[status: completed, ticks: 1]"), "{}", text(&output));
    begun.elapsed()
}
