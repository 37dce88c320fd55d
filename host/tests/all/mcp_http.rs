//! `taskhost serve --http` end to end: the real binary on a real socket and
//! rmcp's streamable HTTP client (raw HTTP on the wire: `mcp_http_wire`).

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::procfs::{ESCAPEES, ProcessMark};
use common::{Client, call, is_error, only_text, serve_command, temp_dir, texts};
use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::json;

pub(crate) const ALICE: &str = "alice-secret-0123456789abcdef";
pub(crate) const BOB: &str = "bob-secret-0123456789abcdef0123";

pub(crate) struct HttpServer {
    child: tokio::process::Child,
    pub(crate) url: String,
    pub(crate) log: std::path::PathBuf,
}

impl HttpServer {
    /// Starts `taskhost serve --http 127.0.0.1:0` with two clients, alice
    /// (token in the file) and bob (token from the environment).
    pub(crate) async fn start(tag: &str) -> Self {
        Self::start_with_keys(tag, "").await
    }

    /// As [`Self::start`], with more `[serve.http]` keys.
    pub(crate) async fn start_with_keys(tag: &str, http_keys: &str) -> Self {
        let config = format!(
            "[serve.http]\n{http_keys}\n\
             [[serve.http.tokens]]\nname = \"alice\"\ntoken = \"{ALICE}\"\n\n\
             [[serve.http.tokens]]\nname = \"bob\"\ntoken_env = \"TASKHOST_TEST_BOB\"\n"
        );
        Self::start_with(&temp_dir(tag), &config).await
    }

    /// Starts `taskhost serve --http 127.0.0.1:0` in `dir` with `config`
    /// (written to `dir/test.toml`) and bob's token in `TASKHOST_TEST_BOB`.
    pub(crate) async fn start_with(dir: &std::path::Path, config: &str) -> Self {
        let log = dir.join("stderr.log");
        let mut command = serve_command(dir, Some(config));
        command.args(["--http", "127.0.0.1:0"]).env("TASKHOST_TEST_BOB", BOB);
        let (child, url) = common::spawn_http_server(command, Some(log.clone())).await;
        Self { child, url, log }
    }

    pub(crate) async fn client(&self, token: &str) -> Client {
        let transport = StreamableHttpClientTransport::with_client(
            taskhost::http_client::client(),
            StreamableHttpClientTransportConfig::with_uri(self.url.clone()).auth_header(token),
        );
        ().serve(transport).await.expect("initialize over HTTP")
    }

    pub(crate) async fn stop(mut self) -> String {
        let pid = self.child.id().expect("running");
        assert!(std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
        let status =
            tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.expect("exits on SIGTERM").unwrap();
        let log = common::wait_for_text(&self.log, "host disposed; exiting", Duration::from_secs(5)).await;
        assert!(status.success(), "exit status {status}; log:\n{log}");
        log
    }
}

#[tokio::test]
async fn two_tokens_are_two_isolated_owners() {
    let server = HttpServer::start("http-owners").await;
    let alice = server.client(ALICE).await;
    let bob = server.client(BOB).await;

    let names: Vec<String> = alice.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect();
    assert_eq!(names, ["bash", "task_input", "task_kill", "task_list", "task_output", "task_wait", "ticker"]);

    let started =
        call(alice.peer(), "ticker", json!({"count": 1000, "interval_ms": 50, "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background ticker task ticker-1");

    // Bob sees nothing of alice's task and can touch none of it.
    assert_eq!(only_text(&call(bob.peer(), "task_list", json!({})).await), "(no background tasks)");
    for (tool, args) in [
        ("task_output", json!({"task_id": "ticker-1"})),
        ("task_output", json!({"task_id": "ticker-1", "wait": true, "timeout_ms": 100})),
        ("task_kill", json!({"task_id": "ticker-1"})),
    ] {
        let refused = call(bob.peer(), tool, args).await;
        assert!(is_error(&refused), "{tool} of a foreign task is an error");
        assert_eq!(only_text(&refused), "task ticker-1 belongs to another session");
    }
    // Unknown ids say so.
    let unknown = call(bob.peer(), "task_output", json!({"task_id": "ticker-77"})).await;
    assert!(is_error(&unknown));
    assert_eq!(
        only_text(&unknown),
        "unknown task id ticker-77: no background task has this id (task_list shows your tasks)"
    );

    // Alice still owns it; a second connection with her token is the same owner.
    let alice_again = server.client(ALICE).await;
    let listed = only_text(&call(alice_again.peer(), "task_list", json!({})).await);
    assert!(listed.contains(" (stopped in 2"), "a token's task has a day to live: {listed}");
    assert_eq!(common::without_time_left(&listed), "ticker-1 [ticker] running — 1000 ticks every 50 ms");
    assert_eq!(
        only_text(&call(alice.peer(), "task_kill", json!({"task_id": "ticker-1"})).await),
        "requested cancellation of task ticker-1"
    );

    // A notice reaches the owner once, on whichever of her connections calls next.
    call(alice.peer(), "ticker", json!({"count": 1, "interval_ms": 1, "run_in_background": true})).await;
    // Poll alice's list until ticker-2 shows as finished (a list reports
    // nothing): the notice rides on exactly one result, on the first call
    // after its settlement.
    let notice = "background task ticker-2 (ticker: 1 ticks every 1 ms) finished [status: completed";
    let mut notices = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let result = texts(&call(alice_again.peer(), "task_list", json!({})).await);
        notices += result.iter().skip(1).filter(|text| text.starts_with(notice)).count();
        assert!(result.len() <= 2, "list plus at most one notice: {result:?}");
        if result[0].contains("ticker-2 [ticker] completed") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "ticker-2 never finished: {result:?}");
        tokio::time::sleep(Duration::from_millis(20)).await; // polling a state with no event here
    }
    if notices == 0 {
        let next = texts(&call(alice_again.peer(), "task_list", json!({})).await);
        assert!(next.len() == 2 && next[1].starts_with(notice), "{next:?}");
        notices = 1;
    }
    assert_eq!(notices, 1, "the notice reaches alice exactly once");
    assert_eq!(texts(&call(alice.peer(), "task_list", json!({})).await).len(), 1);
    assert_eq!(texts(&call(bob.peer(), "task_list", json!({})).await), ["(no background tasks)"]);

    for client in [alice, bob, alice_again] {
        let _ = client.cancel().await;
    }
    server.stop().await;
}

#[tokio::test]
async fn requests_without_a_valid_token_are_refused() {
    let server = HttpServer::start("http-auth").await;
    let http = taskhost::http_client::client();
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
    });
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    for body in [&initialize, &list] {
        for auth in [None, Some("Bearer wrong-token-0123456789abcdef"), Some("Basic YWxpY2U6c2VjcmV0"), Some(ALICE)] {
            let mut request = http
                .post(&server.url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .json(body);
            if let Some(auth) = auth {
                request = request.header("authorization", auth);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 401, "auth {auth:?} must be refused");
            assert_eq!(response.headers()["www-authenticate"], "Bearer realm=\"taskhost\"");
            let answer: serde_json::Value = response.json().await.unwrap();
            let expected = if auth.is_none() || auth.is_some_and(|a| !a.starts_with("Bearer ")) {
                "Unauthorized: missing bearer token: send the header `Authorization: Bearer <token>`"
            } else {
                "Unauthorized: invalid bearer token"
            };
            assert_eq!(answer, json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": expected}}));
        }
    }
    // The rmcp client with a wrong token cannot even initialize.
    let transport = StreamableHttpClientTransport::with_client(
        taskhost::http_client::client(),
        StreamableHttpClientTransportConfig::with_uri(server.url.clone()).auth_header("not-a-valid-token-at-all"),
    );
    assert!(().serve(transport).await.is_err(), "a wrong token must not initialize");
    // The right token works on the same server.
    let response = http
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {ALICE}"))
        .json(&initialize)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    server.stop().await;
}

#[tokio::test]
async fn bad_input_over_http_gets_clear_errors_and_the_server_keeps_serving() {
    let server = HttpServer::start("http-bad").await;
    let alice = server.client(ALICE).await;
    let peer = alice.peer();

    let unknown = call(peer, "no_such_tool", json!({})).await;
    assert!(is_error(&unknown));
    assert_eq!(
        only_text(&unknown),
        "unknown tool \"no_such_tool\"; available tools: bash, task_input, task_kill, task_list, task_output, task_wait, ticker"
    );
    let bad = call(peer, "ticker", json!({"count": "three"})).await;
    assert!(is_error(&bad));
    assert!(only_text(&bad).starts_with("invalid arguments for ticker: at /count: "), "{:?}", texts(&bad));
    let big = "x".repeat(10 * 1024 * 1024);
    let oversized = call(peer, "ticker", json!({"message": big})).await;
    assert!(is_error(&oversized));
    assert_eq!(
        only_text(&oversized),
        "arguments for ticker are 10485774 bytes, over this server's limit of 1048576 bytes \
         ([serve] max_argument_bytes); send less data"
    );
    assert_eq!(only_text(&call(peer, "task_list", json!({})).await), "(no background tasks)");

    // Malformed JSON in a POST body: a JSON-RPC parse error, and the server
    // keeps serving.
    let response = taskhost::http_client::client()
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {ALICE}"))
        .body("{ this is not json")
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(status, 400, "body: {body}");
    assert_eq!((body["id"].clone(), body["error"]["code"].clone()), (json!(null), json!(-32700)), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Parse error: the message is not valid JSON (key must be a string"),
        "{body}"
    );
    assert_eq!(only_text(&call(peer, "task_list", json!({})).await), "(no background tasks)");

    let _ = alice.cancel().await;
    server.stop().await;
}

/// Background bash over HTTP: the owner reads its output, another owner
/// cannot see it, and the shutdown of a server whose store does not outlive
/// it leaves no process of any owner behind (checked in /proc). (With the
/// default store, a token's handed-over trees outlive a shutdown for the
/// next server: `readopt::an_http_owners_background_command_survives_a_sigterm_of_the_server`.)
#[tokio::test]
async fn shutdown_disposes_every_owners_tasks_and_leaves_no_process() {
    let config = format!(
        "[state]\nstore = \"memory\"\n\n[[serve.http.tokens]]\nname = \"alice\"\ntoken = \"{ALICE}\"\n\n\
         [[serve.http.tokens]]\nname = \"bob\"\ntoken_env = \"TASKHOST_TEST_BOB\"\n"
    );
    let server = HttpServer::start_with(&temp_dir("http-shutdown"), &config).await;
    let alice = server.client(ALICE).await;
    let bob = server.client(BOB).await;
    let mark = ProcessMark::new("mcp-http-shutdown");
    let escapees = format!("{}{ESCAPEES}", mark.export());
    assert_eq!(
        only_text(&call(alice.peer(), "bash", json!({"command": escapees, "run_in_background": true})).await),
        "started background bash task bash-1"
    );
    call(bob.peer(), "ticker", json!({"count": 100000, "interval_ms": 1000, "run_in_background": true})).await;
    mark.await_at_least(4, Duration::from_secs(20)).await;
    let output = only_text(
        &call(alice.peer(), "task_output", json!({"task_id": "bash-1", "wait": true, "timeout_ms": 300})).await,
    );
    assert_eq!(output, "started\n[status: running]");
    let foreign = call(bob.peer(), "task_output", json!({"task_id": "bash-1"})).await;
    assert!(is_error(&foreign));
    assert_eq!(only_text(&foreign), "task bash-1 belongs to another session");
    assert_eq!(
        common::without_time_left(&only_text(&call(bob.peer(), "task_list", json!({})).await)),
        "ticker-1 [ticker] running — 100000 ticks every 1000 ms"
    );

    let log = server.stop().await;
    for task in ["bash-1", "ticker-1"] {
        assert!(log.contains(&format!("task settled task={task} status=killed")), "{task} not killed:\n{log}");
    }
    mark.assert_none_within(Duration::from_secs(5)).await;
    drop((alice, bob));
}

#[tokio::test]
async fn http_without_tokens_refuses_to_start() {
    let dir = temp_dir("http-no-tokens");
    let output = serve_command(&dir, None).args(["--http", "127.0.0.1:0"]).stdin(Stdio::null()).output().await.unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("serving over HTTP needs at least one client token"), "stderr: {stderr}");
}

#[tokio::test]
async fn closing_the_response_stream_kills_a_foreground_call() {
    let server = HttpServer::start("http-cancel").await;
    let call = json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "ticker", "arguments": {"count": 100000, "interval_ms": 50}}
    });
    // The client gives up after 500 ms and closes the connection.
    let gave_up = taskhost::http_client::client()
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {ALICE}"))
        .timeout(Duration::from_millis(500))
        .json(&call)
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()), "the call must still be running when the client leaves");
    common::wait_for_text(
        &server.log,
        "stopping a foreground task tool=ticker reason=the call was cancelled",
        Duration::from_secs(10),
    )
    .await;
    server.stop().await;
}

/// The start-up warning about inline tokens in the workspace.
const INLINE_WARNING: &str = "the configuration file holds inline HTTP tokens and lies inside the served workspace";

#[tokio::test]
async fn inline_tokens_in_the_served_workspace_are_warned_about_with_the_fix() {
    // The configuration (alice's token inline) is in the server's cwd.
    let server = HttpServer::start("http-inline").await;
    let log = server.stop().await;
    let line = log.lines().find(|l| l.contains(INLINE_WARNING)).unwrap_or_else(|| panic!("no warning in:\n{log}"));
    assert!(line.contains("WARN") && line.contains("tokens=alice") && line.contains("test.toml"), "{line}");
    assert!(line.contains("token_env = \"NAME\"") && line.contains("token_file = "), "the fix is named: {line}");
    assert!(!line.contains(ALICE), "the secret is never logged: {line}");
}

#[tokio::test]
async fn token_files_and_token_env_authenticate_without_a_warning() {
    let dir = temp_dir("http-token-file");
    // The secret lives outside the served workspace, in a file of its own.
    let secrets = temp_dir("http-token-file-secrets");
    let token_file = secrets.join("alice.token");
    std::fs::write(&token_file, format!("{ALICE}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let config = format!(
        "[[serve.http.tokens]]\nname = \"alice\"\ntoken_file = \"{}\"\n\n\
         [[serve.http.tokens]]\nname = \"bob\"\ntoken_env = \"TASKHOST_TEST_BOB\"\n",
        token_file.display()
    );
    let server = HttpServer::start_with(&dir, &config).await;
    let alice = server.client(ALICE).await;
    let bob = server.client(BOB).await;
    let started =
        call(alice.peer(), "ticker", json!({"count": 1000, "interval_ms": 50, "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background ticker task ticker-1");
    assert_eq!(only_text(&call(bob.peer(), "task_list", json!({})).await), "(no background tasks)");
    for client in [alice, bob] {
        let _ = client.cancel().await;
    }
    let log = server.stop().await;
    assert!(!log.contains(INLINE_WARNING), "no inline token, no warning:\n{log}");
    std::fs::remove_dir_all(&secrets).unwrap();
}
