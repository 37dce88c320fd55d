//! A time to live over MCP (stdio): the real `taskhost serve` with a
//! `[tasks] default_ttl_ms`, the built-in bash plugin, rmcp's client. A
//! background command nobody reads for its `ttl_ms` is stopped, and the
//! stop says why; `task_list` shows the time left; the tool's schema names
//! the server's default.
//!
//! The test waits on the task's end (`task_output` with `wait`), never on a
//! fixed sleep.

use crate::common;

use common::{StdioServer, call, only_text, texts};
use serde_json::json;

#[tokio::test]
async fn an_unread_background_command_is_stopped_at_its_ttl_and_says_why() {
    let server = StdioServer::start("stdio-ttl", Some("[tasks]\ndefault_ttl_ms = 600000\n")).await;
    let peer = server.client.peer().clone();
    let tools = server.client.list_all_tools().await.unwrap();
    let bash = tools.iter().find(|t| t.name == "bash").expect("bash");
    let described = bash.input_schema["properties"]["ttl_ms"]["description"].as_str().unwrap();
    assert!(
        described.ends_with(
            "Default: 600 s (this server's default); 86400 s for a task of a stable owner (one that reconnects)."
        ),
        "{described}"
    );

    let start = json!({"command": "sleep 600", "run_in_background": true, "ttl_ms": 4000});
    assert_eq!(only_text(&call(&peer, "bash", start).await), "started background bash task bash-1");
    let default = json!({"command": "sleep 601", "run_in_background": true});
    assert_eq!(only_text(&call(&peer, "bash", default).await), "started background bash task bash-2");
    let listed = only_text(&call(&peer, "task_list", json!({})).await);
    let rows: Vec<&str> = listed.lines().collect();
    assert!(
        rows[0].starts_with("bash-1 [bash] running — sleep 600 (stopped in ") && rows[0].ends_with(" s unless read)"),
        "{listed}"
    );
    assert!(
        rows[1].starts_with("bash-2 [bash] running — sleep 601 (stopped in ") && rows[1].contains(" min "),
        "{listed}"
    );

    // The wait renews the TTL once, at its start; the command is stopped
    // four seconds later, and the wait returns its end.
    let ended =
        texts(&call(&peer, "task_output", json!({"task_id": "bash-1", "wait": true, "timeout_ms": 60_000})).await);
    assert_eq!(ended[0], "(no new output)\n[status: killed, reason: ttl expired after 4 s, signal: SIGTERM]");
    let warning = "background task bash-1 (bash: sleep 600) will be stopped in 1 s: nobody read it for its time to \
                   live (4 s). Read it with task_output (any read or view renews it for another 4 s), or stop it \
                   with task_kill.";
    assert!(ended[1..].iter().all(|notice| notice == warning), "at most the one warning rides along: {ended:?}");
    let listed = only_text(&call(&peer, "task_list", json!({})).await);
    assert!(listed.starts_with("bash-1 [bash] killed — sleep 600\n"), "{listed}");
    call(&peer, "task_kill", json!({"task_id": "bash-2"})).await;
    let (status, _) = server.disconnect().await;
    assert!(status.success());
}
