//! The HTTP listener's capacity against clients that take it, through
//! `taskhost serve --http` and real sockets: connections without a token
//! hold a small share of the slots, one token's flood leaves the others
//! their calls, dashboard event streams are capped per token.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt as _;
use serde_json::json;
use tokio::io::AsyncReadExt as _;

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef01";

struct Server {
    child: tokio::process::Child,
    url: String,
    log: PathBuf,
    base: PathBuf,
}

impl Server {
    /// `taskhost serve --http 127.0.0.1:0` (as `uid` when given) with the
    /// tokens alice and bob and `http_keys` in `[serve.http]`; the
    /// configuration lies outside the workspace.
    async fn start(tag: &str, uid: Option<u32>, http_keys: &str) -> Self {
        let base = common::temp_dir(tag);
        let work = base.join("work");
        for dir in [&work, &base.join("state"), &base.join("cache"), &base.join("home")] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let config = base.join("limits.toml");
        std::fs::write(
            &config,
            format!(
                "[serve.http]\n{http_keys}\n[[serve.http.tokens]]\nname = \"alice\"\ntoken = \"{ALICE}\"\n\
                 [[serve.http.tokens]]\nname = \"bob\"\ntoken = \"{BOB}\"\n"
            ),
        )
        .unwrap();
        if let Some(uid) = uid {
            crate::state_trust::chown_tree(&base, uid);
        }
        let mut command = common::taskhost_as(uid);
        command
            .args(["serve", "--http", "127.0.0.1:0", "--config"])
            .arg(&config)
            .current_dir(&work)
            .env("HOME", base.join("home"))
            .env("XDG_STATE_HOME", base.join("state"))
            .env("XDG_CACHE_HOME", base.join("cache"))
            .env("RUST_LOG", "info,taskhost=debug");
        let log = base.join("stderr.log");
        let (child, url) = common::spawn_http_server(command, Some(log.clone())).await;
        Self { child, url, log, base }
    }

    fn address(&self) -> String {
        self.url.trim_start_matches("http://").split('/').next().unwrap().to_string()
    }

    fn origin(&self) -> String {
        self.url.trim_end_matches("/mcp").to_string()
    }

    /// A `tools/call` of `tool` with `token`, each on a fresh connection
    /// when `http` has no idle one: the status, `Retry-After`, and the body.
    async fn call(
        &self,
        http: &reqwest::Client,
        token: &str,
        id: u64,
        tool: &str,
        arguments: serde_json::Value,
    ) -> reqwest::Result<(u16, Option<String>, serde_json::Value)> {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": tool, "arguments": arguments}});
        let response = http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .bearer_auth(token)
            .body(body.to_string())
            .send()
            .await?;
        let status = response.status().as_u16();
        let retry = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
        let text = response.text().await?;
        let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("status {status}: {text:?}: {e}"));
        Ok((status, retry, value))
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// 300 connections that never send a byte (more than the 256 slots): a
/// token holder's call is served at once, and the oldest idle connections
/// were closed to make room (the 44 over the slots, and one for alice).
async fn idle_connections(tag: &str, uid: Option<u32>) {
    let server = Server::start(tag, uid, "header_timeout_ms = 60000").await;
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(tokio::net::TcpStream::connect(server.address()).await.unwrap());
    }
    let http = taskhost::http_client::client();
    let (status, _, answer) = tokio::time::timeout(
        Duration::from_secs(20),
        server.call(&http, ALICE, 1, "ticker", json!({"count": 2, "interval_ms": 1})),
    )
    .await
    .expect("the token holder's call is not held up")
    .expect("the token holder's connection is served");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["content"][0]["text"], json!("tick 1\ntick 2\n[status: completed, ticks: 2]"));
    // The server closed the oldest idle connections (an EOF each): the 44
    // beyond the 256 slots and the one alice's connection replaced.
    let mut reads: futures::stream::FuturesUnordered<_> = idle
        .iter_mut()
        .map(|stream| async move {
            let mut byte = [0u8; 1];
            matches!(stream.read(&mut byte).await, Ok(0) | Err(_))
        })
        .collect();
    let mut closed = 0;
    let counted = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(eof) = reads.next().await {
            closed += usize::from(eof);
            if closed > 300 - 256 {
                break;
            }
        }
    })
    .await;
    assert!(counted.is_ok(), "only {closed} of the 300 idle connections were closed, not 45");
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("closed the oldest connection without a token"), "{log}");
    drop(reads);
    server.stop().await;
}

#[tokio::test]
async fn idle_connections_without_a_token_do_not_stop_a_token_holders_call() {
    idle_connections("http-idle", None).await;
}

#[tokio::test]
async fn idle_connections_without_a_token_do_not_stop_a_token_holders_call_on_an_unprivileged_server() {
    let Some(uid) = crate::state_trust::unprivileged() else { return };
    idle_connections("http-idle-nobody", Some(uid)).await;
}

/// Bob sends 300 slow calls at once, each on a connection of its own: he
/// gets his share (requests in flight, connections) and `429` with
/// `Retry-After` beyond it, while alice's call, sent while his are in
/// flight, is answered.
#[tokio::test]
async fn one_tokens_flood_does_not_stop_another_tokens_call() {
    let server = std::sync::Arc::new(Server::start("http-flood", None, "header_timeout_ms = 60000").await);
    let (refused_tx, mut refused_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut flood = tokio::task::JoinSet::new();
    for id in 0..300u64 {
        let (server, refused_tx) = (server.clone(), refused_tx.clone());
        flood.spawn(async move {
            // A client per request: a connection per request.
            let http = taskhost::http_client::client();
            let answer = server.call(&http, BOB, id, "ticker", json!({"count": 30, "interval_ms": 100})).await;
            if let Ok((429, retry, body)) = &answer {
                let _ = refused_tx.send((retry.clone(), body.clone()));
            }
            answer.map(|(status, _, _)| status).ok()
        });
    }
    drop(refused_tx);
    // Once bob has been refused, his share is in use: alice calls now.
    let (retry, body) =
        tokio::time::timeout(Duration::from_secs(30), refused_rx.recv()).await.expect("bob is refused").unwrap();
    assert_eq!(retry.as_deref(), Some("1"), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert_eq!(body["error"]["code"], json!(-32000), "{body}");
    assert!(
        message.starts_with("Too many requests in flight for token \"bob\": at most 32 at once")
            || message.starts_with("Too many connections for token \"bob\": it may hold at most 64 at once"),
        "{message}"
    );
    let http = taskhost::http_client::client();
    let (status, _, answer) = tokio::time::timeout(
        Duration::from_secs(20),
        server.call(&http, ALICE, 1000, "ticker", json!({"count": 1, "interval_ms": 1})),
    )
    .await
    .expect("alice is not held up by bob's flood")
    .expect("alice's connection is served");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["content"][0]["text"], json!("tick 1\n[status: completed, ticks: 1]"));
    let statuses: Vec<Option<u16>> = flood.join_all().await;
    let ok = statuses.iter().filter(|s| **s == Some(200)).count();
    let too_many = statuses.iter().filter(|s| **s == Some(429)).count();
    assert!(ok >= 1 && too_many >= 1, "bob: {ok} answered, {too_many} refused with 429");
    assert!(!statuses.contains(&Some(503)), "no slot was left to nobody: {statuses:?}");
    std::sync::Arc::into_inner(server).unwrap().stop().await;
}

/// One token may hold `max_event_streams_per_token` dashboard event streams
/// (here 2): the next gets `429`; another token still gets one.
#[tokio::test]
async fn dashboard_event_streams_are_capped_per_token() {
    let server = Server::start("http-streams", None, "max_event_streams_per_token = 2").await;
    let http = taskhost::http_client::client();
    let events = format!("{}/dashboard/api/events", server.origin());
    let open = |token: &'static str| http.get(&events).bearer_auth(token).send();
    let first = open(ALICE).await.unwrap();
    let second = open(ALICE).await.unwrap();
    assert_eq!((first.status().as_u16(), second.status().as_u16()), (200, 200));
    let third = open(ALICE).await.unwrap();
    assert_eq!(third.status().as_u16(), 429);
    assert_eq!(third.headers()["retry-after"], "5");
    let body: serde_json::Value = third.json().await.unwrap();
    assert_eq!(
        body["error"],
        json!(
            "too many dashboard event streams for token \"alice\": at most 2 at once \
             ([serve.http] max_event_streams_per_token); close another tab"
        )
    );
    let bobs = open(BOB).await.unwrap();
    assert_eq!(bobs.status().as_u16(), 200, "another token still gets a stream");
    drop((first, second, bobs));
    server.stop().await;
}
