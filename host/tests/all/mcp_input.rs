//! Input to a running task over MCP (stdio): the real `taskhost serve`
//! binary (its process trees started by the exec'd keeper), rmcp's client,
//! the built-in bash plugin started with `interactive: true`, driven with
//! `task_input` and read with `task_output`.
//!
//! Waits are on output lines (reads until a line appears) and on the task's
//! end (`task_output` with `wait`), never a fixed sleep.

use crate::common;

use std::time::Duration;

use common::{StdioServer, call, is_error, only_text, texts};
use serde_json::json;

#[tokio::test]
async fn an_interactive_bash_read_loop_over_stdio() {
    let server = StdioServer::start("stdio-input", None).await;
    let peer = server.client.peer().clone();

    let tools = server.client.list_all_tools().await.unwrap();
    let bash = tools.iter().find(|t| t.name == "bash").expect("bash");
    assert_eq!(bash.input_schema["properties"]["interactive"]["type"], json!("boolean"));
    assert!(tools.iter().any(|t| t.name == "task_input"), "task_input is listed");

    let command = "while read l; do echo \"got $l\"; done; echo \"input closed\"";
    let started =
        call(&peer, "bash", json!({"command": command, "run_in_background": true, "interactive": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    let sent = call(&peer, "task_input", json!({"task_id": "bash-1", "text": "alpha\n"})).await;
    assert!(!is_error(&sent));
    assert_eq!(only_text(&sent), "sent 6 bytes to task bash-1");
    assert_eq!(common::read_until(&peer, "bash-1", "got alpha", Duration::from_secs(20)).await, "got alpha\n");
    // The loop ends as soon as its input closes, so the completion notice
    // may already ride on this very result (notices go on the next one).
    let closed = texts(&call(&peer, "task_input", json!({"task_id": "bash-1", "text": "beta\n", "close": true})).await);
    assert_eq!(closed[0], "sent 5 bytes to task bash-1 and closed its input");
    let notice = "background task bash-1 (bash: while read l; do echo \"got $l\"; done; echo \"input closed\") \
                  finished [status: completed, exit code: 0]. Read its output with task_output.";
    assert!(closed.len() == 1 || (closed.len() == 2 && closed[1] == notice), "{closed:?}");
    assert_eq!(
        only_text(&call(&peer, "task_output", json!({"task_id": "bash-1", "wait": true, "timeout_ms": 20_000})).await),
        "got beta\ninput closed\n[status: completed, exit code: 0]"
    );

    // A program that closed its stdin: the keeper and the init the server
    // started (exec'd keeper mode) do not hold the pipe, so the write fails.
    let deaf = "exec 0<&-; echo \"stdin closed\"; exec sleep 600";
    let started = call(&peer, "bash", json!({"command": deaf, "run_in_background": true, "interactive": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-2");
    assert_eq!(common::read_until(&peer, "bash-2", "stdin closed", Duration::from_secs(20)).await, "stdin closed\n");
    let refused = call(&peer, "task_input", json!({"task_id": "bash-2", "text": "x\n"})).await;
    assert!(is_error(&refused));
    assert_eq!(
        only_text(&refused),
        "sending input to task bash-2 failed: the program no longer reads its stdin (it exited or closed it)"
    );
    call(&peer, "task_kill", json!({"task_id": "bash-2"})).await;

    // Without interactive, stdin is empty: `cat` ends at once, and input is refused.
    let plain = call(&peer, "bash", json!({"command": "cat; echo eof; sleep 600", "run_in_background": true})).await;
    assert_eq!(only_text(&plain), "started background bash task bash-3");
    assert_eq!(common::read_until(&peer, "bash-3", "eof", Duration::from_secs(20)).await, "eof\n");
    let refused = call(&peer, "task_input", json!({"task_id": "bash-3", "text": "x\n"})).await;
    assert!(is_error(&refused));
    assert_eq!(
        only_text(&refused),
        "task bash-3 was started without interactive: true, so its input is closed (it reads end-of-file); to send \
         input, start the command again with run_in_background: true and interactive: true"
    );
    call(&peer, "task_kill", json!({"task_id": "bash-3"})).await;

    let (status, log) = server.disconnect().await;
    assert!(status.success(), "exit status {status}; log:\n{log}");
}
