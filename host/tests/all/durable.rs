//! The durable task store through `taskhost serve` (issue 31, first part):
//! a stable owner's task live when the server is SIGKILLed whose tree
//! cannot be carried on (its keeper died with it) is told lost once by the
//! next server with the same owner, never run again, and ids continue; a
//! store file the server cannot use is refused, untouched. (Trees that are
//! carried on: `readopt.rs`.)

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{Client, call, is_error, only_text, serve_command, state_home, temp_dir, texts};
use rmcp::ServiceExt as _;
use serde_json::json;

/// The store's file of the servers a test runs in `dir`.
pub(crate) fn store_file(dir: &Path) -> PathBuf {
    state_home(dir).join("taskhost").join("tasks.sqlite3")
}

/// `taskhost serve [--owner NAME]` over stdio in `dir`, and a client on it.
pub(crate) async fn serve(dir: &Path, owner: Option<&str>) -> (Client, tokio::process::Child) {
    common::serve_stdio(dir, None, owner).await
}

/// SIGKILLs the server and waits for it to be gone.
pub(crate) async fn sigkill(mut child: tokio::process::Child, client: Client) {
    child.start_kill().expect("SIGKILL the server");
    child.wait().await.expect("the server is reaped");
    drop(client);
}

/// SIGKILLs the keeper of every live handed-over tree the store records
/// (the server is gone): the trees die with them (their init's parent
/// death signal), so the next server finds them lost. Waits for each
/// keeper to be gone or a zombie.
pub(crate) fn kill_keepers(dir: &Path) {
    let store = rusqlite::Connection::open_with_flags(store_file(dir), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("the store opens");
    let trees: Vec<String> = store
        .prepare("SELECT tree FROM tasks WHERE tree IS NOT NULL AND status IN ('running', 'stopping')")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for tree in trees {
        let tree: serde_json::Value = serde_json::from_str(&tree).unwrap();
        let pid = tree["record"]["keeper_pid"].as_i64().expect("a keeper pid") as i32;
        // SAFETY: a signal to a process this test's server started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
        {
            assert!(std::time::Instant::now() < deadline, "keeper {pid} survived SIGKILL");
            std::thread::yield_now();
        }
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

#[tokio::test]
async fn a_stable_owners_task_whose_keeper_died_is_told_lost_once_and_never_run_again() {
    let dir = temp_dir("durable-lost");
    let marker = dir.join("marker");
    // The command says it ran through a FIFO the test reads: the read
    // returns when the command wrote (an event, not a poll).
    let ran = dir.join("ran.fifo");
    let path = std::ffi::CString::new(ran.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo has no other precondition.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "{}", std::io::Error::last_os_error());
    let command = format!("echo ran >> {}; echo ran > {}; sleep 600", marker.display(), ran.display());

    let (client, child) = serve(&dir, Some("alice")).await;
    let peer = client.peer().clone();
    let started = call(&peer, "bash", json!({"command": command, "run_in_background": true})).await;
    assert!(!is_error(&started), "{started:?}");
    assert_eq!(only_text(&started), "started background bash task bash-1");
    // The command ran once (the id was returned after its record was committed).
    let said = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || std::fs::read_to_string(ran)),
    )
    .await
    .expect("the command never ran")
    .unwrap()
    .unwrap();
    assert_eq!(said, "ran\n");
    assert_eq!(lines(&marker), 1);
    sigkill(child, client).await;
    // The store and its write-ahead log are the server user's alone.
    for file in [store_file(&dir), store_file(&dir).with_extension("sqlite3-wal")] {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }
    kill_keepers(&dir);

    // The same owner again: the first result carries exactly one lost notice.
    let (client, child) = serve(&dir, Some("alice")).await;
    let peer = client.peer().clone();
    let first = texts(&call(&peer, "task_list", json!({})).await);
    assert_eq!(first.len(), 2, "the list and one notice: {first:?}");
    assert!(first[0].starts_with("bash-1 [bash] lost"), "{first:?}");
    assert!(
        first[1].starts_with("background task bash-1 (bash: ")
            && first[1].contains("[status: lost")
            && first[1].contains("was not run again"),
        "{first:?}"
    );
    // Told once: the next result has no notice, and the task stays lost.
    let second = texts(&call(&peer, "task_list", json!({})).await);
    assert_eq!(second, [first[0].clone()]);
    let output = only_text(&call(&peer, "task_output", json!({"task_id": "bash-1"})).await);
    assert!(output.ends_with("]") && output.contains("[status: lost"), "{output}");
    // Ids continue after the restart.
    let next = call(&peer, "bash", json!({"command": "sleep 600", "run_in_background": true})).await;
    assert_eq!(only_text(&next), "started background bash task bash-2");
    assert_eq!(lines(&marker), 1, "the lost command never ran again");
    // `taskhost ps` reads the store beside the running server.
    let live = ps(&dir, &["--json"]).await;
    let live: Vec<(&str, &str, &str)> = live
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t["owner"].as_str().unwrap(), t["status"].as_str().unwrap()))
        .collect();
    assert_eq!(live, [("bash-2", "owner:alice", "running")]);
    let all = ps(&dir, &["--all", "--json"]).await;
    let statuses: Vec<&str> = all.as_array().unwrap().iter().map(|t| t["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["lost", "running"]);
    sigkill(child, client).await;
    kill_keepers(&dir);

    // A third server: bash-1 is not told again, and bash-2 is told lost once.
    let (client, child) = serve(&dir, Some("alice")).await;
    let peer = client.peer().clone();
    let third = texts(&call(&peer, "task_list", json!({})).await);
    let notices: Vec<&String> = third.iter().filter(|text| text.starts_with("background task")).collect();
    assert_eq!(notices.len(), 1, "bash-2's loss only, bash-1 never told twice: {third:?}");
    assert!(notices[0].starts_with("background task bash-2 (bash: sleep 600) was lost"), "{third:?}");
    assert_eq!(lines(&marker), 1, "the lost command never ran again");
    sigkill(child, client).await;
}

#[tokio::test]
async fn another_owner_and_a_plain_connection_see_none_of_a_stable_owners_tasks() {
    let dir = temp_dir("durable-fence");
    let (client, child) = serve(&dir, Some("alice")).await;
    let started = call(client.peer(), "bash", json!({"command": "sleep 600", "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    sigkill(child, client).await;

    for owner in [Some("bob"), None] {
        let (client, child) = serve(&dir, owner).await;
        let peer = client.peer().clone();
        assert_eq!(texts(&call(&peer, "task_list", json!({})).await), ["(no background tasks)"], "{owner:?}");
        let foreign = call(&peer, "task_output", json!({"task_id": "bash-1"})).await;
        assert!(is_error(&foreign), "{owner:?}: {foreign:?}");
        sigkill(child, client).await;
    }
    // alice's tree was re-adopted by each server and outlived it: end it.
    kill_keepers(&dir);
}

/// `taskhost ps ARGS` with the state directory of the servers in `dir`.
pub(crate) async fn ps(dir: &Path, args: &[&str]) -> serde_json::Value {
    let output = tokio::process::Command::new(common::BIN)
        .arg("ps")
        .args(args)
        .current_dir(dir)
        .env("XDG_STATE_HOME", state_home(dir))
        .output()
        .await
        .expect("run taskhost ps");
    assert!(output.status.success(), "taskhost ps: {output:?}");
    serde_json::from_slice(&output.stdout).expect("ps --json prints JSON")
}

/// Runs a server over `dir` that must refuse to start; returns its stderr.
async fn refused(dir: &Path) -> String {
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        serve_command(dir, None).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).output(),
    )
    .await
    .expect("the server exits within 30 s")
    .expect("run taskhost serve");
    assert!(!output.status.success(), "the server started: {output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn a_corrupt_or_newer_store_is_refused_with_the_file_and_the_fix_and_left_untouched() {
    let dir = temp_dir("durable-corrupt");
    let file = store_file(&dir);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let garbage = b"this is not a database, but it is the user's file\n".repeat(200);
    std::fs::write(&file, &garbage).unwrap();
    let stderr = refused(&dir).await;
    assert!(stderr.contains(&file.display().to_string()), "{stderr}");
    assert!(stderr.contains("move the file away"), "{stderr}");
    assert_eq!(std::fs::read(&file).unwrap(), garbage, "the file was changed");

    let dir = temp_dir("durable-newer");
    let file = store_file(&dir);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    {
        let connection = rusqlite::Connection::open(&file).unwrap();
        connection
            .execute_batch("PRAGMA application_id = 1953721192; PRAGMA user_version = 99; CREATE TABLE later (x);")
            .unwrap();
    }
    let before = std::fs::read(&file).unwrap();
    let stderr = refused(&dir).await;
    assert!(stderr.contains(&file.display().to_string()) && stderr.contains("schema version 99"), "{stderr}");
    assert_eq!(std::fs::read(&file).unwrap(), before, "the file was changed");
}

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

#[tokio::test]
async fn an_http_tokens_tasks_are_told_once_after_a_sigkill_and_after_a_sigterm() {
    let dir = temp_dir("durable-http");
    let (client, child) = serve_http(&dir).await;
    let started = call(client.peer(), "bash", json!({"command": "sleep 600", "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    sigkill(child, client).await;
    kill_keepers(&dir);

    // The same token after a SIGKILL, its keeper gone too: bash-1 lost, told once.
    let (client, mut child) = serve_http(&dir).await;
    let peer = client.peer().clone();
    let first = texts(&call(&peer, "task_list", json!({})).await);
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(first[0], "bash-1 [bash] lost — sleep 600");
    assert!(first[1].starts_with("background task bash-1 (bash: sleep 600) was lost [status: lost, "), "{first:?}");
    assert_eq!(texts(&call(&peer, "task_list", json!({})).await), [first[0].clone()]);
    let started = call(&peer, "bash", json!({"command": "sleep 600", "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-2");
    // A SIGTERM stops the server, not the stable owner's tree: the next
    // server re-adopts bash-2, running, and tells no end.
    let pid = child.id().expect("running").to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("exits on SIGTERM").unwrap();
    drop(client);

    let (client, child) = serve_http(&dir).await;
    let peer = client.peer().clone();
    let third = texts(&call(&peer, "task_list", json!({})).await);
    assert_eq!(third.len(), 1, "{third:?}");
    assert_eq!(
        common::without_time_left(&third[0]),
        "bash-1 [bash] lost — sleep 600\nbash-2 [bash] running — sleep 600"
    );
    assert_eq!(
        texts(&call(&peer, "task_kill", json!({"task_id": "bash-2"})).await),
        ["requested cancellation of task bash-2"]
    );
    sigkill(child, client).await;
}
