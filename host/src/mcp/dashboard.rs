//! The web dashboard of `taskhost serve --http`: a page that shows, tails and stops tasks and
//! shows plugin versions and reloads, live, behind the tokens of the MCP endpoint.
//!
//! Invariants:
//! - `GET /` (and `/dashboard/app.js`, `/dashboard/app.css`) is a static shell embedded in the
//!   binary (no CDN, no inline script, a strict CSP), the only thing served without a token.
//!   The page keeps the bearer token in `sessionStorage` and sends it as `Authorization:
//!   Bearer`, never in a URL.
//! - The JSON API under `/dashboard/api/` takes the MCP endpoint's tokens. A token sees its own
//!   owner's tasks (and unowned ones); an `admin = true` token in `[serve.http] tokens` sees
//!   every owner's, grouped by owner, and may kill them. A task the viewer may not see is a
//!   `404` with the same JSON error as an unknown one.
//! - Output is read with [`taskhost_core::tasks::TaskRegistry::peek`], which never consumes.
//!   Kill is [`taskhost_core::tasks::TaskRegistry::stop`] with [`StopCause::Dashboard`],
//!   answering `task_kill`'s reply text. It reports nothing: the owner's model gets one notice
//!   (`… was killed from the dashboard [status: …]`) unless it collects or kills the task first.
//! - Live updates are server-sent events (`GET /dashboard/api/events`) fed by
//!   [`taskhost_core::tasks::TaskRegistry::subscribe`] and the reload events; nothing polls,
//!   but on a cluster, where other nodes' tasks are asked for (`dashboard/cluster.rs`), a stream sends a
//!   fresh snapshot every [`events::CLUSTER_RESYNC`].
//!   A stream starts with a `snapshot` of the viewer's tasks, sends a new one when its
//!   receiver lagged, sends a keep-alive after [`PING`] without an event (so a dead client is
//!   noticed), and ends when the server shuts down.
//! - Every request passes the `allowed_hosts` check of `Host`; an `Origin`, when sent, must be
//!   this server's own (`http://<Host>`) or one of `allowed_origins`, else `403`.
//! - Bounds: at most [`MAX_EVENT_STREAMS`] event streams (each also holds one of
//!   `max_connections`; one more gets `503`) and `max_event_streams_per_token` (8) per token
//!   (one more gets `429`); task ids over [`MAX_TASK_ID_BYTES`] are refused; output is the
//!   peek's bounded tail. A request with a valid token authenticates its connection
//!   ([`super::admission`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, broadcast};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::McpServer;
use super::admission::Connection;
use super::tokens::{TokenTable, bearer_token};
use crate::reload::ReloadEvent;
use taskhost_core::agents::Agent;
use taskhost_core::ids::{SessionId, TaskId};
use taskhost_core::tasks::{StopCause, TaskError, TaskSnapshot};
use taskhost_core::tools::control::kill_reply;

mod cluster;
mod events;

/// Event streams served at once, over every token.
pub const MAX_EVENT_STREAMS: usize = 64;

/// Longer task ids are refused before any lookup.
pub const MAX_TASK_ID_BYTES: usize = 128;

/// How often an idle event stream sends a comment line.
pub const PING: Duration = Duration::from_secs(5);

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const APP_CSS: &str = include_str!("dashboard/app.css");

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// The last reload attempt of one tool, as the page shows it.
#[derive(Clone, Debug, serde::Serialize)]
struct LastReload {
    ok: bool,
    /// `reloaded ticker: v2 serving new starts; 1 task still on v1`, or the failure.
    text: String,
    at_ms: u64,
}

/// What every dashboard request shares.
pub struct Dashboard {
    server: Arc<McpServer>,
    tokens: Arc<TokenTable>,
    shutdown: CancellationToken,
    streams: Arc<Semaphore>,
    last_reload: Mutex<HashMap<String, LastReload>>,
    /// Fires after each reload attempt (the plugins panel changed).
    reloads: broadcast::Sender<()>,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
}

/// The authenticated client of one request.
struct Viewer {
    name: String,
    owner: Agent,
    admin: bool,
    /// The token's event stream slots, and how many.
    streams: Arc<Semaphore>,
    max_streams: usize,
}

impl Viewer {
    fn of(entry: &super::tokens::TokenEntry) -> Self {
        Self {
            name: entry.name.clone(),
            owner: entry.owner.clone(),
            admin: entry.admin,
            streams: entry.streams.clone(),
            max_streams: entry.max_streams,
        }
    }

    fn sees(&self, owner_session: Option<&SessionId>) -> bool {
        self.admin || owner_session.is_none_or(|session| session == self.owner.session())
    }
}

/// The dashboard's routes, to merge into the HTTP app (outside the MCP
/// endpoint's layers).
pub fn router(server: Arc<McpServer>, tokens: Arc<TokenTable>, shutdown: CancellationToken) -> axum::Router {
    let settings = &server.settings().http;
    let allowed_hosts = settings.allowed_hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
    let allowed_origins = settings.allowed_origins.iter().map(|o| o.to_ascii_lowercase()).collect();
    let (reloads, _) = broadcast::channel(16);
    let dashboard = Arc::new(Dashboard {
        server,
        tokens,
        shutdown,
        streams: Arc::new(Semaphore::new(MAX_EVENT_STREAMS)),
        last_reload: Mutex::default(),
        reloads,
        allowed_hosts,
        allowed_origins,
    });
    dashboard.follow_reloads();
    dashboard.answer_other_nodes();
    axum::Router::new()
        .route("/", get(index))
        .route("/dashboard/app.js", get(app_js))
        .route("/dashboard/app.css", get(app_css))
        .route("/dashboard/api/session", get(session))
        .route("/dashboard/api/tasks", get(tasks))
        .route("/dashboard/api/tasks/{id}/output", get(output))
        .route("/dashboard/api/tasks/{id}/kill", post(kill))
        .route("/dashboard/api/plugins", get(plugins))
        .route("/dashboard/api/events", get(events::events))
        .layer(axum::middleware::from_fn_with_state(dashboard.clone(), guard))
        .with_state(dashboard)
}

/// A refusal a helper returns (boxed: a response is large).
type Refusal = Box<Response>;

fn refusal(status: StatusCode, message: impl Into<String>) -> Refusal {
    Box::new(error(status, message))
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let mut response = (status, axum::Json(json!({"error": message.into()}))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"taskhost\""));
    }
    response
}

/// Host and origin checks in front of every dashboard route, and the
/// security headers on every answer.
async fn guard(State(dashboard): State<Arc<Dashboard>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .map(str::to_ascii_lowercase)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_ascii_lowercase()));
    let Some(host) = host.filter(|host| dashboard.host_allowed(host)) else {
        tracing::info!(path = %request.uri().path(), "dashboard: refused: host not allowed");
        return with_security_headers(error(
            StatusCode::FORBIDDEN,
            "Forbidden: the Host header is not in [serve.http] allowed_hosts",
        ));
    };
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes()).to_ascii_lowercase();
        let same_origin = origin == format!("http://{host}");
        if !same_origin && !dashboard.allowed_origins.contains(&origin) {
            tracing::info!(%origin, "dashboard: refused: origin not allowed");
            return with_security_headers(error(
                StatusCode::FORBIDDEN,
                format!(
                    "Forbidden: Origin {origin:?} is neither this server's own origin nor listed in \
                     [serve.http] allowed_origins"
                ),
            ));
        }
    }
    // A cluster node that cannot confirm its membership shows no task.
    if request.uri().path().starts_with("/dashboard/api/")
        && let Err(refusal) = dashboard.server.confirm_membership().await
    {
        return with_security_headers(error(StatusCode::SERVICE_UNAVAILABLE, refusal));
    }
    // A valid token makes the connection an authenticated one (out of the
    // share of connections without a token).
    if let Some(connection) = request.extensions().get::<Arc<Connection>>()
        && let Some(entry) = bearer_token(request.headers()).and_then(|t| dashboard.tokens.authenticate(t))
        && connection.authenticate(entry).is_err()
    {
        let mut refusal = error(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "Too many connections for token {:?}: at most {} at once ([serve.http] max_connections_per_token)",
                entry.name, entry.max_connections
            ),
        );
        refusal.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        refusal.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        return with_security_headers(refusal);
    }
    with_security_headers(next.run(request).await)
}

fn with_security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // The shell revalidates (a new binary serves a new page); API answers
    // are never stored.
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn app_css() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

impl Dashboard {
    fn host_allowed(&self, host: &str) -> bool {
        if self.allowed_hosts.iter().any(|h| h == "*") {
            return true;
        }
        let Ok(authority) = host.parse::<axum::http::uri::Authority>() else { return false };
        let name = authority.host().trim_matches(['[', ']']);
        self.allowed_hosts.iter().any(|allowed| match allowed.parse::<axum::http::uri::Authority>() {
            Ok(allowed) => {
                allowed.host().trim_matches(['[', ']']) == name
                    && allowed.port_u16().is_none_or(|port| authority.port_u16() == Some(port))
            }
            Err(_) => allowed.trim_matches(['[', ']']) == name,
        })
    }

    fn viewer(&self, headers: &HeaderMap) -> Result<Viewer, Refusal> {
        let Some(presented) = bearer_token(headers) else {
            return Err(refusal(
                StatusCode::UNAUTHORIZED,
                "Unauthorized: missing bearer token: send the header `Authorization: Bearer <token>`",
            ));
        };
        let Some(entry) = self.tokens.authenticate(presented) else {
            tracing::info!("dashboard: refused: invalid bearer token");
            return Err(refusal(StatusCode::UNAUTHORIZED, "Unauthorized: invalid bearer token"));
        };
        Ok(Viewer::of(entry))
    }

    /// The tasks `viewer` may see, in start order.
    fn visible_tasks(&self, viewer: &Viewer) -> Vec<TaskSnapshot> {
        let registry = self.server.host().registry();
        if viewer.admin { registry.list_all() } else { registry.list(Some(&viewer.owner)) }
    }

    /// The agent to act as on `id` for `viewer`: the task's owner, when
    /// the viewer may see the task. `404` otherwise, whether the task is
    /// unknown or another owner's.
    fn actor(&self, viewer: &Viewer, id: &str) -> Result<(TaskId, Agent), Refusal> {
        if id.len() > MAX_TASK_ID_BYTES {
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                format!("task id too long: at most {MAX_TASK_ID_BYTES} bytes (ids look like bash-3)"),
            ));
        }
        let id = TaskId::new(id);
        let not_found = || {
            refusal(
                StatusCode::NOT_FOUND,
                format!(
                    "no task {id} among the tasks this token may see ({}); GET /dashboard/api/tasks lists them",
                    if viewer.admin { "every owner's".to_string() } else { format!("{}'s", viewer.name) }
                ),
            )
        };
        let registry = self.server.host().registry();
        if !viewer.admin {
            return match registry.get(&id, Some(&viewer.owner)) {
                Ok(_) => Ok((id, viewer.owner.clone())),
                Err(TaskError::UnknownTask(_) | TaskError::ForeignTask(_)) => Err(not_found()),
                Err(other) => Err(refusal(StatusCode::INTERNAL_SERVER_ERROR, other.to_string())),
            };
        }
        let Some(task) = registry.list_all().into_iter().find(|t| t.id == id) else { return Err(not_found()) };
        match &task.owner_session {
            None => Ok((id, viewer.owner.clone())),
            Some(session) => match self.tokens.entries().iter().find(|e| e.owner.session() == session) {
                Some(entry) => Ok((id, entry.owner.clone())),
                None => Err(refusal(
                    StatusCode::CONFLICT,
                    format!(
                        "task {id} belongs to {session}, which is not a [serve.http] token's owner; \
                         the dashboard acts only for token owners"
                    ),
                )),
            },
        }
    }

    fn plugins_json(&self) -> Value {
        let last = self.last_reload.lock().unwrap_or_else(|e| e.into_inner());
        let plugins: Vec<Value> = self
            .server
            .plugins()
            .iter()
            .map(|plugin| {
                let serving = plugin.serving();
                let live: Vec<Value> = plugin
                    .live_tasks_by_version()
                    .iter()
                    .map(|(seq, live)| json!({"version": format!("v{seq}"), "live": live}))
                    .collect();
                json!({
                    "tool": plugin.tool(),
                    "serving": serving.info(),
                    "tag": serving.tag(),
                    "live_by_version": live,
                    "last_reload": last.get(plugin.tool()),
                })
            })
            .collect();
        json!({ "plugins": plugins })
    }

    /// Keeps each plugin's last reload result, and tells event streams.
    fn follow_reloads(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        for plugin in self.server.plugins() {
            let mut events = plugin.subscribe();
            let dashboard = Arc::downgrade(self);
            let stop = self.shutdown.clone();
            tokio::spawn(async move {
                loop {
                    let event = tokio::select! {
                        event = events.recv() => event,
                        _ = stop.cancelled() => return,
                    };
                    let event = match event {
                        Ok(event) => event,
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return,
                    };
                    let Some(dashboard) = dashboard.upgrade() else { return };
                    let (tool, ok) = match &event {
                        ReloadEvent::Reloaded(r) => (r.tool.clone(), true),
                        ReloadEvent::Failed(f) => (f.tool.clone(), false),
                    };
                    let last = LastReload { ok, text: event.to_string(), at_ms: unix_ms(SystemTime::now()) };
                    dashboard.last_reload.lock().unwrap_or_else(|e| e.into_inner()).insert(tool, last);
                    let _ = dashboard.reloads.send(());
                }
            });
        }
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A task as the page shows it: the snapshot, its owner's token name and
/// its status line. Serialized straight from the snapshot (no intermediate
/// JSON tree: the list of 1 000 tasks is the page's hot path).
#[derive(serde::Serialize)]
struct TaskView<'a> {
    #[serde(flatten)]
    task: &'a TaskSnapshot,
    owner: &'a str,
    status_line: String,
}

impl<'a> TaskView<'a> {
    fn of(task: &'a TaskSnapshot) -> Self {
        let owner = match &task.owner_session {
            Some(session) => session.as_str().strip_prefix("http:").unwrap_or(session.as_str()),
            None => "(unowned)",
        };
        Self { task, owner, status_line: task.status_line() }
    }
}

fn task_json(task: &TaskSnapshot) -> Value {
    serde_json::to_value(TaskView::of(task)).unwrap_or(Value::Null)
}

/// `{"tasks": [...]}`, serialized once.
fn tasks_body(tasks: &[TaskSnapshot]) -> String {
    #[derive(serde::Serialize)]
    struct Tasks<'a> {
        tasks: Vec<TaskView<'a>>,
    }
    let body = Tasks { tasks: tasks.iter().map(TaskView::of).collect() };
    serde_json::to_string(&body).unwrap_or_else(|_| r#"{"tasks":[]}"#.to_string())
}

fn json_response(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn session(State(dashboard): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    match dashboard.viewer(&headers) {
        Ok(viewer) => axum::Json(json!({
            "name": viewer.name,
            "owner": viewer.owner.session().as_str(),
            "admin": viewer.admin,
        }))
        .into_response(),
        Err(refusal) => *refusal,
    }
}

async fn tasks(State(dashboard): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    match dashboard.viewer(&headers) {
        Ok(viewer) => json_response(dashboard.tasks_everywhere(&viewer).await),
        Err(refusal) => *refusal,
    }
}

async fn plugins(State(dashboard): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    match dashboard.viewer(&headers) {
        Ok(_) => axum::Json(dashboard.plugins_json()).into_response(),
        Err(refusal) => *refusal,
    }
}

/// `GET /dashboard/api/tasks/{id}/output?since=<offset>`: the output after
/// `since` (0 by default), never consumed.
async fn output(State(dashboard): State<Arc<Dashboard>>, Path(id): Path<String>, request: Request) -> Response {
    let viewer = match dashboard.viewer(request.headers()) {
        Ok(viewer) => viewer,
        Err(refusal) => return *refusal,
    };
    let since = match request.uri().query().map(since_of) {
        None => 0,
        Some(Ok(since)) => since,
        Some(Err(refusal)) => return *refusal,
    };
    let response = dashboard.output_here(&viewer, &id, since).await;
    if response.status() != StatusCode::NOT_FOUND {
        return response;
    }
    let call = crate::cluster::dashboard::DashboardCall::Output { task_id: id.clone(), since };
    dashboard.on_its_node(&viewer, &id, call).await.unwrap_or(response)
}

impl Dashboard {
    /// The output of task `id` after `since`, when this node has it.
    async fn output_here(&self, viewer: &Viewer, id: &str, since: u64) -> Response {
        let (id, actor) = match self.actor(viewer, id) {
            Ok(found) => found,
            Err(refusal) => return *refusal,
        };
        match self.server.host().registry().peek(&id, Some(&actor), since).await {
            Ok(peek) => axum::Json(json!({
                "text": peek.text,
                "start": peek.start,
                "end": peek.end,
                "skipped": peek.skipped,
                "task": task_json(&peek.snapshot),
            }))
            .into_response(),
            Err(TaskError::UnknownTask(_) | TaskError::ForeignTask(_)) => {
                error(StatusCode::NOT_FOUND, format!("no task {id} among the tasks this token may see"))
            }
            Err(other) => error(StatusCode::BAD_GATEWAY, other.to_string()),
        }
    }

    /// Stops task `id`, when this node has it.
    async fn kill_here(&self, viewer: &Viewer, id: &str) -> Response {
        let (id, actor) = match self.actor(viewer, id) {
            Ok(found) => found,
            Err(refusal) => return *refusal,
        };
        let span = tracing::info_span!("dashboard_kill", task = %id, owner = %actor.session(), viewer = %viewer.name);
        let reason = format!("killed from the dashboard by {}", viewer.name);
        let registry = self.server.host().registry();
        // Not the owner's request: the owner's model is told with a notice.
        let cause = StopCause::Dashboard { viewer: viewer.name.clone() };
        match registry.stop(&id, cause, Some(&reason)).instrument(span.clone()).await {
            Ok(killed) => {
                let text = kill_reply(&id, &killed);
                span.in_scope(|| tracing::info!(reply = %text, "killed from the dashboard"));
                let task = registry.get(&id, Some(&actor)).ok();
                axum::Json(json!({
                    "text": text,
                    "is_error": false,
                    "task": task.as_ref().map(task_json),
                }))
                .into_response()
            }
            Err(refusal) => error(StatusCode::CONFLICT, refusal.to_string()),
        }
    }
}

fn since_of(query: &str) -> Result<u64, Refusal> {
    let mut since = 0;
    for pair in query.split('&') {
        if let Some(value) = pair.strip_prefix("since=") {
            since = value.parse().map_err(|_| {
                refusal(
                    StatusCode::BAD_REQUEST,
                    format!("since={value:?} is not a byte offset: pass the `end` of the previous answer, or 0"),
                )
            })?;
        }
    }
    Ok(since)
}

/// `POST /dashboard/api/tasks/{id}/kill`: the `task_kill` tool, as the
/// task's owner.
async fn kill(State(dashboard): State<Arc<Dashboard>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let viewer = match dashboard.viewer(&headers) {
        Ok(viewer) => viewer,
        Err(refusal) => return *refusal,
    };
    let response = dashboard.kill_here(&viewer, &id).await;
    if response.status() != StatusCode::NOT_FOUND {
        return response;
    }
    let call = crate::cluster::dashboard::DashboardCall::Kill { task_id: id.clone() };
    dashboard.on_its_node(&viewer, &id, call).await.unwrap_or(response)
}
