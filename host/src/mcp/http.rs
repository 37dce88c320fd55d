//! MCP over streamable HTTP (axum, served by hyper), one owner per bearer token; the same
//! listener serves the web dashboard ([`super::dashboard`]) at `/` and under `/dashboard/`.
//!
//! Invariants:
//! - Every request needs `Authorization: Bearer <token>` matching one of `[serve.http] tokens`,
//!   else `401` before rmcp sees it. Tokens are compared in constant time against every
//!   configured token (no early exit that would tell which one came close).
//! - Each token name is one owner: a long-lived agent `http:<name>` made when the server
//!   starts and disposed when it stops. Every request of that token runs as it, whatever its
//!   MCP session, so a client may reconnect to its tasks and never reach another token's.
//! - rmcp runs stateless (one handler per request, as 2026-07-28 requires and older clients
//!   accept). A closed response stream cancels the request, which cancels a foreground run.
//!   `Host` must be one of `allowed_hosts` (DNS rebinding); an `Origin`, when sent, one of
//!   `allowed_origins` (none by default); else `403`.
//! - Every body passes the same JSON-RPC gate as stdio ([`super::jsonrpc`]) before rmcp, and
//!   every refusal (the gate's, the auth layer's, rmcp's own plain-text ones) is a JSON-RPC
//!   error body, with the request's id when it was readable. Each request is judged by its own
//!   `MCP-Protocol-Version` header and `_meta`; a 2025-11-25 request gets the v1 tasks bridge
//!   ([`super::tasks_v1`]).
//! - hyper serves connections directly (not `axum::serve`) with its header-read timer on:
//!   headers must arrive within `header_timeout_ms` of opening or of the previous answer (an
//!   idle keep-alive connection closes then), and a body within as long after its headers.
//! - Admission ([`super::admission`]): at most `max_connections` at once; when all are taken a
//!   new connection closes the oldest one without a valid token yet, or, when every slot is
//!   authenticated, gets `503` with a JSON-RPC error body and is closed. Per token at most
//!   `max_connections_per_token` connections and `max_requests_per_token` requests in flight;
//!   beyond either, `429` with `Retry-After`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::admission::{Admission, Connection, OverShare, Refused, RequestSlot};
use super::handler::AuthenticatedOwner;
use super::jsonrpc::{self, Checked, INTERNAL_ERROR, INVALID_REQUEST, LIMIT_EXCEEDED, Rejection};
use super::tokens::{TokenTable, bearer_token};
use super::{McpHandler, McpServer, tasks_v1};

/// How often an idle SSE response is pinged; a dead client is noticed (and
/// its request cancelled) on the next ping.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(1);

/// The axum app: origin check, then auth, then the JSON-RPC gate, in front
/// of the rmcp service at `path`.
pub fn router(server: Arc<McpServer>, tokens: Arc<TokenTable>, shutdown: CancellationToken) -> axum::Router {
    let settings = &server.settings().http;
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(Some(SSE_KEEP_ALIVE))
        .with_cancellation_token(shutdown)
        // As large as a stdio line, so oversized tool arguments reach the
        // handler and get its readable refusal rather than a bare 413.
        .with_max_request_body_bytes(super::stdio::MAX_LINE_BYTES);
    config = if settings.allowed_hosts.iter().any(|h| h == "*") {
        config.disable_allowed_hosts()
    } else {
        config.with_allowed_hosts(settings.allowed_hosts.clone())
    };
    let path = settings.path.clone();
    let origins: Arc<Vec<String>> =
        Arc::new(settings.allowed_origins.iter().map(|origin| origin.to_ascii_lowercase()).collect());
    let dashboard = super::dashboard::router(server.clone(), tokens.clone(), config.cancellation_token.clone());
    let handler_server = server.clone();
    let service = StreamableHttpService::new(
        move || Ok(McpHandler::for_http(handler_server.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    // The last layer added is the outermost.
    axum::Router::new()
        .nest_service(&path, service)
        .layer(axum::middleware::from_fn_with_state(server, gate))
        .layer(axum::middleware::from_fn_with_state(tokens, require_token))
        .layer(axum::middleware::from_fn_with_state(origins, check_origin))
        // After the layers, which are the MCP endpoint's: the dashboard
        // checks hosts, origins and tokens itself.
        .merge(dashboard)
}

/// A JSON-RPC error body with an HTTP status.
fn error_response(status: StatusCode, rejection: &Rejection) -> Response {
    (status, axum::Json(rejection.to_value())).into_response()
}

/// The HTTP status of a gate refusal, as rmcp maps the same codes.
fn status_of(rejection: &Rejection) -> StatusCode {
    match rejection.code {
        jsonrpc::PARSE_ERROR | jsonrpc::INVALID_REQUEST => StatusCode::BAD_REQUEST,
        jsonrpc::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        LIMIT_EXCEEDED => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::OK,
    }
}

async fn check_origin(State(allowed): State<Arc<Vec<String>>>, request: Request, next: Next) -> Response {
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes()).to_ascii_lowercase();
        if !allowed.contains(&origin) {
            tracing::info!(%origin, "refused: origin not allowed");
            return error_response(
                StatusCode::FORBIDDEN,
                &Rejection::new(
                    Value::Null,
                    INVALID_REQUEST,
                    format!(
                        "Forbidden: Origin {origin:?} is not allowed. Requests from web pages need their origin \
                         listed in [serve.http] allowed_origins"
                    ),
                ),
            );
        }
    }
    next.run(request).await
}

async fn require_token(State(tokens): State<Arc<TokenTable>>, mut request: Request, next: Next) -> Response {
    let Some(presented) = bearer_token(request.headers()) else {
        tracing::info!(path = %request.uri().path(), "refused: no bearer token");
        return unauthorized("missing bearer token: send the header `Authorization: Bearer <token>`");
    };
    let Some(entry) = tokens.authenticate(presented) else {
        tracing::info!(path = %request.uri().path(), "refused: invalid bearer token");
        return unauthorized("invalid bearer token");
    };
    tracing::debug!(client = %entry.name, "authenticated");
    if let Some(connection) = request.extensions().get::<Arc<Connection>>()
        && let Err(over) = connection.authenticate(entry)
    {
        return too_many(&entry.name, over);
    }
    let slot = match RequestSlot::take(entry) {
        Ok(slot) => slot,
        Err(over) => return too_many(&entry.name, over),
    };
    request.extensions_mut().insert(AuthenticatedOwner(entry.owner.clone()));
    let response = next.run(request).await;
    drop(slot);
    response
}

/// `429` with `Retry-After` and a JSON-RPC error body naming the bound; a
/// connection over the token's share is closed after it.
fn too_many(token: &str, over: OverShare) -> Response {
    let (message, close) = match over {
        OverShare::Connections(limit) => (
            format!(
                "Too many connections for token {token:?}: it may hold at most {limit} at once \
                 ([serve.http] max_connections_per_token); reuse one, or close another"
            ),
            true,
        ),
        OverShare::Requests(limit) => (
            format!(
                "Too many requests in flight for token {token:?}: at most {limit} at once \
                 ([serve.http] max_requests_per_token); retry when one has answered"
            ),
            false,
        ),
    };
    tracing::info!(client = %token, %message, "refused with 429");
    let mut response =
        error_response(StatusCode::TOO_MANY_REQUESTS, &Rejection::new(Value::Null, LIMIT_EXCEEDED, message));
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    if close {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

fn unauthorized(message: &'static str) -> Response {
    let mut response = error_response(
        StatusCode::UNAUTHORIZED,
        &Rejection::new(Value::Null, INVALID_REQUEST, format!("Unauthorized: {message}")),
    );
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"taskhost\""));
    response
}

/// The JSON-RPC gate for HTTP: reads the body (bounded in size and time),
/// answers what is not a well-formed request of a known method, serves the
/// 2025-11-25 tasks bridge, and turns rmcp's plain-text refusals into
/// JSON-RPC error bodies.
async fn gate(State(server): State<Arc<McpServer>>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return as_json_rpc(next.run(request).await, Value::Null).await;
    }
    let json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return error_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &Rejection::new(
                Value::Null,
                INVALID_REQUEST,
                "Unsupported Media Type: send the JSON-RPC message with Content-Type: application/json",
            ),
        );
    }
    let settings = &server.settings().http;
    let (parts, body) = request.into_parts();
    let limit = super::stdio::MAX_LINE_BYTES;
    let timeout = Duration::from_millis(settings.header_timeout_ms);
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(error)) => {
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                &Rejection::new(
                    Value::Null,
                    INVALID_REQUEST,
                    format!("the request body is unreadable or over the limit of {limit} bytes: {error}"),
                ),
            );
        }
        Err(_) => {
            return error_response(
                StatusCode::REQUEST_TIMEOUT,
                &Rejection::new(
                    Value::Null,
                    INVALID_REQUEST,
                    format!(
                        "the request body did not arrive within {} ms ([serve.http] header_timeout_ms)",
                        settings.header_timeout_ms
                    ),
                ),
            );
        }
    };
    let (id, method, message) = match jsonrpc::check(&bytes) {
        Err(rejection) => {
            tracing::info!(code = rejection.code, message = %rejection.message, "answered by the gate");
            return error_response(status_of(&rejection), &rejection);
        }
        Ok(Checked::Request { id, method, message }) => (id, method, message),
        // Notifications and responses go to rmcp (it answers 202).
        Ok(Checked::Notification { .. } | Checked::Response { .. }) => {
            return as_json_rpc(next.run(Request::from_parts(parts, Body::from(bytes))).await, Value::Null).await;
        }
    };
    if let Err(mismatch) = super::standard_headers::check(&parts.headers, &method, &message) {
        tracing::info!(%mismatch, "answered by the gate");
        return error_response(
            StatusCode::BAD_REQUEST,
            &Rejection::new(id, super::standard_headers::HEADER_MISMATCH, mismatch),
        );
    }
    let header_version = parts.headers.get("mcp-protocol-version").and_then(|value| value.to_str().ok());
    let v1 = if method == "initialize" {
        message["params"]["protocolVersion"].as_str() == Some(tasks_v1::PROTOCOL)
    } else {
        header_version == Some(tasks_v1::PROTOCOL)
    };
    if v1 && tasks_v1::intercepts(&method, &message) {
        let Some(owner) = parts.extensions.get::<AuthenticatedOwner>() else {
            return error_response(
                StatusCode::UNAUTHORIZED,
                &Rejection::new(id, INVALID_REQUEST, "unauthenticated request: no owner for this call"),
            );
        };
        let answer = match tasks_v1::answer(&server, &owner.0, &id, &method, &message).await {
            Ok(result) => serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(rejection) => rejection.to_value(),
        };
        return (StatusCode::OK, axum::Json(answer)).into_response();
    }
    if let Err(rejection) = jsonrpc::to_rmcp(Some(&id), &method, message) {
        return error_response(status_of(&rejection), &rejection);
    }
    let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    if v1 && matches!(method.as_str(), "initialize" | "tools/list") && response.status() == StatusCode::OK {
        return patched(&server, &method, response).await;
    }
    as_json_rpc(response, id).await
}

/// rmcp's answer to a 2025-11-25 `initialize`/`tools/list`, with what the v1
/// tasks bridge adds.
async fn patched(server: &McpServer, method: &str, response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &Rejection::new(Value::Null, INTERNAL_ERROR, "the answer could not be read"),
        );
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    if let Some(result) = value.get_mut("result") {
        tasks_v1::patch_result(server, method, result);
    }
    let body = serde_json::to_vec(&value).expect("a JSON value serializes");
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// Turns a refusal that is not JSON (rmcp's plain-text 4xx/5xx) into a
/// JSON-RPC error body with the same status.
async fn as_json_rpc(response: Response, id: Value) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.contains("json") || value.contains("event-stream"));
    if status.is_success() || is_json || status == StatusCode::UNAUTHORIZED {
        return response;
    }
    let (parts, body) = response.into_parts();
    // rmcp's refusals are one sentence; a longer body is cut.
    let text = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let text = if text.is_empty() { status.canonical_reason().unwrap_or("error").to_string() } else { text };
    let code = if status.is_server_error() { INTERNAL_ERROR } else { INVALID_REQUEST };
    let mut json = error_response(status, &Rejection::new(id, code, text));
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            json.headers_mut().insert(name.clone(), value.clone());
        }
    }
    json
}

/// How long open connections get to finish after shutdown starts.
const DRAIN: Duration = Duration::from_secs(5);

/// Refusals of connections over the cap written at once; past that, a
/// connection over the cap is closed without an answer.
const REFUSALS_AT_ONCE: usize = 64;

/// How long a new connection waits for the slot of the unauthenticated
/// connection it closed (its task must end first).
const EVICTED_SLOT_WAIT: Duration = Duration::from_secs(1);

/// Serves HTTP on `listener` until `shutdown` is cancelled, then disposes
/// every token's owner (their tasks are cancelled and awaited).
pub async fn serve(
    server: Arc<McpServer>,
    tokens: TokenTable,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};

    let tokens = Arc::new(tokens);
    let address: SocketAddr = listener.local_addr()?;
    // Plugins' HTTP requests may not reach this port unless an origin names it.
    let _own_port = crate::outbound::own_listeners::register(address);
    let app = router(server.clone(), tokens.clone(), shutdown.child_token());
    let settings = server.settings().http.clone();
    tracing::info!(%address, path = %settings.path, clients = tokens.entries().len(), "serving MCP over HTTP");
    let header_timeout = Duration::from_millis(settings.header_timeout_ms);
    let admission = Admission::new(settings.max_connections);
    let refusals = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    let warned_full = Arc::new(AtomicBool::new(false));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors (EMFILE) and the like: wait for some to free.
                tracing::warn!(%error, "accepting a connection failed; retrying shortly");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (app, stop, admission) = (app.clone(), shutdown.clone(), admission.clone());
        let (refusals, warned_full) = (refusals.clone(), warned_full.clone());
        connections.spawn(async move {
            let connection = match admission.admit(EVICTED_SLOT_WAIT).await {
                Ok(connection) => connection,
                Err(Refused::Full) => {
                    if !warned_full.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            limit = admission.max_connections(),
                            %peer,
                            "connection bound hit ([serve.http] max_connections, every slot authenticated); \
                             refusing connections with 503"
                        );
                    }
                    if let Ok(permit) = refusals.try_acquire_owned() {
                        refuse_connection(stream, admission.max_connections()).await;
                        drop(permit);
                    }
                    return;
                }
            };
            warned_full.store(false, Ordering::Relaxed);
            let carried = connection.clone();
            let app = tower::ServiceExt::map_request(app, move |mut request: Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(carried.clone());
                request
            });
            let service = hyper_util::service::TowerToHyperService::new(app);
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            let mut served = std::pin::pin!(served);
            tokio::select! {
                result = served.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%peer, %error, "connection ended with an error");
                    }
                }
                _ = connection.closed().cancelled() => {
                    tracing::debug!(%peer, "closed: the oldest connection without a token, for a new one");
                }
                _ = stop.cancelled() => {
                    served.as_mut().graceful_shutdown();
                    let _ = served.await;
                }
            }
            drop(connection);
        });
    }
    // A client holding a stream open must not hold the shutdown.
    if tokio::time::timeout(DRAIN, async { while connections.join_next().await.is_some() {} }).await.is_err() {
        tracing::warn!("connections still open {} s after shutdown; closing them", DRAIN.as_secs());
        connections.abort_all();
    }
    // The server is going away: stable owners' handed-over trees run on for
    // the next one (see `TaskRegistry::begin_shutdown`).
    server.host().registry().begin_shutdown();
    tokens.dispose().await;
    Ok(())
}

/// Answers a connection over the cap with `503` and a JSON-RPC error body.
async fn refuse_connection(mut stream: tokio::net::TcpStream, limit: usize) {
    let body = Rejection::new(
        Value::Null,
        LIMIT_EXCEEDED,
        format!(
            "Too many connections: this server serves at most {limit} at once ([serve.http] max_connections); \
             retry shortly"
        ),
    )
    .to_value()
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         retry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    // Read what already arrived, so closing does not reset the connection
    // before the client reads the answer.
    let mut scratch = [0u8; 16 * 1024];
    let _ = tokio::time::timeout(Duration::from_millis(100), stream.read(&mut scratch)).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}
