//! `taskhost serve --http` on the wire: raw HTTP for what MCP clients do
//! not send (foreign hosts and origins, bodies that are not JSON-RPC,
//! half-sent requests, idle and surplus connections, mixed protocol
//! versions), each answered with the status and the JSON-RPC error it must
//! get, and the server serving on.

use crate::common;
use crate::mcp_http::{ALICE, HttpServer};

use std::time::Duration;

use serde_json::json;

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

/// The standard headers (SEP-2243): a request whose `Mcp-Method` or
/// `Mcp-Name` disagrees with its body is refused with a 400 and a
/// header-mismatch error (a balancer routed it on a name the server would
/// not act on); matching headers, and none, are served.
#[tokio::test]
async fn standard_headers_that_disagree_with_the_body_are_refused() {
    let server = HttpServer::start("http-std-headers").await;
    let http = taskhost::http_client::client();
    let v1 = ("mcp-protocol-version", "2025-11-25");
    let (status, _) = post(&http, &server, &[v1], initialize_body(1, "2025-11-25")).await;
    assert_eq!(status, 200);
    let list =
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "task_list", "arguments": {}}});
    let (status, answer) =
        post(&http, &server, &[v1, ("mcp-method", "tools/call"), ("mcp-name", "task_list")], list.to_string()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["content"][0]["text"], "(no background tasks)", "{answer}");
    let (status, answer) = post(&http, &server, &[v1, ("mcp-name", "bash")], list.to_string()).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], -32001, "{answer}");
    assert_eq!(answer["id"], 2, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("Mcp-Name is \"bash\""), "{answer}");
    let (status, answer) = post(&http, &server, &[v1, ("mcp-method", "tools/list")], list.to_string()).await;
    assert_eq!((status, answer["error"]["code"].clone()), (400, json!(-32001)), "{answer}");
    // Served on, without the headers.
    tools_list_works(&http, &server, 3).await;
    server.stop().await;
}
