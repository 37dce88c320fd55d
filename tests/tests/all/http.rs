//! Outbound HTTP (`wasi:http`) for a plugin granted `[producer.grants.http]`:
//! the `http-get` fixture (a real component using the standard
//! `wasi:http/outgoing-handler`) against real local servers. An allowed
//! origin answers; a refused origin, a refused method, the metadata address,
//! a name resolving to a special address, a redirect to a refused origin, an
//! oversized body, a slow server and a request flood each get the readable
//! error and the host carries on; the injected credential reaches the server
//! and never the guest; a plugin not granted HTTP is refused at load.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;
use taskhost::Host;
use taskhost::config::Config;
use taskhost::setup::host_from_config;
use taskhost::tools::CallContext;
use taskhost_tests::agent_calls::call;
use taskhost_tests::fixtures::HTTP_GET_PATH;

const SECRET: &str = "Bearer s3cret-never-for-the-guest";

#[derive(Clone, Default)]
struct Seen {
    authorization: Arc<Mutex<Vec<String>>>,
    hits: Arc<AtomicUsize>,
}

/// A real server on 127.0.0.1: `/ok`, `/auth` (records Authorization),
/// `/big` (100 000 bytes), `/slow` (never answers), `/redirect?to=<url>`.
async fn server() -> (SocketAddr, Seen) {
    let seen = Seen::default();
    let app = axum::Router::new()
        .route("/ok", get(|| async { "hello" }))
        .route(
            "/auth",
            get(|State(seen): State<Seen>, headers: HeaderMap| async move {
                let value = headers.get(header::AUTHORIZATION).map(|v| v.to_str().unwrap_or("?").to_string());
                seen.authorization.lock().unwrap().push(value.unwrap_or_default());
                "recorded"
            }),
        )
        .route("/big", get(|| async { "x".repeat(100_000) }))
        .route("/slow", get(std::future::pending::<&'static str>))
        .route(
            "/redirect",
            get(|axum::extract::RawQuery(query): axum::extract::RawQuery| async move {
                let to = query.unwrap_or_default().strip_prefix("to=").unwrap_or_default().to_string();
                (StatusCode::FOUND, [(header::LOCATION, to)]).into_response()
            }),
        )
        .layer(axum::middleware::from_fn_with_state(seen.clone(), count_hits))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

async fn count_hits(
    State(seen): State<Seen>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    seen.hits.fetch_add(1, Ordering::SeqCst);
    next.run(request).await
}

/// A host serving `http-get` with `grant` (the body of `[producer.grants.http]`).
async fn serve(grant: &str, dir: &Path) -> anyhow::Result<Host> {
    let text = format!(
        "[[producer]]\ntool = \"http_get\"\nplugin = {HTTP_GET_PATH:?}\nbackground = false\n\
         [producer.grants.http]\n{grant}\n"
    );
    host_from_config(&Config::parse(&text)?, dir).await
}

/// One `http_get` call (one task), as an agent of its own.
async fn get_url(host: &Host, url: &str, follow: u32) -> String {
    static AGENTS: AtomicUsize = AtomicUsize::new(0);
    let id = format!("http-{}", AGENTS.fetch_add(1, Ordering::SeqCst));
    let agent = host.create_agent(id.as_str(), id.as_str()).unwrap();
    call(host, &CallContext::for_agent(&agent), "http_get", json!({"url": url, "follow": follow})).await
}

#[tokio::test]
async fn a_granted_origin_answers_and_everything_else_is_refused_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, seen) = server().await;
    let (other, other_seen) = server().await;
    std::fs::write(dir.path().join("token"), format!("{SECRET}\n")).unwrap();
    let grant = format!(
        "origins = [\"http://{allowed}\"]\nmax_response_bytes = 10000\nrequest_timeout_ms = 300\n\
         [[producer.grants.http.credentials]]\norigin = \"http://{allowed}\"\nheader = \"Authorization\"\n\
         value_file = \"token\"\n"
    );
    let host = serve(&grant, dir.path()).await.unwrap();

    let ok = get_url(&host, &format!("http://{allowed}/ok"), 0).await;
    assert!(ok.contains("status 200") && ok.contains("body hello"), "{ok}");

    // The credential reaches the server, and nothing the guest sees holds it.
    let auth = get_url(&host, &format!("http://{allowed}/auth"), 0).await;
    assert!(auth.contains("body recorded"), "{auth}");
    assert_eq!(*seen.authorization.lock().unwrap(), [SECRET]);
    assert!(!auth.contains("s3cret") && !ok.contains("s3cret"), "{auth}");

    let refused = get_url(&host, &format!("http://{other}/ok"), 0).await;
    assert!(refused.contains(&format!("origin http://{other} is not granted to this plugin")), "{refused}");
    let metadata = get_url(&host, "http://169.254.169.254/latest/meta-data/", 0).await;
    assert!(metadata.contains("origin http://169.254.169.254:80 is not granted"), "{metadata}");

    // A redirect to a refused origin: the guest's next request is refused.
    let redirect = get_url(&host, &format!("http://{allowed}/redirect?to=http://{other}/ok"), 1).await;
    assert!(redirect.contains(&format!("redirect http://{other}/ok")), "{redirect}");
    assert!(redirect.contains(&format!("origin http://{other} is not granted")), "{redirect}");
    assert_eq!(other_seen.hits.load(Ordering::SeqCst), 0, "no request reached the refused server");

    let big = get_url(&host, &format!("http://{allowed}/big"), 0).await;
    assert!(big.contains("is over 10000 bytes, its bound ([producer.grants.http] max_response_bytes)"), "{big}");
    let slow = get_url(&host, &format!("http://{allowed}/slow"), 0).await;
    assert!(slow.contains("took longer than 300 ms, its bound ([producer.grants.http] request_timeout_ms)"), "{slow}");

    // The host carries on.
    let again = get_url(&host, &format!("http://{allowed}/ok"), 0).await;
    assert!(again.contains("body hello"), "{again}");
    host.dispose().await;
}

#[tokio::test]
async fn special_addresses_need_an_origin_that_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, seen) = server().await;
    let port = addr.port();
    // A name (not `localhost`, not an IP literal) that resolves to a special
    // address: this machine's own host name (loopback or a private address
    // on every machine the suite runs on).
    let name = std::fs::read_to_string("/etc/hostname").expect("/etc/hostname names this machine");
    let name = name.trim().to_ascii_lowercase();
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), port))
        .await
        .unwrap_or_else(|e| panic!("this machine's host name {name:?} must resolve (add it to /etc/hosts): {e}"))
        .collect();
    assert!(
        resolved.iter().all(|a| taskhost::outbound::guard::special_range(a.ip()).is_some()),
        "{name} resolves to {resolved:?}; the test needs it to resolve to loopback or a private address"
    );
    let host = serve(&format!("origins = [\"http://{name}:{port}\"]"), dir.path()).await.unwrap();
    let refused = get_url(&host, &format!("http://{name}:{port}/ok"), 0).await;
    assert!(refused.contains(&format!("{name} resolves to")) && refused.contains("names it"), "{refused}");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 0);
    host.dispose().await;

    // Named explicitly (`localhost`), loopback is reached.
    let host = serve(&format!("origins = [\"http://localhost:{port}\"]"), dir.path()).await.unwrap();
    let ok = get_url(&host, &format!("http://localhost:{port}/ok"), 0).await;
    assert!(ok.contains("body hello"), "{ok}");
    host.dispose().await;
}

#[tokio::test]
async fn methods_and_the_request_budget_are_bounded_per_task() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, seen) = server().await;
    let host = serve(&format!("origins = [\"http://{addr}\"]\nmax_requests_per_task = 2"), dir.path()).await.unwrap();
    let agent = host.create_agent("http", "http-session").unwrap();
    let context = CallContext::for_agent(&agent);
    let post = call(&host, &context, "http_get", json!({"url": format!("http://{addr}/ok"), "method": "POST"})).await;
    assert!(post.contains("method POST is not granted"), "{post}");
    // A redirect loop: two requests, then the task's budget is spent.
    let url = format!("http://{addr}/redirect?to=http://{addr}/redirect?to=http://{addr}/ok");
    let flood = call(&host, &context, "http_get", json!({"url": url, "follow": 5})).await;
    assert!(flood.contains("already made 2 requests, its bound"), "{flood}");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 2);
    // Each task has its own budget.
    let ok = call(&host, &context, "http_get", json!({"url": format!("http://{addr}/ok")})).await;
    assert!(ok.contains("body hello"), "{ok}");
    host.dispose().await;
}

#[tokio::test]
async fn a_plugin_not_granted_http_is_refused_at_load() {
    let text = format!("[[producer]]\ntool = \"http_get\"\nplugin = {HTTP_GET_PATH:?}\n");
    let error = format!("{:#}", host_from_config(&Config::parse(&text).unwrap(), Path::new(".")).await.err().unwrap());
    assert!(error.contains("which its configuration does not grant: add [producer.grants.http]"), "{error}");
}
