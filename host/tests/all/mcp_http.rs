//! `taskhost serve --http` end to end: the real binary on a real socket,
//! rmcp's streamable HTTP client, and raw HTTP for what clients don't send.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::procfs::{ESCAPEES, ProcessMark};
use common::{Client, call, is_error, only_text, serve_command, temp_dir, texts};
use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::json;

const ALICE: &str = "alice-secret-0123456789abcdef";
const BOB: &str = "bob-secret-0123456789abcdef0123";

struct HttpServer {
    child: tokio::process::Child,
    url: String,
    log: std::path::PathBuf,
}

impl HttpServer {
    /// Starts `taskhost serve --http 127.0.0.1:0` with two clients, alice
    /// (token in the file) and bob (token from the environment).
    async fn start(tag: &str) -> Self {
        Self::start_with_keys(tag, "").await
    }

    /// As [`Self::start`], with more `[serve.http]` keys.
    async fn start_with_keys(tag: &str, http_keys: &str) -> Self {
        let config = format!(
            "[serve.http]\n{http_keys}\n\
             [[serve.http.tokens]]\nname = \"alice\"\ntoken = \"{ALICE}\"\n\n\
             [[serve.http.tokens]]\nname = \"bob\"\ntoken_env = \"TASKHOST_TEST_BOB\"\n"
        );
        Self::start_with(&temp_dir(tag), &config).await
    }

    /// Starts `taskhost serve --http 127.0.0.1:0` in `dir` with `config`
    /// (written to `dir/test.toml`) and bob's token in `TASKHOST_TEST_BOB`.
    async fn start_with(dir: &std::path::Path, config: &str) -> Self {
        let log = dir.join("stderr.log");
        let mut command = serve_command(dir, Some(config));
        command.args(["--http", "127.0.0.1:0"]).env("TASKHOST_TEST_BOB", BOB);
        let (child, url) = common::spawn_http_server(command, Some(log.clone())).await;
        Self { child, url, log }
    }

    async fn client(&self, token: &str) -> Client {
        let transport = StreamableHttpClientTransport::with_client(
            taskhost::http_client::client(),
            StreamableHttpClientTransportConfig::with_uri(self.url.clone()).auth_header(token),
        );
        ().serve(transport).await.expect("initialize over HTTP")
    }

    async fn stop(mut self) -> String {
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
    assert_eq!(
        only_text(&call(alice_again.peer(), "task_list", json!({})).await),
        "ticker-1 [ticker] running — 1000 ticks every 50 ms"
    );
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
        only_text(&call(bob.peer(), "task_list", json!({})).await),
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

#[tokio::test]
async fn a_host_header_outside_allowed_hosts_is_refused() {
    let server = HttpServer::start("http-hosts").await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    let send = |host: &'static str| {
        taskhost::http_client::client()
            .post(&server.url)
            .header("host", host)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {ALICE}"))
            .json(&list)
            .send()
    };
    // A DNS-rebinding page reaches the loopback server under its own name.
    let refused = send("evil.example").await.unwrap();
    assert_eq!(refused.status(), 403);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body, rpc_error(json!(1), -32600, "Forbidden: Host header is not allowed"));
    assert_eq!(send("localhost").await.unwrap().status(), 200);
    server.stop().await;
}

/// A raw POST of `body` to the server with alice's token and `headers`;
/// the status and the JSON answer.
async fn post(
    http: &reqwest::Client,
    server: &HttpServer,
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
) -> (u16, serde_json::Value) {
    let mut request = http
        .post(&server.url)
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {ALICE}"));
    if !headers.iter().any(|(name, _)| *name == "content-type") {
        request = request.header("content-type", "application/json");
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.body(body).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let answer = serde_json::from_str(&text).unwrap_or_else(|e| panic!("status {status}: {text:?} is not JSON: {e}"));
    (status, answer)
}

fn initialize_body(id: u64, version: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
    .to_string()
}

/// `tools/list` as a 2025-11-25 client sends it after initializing.
async fn tools_list_works(http: &reqwest::Client, server: &HttpServer, id: u64) {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}).to_string();
    let (status, answer) = post(http, server, &[("mcp-protocol-version", "2025-11-25")], body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], json!(id), "{answer}");
    assert_eq!(answer["result"]["tools"].as_array().map(Vec::len), Some(7), "{answer}");
}

fn rpc_error(id: serde_json::Value, code: i64, message: &str) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Issue 12 items 8 and 9: `Origin` is validated against
/// `allowed_origins`, the bearer scheme is case-insensitive.
#[tokio::test]
async fn origins_are_validated_and_the_bearer_scheme_is_case_insensitive() {
    let server = HttpServer::start_with_keys("http-origin", "allowed_origins = [\"https://app.example.com\"]").await;
    let http = taskhost::http_client::client();
    for origin in ["https://evil.example.com", "null", "http://app.example.com"] {
        let (status, answer) = post(&http, &server, &[("origin", origin)], initialize_body(1, "2025-11-25")).await;
        assert_eq!(status, 403);
        assert_eq!(
            answer,
            rpc_error(
                json!(null),
                -32600,
                &format!(
                    "Forbidden: Origin {origin:?} is not allowed. Requests from web pages need their origin listed \
                     in [serve.http] allowed_origins"
                )
            )
        );
    }
    for origin in ["https://app.example.com", "HTTPS://App.Example.com"] {
        let (status, answer) = post(&http, &server, &[("origin", origin)], initialize_body(2, "2025-11-25")).await;
        assert_eq!((status, answer["result"]["serverInfo"]["name"].clone()), (200, json!("taskhost")), "{answer}");
    }
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        let response = http
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("{scheme} {ALICE}"))
            .body(initialize_body(3, "2025-11-25"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "scheme {scheme}");
    }
    tools_list_works(&http, &server, 4).await;
    server.stop().await;
}

/// Issue 12 items 6, 7 and 9 over HTTP: bodies that are not JSON-RPC get
/// JSON-RPC errors (with the id when readable), and the server keeps serving.
#[tokio::test]
async fn bodies_that_are_not_json_rpc_get_json_rpc_errors() {
    let server = HttpServer::start("http-bodies").await;
    let http = taskhost::http_client::client();
    let v = [("mcp-protocol-version", "2025-11-25")];
    let (status, answer) = post(&http, &server, &[("content-type", "text/plain")], "hello").await;
    assert_eq!(status, 415);
    assert_eq!(
        answer,
        rpc_error(
            json!(null),
            -32600,
            "Unsupported Media Type: send the JSON-RPC message with Content-Type: application/json"
        )
    );
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let (status, answer) = post(&http, &server, &v, deep).await;
    assert_eq!(status, 400);
    assert_eq!(
        answer,
        rpc_error(
            json!(null),
            -32700,
            "Parse error: the message nests arrays/objects deeper than 64 levels; flatten it"
        )
    );
    let (status, answer) =
        post(&http, &server, &v, r#"{"jsonrpc":"2.0","id":5,"method":"ping","params":{"x":"\ud800"}}"#).await;
    assert_eq!((status, answer["id"].clone(), answer["error"]["code"].clone()), (400, json!(null), json!(-32700)));
    let (status, answer) = post(&http, &server, &v, r#"{"jsonrpc":"1.0","id":6,"method":"ping"}"#).await;
    assert_eq!((status, answer), (400, rpc_error(json!(6), -32600, "Invalid request: \"jsonrpc\" must be \"2.0\"")));
    let (status, answer) = post(&http, &server, &v, r#"{"jsonrpc":"2.0","id":7,"method":"no/such"}"#).await;
    assert_eq!(
        (status, answer),
        (
            404,
            rpc_error(
                json!(7),
                -32601,
                "Method not found: \"no/such\"; this server implements initialize, ping, tools/list, tools/call and tasks/*"
            )
        )
    );
    for (id, params, message) in [
        (
            8,
            json!({"name": "bash", "arguments": [1]}),
            "params.arguments must be an object (the tool's arguments by name), got an array",
        ),
        (
            9,
            json!({"name": "bash", "arguments": "ls"}),
            "params.arguments must be an object (the tool's arguments by name), got a string",
        ),
        (10, json!({"name": 3}), "params.name must be a string (the tool's name as a string), got a number"),
    ] {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string();
        let (status, answer) = post(&http, &server, &v, body).await;
        assert_eq!(
            (status, answer),
            (200, rpc_error(json!(id), -32602, &format!("Invalid params for tools/call: {message}")))
        );
    }
    let (status, answer) = post(&http, &server, &v, r#"{"jsonrpc":"2.0","id":11,"method":"tools/call"}"#).await;
    assert_eq!(
        (status, answer),
        (
            200,
            rpc_error(
                json!(11),
                -32602,
                "Invalid params for tools/call: params is missing; send params.name (the tool's name as a string)"
            )
        )
    );
    tools_list_works(&http, &server, 12).await;
    server.stop().await;
}

/// Issue 12 item 3: a half-sent request and an idle connection are closed
/// after `header_timeout_ms`; honest requests keep working.
#[tokio::test]
async fn half_sent_requests_and_idle_connections_are_timed_out() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = HttpServer::start_with_keys("http-timeouts", "header_timeout_ms = 300").await;
    let address = server.url.trim_start_matches("http://").split('/').next().unwrap().to_string();
    let mut half = tokio::net::TcpStream::connect(&address).await.unwrap();
    half.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty").await.unwrap();
    let mut idle = tokio::net::TcpStream::connect(&address).await.unwrap();
    for stream in [&mut half, &mut idle] {
        // The server closes it: the read ends (EOF or reset), well before 20 s.
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the server did not close the connection");
    }
    tools_list_works(&taskhost::http_client::client(), &server, 1).await;
    server.stop().await;
}

/// Issue 12 item 3: connections over `max_connections`, when every slot is
/// held by a token holder, get a 503 with a JSON-RPC error body; once
/// connections close, clients are served again. (Connections without a
/// token make room instead: `http_limits`.)
#[tokio::test]
async fn connections_over_the_cap_get_a_503_with_a_json_rpc_error() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = HttpServer::start_with_keys("http-cap", "max_connections = 3\nheader_timeout_ms = 60000").await;
    let address = server.url.trim_start_matches("http://").split('/').next().unwrap().to_string();
    let mut holders = Vec::new();
    for id in 0..3 {
        // Each holder authenticates with one ping, then stays open, idle.
        let mut holder = tokio::net::TcpStream::connect(&address).await.unwrap();
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "ping"}).to_string();
        let request = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ALICE}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             MCP-Protocol-Version: 2025-11-25\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        holder.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let mut chunk = [0u8; 4096];
        while !String::from_utf8_lossy(&answer).contains(&format!("\"id\":{id}")) {
            let n = tokio::time::timeout(Duration::from_secs(20), holder.read(&mut chunk)).await.unwrap().unwrap();
            assert!(n > 0, "the holder's ping was answered: {}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&chunk[..n]);
        }
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
        holders.push(holder);
    }
    // The three authenticated holders take the slots.
    let mut over = tokio::net::TcpStream::connect(&address).await.unwrap();
    over.write_all(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(20), over.read_to_string(&mut response)).await.unwrap().unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 503 Service Unavailable"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(body).unwrap(),
        rpc_error(
            json!(null),
            -32000,
            "Too many connections: this server serves at most 3 at once ([serve.http] max_connections); retry shortly"
        )
    );
    let log = common::wait_for_text(&server.log, "connection bound hit", Duration::from_secs(10)).await;
    assert_eq!(log.matches("connection bound hit").count(), 1, "logged once: {log}");
    drop(holders);
    // The server notices the closes; a client is then served again.
    let http = taskhost::http_client::client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let response = http
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {ALICE}"))
            .body(initialize_body(1, "2025-11-25"))
            .send()
            .await;
        match response {
            Ok(response) if response.status() == 200 => break,
            other => assert!(tokio::time::Instant::now() < deadline, "still refused after the holders left: {other:?}"),
        }
        tokio::task::yield_now().await;
    }
    tools_list_works(&http, &server, 2).await;
    server.stop().await;
}

/// Issue 12 item 10 over HTTP: rmcp serves HTTP statelessly, so the rule is
/// per request: each is judged by its own `MCP-Protocol-Version` header and
/// `_meta`. A 2026-07-28 request, then `initialize`, then pings of either
/// generation: each gets the answer its own protocol gives, and a 2026-07-28
/// request without its context gets an error that says what is missing.
#[tokio::test]
async fn http_judges_each_request_by_its_own_protocol() {
    let server = HttpServer::start("http-modes").await;
    let http = taskhost::http_client::client();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let modern = [("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/list")];
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}).to_string();
    let (status, answer) = post(&http, &server, &modern, list).await;
    assert_eq!((status, answer["result"]["tools"].as_array().map(Vec::len)), (200, Some(7)), "{answer}");
    let (status, answer) = post(&http, &server, &[], initialize_body(2, "2025-11-25")).await;
    assert_eq!((status, answer["result"]["protocolVersion"].clone()), (200, json!("2025-11-25")), "{answer}");
    let ping = |id: u64| json!({"jsonrpc": "2.0", "id": id, "method": "ping"}).to_string();
    let (status, answer) = post(&http, &server, &[("mcp-protocol-version", "2025-11-25")], ping(3)).await;
    assert_eq!((status, answer), (200, json!({"jsonrpc": "2.0", "id": 3, "result": {}})));
    let (status, answer) =
        post(&http, &server, &[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "ping")], ping(4)).await;
    assert_eq!(
        (status, answer),
        (
            400,
            rpc_error(
                json!(4),
                -32602,
                "Invalid params: request _meta is missing or has malformed required fields: \
                 io.modelcontextprotocol/protocolVersion, io.modelcontextprotocol/clientCapabilities"
            )
        )
    );
    tools_list_works(&http, &server, 5).await;
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
