//! The MCP tasks extension over stdio: a client that declares
//! `io.modelcontextprotocol/tasks` gets foreground producer calls answered as
//! MCP tasks backed by the registry (`tasks/get`, `tasks/cancel`).

use crate::common;

use std::time::Duration;

use common::{args, call, only_text, texts};
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig, GetTaskParams,
    GetTaskResult, Implementation, TaskPayload, TaskStatus,
};
use rmcp::service::{Peer, RoleClient};
use serde_json::json;

struct TasksClient;

impl rmcp::ClientHandler for TasksClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::builder().enable_tasks().build(), Implementation::new("tasks-test", "0"))
    }
}

async fn start_as_task(peer: &Peer<RoleClient>, arguments: serde_json::Value) -> String {
    let params = CallToolRequestParams::new("ticker").with_arguments(args(arguments));
    match peer.call_tool_once(params).await.unwrap() {
        CallToolResponse::Task(created) => {
            assert_eq!(created.task.status, TaskStatus::Working);
            assert!(created.task.poll_interval_ms.is_some());
            created.task.task_id
        }
        other => panic!("expected a task, got {other:?}"),
    }
}

async fn until_terminal(peer: &Peer<RoleClient>, id: &str) -> GetTaskResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = peer.get_task(GetTaskParams::new(id)).await.unwrap();
        if got.task.status() != TaskStatus::Working {
            return got;
        }
        assert!(tokio::time::Instant::now() < deadline, "task {id} did not settle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn foreground_calls_become_registry_backed_mcp_tasks() {
    let dir = common::temp_dir("tasks");
    let mut child = common::spawn_stdio_server(&dir, None);
    let client = TasksClient.serve((child.stdout.take().unwrap(), child.stdin.take().unwrap())).await.unwrap();
    let peer = client.peer().clone();
    assert!(client.peer_info().unwrap().capabilities.supports_tasks());

    // A foreground call answers with a task that the registry lists.
    let id = start_as_task(&peer, json!({"count": 3, "interval_ms": 100})).await;
    assert_eq!(id, "ticker-1");
    assert_eq!(
        only_text(&call(&peer, "task_list", json!({})).await),
        "ticker-1 [ticker] running — 3 ticks every 100 ms"
    );
    let done = until_terminal(&peer, &id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed);
    let TaskPayload::Completed { result } = &done.task.payload else { panic!("payload {:?}", done.task.payload) };
    assert_eq!(result["content"][0]["text"], json!("tick 1\ntick 2\ntick 3\n[status: completed, ticks: 3]"));
    assert_eq!(result["isError"], json!(false));
    // The result is kept: the same on every get, and collected (no notice).
    assert_eq!(peer.get_task(GetTaskParams::new(&id)).await.unwrap(), done);
    assert_eq!(texts(&call(&peer, "task_list", json!({})).await).len(), 1);

    // tasks/cancel kills the registry task.
    let id = start_as_task(&peer, json!({"count": 1000, "interval_ms": 1000})).await;
    peer.cancel_task(CancelTaskParams::new(&id)).await.unwrap();
    let cancelled = until_terminal(&peer, &id).await;
    assert_eq!(cancelled.task.status(), TaskStatus::Cancelled);
    assert_eq!(
        cancelled.task.task.status_message.as_deref(),
        Some("ticker-2 [ticker] killed — 1000 ticks every 1000 ms")
    );

    // An explicit background start and a control tool stay plain results.
    let started = call(&peer, "ticker", json!({"count": 1, "interval_ms": 1, "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background ticker task ticker-3");
    // A background task is not an MCP task; unknown ids are refused.
    let error = peer.get_task(GetTaskParams::new("ticker-3")).await.unwrap_err().to_string();
    assert!(error.contains("task ticker-3 is a background task, not an MCP task"), "{error}");
    let error = peer.get_task(GetTaskParams::new("ticker-99")).await.unwrap_err().to_string();
    assert!(error.contains("unknown task id ticker-99"), "{error}");

    let _ = client.cancel().await;
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.unwrap().unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn clients_without_the_extension_get_plain_foreground_results() {
    let server = common::StdioServer::start("tasks-plain", None).await;
    // The server advertises the extension; this client did not declare it.
    assert!(server.client.peer_info().unwrap().capabilities.supports_tasks());
    let result = call(server.client.peer(), "ticker", json!({"count": 1, "interval_ms": 1})).await;
    assert_eq!(only_text(&result), "tick 1\n[status: completed, ticks: 1]");
    let (status, _) = server.disconnect().await;
    assert!(status.success());
}
