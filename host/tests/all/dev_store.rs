//! `taskhost dev` on SQLite beside a stopped `serve` (issue 31, item 1):
//! the console keeps its own store in the state directory, so its ids go
//! on across runs, and it never touches `serve`'s records or trees: a
//! stable owner's tree left running by a stopped server is still re-adopted
//! by the next `serve` after `dev` ran and exited there.

use crate::common;
use crate::durable::ps;
use crate::readopt::{left_running_by_a_sigkill, serve_owner, sigkill, the_rest_after_the_restart};

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{state_home, temp_dir};

/// `taskhost dev <ticker>` on the console (stdin a pipe, not a script)
/// with the state directory of the servers in `dir`; returns its stdout.
async fn dev_console(dir: &Path, input: &str) -> String {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new(common::BIN)
        .args(["dev", taskhost::builtin::TICKER_PATH])
        .current_dir(dir)
        .env("XDG_STATE_HOME", state_home(dir))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run taskhost dev");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("dev ends at the end of its input")
        .unwrap();
    assert!(output.status.success(), "taskhost dev: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn dev_keeps_its_own_store_and_leaves_a_stopped_servers_trees_to_the_next_server() {
    let dir = temp_dir("dev-store");
    let before = left_running_by_a_sigkill(&dir).await;

    // Two console runs in the same state directory: the second's id is
    // fresh (its own store), and neither claims serve's records.
    for id in ["ticker-1", "ticker-2"] {
        let input = format!("bg {{\"count\": 1, \"interval_ms\": 1, \"message\": \"t\"}}\nwait {id}\nquit\n");
        let stdout = dev_console(&dir, &input).await;
        assert!(stdout.contains(&format!("started background ticker task {id}\n")), "{stdout}");
        assert!(stdout.contains(&format!("{id} finished first")), "{stdout}");
    }
    let taskhost = state_home(&dir).join("taskhost");
    assert!(taskhost.join("dev-tasks.sqlite3").is_file(), "dev's own store");
    let serves = ps(&dir, &["--all", "--json"]).await;
    let serves: Vec<(&str, &str)> =
        serves.as_array().unwrap().iter().map(|t| (t["id"].as_str().unwrap(), t["status"].as_str().unwrap())).collect();
    assert_eq!(serves, [("bash-1", "running")], "serve's store is as the stopped server left it");

    // The next server re-adopts the tree: the rest of its output, its end
    // told once, the command run once.
    let (client, child) = serve_owner(&dir, "alice").await;
    the_rest_after_the_restart(client.peer(), &dir, &before).await;
    sigkill(child, client).await;
}
