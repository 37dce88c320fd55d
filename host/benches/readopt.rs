//! Re-adoption at start-up (issue 31's goal: 1 000 live trees in <= 1 s):
//! how long the next `taskhost serve` takes to start when a stopped one
//! left N live durable trees behind.
//!
//! Run: `cargo bench -p taskhost --bench readopt` (`-- --trees N` for
//! another N, default 1000; `-- --rounds R`, default 2). Prints one table;
//! docs/benchmarks-log.md quotes it.
//!
//! Each round, for N and for the baseline's 10 trees (alternating), on a
//! fresh state directory (the compile cache is shared by the rounds, warm
//! as on a restart):
//! 1. `taskhost serve --owner bench` (stdio, a real MCP client) starts N
//!    background bash commands (`echo up; exec sleep 600`), each a durable
//!    tree the built-in bash plugin hands over, and reads each until it said
//!    `up` (its cursor is stored); the server is stopped with SIGTERM (as
//!    `systemctl restart` stops it) and exits; every tree is checked to be
//!    still running (its directory has no `status` file yet);
//! 2. timed: the next `taskhost serve --owner bench` from its spawn to its
//!    `host ready` log line (the store opened and loaded, every tree
//!    re-adopted: proof, connection, follower; then the tools listed), and
//!    to the answer of the client's `initialize` (the stable owner attached:
//!    the records handed to it); its `task_list` must list the N tasks
//!    `running` under their old ids;
//! 3. every task is killed with `task_kill`, the server's input closed, and
//!    no tree may be left running (and each is `sleep 600` at most anyway).
//!
//! Machine limits: each tree is its keeper and `sleep` (two pids), each
//! re-adopted tree holds a pidfd and a log watch in the server.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{Peer, RoleClient};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;

const BIN: &str = env!("CARGO_BIN_EXE_taskhost");
const BASELINE_TREES: usize = 10;

/// Trees still running in `state`: a tree's directory gets its `status`
/// file when it ends.
fn trees_running(state: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(state.join("trees")) else { return 0 };
    entries.flatten().filter(|entry| entry.path().is_dir() && !entry.path().join("status").exists()).count()
}

async fn call(peer: &Peer<RoleClient>, tool: &str, arguments: Value) -> String {
    let Value::Object(arguments) = arguments else { unreachable!() };
    let result = peer.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(arguments)).await;
    let result = result.unwrap_or_else(|e| panic!("{tool} failed: {e}"));
    result.content.iter().map(|block| block.as_text().expect("text").text.clone()).collect::<Vec<_>>().join("\n")
}

/// `taskhost serve --owner bench` in `dir`; stderr to `log`, or piped.
fn serve(dir: &Path, log: Option<&Path>) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(["serve", "--owner", "bench", "--config"])
        .arg(dir.join("bench.toml"))
        .current_dir(dir.join("work"))
        .env("XDG_STATE_HOME", dir.join("xdg"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    match log {
        Some(log) => command.stderr(std::fs::File::create(log).unwrap()),
        None => command.stderr(Stdio::piped()),
    };
    command
}

/// CPU time (user + system) process `pid` used so far, all its threads.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // utime and stime: fields 14 and 15, the 12th and 13th after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

struct Restart {
    /// Spawn to the `host ready` line.
    ready: Duration,
    /// Spawn to the `initialize` answer.
    initialized: Duration,
    /// The server's CPU time at `host ready`.
    cpu: Duration,
}

async fn round(cache: &Path, trees: usize) -> Restart {
    let dir = tempfile::Builder::new().prefix("taskhost-readopt-").tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(dir.path().join("work")).unwrap();
    std::fs::write(
        dir.path().join("bench.toml"),
        format!(
            "[state]\ndir = {state:?}\n[plugins]\ncache_dir = {cache:?}\n\
             [tasks]\nmax_live_tasks_per_owner = {n}\nmax_finished_tasks_per_owner = {n}\n",
            n = trees + 1
        ),
    )
    .unwrap();

    // 1. The trees, left behind by a server stopped with SIGTERM.
    let mut child = serve(dir.path(), Some(&dir.path().join("first.log"))).spawn().unwrap();
    let client = ().serve((child.stdout.take().unwrap(), child.stdin.take().unwrap())).await.unwrap();
    let mut ids = Vec::with_capacity(trees);
    for _ in 0..trees {
        let text =
            call(client.peer(), "bash", json!({"command": "echo up; exec sleep 600", "run_in_background": true})).await;
        ids.push(text.strip_prefix("started background bash task ").unwrap_or_else(|| panic!("{text}")).to_string());
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    for id in &ids {
        while !call(client.peer(), "task_output", json!({"task_id": id})).await.contains("up\n") {
            assert!(Instant::now() < deadline, "{id} never said it runs");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // SAFETY: kill with the pid of a child not reaped yet.
    assert_eq!(unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) }, 0);
    assert!(child.wait().await.unwrap().success(), "the first server exits on SIGTERM");
    drop(client);
    assert_eq!(trees_running(&state), trees, "every tree outlives its server");

    // 2. The next server's start-up, timed.
    let t = Instant::now();
    let mut child = serve(dir.path(), None).spawn().unwrap();
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let ready = loop {
        let line = stderr.next_line().await.unwrap().expect("the server logs `host ready`");
        if line.contains("host ready") {
            break t.elapsed();
        }
    };
    let cpu = cpu_time(child.id().unwrap());
    // The rest of its log is drained (and dropped).
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    let client = ().serve((child.stdout.take().unwrap(), child.stdin.take().unwrap())).await.unwrap();
    let initialized = t.elapsed();
    let list = call(client.peer(), "task_list", json!({})).await;
    for id in &ids {
        assert!(list.contains(&format!("{id} [bash] running")), "{id} is not re-adopted as running: {list}");
    }
    assert_eq!(list.matches("[bash] running").count(), trees, "{list}");

    // 3. Every tree killed.
    for id in &ids {
        call(client.peer(), "task_kill", json!({"task_id": id})).await;
    }
    for id in &ids {
        let text = call(client.peer(), "task_output", json!({"task_id": id, "wait": true, "timeout_ms": 30000})).await;
        assert!(text.contains("[status: killed"), "{id} was not killed: {text}");
    }
    drop(client);
    assert!(child.wait().await.unwrap().success(), "the second server exits when its input closes");
    assert_eq!(trees_running(&state), 0, "a tree outlived the bench");
    Restart { ready, initialized, cpu }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|at| args.get(at + 1)).map_or(default, |n| n.parse().unwrap())
}

#[tokio::main]
async fn main() {
    let trees = arg("--trees", 1000);
    assert!(trees > BASELINE_TREES, "--trees must exceed the baseline's {BASELINE_TREES}");
    let rounds = arg("--rounds", 2);
    let cache = tempfile::Builder::new().prefix("taskhost-readopt-cache-").tempdir().unwrap();
    // Warms the compile cache (a restart finds it warm).
    round(cache.path(), BASELINE_TREES).await;
    let mut results: [Vec<Restart>; 2] = Default::default();
    for _ in 0..rounds {
        for (way, n) in [(0, BASELINE_TREES), (1, trees)] {
            results[way].push(round(cache.path(), n).await);
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "`taskhost serve` start-up when the stopped server left N live durable trees ({rounds} rounds, alternating):"
    );
    for (way, n) in [(0, BASELINE_TREES), (1, trees)] {
        for (i, r) in results[way].iter().enumerate() {
            println!(
                "  {n:>5} trees, round {}: spawn to `host ready` {:>8.1} ms (server CPU {:>6.0} ms), \
                 to `initialize` answered {:>8.1} ms",
                i + 1,
                ms(r.ready),
                ms(r.cpu),
                ms(r.initialized),
            );
        }
    }
    let best = |runs: &[Restart]| runs.iter().map(|r| ms(r.initialized)).fold(f64::INFINITY, f64::min);
    let (base, many) = (best(&results[0]), best(&results[1]));
    println!(
        "  best to `initialize` answered: {trees} trees {many:.1} ms, {BASELINE_TREES} trees {base:.1} ms: \
         ratio {:.1}x; {:.2} ms per tree beyond the baseline",
        many / base,
        (many - base) / (trees - BASELINE_TREES) as f64
    );
}
