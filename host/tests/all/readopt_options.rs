//! What a start asked for is kept with its re-adopted tree across a
//! SIGKILL of `taskhost serve --owner` (issue 31): input to an interactive
//! command, its `notify_on` milestone, and its time to live (the deadline
//! the store holds, renewed by reads before the crash). And a server stopped
//! the instant it answered a start still hands the tree on. Real SQLite,
//! real processes, rmcp's client.

use std::time::Duration;

use serde_json::json;

use crate::common::{self, call, only_text, read_until, temp_dir, texts};
use crate::readopt::{serve_owner, sigkill, sigterm, told_once};

#[tokio::test]
async fn an_interactive_commands_input_milestone_and_ttl_survive_a_sigkill_of_the_server() {
    let dir = temp_dir("readopt-options");
    let (client, child) = serve_owner(&dir, "alice").await;
    let peer = client.peer().clone();
    let chat = common::started_task(
        &call(
            &peer,
            "bash",
            json!({
                "command": "while read line; do echo \"got $line\"; done; echo bye",
                "run_in_background": true,
                "interactive": true,
                "notify_on": {"pattern": "^got two"},
            }),
        )
        .await,
    );
    let doomed = common::started_task(
        &call(&peer, "bash", json!({"command": "sleep 600", "run_in_background": true, "ttl_ms": 3000})).await,
    );
    let sent = call(&peer, "task_input", json!({"task_id": chat, "text": "one\n"})).await;
    assert!(!common::is_error(&sent), "{sent:?}");
    read_until(&peer, &chat, "got one", Duration::from_secs(30)).await;
    sigkill(child, client).await;

    let (client, mut child) = serve_owner(&dir, "alice").await;
    let peer = client.peer().clone();
    // Input reaches the re-adopted command.
    let sent = call(&peer, "task_input", json!({"task_id": chat, "text": "two\n"})).await;
    assert!(!common::is_error(&sent), "input after the restart: {sent:?}");
    // Its milestone still watches its output: one notice, with no read of
    // it (on the input's own answer when the line came that fast).
    let early: Vec<String> =
        texts(&sent).into_iter().skip(1).filter(|t| t.contains(&format!("task {chat} "))).collect();
    let notice = match <[String; 1]>::try_from(early) {
        Ok([notice]) => {
            let again = texts(&call(&peer, "task_list", json!({})).await);
            assert!(!again.iter().skip(1).any(|t| t.contains(&format!("task {chat} "))), "told once: {again:?}");
            notice
        }
        Err(none) => {
            assert!(none.is_empty(), "one notice at most: {none:?}");
            told_once(&peer, &chat, |_| {}).await
        }
    };
    assert!(notice.contains("printed a line matching /^got two/: got two"), "{notice}");
    // Its time to live still runs: the unread command is stopped and says why.
    let ended =
        texts(&call(&peer, "task_output", json!({"task_id": doomed, "wait": true, "timeout_ms": 30_000})).await);
    assert!(ended[0].starts_with("(no new output)\n[status: killed, reason: ttl expired after 3 s"), "{ended:?}");
    // Closing the input ends the chat.
    let closed = call(&peer, "task_input", json!({"task_id": chat, "text": "", "close": true})).await;
    assert!(!common::is_error(&closed), "{}", only_text(&closed));
    let rest = texts(&call(&peer, "task_output", json!({"task_id": chat, "wait": true, "timeout_ms": 30_000})).await);
    assert!(rest[0].ends_with("bye\n[status: completed, exit code: 0]"), "{rest:?}");
    drop(client);
    let _ = child.wait().await;
}

/// A SIGTERM as soon as the start is answered: the tree's plan may still be
/// on its way to its keeper, which must take it up although the server is
/// gone (it once dropped it, and the next server found the task lost). A
/// race, so several rounds; each must find the task running.
#[tokio::test]
async fn a_server_stopped_right_after_a_start_still_hands_the_tree_on() {
    for round in 0..6 {
        let dir = temp_dir(&format!("readopt-stop-at-start-{round}"));
        let (client, child) = serve_owner(&dir, "alice").await;
        let started = call(client.peer(), "bash", json!({"command": "sleep 600", "run_in_background": true})).await;
        let id = common::started_task(&started);
        sigterm(child, client).await;
        let (client, child) = serve_owner(&dir, "alice").await;
        let listed = only_text(&call(client.peer(), "task_list", json!({})).await);
        assert!(listed.starts_with(&format!("{id} [bash] running")), "round {round}: {listed}");
        call(client.peer(), "task_kill", json!({"task_id": id})).await;
        sigkill(child, client).await;
    }
}
