//! Outbound HTTP (`wasi:http`) for a plugin granted `[producer.grants.http]`:
//! the `http-get` fixture (a real component using the standard
//! `wasi:http/outgoing-handler`) against real local servers, one concern per
//! test. An allowed origin answers; a refused origin, a private address,
//! the metadata address, a redirect to a refused origin, a name resolving to
//! loopback, the host's own MCP port, a self-signed TLS server, an oversized
//! body, a slow server and a request flood each get their readable error,
//! the task ends `failed` with it, and the next task on the same host is
//! answered; the injected credential reaches the server and never the guest
//! (its output and its whole linear memory are searched); a plugin not
//! granted HTTP is refused at load and `taskhost check` names the grant.
//! `http_as_nobody` runs `taskhost serve` as another user (`setpriv`).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::{Value, json};
use taskhost::Host;
use taskhost::config::Config;
use taskhost::setup::host_from_config;
use taskhost::tools::CallContext;
use taskhost_tests::agent_calls::call;
use taskhost_tests::fixtures::HTTP_GET_PATH;

pub(crate) const SECRET: &str = "Bearer s3cret-never-for-the-guest";
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_taskhost-cli");

#[derive(Clone, Default)]
pub(crate) struct Seen {
    pub(crate) authorization: Arc<Mutex<Vec<String>>>,
    pub(crate) hits: Arc<AtomicUsize>,
}

/// A real server on `ip`: `/ok`, `/auth` (records Authorization), `/big`
/// (100 000 bytes, with a length), `/big-stream` (100 000 bytes in chunks,
/// no length), `/slow` (never answers), `/redirect?to=<url>`.
async fn server_on(ip: IpAddr) -> (SocketAddr, Seen) {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    serve_app(listener).await
}

pub(crate) async fn server() -> (SocketAddr, Seen) {
    server_on([127, 0, 0, 1].into()).await
}

fn app(seen: &Seen) -> axum::Router {
    axum::Router::new()
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
        .route(
            "/big-stream",
            get(|| async {
                let chunks = (0..100).map(|_| Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b'y'; 1000])));
                axum::body::Body::from_stream(futures_stream(chunks))
            }),
        )
        .route("/slow", get(std::future::pending::<&'static str>))
        .route(
            "/redirect",
            get(|axum::extract::RawQuery(query): axum::extract::RawQuery| async move {
                let to = query.unwrap_or_default().strip_prefix("to=").unwrap_or_default().to_string();
                (StatusCode::FOUND, [(header::LOCATION, to)]).into_response()
            }),
        )
        .layer(axum::middleware::from_fn_with_state(seen.clone(), count_hits))
        .with_state(seen.clone())
}

fn futures_stream<I: Iterator + Send + 'static>(items: I) -> taskhost::futures::stream::Iter<I> {
    taskhost::futures::stream::iter(items)
}

async fn serve_app(listener: tokio::net::TcpListener) -> (SocketAddr, Seen) {
    let seen = Seen::default();
    let addr = listener.local_addr().unwrap();
    let app = app(&seen);
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

/// The configuration serving `http-get` with `grant` (the body of
/// `[producer.grants.http]`).
fn config_text(grant: &str) -> String {
    format!(
        "[[producer]]\ntool = \"http_get\"\nplugin = {HTTP_GET_PATH:?}\nbackground = false\n\
         [producer.grants.http]\n{grant}\n"
    )
}

/// A host serving `http-get` with `grant`.
async fn serve(grant: &str, dir: &Path) -> anyhow::Result<Host> {
    host_from_config(&Config::parse(&config_text(grant))?, dir).await
}

/// One `http_get` call (one task) with `args`, as an agent of its own.
async fn get_with(host: &Host, args: Value) -> String {
    static AGENTS: AtomicUsize = AtomicUsize::new(0);
    let id = format!("http-{}", AGENTS.fetch_add(1, Ordering::SeqCst));
    let agent = host.create_agent(id.as_str(), id.as_str()).unwrap();
    call(host, &CallContext::for_agent(&agent), "http_get", args).await
}

async fn get_url(host: &Host, url: &str) -> String {
    get_with(host, json!({"url": url})).await
}

/// The task of `reply` failed with the guest's `error` line holding `text`.
#[track_caller]
pub(crate) fn assert_failed_with(reply: &str, text: &str) {
    let error = reply.lines().find(|l| l.starts_with("error ")).unwrap_or_else(|| panic!("no error line: {reply}"));
    assert!(error.contains(text), "expected {text:?} in the error line: {reply}");
    assert!(reply.contains("[status: failed, error]"), "the task ends failed, with the error: {reply}");
}

/// The host carries on: a new task on it is answered by `allowed`.
async fn assert_carries_on(host: &Host, allowed: SocketAddr) {
    let again = get_url(host, &format!("http://{allowed}/ok")).await;
    assert!(again.contains("status 200") && again.contains("body hello"), "the next task: {again}");
}

#[tokio::test]
async fn a_granted_origin_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, seen) = server().await;
    let host = serve(&format!("origins = [\"http://{allowed}\"]"), dir.path()).await.unwrap();
    let ok = get_url(&host, &format!("http://{allowed}/ok")).await;
    assert!(ok.contains("status 200") && ok.contains("body hello"), "{ok}");
    assert!(ok.contains("[status: completed, ok]"), "{ok}");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 1);
    host.dispose().await;
}

#[tokio::test]
async fn an_origin_not_granted_is_refused_before_connecting_and_the_host_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, _) = server().await;
    let (other, other_seen) = server().await;
    let host = serve(&format!("origins = [\"http://{allowed}\"]"), dir.path()).await.unwrap();
    let refused = get_url(&host, &format!("http://{other}/ok")).await;
    assert_failed_with(&refused, &format!("origin http://{other} is not granted to this plugin"));
    // Same host, another port; same port, another scheme.
    let https = get_url(&host, &format!("https://{allowed}/ok")).await;
    assert_failed_with(&https, &format!("origin https://{allowed} is not granted"));
    assert_eq!(other_seen.hits.load(Ordering::SeqCst), 0, "no request reached the refused server");
    assert_carries_on(&host, allowed).await;
    host.dispose().await;
}

#[tokio::test]
async fn a_method_not_granted_is_refused_and_the_host_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, seen) = server().await;
    let host = serve(&format!("origins = [\"http://{allowed}\"]"), dir.path()).await.unwrap();
    let post = get_with(&host, json!({"url": format!("http://{allowed}/ok"), "method": "POST"})).await;
    assert_failed_with(&post, "method POST is not granted");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 0);
    assert_carries_on(&host, allowed).await;
    host.dispose().await;
}

#[tokio::test]
async fn a_private_address_is_refused_unless_an_origin_names_it_and_the_host_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, _) = server().await;
    let host = serve(&format!("origins = [\"http://{allowed}\"]"), dir.path()).await.unwrap();
    // Unroutable addresses: were either tried, the refusal would be a
    // connection error or the time bound instead.
    for url in ["http://10.255.255.1/", "http://192.168.255.254:8080/", "http://[fd00::1]/"] {
        let refused = get_url(&host, url).await;
        assert_failed_with(&refused, "is not granted to this plugin");
    }
    assert_carries_on(&host, allowed).await;
    host.dispose().await;
}

#[tokio::test]
async fn the_metadata_address_is_refused_in_every_spelling_and_the_host_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, _) = server().await;
    let host = serve(&format!("origins = [\"http://{allowed}\"]"), dir.path()).await.unwrap();
    for (url, origin) in [
        ("http://169.254.169.254/latest/meta-data/", "http://169.254.169.254:80"),
        ("http://[::ffff:169.254.169.254]/latest/meta-data/", "http://[::ffff:169.254.169.254]:80"),
        ("http://[fd00:ec2::254]/latest/meta-data/", "http://[fd00:ec2::254]:80"),
    ] {
        let refused = get_url(&host, url).await;
        assert_failed_with(&refused, &format!("origin {origin} is not granted"));
    }
    assert_carries_on(&host, allowed).await;
    host.dispose().await;
}

#[tokio::test]
async fn a_redirect_to_a_refused_origin_is_refused_and_the_host_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, _) = server().await;
    let (other, other_seen) = server().await;
    let host = serve(&format!("origins = [\"http://{allowed}\"]"), dir.path()).await.unwrap();
    // The host follows no redirect: the guest sees the 302, follows it with
    // a new request, and that one is refused.
    let redirect =
        get_with(&host, json!({"url": format!("http://{allowed}/redirect?to=http://{other}/ok"), "follow": 1})).await;
    assert!(redirect.contains("status 302"), "{redirect}");
    assert!(redirect.contains(&format!("redirect http://{other}/ok")), "{redirect}");
    assert_failed_with(&redirect, &format!("origin http://{other} is not granted"));
    let metadata =
        get_with(&host, json!({"url": format!("http://{allowed}/redirect?to=http://169.254.169.254/"), "follow": 1}))
            .await;
    assert_failed_with(&metadata, "origin http://169.254.169.254:80 is not granted");
    assert_eq!(other_seen.hits.load(Ordering::SeqCst), 0, "no request reached the refused server");
    assert_carries_on(&host, allowed).await;
    host.dispose().await;
}

/// A name other than `localhost` that resolves to loopback on this machine
/// and on a stock Debian: the machine's own host name (`127.0.1.1` there),
/// or Debian's `ip6-localhost`/`ip6-loopback`, or `localhost.localdomain`.
async fn loopback_name() -> (String, IpAddr) {
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default().trim().to_ascii_lowercase();
    let mut tried = Vec::new();
    for name in [hostname.as_str(), "ip6-localhost", "ip6-loopback", "localhost.localdomain"] {
        if name.is_empty() || name == "localhost" {
            continue;
        }
        let resolved: Vec<IpAddr> = match tokio::net::lookup_host((name, 0)).await {
            Ok(addrs) => addrs.map(|a| a.ip()).collect(),
            Err(_) => Vec::new(),
        };
        if let Some(ip) = resolved.first()
            && resolved.iter().all(IpAddr::is_loopback)
        {
            return (name.to_string(), *ip);
        }
        tried.push(format!("{name} -> {resolved:?}"));
    }
    panic!(
        "no name other than localhost resolves to loopback only ({tried:?}); add this machine's host name to \
         /etc/hosts as Debian does: `127.0.1.1 {hostname}`"
    );
}

#[tokio::test]
async fn a_hostname_that_resolves_to_loopback_is_refused_unless_named_and_the_host_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (name, ip) = loopback_name().await;
    // The server listens on the very address the name resolves to: only the
    // guard stands between the request and it.
    let (addr, seen) = server_on(ip).await;
    let port = addr.port();
    let (allowed, _) = server().await;
    let grant = format!("origins = [\"http://{name}:{port}\", \"http://{allowed}\"]");
    let host = serve(&grant, dir.path()).await.unwrap();
    let refused = get_url(&host, &format!("http://{name}:{port}/ok")).await;
    assert_failed_with(&refused, &format!("{name} resolves to {ip}: address {ip} is loopback"));
    assert_eq!(seen.hits.load(Ordering::SeqCst), 0, "the guard refused before connecting");
    assert_carries_on(&host, allowed).await;
    host.dispose().await;

    // Named explicitly (the IP literal), the same server is reached.
    let literal = if ip.is_ipv6() { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
    let host = serve(&format!("origins = [\"http://{literal}\"]"), dir.path()).await.unwrap();
    let ok = get_url(&host, &format!("http://{literal}/ok")).await;
    assert!(ok.contains("body hello"), "{ok}");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 1);
    host.dispose().await;
}

#[tokio::test]
async fn an_origin_whose_name_is_a_number_is_refused_at_load() {
    // A URL parser reads these as 127.0.0.1 and the client would connect
    // to it without resolving, past the check of resolved addresses.
    let dir = tempfile::tempdir().unwrap();
    let (addr, _) = server().await;
    for name in ["2130706433", "127.1", "0x7f000001"] {
        let error = format!(
            "{:#}",
            serve(&format!("origins = [\"http://{name}:{}\"]", addr.port()), dir.path()).await.err().unwrap()
        );
        assert!(error.contains("ends in a number, which is read as an IP address"), "{error}");
    }
}

#[tokio::test]
async fn an_oversized_body_is_cut_at_its_bound_and_the_host_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, _) = server().await;
    let host =
        serve(&format!("origins = [\"http://{allowed}\"]\nmax_response_bytes = 10000"), dir.path()).await.unwrap();
    let bound = "is over 10000 bytes, its bound ([producer.grants.http] max_response_bytes)";
    // Refused from its length, and counted as it streams in (no length).
    let big = get_url(&host, &format!("http://{allowed}/big")).await;
    assert_failed_with(&big, bound);
    let stream = get_url(&host, &format!("http://{allowed}/big-stream")).await;
    assert_failed_with(&stream, bound);
    assert!(!stream.contains(&"y".repeat(10_001)), "no more than the bound reached the guest");
    assert_carries_on(&host, allowed).await;
    host.dispose().await;
}

#[tokio::test]
async fn a_slow_server_times_out_at_its_bound_and_the_host_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, seen) = server().await;
    let host = serve(&format!("origins = [\"http://{allowed}\"]\nrequest_timeout_ms = 300"), dir.path()).await.unwrap();
    let slow = get_url(&host, &format!("http://{allowed}/slow")).await;
    assert_failed_with(&slow, "took longer than 300 ms, its bound ([producer.grants.http] request_timeout_ms)");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 1, "the request reached the server");
    assert_carries_on(&host, allowed).await;
    host.dispose().await;
}

#[tokio::test]
async fn a_request_flood_stops_at_the_tasks_budget_and_the_host_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, seen) = server().await;
    let host = serve(&format!("origins = [\"http://{addr}\"]\nmax_requests_per_task = 2"), dir.path()).await.unwrap();
    // A redirect chain the guest follows: two requests, then the budget is spent.
    let url = format!("http://{addr}/redirect?to=http://{addr}/redirect?to=http://{addr}/ok");
    let flood = get_with(&host, json!({"url": url, "follow": 5})).await;
    assert_failed_with(&flood, "already made 2 requests, its bound ([producer.grants.http] max_requests_per_task)");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 2);
    // Each task has its own budget.
    assert_carries_on(&host, addr).await;
    host.dispose().await;
}

/// `text` as the fixture's `scan` takes it: each byte XOR 0x5a, in hex (so
/// the guest never holds `text` itself).
pub(crate) fn needle(text: &str) -> String {
    text.bytes().map(|b| format!("{:02x}", b ^ 0x5a)).collect()
}

/// A host serving `http-get` with a credential for the origin `allowed`.
async fn serve_with_credential(allowed: SocketAddr, dir: &Path) -> Host {
    std::fs::write(dir.join("token"), format!("{SECRET}\n")).unwrap();
    let grant = format!(
        "origins = [\"http://{allowed}\"]\n\
         [[producer.grants.http.credentials]]\norigin = \"http://{allowed}\"\nheader = \"Authorization\"\n\
         value_file = \"token\"\n"
    );
    serve(&grant, dir).await.unwrap()
}

#[tokio::test]
async fn an_injected_credential_reaches_the_server_and_never_the_guest() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, seen) = server().await;
    let host = serve_with_credential(allowed, dir.path()).await;
    // After its request, the guest searches its whole linear memory for the
    // secret (and, to show the search finds what is there, for the body it
    // read).
    let auth = get_with(
        &host,
        json!({"url": format!("http://{allowed}/auth"), "scan": [needle(SECRET), needle("s3cret-never"), needle("recorded")]}),
    )
    .await;
    assert!(auth.contains("body recorded"), "{auth}");
    assert_eq!(*seen.authorization.lock().unwrap(), [SECRET], "the server got the credential");
    assert!(auth.contains("scan 2 found at"), "the scan finds the body the guest read: {auth}");
    for scanned in ["scan 0 absent in", "scan 1 absent in"] {
        assert!(auth.contains(scanned), "the secret is in the guest's memory: {auth}");
    }
    assert!(!auth.contains("s3cret"), "the secret is in the guest's output: {auth}");
    host.dispose().await;
}

#[tokio::test]
async fn a_plugin_not_granted_http_is_refused_at_load_and_check_names_the_grant() {
    let text = format!("[[producer]]\ntool = \"http_get\"\nplugin = {HTTP_GET_PATH:?}\n");
    let error = format!("{:#}", host_from_config(&Config::parse(&text).unwrap(), Path::new(".")).await.err().unwrap());
    assert!(error.contains("which its configuration does not grant: add [producer.grants.http]"), "{error}");
    let check = std::process::Command::new(BIN).args(["check", HTTP_GET_PATH]).output().unwrap();
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("imports `wasi:http/"), "{stderr}");
    assert!(stderr.contains("add [producer.grants.http] to its [[producer]] entry"), "{stderr}");
}

/// An MCP server of this host (the real `serve --http` loop) on `listener`.
async fn serve_mcp(host: &Host, listener: tokio::net::TcpListener) -> taskhost::tokio_util::sync::CancellationToken {
    let config =
        Config::parse("[[serve.http.tokens]]\nname = \"alice\"\ntoken = \"alice-token-0123456789abcdef\"\n").unwrap();
    let server = taskhost::mcp::McpServer::new(host.clone(), config.serve.clone());
    let tokens = taskhost::mcp::tokens::TokenTable::from_config(&server).unwrap();
    let shutdown = taskhost::tokio_util::sync::CancellationToken::new();
    tokio::spawn(taskhost::mcp::http::serve(server, tokens, listener, shutdown.clone()));
    shutdown
}

#[tokio::test]
async fn the_hosts_own_mcp_port_is_refused_on_every_address_unless_an_origin_names_it() {
    let dir = tempfile::tempdir().unwrap();
    // `serve --http 0.0.0.0:PORT`: every address of this machine reaches it.
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (allowed, _) = server().await;
    let grant = format!("origins = [\"http://localhost:{port}\", \"http://127.0.0.1:{port}\", \"http://{allowed}\"]");
    let host = serve(&grant, dir.path()).await.unwrap();
    let shutdown = serve_mcp(&host, listener).await;

    // `localhost` names loopback, but not the host's own MCP port.
    let refused = get_url(&host, &format!("http://localhost:{port}/")).await;
    assert_failed_with(&refused, &format!("is the host's own MCP port (served on 0.0.0.0:{port})"));
    assert_carries_on(&host, allowed).await;
    // The IP literal names it: the request reaches the MCP server (which
    // wants a token).
    let named = get_url(&host, &format!("http://127.0.0.1:{port}/mcp")).await;
    assert!(named.contains("status 401"), "{named}");

    // A public address of this machine (not a special range): a name that
    // resolves to it (DNS the test cannot control, so the resolver's check
    // is called with that address) is refused at that port.
    let public: Vec<IpAddr> = taskhost::outbound::own_listeners::interface_addresses()
        .into_iter()
        .filter(|ip| !ip.is_loopback() && !matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80))
        .collect();
    let interface = *public.first().expect("this machine has an interface address besides loopback (`ip addr`)");
    let checked = host_grant(&format!("origins = [\"http://deploy.example.com:{port}\"]"), dir.path());
    let why =
        taskhost::outbound::guard::allowed_addresses(&checked, "deploy.example.com", vec![interface]).unwrap_err();
    assert!(why.contains(&format!("address {} is the host's own MCP port", SocketAddr::new(interface, port))), "{why}");
    // The same name at another port is not the MCP server.
    let checked = host_grant(&format!("origins = [\"http://deploy.example.com:{}\"]", port ^ 1), dir.path());
    let other_port = taskhost::outbound::guard::allowed_addresses(&checked, "deploy.example.com", vec![interface]);
    if taskhost::outbound::guard::special_range(interface).is_none() {
        assert_eq!(other_port, Ok(vec![interface]));
    }
    shutdown.cancel();
    host.dispose().await;
}

fn host_grant(grant: &str, dir: &Path) -> taskhost::outbound::grant::CheckedHttpGrant {
    toml::from_str::<taskhost::outbound::grant::HttpGrant>(grant).unwrap().check_at_load(dir).unwrap()
}

/// A TLS server on 127.0.0.1 with a self-signed certificate for
/// `localhost`: each connection whose handshake completes is counted and
/// answered `200 hello`.
async fn tls_server() -> (SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio_rustls::rustls;
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let counted = handshakes.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake.
                let Ok(mut stream) = acceptor.accept(stream).await else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let _ =
                    stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello").await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, handshakes)
}

#[tokio::test]
async fn a_self_signed_tls_server_is_refused_with_a_readable_error_and_the_host_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (tls, handshakes) = tls_server().await;
    let (allowed, _) = server().await;
    let port = tls.port();
    let grant = format!("origins = [\"https://localhost:{port}\", \"http://{allowed}\"]");
    let host = serve(&grant, dir.path()).await.unwrap();
    let refused = get_url(&host, &format!("https://localhost:{port}/ok")).await;
    assert_failed_with(&refused, &format!("the request to https://localhost:{port} failed"));
    assert!(refused.contains("invalid peer certificate: UnknownIssuer"), "the error says why: {refused}");
    assert!(
        refused.contains("is not one this host trusts: only certificates signed by the system's CA roots"),
        "{refused}"
    );
    assert_eq!(handshakes.load(Ordering::SeqCst), 0, "no TLS session was established");
    assert_carries_on(&host, allowed).await;
    host.dispose().await;
}
