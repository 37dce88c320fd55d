//! Retention of the durable store through `taskhost serve` and a real
//! SQLite file: finished records beyond `[state] max_finished_tasks` are
//! deleted oldest first as tasks end, an end nobody was told of goes last,
//! the deletion is logged, `taskhost ps` no longer lists what went, and a
//! restart still issues fresh ids (the counters outlive the records).

use crate::common;
use crate::durable::{kill_keepers, ps, sigkill};

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{Client, call, is_error, only_text, serve_command, temp_dir, texts};
use rmcp::ServiceExt as _;
use serde_json::json;
use tokio::io::AsyncBufReadExt as _;

const CONFIG: &str = "[state]\nmax_finished_tasks = 1\n";

/// `taskhost serve --owner OWNER` with `config` over stdio in `dir`, a
/// client on it, and its stderr's lines (also kept in `stderr-OWNER.log`).
async fn serve_with(
    dir: &Path,
    owner: &str,
    config: Option<&str>,
) -> (Client, tokio::process::Child, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let mut child = serve_command(dir, config)
        .arg("--owner")
        .arg(owner)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn taskhost serve");
    let (sender, lines) = tokio::sync::mpsc::unbounded_channel();
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let log = dir.join(format!("stderr-{owner}.log"));
    tokio::spawn(async move {
        let mut kept = String::new();
        while let Ok(Some(line)) = stderr.next_line().await {
            kept.push_str(&line);
            kept.push('\n');
            let _ = std::fs::write(&log, &kept);
            let _ = sender.send(line);
        }
    });
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let client = ().serve((stdout, stdin)).await.expect("initialize over stdio");
    (client, child, lines)
}

/// [`serve_with`] with [`CONFIG`].
async fn serve(
    dir: &Path,
    owner: &str,
) -> (Client, tokio::process::Child, tokio::sync::mpsc::UnboundedReceiver<String>) {
    serve_with(dir, owner, Some(CONFIG)).await
}

/// Starts `echo N` in the background as bash-N and waits for its end (which
/// the wait reports).
async fn ended_and_told(peer: &rmcp::service::Peer<rmcp::RoleClient>, n: u32) {
    let started = call(peer, "bash", json!({"command": format!("echo {n}"), "run_in_background": true})).await;
    // A quick end may already ride on the start's answer as its notice.
    assert_eq!(texts(&started)[0], format!("started background bash task bash-{n}"));
    let ended = call(peer, "task_output", json!({"task_id": format!("bash-{n}"), "wait": true})).await;
    assert!(texts(&ended)[0].contains("[status: completed"), "{ended:?}");
}

/// Reads the server's log lines until its retention reports have deleted
/// `expected` records in all (fails on more, or after 60 s).
async fn wait_for_deletions(lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>, expected: usize) {
    let mut deleted = 0;
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        while deleted < expected {
            let line = lines.recv().await.expect("the server's stderr ended");
            if !line.contains("retention deleted finished task records") {
                continue;
            }
            let count = line.split_once(" deleted=").expect("the report counts the deleted records").1;
            let count: String = count.chars().take_while(char::is_ascii_digit).collect();
            deleted += count.parse::<usize>().unwrap();
        }
    })
    .await;
    assert!(waited.is_ok(), "retention reported {deleted} of {expected} deletions");
    assert_eq!(deleted, expected, "retention deleted more than it had to");
}

fn ids(records: &serde_json::Value) -> Vec<(String, String)> {
    records
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap().to_string(), t["status"].as_str().unwrap().to_string()))
        .collect()
}

#[tokio::test]
async fn finished_records_beyond_the_bound_go_oldest_first_untold_last_and_ids_stay_fresh() {
    let dir = temp_dir("retention");
    // alice's background command; the server is SIGKILLed and its keeper
    // too, so the next server settles it lost, an end alice is never told
    // (she does not come back).
    let (client, child, _lines) = serve(&dir, "alice").await;
    let started = call(client.peer(), "bash", json!({"command": "sleep 600", "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    sigkill(child, client).await;
    kill_keepers(&dir);

    // bob's three commands end and are told (a wait returns each end):
    // with one finished record allowed, all three go, the newest too, and
    // alice's untold end stays.
    let (client, child, mut lines) = serve(&dir, "bob").await;
    for n in 2..=4 {
        ended_and_told(client.peer(), n).await;
    }
    wait_for_deletions(&mut lines, 3).await;
    assert_eq!(ids(&ps(&dir, &["--all", "--json"]).await), [("bash-1".to_string(), "lost".to_string())]);
    sigkill(child, client).await;

    // A restart: nothing more to delete, and the next id is fresh although
    // the records of bash-2..4 are gone.
    let (client, child, _lines) = serve(&dir, "bob").await;
    let started = call(client.peer(), "bash", json!({"command": "sleep 600", "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-5");
    let listed = ids(&ps(&dir, &["--all", "--json"]).await);
    assert_eq!(
        listed,
        [("bash-1".to_string(), "lost".to_string()), ("bash-5".to_string(), "running".to_string())],
        "a live record is never a finished one to prune"
    );
    let stopped = call(client.peer(), "task_kill", json!({"task_id": "bash-5"})).await;
    assert!(!is_error(&stopped), "{stopped:?}");
    sigkill(child, client).await;
    kill_keepers(&dir);
}

/// A store over its bounds when a server starts is pruned before the
/// registry reads it: the records that went are never restored.
#[tokio::test]
async fn a_store_over_its_bounds_is_pruned_before_the_next_server_reads_it() {
    let dir = temp_dir("retention-start");
    let (client, child, _lines) = serve_with(&dir, "carol", None).await;
    for n in 1..=3 {
        ended_and_told(client.peer(), n).await;
    }
    sigkill(child, client).await;

    let (client, child, mut lines) = serve(&dir, "carol").await;
    let mut pruned = None;
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let line = lines.recv().await.expect("the server's stderr ended");
            if line.contains("retention deleted finished task records") {
                pruned = Some(line);
            } else if line.contains("task store restored") {
                return line;
            }
        }
    })
    .await
    .expect("the server never read its store");
    let pruned = pruned.expect("retention ran before the store was read");
    assert!(pruned.contains(" deleted=2 ") && pruned.contains(" kept=1"), "{pruned}");
    assert!(read.contains(" restored=1 "), "only the newest record is restored: {read}");
    let list = texts(&call(client.peer(), "task_list", json!({})).await);
    assert_eq!(list.len(), 1, "{list:?}");
    assert!(list[0].starts_with("bash-3 [bash] completed") && !list[0].contains("bash-1"), "{list:?}");
    assert_eq!(ids(&ps(&dir, &["--all", "--json"]).await), [("bash-3".to_string(), "completed".to_string())]);
    sigkill(child, client).await;
}
