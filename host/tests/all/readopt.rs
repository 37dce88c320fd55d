//! Trees re-adopted across a restart (issue 31, step 4) through `taskhost
//! serve`, real SQLite and real processes: a stable owner's background bash
//! command outlives a SIGKILL of the server, the next server re-adopts it
//! under the same id, its owner reads the rest of the output with no line
//! lost or repeated and is told of its end once; a kill requested before
//! the crash is carried out after it. Every wait ends on an event (a FIFO
//! the command reads, a line of output, a status), paced reads where MCP
//! gives no event.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{Client, call, log_file, only_text, read_until, serve_command, temp_dir, texts};
use rmcp::ServiceExt as _;
use serde_json::json;

const ALICE: &str = "alice-secret-0123456789abcdef";

/// `taskhost serve --http` in `dir` with the token alice, and her client.
async fn serve_http(dir: &Path) -> (Client, tokio::process::Child) {
    let config = format!("[[serve.http.tokens]]\nname = \"alice\"\ntoken = \"{ALICE}\"\n");
    let mut command = serve_command(dir, Some(&config));
    command.args(["--http", "127.0.0.1:0"]);
    let (child, url) = common::spawn_http_server(command, Some(dir.join("stderr.log"))).await;
    let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
        taskhost::http_client::client(),
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url).auth_header(ALICE),
    );
    (().serve(transport).await.expect("initialize over HTTP"), child)
}

/// `taskhost serve --owner NAME` over stdio in `dir`, and a client on it.
pub(crate) async fn serve_owner(dir: &Path, owner: &str) -> (Client, tokio::process::Child) {
    common::serve_stdio(dir, None, Some(owner)).await
}

pub(crate) async fn sigkill(mut child: tokio::process::Child, client: Client) {
    child.start_kill().expect("SIGKILL the server");
    child.wait().await.expect("the server is reaped");
    drop(client);
}

/// `systemctl stop` and `restart`: SIGTERM, and the server exits by itself.
pub(crate) async fn sigterm(mut child: tokio::process::Child, client: Client) {
    let pid = child.id().expect("running") as i32;
    // SAFETY: kill with a pid this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "{}", std::io::Error::last_os_error());
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait()).await.expect("exits on SIGTERM").unwrap();
    assert!(status.success(), "exit status {status}");
    drop(client);
}

pub(crate) fn fifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo has no other precondition.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{}", std::io::Error::last_os_error());
}

/// Lets the command blocked reading `fifo` go on: the open returns once it
/// reads (an event).
async fn release(fifo: PathBuf) {
    tokio::time::timeout(Duration::from_secs(20), tokio::task::spawn_blocking(move || std::fs::write(fifo, "go\n")))
        .await
        .expect("the command never read its FIFO")
        .unwrap()
        .unwrap();
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

/// Calls `task_list` until one notice about `id` came (paced: MCP gives a
/// client no event for it), checking every listing with `check`; returns
/// the notice. Then one more call: told once, no second notice.
pub(crate) async fn told_once(peer: &rmcp::service::Peer<rmcp::RoleClient>, id: &str, check: impl Fn(&str)) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let notices = |result: &[String]| -> Vec<String> {
        result.iter().skip(1).filter(|t| t.contains(&format!("task {id} "))).cloned().collect()
    };
    loop {
        let result = texts(&call(peer, "task_list", json!({})).await);
        check(&result[0]);
        let mut found = notices(&result);
        assert!(found.len() <= 1, "one notice at most: {result:?}");
        if let Some(notice) = found.pop() {
            let again = texts(&call(peer, "task_list", json!({})).await);
            assert!(notices(&again).is_empty(), "told once: {again:?}");
            return notice;
        }
        assert!(std::time::Instant::now() < deadline, "no notice of {id}: {result:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The command: says it ran (a marker line), prints, waits for `go`, prints
/// more on both streams, exits 3.
pub(crate) fn command(dir: &Path) -> String {
    format!(
        "echo ran >> {marker}; echo a1; echo a2; echo e1 >&2; read x < {go}; echo b1; echo b2; echo e2 >&2; exit 3",
        marker = dir.join("marker").display(),
        go = dir.join("go.fifo").display(),
    )
}

/// The whole output, as it reads in one piece.
const WHOLE: &str = "a1\na2\n[stderr]\ne1\n[stdout]\nb1\nb2\n[stderr]\ne2\n";

/// Reads the rest after the restart and checks the end is told once: by
/// the read that finds it, or else by one notice.
pub(crate) async fn the_rest_after_the_restart(peer: &rmcp::service::Peer<rmcp::RoleClient>, dir: &Path, before: &str) {
    // Re-adopted, not lost: the first result carries no notice, the task runs.
    let first = texts(&call(peer, "task_list", json!({})).await);
    assert_eq!(first.len(), 1, "no notice: the task goes on: {first:?}");
    assert!(first[0].starts_with("bash-1 [bash] running"), "{first:?}");
    release(dir.join("go.fifo")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut after = String::new();
    let mut notices = 0;
    let status = loop {
        let result = texts(&call(peer, "task_output", json!({"task_id": "bash-1"})).await);
        let (body, status) = result[0].rsplit_once('\n').expect("body and status line");
        if body != "(no new output)" {
            after.push_str(body);
            after.push('\n');
        }
        let noticed = result.iter().skip(1).filter(|t| t.contains("task bash-1 ")).count();
        notices += noticed;
        if status != "[status: running]" {
            // The read that finds the end tells it: no notice beside it.
            assert_eq!(noticed, 0, "the read told the end; a notice beside it tells it twice: {result:?}");
            break status.to_string();
        }
        // A notice may ride on a read that still saw the task running (it
        // settled between the read and the delivery): it is the one tell
        // the model did not ask for; the next read is the model asking.
        assert!(std::time::Instant::now() < deadline, "bash-1 never ended: {after:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status, "[status: completed, exit code: 3]");
    assert!(notices <= 1, "told by {notices} notices");
    assert_eq!(format!("{before}{after}"), WHOLE, "no line lost or repeated across the restart");
    let list = texts(&call(peer, "task_list", json!({})).await);
    assert_eq!(list.len(), 1, "told once: {list:?}");
    assert_eq!(lines(&dir.join("marker")), 1, "the command ran once");
}

#[tokio::test]
async fn an_http_owners_background_command_survives_a_sigkill_of_the_server() {
    let dir = temp_dir("readopt-http");
    fifo(&dir.join("go.fifo"));
    let (client, child) = serve_http(&dir).await;
    let started = call(client.peer(), "bash", json!({"command": command(&dir), "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    let before = read_until(client.peer(), "bash-1", "e1", Duration::from_secs(30)).await;
    assert_eq!(before, "a1\na2\n[stderr]\ne1\n");
    sigkill(child, client).await;

    let (client, child) = serve_http(&dir).await;
    the_rest_after_the_restart(client.peer(), &dir, &before).await;
    sigkill(child, client).await;
}

/// Issue 31: a stopped server (`systemctl restart`: SIGTERM) leaves a stable
/// owner's tree running, as a crash does; the next server re-adopts it.
#[tokio::test]
async fn an_http_owners_background_command_survives_a_sigterm_of_the_server() {
    let dir = temp_dir("readopt-sigterm");
    fifo(&dir.join("go.fifo"));
    let (client, child) = serve_http(&dir).await;
    let started = call(client.peer(), "bash", json!({"command": command(&dir), "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    let before = read_until(client.peer(), "bash-1", "e1", Duration::from_secs(30)).await;
    sigterm(child, client).await;

    let (client, child) = serve_http(&dir).await;
    the_rest_after_the_restart(client.peer(), &dir, &before).await;
    sigkill(child, client).await;
}

/// `serve --owner alice` in `dir` starts [`command`] as `bash-1`, reads it
/// up to `e1` and is SIGKILLed, leaving the tree waiting on its FIFO;
/// returns what was read.
pub(crate) async fn left_running_by_a_sigkill(dir: &Path) -> String {
    fifo(&dir.join("go.fifo"));
    let (client, child) = serve_owner(dir, "alice").await;
    let started = call(client.peer(), "bash", json!({"command": command(dir), "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    let before = read_until(client.peer(), "bash-1", "e1", Duration::from_secs(30)).await;
    sigkill(child, client).await;
    before
}

#[tokio::test]
async fn an_owner_named_stdio_clients_background_command_survives_a_sigkill_of_the_server() {
    let dir = temp_dir("readopt-owner");
    let before = left_running_by_a_sigkill(&dir).await;

    let (client, child) = serve_owner(&dir, "alice").await;
    the_rest_after_the_restart(client.peer(), &dir, &before).await;
    sigkill(child, client).await;
}

/// A plain stdio connection's tree dies with its server: told lost once
/// to nobody (the connection is gone), never run again, never re-adopted.
#[tokio::test]
async fn a_plain_stdio_task_is_not_carried_across_a_restart() {
    let dir = temp_dir("readopt-plain");
    fifo(&dir.join("go.fifo"));
    let mut server = serve_command(&dir, None);
    server.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(log_file(&dir)).kill_on_drop(true);
    let (client, child) = common::connect_stdio(&mut server).await;
    let started = call(client.peer(), "bash", json!({"command": command(&dir), "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    read_until(client.peer(), "bash-1", "e1", Duration::from_secs(30)).await;
    sigkill(child, client).await;
    // The tree dies with its server (its keeper sees the lifeline go):
    // then nobody reads the FIFO any more (a non-blocking open for writing
    // finds no reader). Paced: the tree's death gives this test no event.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let go = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(dir.join("go.fifo"));
        match go.map_err(|e| e.raw_os_error()) {
            Err(Some(libc::ENXIO)) => break,
            other => {
                drop(other);
                assert!(std::time::Instant::now() < deadline, "the plain tree outlived its server");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    let (client, child) = serve_owner(&dir, "alice").await;
    let list = texts(&call(client.peer(), "task_list", json!({})).await);
    assert_eq!(list, ["(no background tasks)"], "another owner is told nothing");
    assert_eq!(lines(&dir.join("marker")), 1, "the command ran once");
    // The store says how it ended, once: lost, with the reason; no tree.
    let store = common::state_home(&dir).join("taskhost").join("tasks.sqlite3");
    let store = rusqlite::Connection::open_with_flags(store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let rows: Vec<(String, String, Option<String>, Option<String>)> = store
        .prepare("SELECT id, status, detail, tree FROM tasks")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (id, status, detail, tree) = &rows[0];
    assert_eq!((id.as_str(), status.as_str()), ("bash-1", "lost"), "{rows:?}");
    assert!(detail.as_deref().is_some_and(|d| d.contains("was not run again")), "{rows:?}");
    assert_eq!(tree, &None, "a plain connection's tree is never made durable");
    sigkill(child, client).await;
}

use std::os::unix::fs::OpenOptionsExt as _;

/// A kill requested before the crash is carried out after it: the command
/// ignores SIGTERM, so its tree outlives the SIGKILLed server's grace; the
/// next server kills it, and it is never reported running again.
#[tokio::test]
async fn a_kill_requested_before_a_crash_is_carried_out_after_it() {
    let dir = temp_dir("readopt-kill");
    let marker = dir.join("marker");
    let command = format!("trap '' TERM; echo ran >> {}; echo up; sleep 600", marker.display());
    let (client, child) = serve_http(&dir).await;
    let started = call(client.peer(), "bash", json!({"command": command, "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    read_until(client.peer(), "bash-1", "up", Duration::from_secs(30)).await;
    // The kill is requested (stored `stopping` before the SIGTERM), then the
    // server dies inside the grace, before its SIGKILL.
    let peer = client.peer().clone();
    let kill = tokio::spawn(async move { call(&peer, "task_kill", json!({"task_id": "bash-1"})).await });
    let store = common::state_home(&dir).join("taskhost").join("tasks.sqlite3");
    stopping_in(&store).await;
    sigkill(child, client).await;
    let _ = kill.await;

    let (client, child) = serve_http(&dir).await;
    let peer = client.peer().clone();
    let notice =
        told_once(&peer, "bash-1", |list| assert!(!list.contains("running"), "never running again: {list}")).await;
    assert!(notice.contains("[status: killed, signal: SIGKILL]"), "{notice}");
    let list = texts(&call(&peer, "task_list", json!({})).await);
    assert!(list[0].starts_with("bash-1 [bash] killed"), "{list:?}");
    assert_eq!(lines(&marker), 1, "the command ran once");
    sigkill(child, client).await;
}

/// A durable tree killed the moment its start returned is killed: its
/// keeper, started again as the binary, may not listen on its socket yet,
/// and the kill waits for it rather than finding nobody there.
#[tokio::test]
async fn a_durable_tree_killed_right_after_its_start_ends_killed() {
    let dir = temp_dir("readopt-early-kill");
    let (client, child) = serve_owner(&dir, "alice").await;
    for n in 1..=5 {
        let id = common::started_task(
            &call(client.peer(), "bash", json!({"command": "sleep 600", "run_in_background": true})).await,
        );
        assert_eq!(id, format!("bash-{n}"));
        let killed = texts(&call(client.peer(), "task_kill", json!({"task_id": id})).await).remove(0);
        assert_eq!(killed, format!("requested cancellation of task {id}"));
        let read =
            texts(&call(client.peer(), "task_output", json!({"task_id": id, "wait": true, "timeout_ms": 30000})).await)
                .remove(0);
        assert!(read.ends_with("[status: killed, signal: SIGTERM]"), "{id}: {read}");
    }
    sigkill(child, client).await;
}

/// Waits until the store records bash-1 `stopping` (read beside the
/// server; paced: the file gives no event here).
async fn stopping_in(store: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let connection = rusqlite::Connection::open_with_flags(store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY);
        let status: Option<String> = connection
            .ok()
            .and_then(|c| c.query_row("SELECT status FROM tasks WHERE id = 'bash-1'", [], |row| row.get(0)).ok());
        if status.as_deref() == Some("stopping") {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the kill was never recorded: {status:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A durable tree cannot reach what proves it: the trees' directory (its
/// own keeper's logs, status and socket) and the store (its secret) are
/// outside its view, whatever path it tries; with the server as `uid` too.
async fn a_durable_tree_cannot_reach(tag: &str, uid: Option<u32>) {
    let base = temp_dir(tag);
    let workspace = base.join("work");
    let home = base.join("home");
    let state_home = base.join("state");
    for dir in [&workspace, &home, &state_home] {
        std::fs::create_dir_all(dir).unwrap();
    }
    if let Some(uid) = uid {
        for dir in [&base, &workspace, &home, &state_home] {
            std::os::unix::fs::chown(dir, Some(uid), Some(uid)).unwrap();
        }
    }
    let state = state_home.join("taskhost");
    let trees = state.join("trees");
    let probes = [
        trees.display().to_string(),
        format!("{}/*/k.sock", trees.display()),
        format!("{}/*/stdout.log", trees.display()),
        state.join("tasks.sqlite3").display().to_string(),
    ];
    let command = format!(
        "for p in {}; do if ls -d $p >/dev/null 2>&1 || cat $p >/dev/null 2>&1; then echo \"reached $p\"; fi; done; echo probed",
        probes.join(" ")
    );
    let mut server = common::serve_stdio_as(uid, &base, &workspace, &home);
    server.env("XDG_STATE_HOME", &state_home).args(["--owner", "alice"]);
    let (client, child) = common::connect_stdio(&mut server).await;
    let started = call(client.peer(), "bash", json!({"command": command, "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    let output = read_until(client.peer(), "bash-1", "probed", Duration::from_secs(30)).await;
    assert_eq!(output, "probed\n", "a durable tree reached its keeper's files or the store");
    // The tree was durable: its keeper's directory is there, on the host.
    let kept = std::fs::read_dir(&trees).expect("the trees' directory").count();
    assert!(kept <= 1, "{kept} trees");
    let store =
        rusqlite::Connection::open_with_flags(state.join("tasks.sqlite3"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let tree: Option<String> =
        store.query_row("SELECT tree FROM tasks WHERE id = 'bash-1'", [], |row| row.get(0)).unwrap();
    assert!(tree.is_some_and(|t| t.contains("keeper_pid")), "bash-1 was a durable tree");
    sigkill(child, client).await;
}

#[tokio::test]
async fn a_durable_tree_cannot_reach_its_keepers_files_or_the_store() {
    a_durable_tree_cannot_reach("readopt-reach", None).await;
}

#[tokio::test]
async fn a_durable_tree_of_an_unprivileged_server_cannot_reach_its_keepers_files_or_the_store() {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0
        && common::gap_accepted("root", "switching to another uid needs root", "run the tests as root (CI does)")
    {
        return;
    }
    a_durable_tree_cannot_reach("readopt-reach-nobody", Some(65534)).await;
}

/// The crash loop: iterations of three background commands of an HTTP
/// owner, each waiting on its FIFO midway, and a wasm task (told lost once
/// after each restart, and listed lost); before the SIGKILL of the
/// server, a random number of reads of each (0 to 3) and, at random, its
/// FIFO released (it may end, be read, be noticed, before the crash); then
/// a restart, the rest released and read. Every command ran once (its
/// marker has one line), its output read across the two servers is whole
/// (no line lost or repeated), its end told exactly once (a notice, or the
/// read that found it before any notice), and ids go on. CI runs
/// `TASKHOST_CRASH_ITERATIONS` iterations (default 3); the full loop is
/// `TASKHOST_CRASH_ITERATIONS=200` (the seed is printed).
#[tokio::test]
async fn a_crash_loop_never_runs_a_command_twice_and_tells_every_end_once() {
    let iterations: usize = std::env::var("TASKHOST_CRASH_ITERATIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(3);
    let mut seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    println!("crash loop: {iterations} iterations, seed {seed}");
    let mut random = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let dir = temp_dir("readopt-crash");
    let whole: String = (1..=600).map(|n| format!("{n}\n")).collect();
    let mut next = 1;
    for iteration in 0..iterations {
        let (client, child) = serve_http(&dir).await;
        let peer = client.peer().clone();
        let mut tasks = Vec::new();
        for k in 0..3 {
            let marker = dir.join(format!("marker-{iteration}-{k}"));
            let go = dir.join(format!("go-{iteration}-{k}.fifo"));
            fifo(&go);
            let command =
                format!("echo ran >> {}; seq 1 300; read x < {}; seq 301 600", marker.display(), go.display());
            let started = call(&peer, "bash", json!({"command": command, "run_in_background": true})).await;
            assert_eq!(only_text(&started), format!("started background bash task bash-{next}"));
            tasks.push(Tracked { id: format!("bash-{next}"), marker, go, ..Tracked::default() });
            next += 1;
        }
        // A wasm task beside them: its guest state is in the server's
        // memory, so the restart tells it lost, once.
        let ticker = format!("ticker-{}", iteration + 1);
        let started =
            call(&peer, "ticker", json!({"count": 100000, "interval_ms": 50, "run_in_background": true})).await;
        assert_eq!(only_text(&started), format!("started background ticker task {ticker}"));
        let mut lost = [Tracked { id: ticker.clone(), ..Tracked::default() }];
        for k in 0..tasks.len() {
            if random(3) == 0 {
                release(tasks[k].go.clone()).await;
                tasks[k].released = true;
            }
            for _ in 0..random(4) {
                let id = tasks[k].id.clone();
                read_once(&peer, &id, &mut tasks, &mut lost).await;
            }
        }
        sigkill(child, client).await;

        let (client, child) = serve_http(&dir).await;
        let peer = client.peer().clone();
        for k in 0..tasks.len() {
            if !tasks[k].released {
                release(tasks[k].go.clone()).await;
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while !tasks[k].ended {
                let id = tasks[k].id.clone();
                read_once(&peer, &id, &mut tasks, &mut lost).await;
                assert!(std::time::Instant::now() < deadline, "{} never ended: {:?}", tasks[k].id, tasks[k].read);
                if !tasks[k].ended {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        // Notices still owed ride on the next result.
        let list = texts(&call(&peer, "task_list", json!({})).await);
        count_notices(&list, &mut tasks);
        count_notices(&list, &mut lost);
        let again = texts(&call(&peer, "task_list", json!({})).await);
        assert_eq!(again.len(), 1, "no notice left: {again:?}");
        let listed = again[0].lines().find(|line| line.starts_with(&format!("{ticker} "))).unwrap_or_default();
        assert!(listed.contains("] lost"), "{ticker} is listed lost: {again:?}");
        assert_eq!(lost[0].notices, 1, "{ticker}'s loss told once in iteration {iteration}: {:?}", lost[0]);
        for task in &tasks {
            let at = format!("{} in iteration {iteration}", task.id);
            assert_eq!(task.read, whole, "{at}: no line lost or repeated");
            assert_eq!(lines(&task.marker), 1, "{at} ran once");
            assert_eq!(task.notices + usize::from(task.reported_before_notice), 1, "{at}'s end told once: {task:?}");
        }
        sigkill(child, client).await;
    }
}

#[derive(Debug, Default)]
struct Tracked {
    id: String,
    marker: PathBuf,
    go: PathBuf,
    released: bool,
    /// The output read so far, across servers.
    read: String,
    /// A read returned its end.
    ended: bool,
    /// A read returned its end before any notice of it.
    reported_before_notice: bool,
    notices: usize,
}

/// Counts the notices of `result` (every text after the first) against the
/// tasks they name.
fn count_notices(result: &[String], tasks: &mut [Tracked]) {
    for notice in result.iter().skip(1) {
        for task in tasks.iter_mut() {
            if notice.starts_with(&format!("background task {} ", task.id)) {
                task.notices += 1;
            }
        }
    }
}

/// One consuming read of `id`, its body and end and every notice riding on
/// it counted.
async fn read_once(
    peer: &rmcp::service::Peer<rmcp::RoleClient>,
    id: &str,
    tasks: &mut [Tracked],
    lost: &mut [Tracked],
) {
    let result = texts(&call(peer, "task_output", json!({"task_id": id})).await);
    count_notices(&result, tasks);
    count_notices(&result, lost);
    let (body, status) = result[0].rsplit_once('\n').expect("body and status line");
    let task = tasks.iter_mut().find(|t| t.id == id).unwrap();
    if body != "(no new output)" {
        task.read.push_str(body);
        task.read.push('\n');
    }
    if status != "[status: running]" {
        assert_eq!(status, "[status: completed, exit code: 0]", "{id}");
        if !task.ended && task.notices == 0 {
            task.reported_before_notice = true;
        }
        task.ended = true;
    }
}
