//! Issue 30 through `taskhost serve` and a real MCP client: what the model is
//! told about output is complete and true.
//!
//! - 10 MiB of background output read to the end: every skip names its
//!   lines and a file; the skipped bytes come back both ways (the `lines`
//!   view, and the owner's own command reading the file) and match the
//!   command's output byte for byte; another owner's commands cannot read
//!   the file.
//! - Under a CPU-saturated host (a spinner on every core) a plugin's call
//!   deadline never blames the plugin for the host's spawn.
//! - 50 owners × 110 tasks of 400 KB: the server's resident memory stays
//!   within `[tasks] output_memory_total_bytes` plus a stated overhead.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Client, call, serve_command, temp_dir, texts};
use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use sha2::Digest as _;

/// `taskhost serve --http` with one token per name (`<name>-secret-…`).
struct HttpServer {
    child: tokio::process::Child,
    mcp: String,
    dir: std::path::PathBuf,
}

fn token(name: &str) -> String {
    format!("{name}-secret-0123456789abcdef")
}

impl HttpServer {
    async fn start(tag: &str, names: &[String], extra: &str) -> Self {
        let dir = temp_dir(tag);
        let mut config = String::new();
        for name in names {
            config.push_str(&format!(
                "[[serve.http.tokens]]\nname = \"{name}\"\ntoken_env = \"TASKHOST_TEST_{}\"\n\n",
                name.to_uppercase().replace('-', "_")
            ));
        }
        config.push_str(extra);
        let mut command = serve_command(&dir, Some(&config));
        command.args(["--http", "127.0.0.1:0"]).env("RUST_LOG", "info");
        for name in names {
            command.env(format!("TASKHOST_TEST_{}", name.to_uppercase().replace('-', "_")), token(name));
        }
        let (child, mcp) = common::spawn_http_server(command, Some(dir.join("stderr.log"))).await;
        Self { child, mcp, dir }
    }

    async fn client(&self, name: &str) -> Client {
        let transport = StreamableHttpClientTransport::with_client(
            taskhost::http_client::client(),
            StreamableHttpClientTransportConfig::with_uri(self.mcp.clone()).auth_header(token(name)),
        );
        ().serve(transport).await.expect("initialize over HTTP")
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    async fn stop(mut self) {
        let pid = self.pid();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
        let status =
            tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await.expect("exits on SIGTERM").unwrap();
        assert!(status.success(), "exit status {status}");
        // Kept when the test fails before this (its logs are there); the
        // 50-owner run leaves about 2 GiB of task logs otherwise.
        let _ = std::fs::remove_dir_all(format!("{}-state", self.dir.display()));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The reply of a tool call (its first text block; notices may follow).
async fn reply(client: &Client, tool: &str, arguments: Value) -> String {
    texts(&call(client.peer(), tool, arguments).await).remove(0)
}

/// Starts a background bash command and returns its task id.
async fn start(client: &Client, command: &str) -> String {
    common::started_task(&call(client.peer(), "bash", json!({"command": command, "run_in_background": true})).await)
}

/// `[<n> bytes of output skipped here (lines <a>-<b>); …; your commands can
/// read them in the full output: <path>]`: `(n, a, b, path)`.
fn skip_note(line: &str) -> Option<(usize, u64, u64, String)> {
    let rest = line.strip_prefix('[')?;
    let (bytes, rest) = rest.split_once(" bytes of output skipped here (lines ")?;
    let (range, rest) = rest.split_once(')')?;
    let (first, last) = range.split_once('-')?;
    let path = rest.split_once("; your commands can read them in the full output: ")?.1.strip_suffix(']')?;
    Some((bytes.parse().ok()?, first.parse().ok()?, last.parse().ok()?, path.to_string()))
}

fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Issue 30, item 1: 10 MiB read to the end over MCP; every skipped byte
/// comes back through the `lines` view and through the file, as the command
/// printed it; bob's commands cannot read alice's file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_mib_of_background_output_is_read_to_the_end_and_every_skipped_byte_comes_back() {
    let names = ["alice".to_string(), "bob".to_string()];
    let server = HttpServer::start("mcp-10mib", &names, "").await;
    let alice = server.client("alice").await;
    let bob = server.client("bob").await;
    const LINES: u64 = 750_000;
    let expected: String = (1..=LINES).map(|n| format!("line {n:08}\n")).collect();
    assert!(expected.len() > 10 << 20, "{} bytes", expected.len());
    let id = start(&alice, &format!("seq -f 'line %08g' 1 {LINES}")).await;

    // Consuming reads until the end, each checked against the command's
    // output where it must lie; skips are retrieved both ways.
    let mut at = 0usize;
    let mut skips = 0;
    let mut path_seen = None;
    loop {
        let text = reply(&alice, "task_output", json!({"task_id": id, "wait": true, "timeout_ms": 200})).await;
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
        let mut body = if body == "(no new output)" { "" } else { body };
        if let Some((first_line, rest)) = body.split_once('\n')
            && let Some((bytes, first, last, path)) = skip_note(first_line)
        {
            body = rest;
            skips += 1;
            // The lines view, a page at a time.
            let mut lines = String::new();
            let mut from = first;
            while from <= last {
                let page =
                    reply(&alice, "task_output", json!({"task_id": id, "view": "lines", "from": from, "to": last}))
                        .await;
                let page = page.rsplit_once('\n').unwrap().0;
                let shown: Vec<&str> = page.lines().filter(|l| !l.starts_with("[view cut at ")).collect();
                assert!(!shown.is_empty(), "{page}");
                for line in &shown {
                    lines.push_str(line);
                    lines.push('\n');
                }
                from += shown.len() as u64;
            }
            let line_start = expected[..at].rfind('\n').map_or(0, |n| n + 1);
            assert_eq!(lines, expected[line_start..at + bytes], "lines {first}-{last}, as printed");
            // The owner's own command reads the same bytes from the file.
            let command = format!("sed -n '{first},{last}p' {path} | sha256sum | cut -d' ' -f1");
            let hashed = reply(&alice, "bash", json!({"command": command})).await;
            assert_eq!(
                hashed,
                format!(
                    "{}\n[status: completed, exit code: 0]",
                    sha256_hex(&expected.as_bytes()[line_start..at + bytes])
                )
            );
            at += bytes;
            path_seen = Some(path);
        }
        assert!(expected[at..].starts_with(body), "a read returns the output where it lies (at byte {at})");
        at += body.len();
        // The tool's answer drops the read's final line break.
        if !body.is_empty() && expected.as_bytes().get(at) == Some(&b'\n') {
            at += 1;
        }
        if status != "[status: running]" {
            assert_eq!(status, "[status: completed, exit code: 0]");
            break;
        }
    }
    assert_eq!(at, expected.len(), "every byte was read or retrieved");
    assert!(skips > 0, "10 MiB outran the 64 KiB reads");
    let path = path_seen.expect("a skip named the file");
    // The whole file is the command's output.
    let command = format!("wc -c < {path}; sha256sum < {path} | cut -d' ' -f1");
    let whole = reply(&alice, "bash", json!({"command": command})).await;
    assert_eq!(
        whole,
        format!("{}\n{}\n[status: completed, exit code: 0]", expected.len(), sha256_hex(expected.as_bytes()))
    );
    // Another owner's commands do not see it.
    let probe = format!(
        "head -c 20 {path} >/dev/null 2>&1 && echo read || echo unreadable; \
         ls $(dirname {path}) >/dev/null 2>&1 && echo listed || echo hidden"
    );
    let seen_by_bob = reply(&bob, "bash", json!({"command": probe})).await;
    assert_eq!(seen_by_bob, "unreadable\nhidden\n[status: completed, exit code: 0]", "bob reached alice's log");
    let _ = alice.cancel().await;
    let _ = bob.cancel().await;
    server.stop().await;
}

/// Busy loops on every core until dropped.
struct Spinners {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Spinners {
    fn on_every_core() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n = std::hint::black_box(n.wrapping_mul(6364136223846793005).wrapping_add(1));
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Issue 30, item 3: with a spinner on every core and a call deadline below
/// what a sandboxed spawn takes on such a host, no start fails for the
/// deadline: the spawn is the host's time, not the plugin's. (Without the
/// pause the same run fails: the plugin is blamed for the spawn.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_host_never_blames_the_plugin_for_its_spawns() {
    // Far above what the plugin's own calls take here (0-40 ms: well under a
    // millisecond of CPU, the rest waiting for a core), below what many
    // spawns take on this saturated host (up to hundreds of milliseconds).
    const DEADLINE_MS: u64 = 100;
    // Enough starts at once that some spawns outlast the deadline on a quiet
    // 2-core machine too (at 10, with spawns cached since run N, a CI run saw
    // none: the check at the end then proves nothing and fails).
    const AT_ONCE: usize = 24;
    let config = format!(
        "[tasks]\nmax_live_tasks_per_owner = 100\n\n[plugins]\ncall_deadline_ms = {DEADLINE_MS}\nepoch_tick_ms = 1\n"
    );
    let server = common::StdioServer::start("mcp-saturated", Some(&config)).await;
    let peer = server.client.peer().clone();
    // Warm up once (the keeper, the compile cache), unloaded.
    common::started_task(&call(&peer, "bash", json!({"command": "true", "run_in_background": true})).await);
    let spinners = Spinners::on_every_core();
    let mut took = Vec::new();
    for round in 0..6 {
        // Several at once: the spawns also wait for each other.
        let starts = (0..AT_ONCE).map(|_| {
            let peer = peer.clone();
            async move {
                let started = Instant::now();
                let result = call(&peer, "bash", json!({"command": "true", "run_in_background": true})).await;
                (started.elapsed(), result)
            }
        });
        for (elapsed, result) in futures::future::join_all(starts).await {
            let answer = texts(&result).remove(0);
            assert!(!answer.contains("call deadline"), "round {round} blamed the plugin: {answer}");
            common::started_task(&result);
            took.push(elapsed);
        }
    }
    drop(spinners);
    took.sort();
    let ms = |d: &Duration| d.as_millis();
    println!(
        "starts under load: median {} ms, slowest {} ms (the call deadline is {DEADLINE_MS} ms)",
        ms(&took[took.len() / 2]),
        ms(took.last().unwrap())
    );
    let (status, log) = server.disconnect().await;
    assert!(status.success());
    // The calls the server saw outlast the deadline by the wall clock, the
    // host's spawn included: the old rule would have failed each of them
    // (else the host was not loaded enough for the test to tell anything).
    let outlasted: Vec<(u64, u64)> = log
        .lines()
        .filter(|line| line.contains("guest call outlasted its deadline by the wall clock"))
        .filter_map(|line| {
            let number = |key: &str| line.split_once(key)?.1.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok();
            Some((number("wall_ms=")?, number("own_ms=")?))
        })
        .collect();
    println!("calls that outlasted the {DEADLINE_MS} ms deadline by the wall clock (wall ms, own ms): {outlasted:?}");
    assert!(!outlasted.is_empty(), "no call outlasted the deadline by the wall clock: the test shows nothing");
    assert!(outlasted.iter().all(|&(_, own)| own < DEADLINE_MS), "{outlasted:?}");
}

/// `VmRSS` and `VmHWM` of a process, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's /proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches(" kB").parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Runs `count` background commands for one owner, `at_once` at a time,
/// waiting for each batch to finish (without reading its output).
async fn run_batches(client: &Client, command: &str, count: usize, at_once: usize) {
    let mut left = count;
    while left > 0 {
        let batch = at_once.min(left);
        left -= batch;
        let mut ids = Vec::new();
        for _ in 0..batch {
            ids.push(start(client, command).await);
        }
        loop {
            let rows = reply(client, "task_wait", json!({"task_ids": ids, "timeout_ms": 60_000})).await;
            let live =
                rows.lines().skip(1).filter(|row| row.contains("] running") || row.contains("] stopping")).count();
            let failed = rows
                .lines()
                .skip(1)
                .find(|row| !row.contains("] completed") && !row.contains("] running") && !row.contains("] stopping"));
            assert!(failed.is_none(), "{rows}");
            if live == 0 {
                break;
            }
        }
    }
}

/// Issue 30, item 4: 50 owners each run 110 background commands of 400 KB
/// of output, read by nobody (every owner keeps its last 100 finished
/// tasks: 5 000 tasks, 2 GB of output). The server's resident memory
/// (`/proc/<pid>/status`, its peak `VmHWM`) grows by at most
/// `[tasks] output_memory_total_bytes` (the default, 64 MiB) plus a stated
/// overhead: 5 000 task records, the live tasks' stores and buffers, 50 HTTP
/// sessions, and the allocator's slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_under_50_owners_of_110_tasks_stays_within_the_bound() {
    const OWNERS: usize = 50;
    const TASKS: usize = 110;
    const BOUND_MIB: u64 = 64;
    const OVERHEAD_MIB: u64 = 96;
    let names: Vec<String> = (0..OWNERS).map(|n| format!("owner{n}")).collect();
    // The in-memory store: HTTP tokens are stable owners, whose background
    // commands would otherwise be durable trees (a keeper that outlives the
    // server, log files and a socket each, followed through the logs), which
    // the readopt suite measures; this test measures the output bound.
    let server = HttpServer::start("mcp-memory", &names, "[state]\nstore = \"memory\"\n").await;
    let pid = server.pid();
    let mut clients = Vec::new();
    for name in &names {
        clients.push(server.client(name).await);
    }
    // Warm: every owner's session, a task each (the keeper, the plugin).
    let warm = clients.iter().map(|client| run_batches(client, "echo warm", 1, 1));
    futures::future::join_all(warm).await;
    let (baseline, _) = memory_kib(pid);
    let started = Instant::now();
    // 4 000 lines of 100 bytes, from bash alone (one process per task).
    let command = "printf '%099d\\n' {1..4000}";
    let load = clients.iter().map(|client| run_batches(client, command, TASKS, 2));
    futures::future::join_all(load).await;
    let (rss, peak) = memory_kib(pid);
    let grew = peak.saturating_sub(baseline) / 1024;
    println!(
        "{OWNERS} owners × {TASKS} tasks of 400 KB in {} s: resident {} MiB before, {} MiB after, peak {} MiB \
         (grew {grew} MiB; bound {BOUND_MIB} MiB + overhead {OVERHEAD_MIB} MiB)",
        started.elapsed().as_secs(),
        baseline / 1024,
        rss / 1024,
        peak / 1024
    );
    assert!(grew <= BOUND_MIB + OVERHEAD_MIB, "the server grew by {grew} MiB");
    // The output is still there: an early task's, whole, from its file.
    let first = reply(&clients[0], "task_list", json!({})).await;
    let id = first.lines().find(|row| row.starts_with("bash-")).and_then(|row| row.split(' ').next()).expect(&first);
    let page =
        reply(&clients[0], "task_output", json!({"task_id": id, "view": "lines", "from": 3990, "to": 4000})).await;
    let expected: String = (3990..=4000).map(|n| format!("{n:099}\n")).collect();
    assert_eq!(page, format!("{expected}[status: completed, exit code: 0]"), "an early task's last lines, kept");
    for client in clients {
        let _ = client.cancel().await;
    }
    let log = std::fs::read_to_string(server.dir.join("stderr.log")).unwrap();
    assert!(!log.contains("output was not taken"), "output was lost under the load");
    server.stop().await;
}
