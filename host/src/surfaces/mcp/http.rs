//! MCP over streamable HTTP (axum), with bearer-token owners.
//!
//! Model:
//! - Every request must carry `Authorization: Bearer <token>` matching one
//!   of `[serve.http] tokens`; anything else gets `401` before rmcp sees it.
//!   Tokens are compared in constant time, against every configured token
//!   (no early exit that would tell which one came close).
//! - Each token name is one owner: a long-lived agent `http:<name>` created
//!   when the server starts and disposed when it stops. Every request of
//!   that token runs as that agent, whatever MCP session it belongs to, so a
//!   client may reconnect and find its tasks again, and no client can reach
//!   another token's tasks.
//! - rmcp runs stateless (one handler per request), the mode the 2026-07-28
//!   protocol requires and older clients accept. A closed response stream
//!   cancels the request, which cancels a foreground run.
//! - `Host` headers are checked against `allowed_hosts` (DNS rebinding).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use super::handler::AuthenticatedOwner;
use super::{McpHandler, McpServer};
use crate::agents::Agent;

/// How often an idle SSE response is pinged; a dead client is noticed (and
/// its request cancelled) on the next ping.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(1);

/// The configured clients: secret and owner per token name.
pub struct TokenTable {
    entries: Vec<TokenEntry>,
}

struct TokenEntry {
    name: String,
    secret: Vec<u8>,
    owner: Agent,
}

impl TokenTable {
    /// Resolves every configured token and creates its owner agent.
    pub fn from_config(server: &McpServer) -> anyhow::Result<Self> {
        let tokens = &server.settings().http.tokens;
        anyhow::ensure!(
            !tokens.is_empty(),
            "serving over HTTP needs at least one client token: add to taskhost.toml\n\
             [[serve.http.tokens]]\nname = \"me\"\ntoken_env = \"TASKHOST_TOKEN\"   # or token = \"<32+ random characters>\""
        );
        let mut entries = Vec::with_capacity(tokens.len());
        for token in tokens {
            let secret = token.resolve()?.into_bytes();
            anyhow::ensure!(
                entries.iter().all(|e: &TokenEntry| e.secret.ct_eq(&secret).unwrap_u8() == 0),
                "[serve.http] tokens {:?} and another token have the same secret; each owner needs its own",
                token.name
            );
            let id = format!("http:{}", token.name);
            let owner = server.host().create_agent(id.as_str(), id.as_str())?;
            entries.push(TokenEntry { name: token.name.clone(), secret, owner });
        }
        Ok(Self { entries })
    }

    /// The owner of a presented secret. Compares against every entry.
    fn authenticate(&self, presented: &[u8]) -> Option<&TokenEntry> {
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.secret.ct_eq(presented)) {
                found = Some(entry);
            }
        }
        found
    }

    /// Disposes every owner: their tasks are cancelled and awaited.
    pub async fn dispose(&self) {
        futures::future::join_all(self.entries.iter().map(|e| e.owner.dispose())).await;
    }
}

/// The axum app: auth in front of the rmcp service at `path`.
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
    let handler_server = server.clone();
    let service = StreamableHttpService::new(
        move || Ok(McpHandler::for_http(handler_server.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    axum::Router::new().nest_service(&path, service).layer(axum::middleware::from_fn_with_state(tokens, require_token))
}

async fn require_token(State(tokens): State<Arc<TokenTable>>, mut request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
        .map(<[u8]>::trim_ascii);
    let Some(presented) = presented else {
        tracing::info!(path = %request.uri().path(), "refused: no bearer token");
        return unauthorized("missing bearer token: send the header `Authorization: Bearer <token>`");
    };
    let Some(entry) = tokens.authenticate(presented) else {
        tracing::info!(path = %request.uri().path(), "refused: invalid bearer token");
        return unauthorized("invalid bearer token");
    };
    tracing::debug!(client = %entry.name, "authenticated");
    request.extensions_mut().insert(AuthenticatedOwner(entry.owner.clone()));
    next.run(request).await
}

fn unauthorized(message: &'static str) -> Response {
    let mut response = (StatusCode::UNAUTHORIZED, message).into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"taskhost\""));
    response
}

/// How long open connections get to finish after shutdown starts.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves HTTP on `listener` until `shutdown` is cancelled, then disposes
/// every token's owner (their tasks are cancelled and awaited).
pub async fn serve(
    server: Arc<McpServer>,
    tokens: TokenTable,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tokens = Arc::new(tokens);
    let address: SocketAddr = listener.local_addr()?;
    let app = router(server.clone(), tokens.clone(), shutdown.child_token());
    tracing::info!(%address, path = %server.settings().http.path, clients = tokens.entries.len(), "serving MCP over HTTP");
    let stop = shutdown.clone();
    let serving = axum::serve(listener, app).with_graceful_shutdown(async move { stop.cancelled().await });
    let served = tokio::select! {
        served = serving => served,
        // A client holding a stream open must not hold the shutdown.
        _ = async { shutdown.cancelled().await; tokio::time::sleep(DRAIN).await } => {
            tracing::warn!("connections still open {} s after shutdown; closing them", DRAIN.as_secs());
            Ok(())
        }
    };
    tokens.dispose().await;
    served.map_err(|e| anyhow::anyhow!("HTTP server on {address} failed: {e}"))
}
