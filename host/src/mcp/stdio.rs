//! MCP over a byte stream (stdio): one connection, one owner agent (`stdio-N`), disposed (its
//! tasks cancelled and awaited) before [`serve_connection`] returns. Between the client and
//! rmcp sits a gate, which is rmcp's transport.
//!
//! Invariants:
//! - Every line passes [`jsonrpc::check`]: what is not a well-formed JSON-RPC message of a
//!   known method is answered by the gate itself (`-32700`/`-32600`/`-32601`/`-32602`, with the
//!   id whenever it is readable); rmcp only receives messages it can read.
//! - Lifecycle: before a protocol is chosen, notifications and stray responses are ignored
//!   (rmcp would end the connection on them) and requests other than `ping`/`initialize` are
//!   refused. The first `initialize` chooses the handshake protocol, a first request carrying
//!   the 2026-07-28 `_meta` the per-request one, for the whole connection: a second
//!   `initialize`, or one on a 2026-07-28 connection, is refused. A 2025-11-25 connection gets
//!   the v1 tasks bridge ([`super::tasks_v1`]).
//! - A request reusing the id of one still in flight is refused (`-32600`, naming the id; the
//!   first keeps its answer); at most [`MAX_IN_FLIGHT`] requests are in flight, the next is
//!   refused (`-32000`, naming the bound).
//! - Memory is bounded both ways: lines are read up to [`MAX_LINE_BYTES`] (a longer one is
//!   skipped and answered); everything written to the client goes through one queue of
//!   [`OUTBOUND_QUEUE`] messages. When the client stops reading, the queue fills, the gate's
//!   answers wait for room and the gate stops reading: a client that does not read is not read.
//! - Every line written to the client is written whole, by one writer.
//! - The server's [`LoadGate`] opens once the first `tools/list` answer was written and flushed
//!   (not when rmcp produced it), so background plugin loads and the process host's start-ahead
//!   work do not compete with it; the first call of a still-loading tool opens it too
//!   ([`crate::plugin::producer::LoadingProducer`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::RoleServer;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::jsonrpc::{self, Checked, INVALID_REQUEST, LIMIT_EXCEEDED, Rejection};
use super::{McpHandler, McpServer, tasks_v1};
use crate::plugin::producer::LoadGate;
use taskhost_core::agents::Agent;

mod lines;
use lines::{LineRead, pump_outbound, read_bounded_line};

/// The longest line accepted from a client (rmcp's own default, 16 MiB).
pub const MAX_LINE_BYTES: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// Requests one connection may have in flight (answered neither by rmcp
/// nor by the gate yet).
pub const MAX_IN_FLIGHT: usize = 64;

/// Messages queued for the client before the server stops producing.
pub const OUTBOUND_QUEUE: usize = 64;

/// How long a finished connection waits for its last answers to be written.
const FINAL_WRITE: Duration = Duration::from_secs(5);

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// Serves one MCP connection over `reader`/`writer` until the client
/// disconnects or `shutdown` is cancelled, then disposes its owner.
pub async fn serve_connection<R, W>(
    server: Arc<McpServer>,
    reader: R,
    writer: W,
    shutdown: CancellationToken,
) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve_connection_as(server, reader, writer, shutdown, None).await
}

/// As [`serve_connection`], for the stable owner `owner` when given
/// (`serve --owner`): the connection's agent is the session `owner:NAME`,
/// whose records the task store keeps across restarts and hands back here.
pub async fn serve_connection_as<R, W>(
    server: Arc<McpServer>,
    reader: R,
    writer: W,
    shutdown: CancellationToken,
    owner: Option<&str>,
) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (name, owner) = match owner {
        Some(stable) => {
            let name = format!("owner:{stable}");
            (name.clone(), server.host().create_durable_agent(name.as_str(), name.as_str())?)
        }
        None => {
            let name = format!("stdio-{}", NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed));
            (name.clone(), server.host().create_agent(name.as_str(), name.as_str())?)
        }
    };
    let span = tracing::info_span!("mcp_connection", connection = %name, owner = %name);
    async move {
        let (transport, pumps) = Gate::start(server.clone(), owner.clone(), reader, writer);
        let handler = McpHandler::for_connection(server.clone(), owner.clone());
        let served = match handler.serve_with_ct(transport, shutdown.child_token()).await {
            Ok(running) => {
                let reason = running.waiting().await;
                tracing::info!(?reason, "connection closed");
                Ok(())
            }
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(during)) => {
                tracing::info!(%during, "client left before initializing");
                Ok(())
            }
            Err(rmcp::service::ServerInitializeError::Cancelled) => Ok(()),
            Err(error) => Err(anyhow::Error::new(error).context(format!("initializing MCP connection {name}"))),
        };
        // The connection is the server's: it is going away. A plain owner's
        // tasks die with it (its records say how they ended); a stable
        // owner's handed-over trees run on for the next server (see
        // `TaskRegistry::begin_shutdown`).
        server.host().registry().begin_shutdown();
        owner.dispose().await;
        tracing::info!("owner disposed");
        pumps.finish().await;
        served
    }
    .instrument(span)
    .await
}

/// The protocol a connection chose (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lifecycle {
    /// Nothing chosen yet: only `ping` and the choosing requests are served.
    Fresh,
    /// `initialize` was forwarded.
    Handshake,
    /// The first request carried the 2026-07-28 per-request `_meta`.
    PerRequest,
}

/// What the inbound pump, rmcp's sends and the bridge share.
struct Gate {
    server: Arc<McpServer>,
    owner: Agent,
    /// Everything written to the client, whole lines.
    out: mpsc::Sender<Outbound>,
    /// Requests in flight by id (their JSON text), with their method.
    in_flight: Mutex<HashMap<String, InFlight>>,
    lifecycle: Mutex<Lifecycle>,
    /// The connection negotiated 2025-11-25: the v1 tasks bridge applies.
    v1: AtomicBool,
    warned_in_flight: AtomicBool,
    warned_line: AtomicBool,
}

/// One line for the client.
struct Outbound {
    line: Vec<u8>,
    /// Opened once the line is written and flushed (a `tools/list` answer).
    then_open: Option<LoadGate>,
}

struct InFlight {
    method: String,
    /// A request the bridge answers runs here; a cancellation aborts it.
    bridged: Option<AbortHandle>,
}

/// The tasks that move bytes; see [`Pumps::finish`].
struct Pumps {
    inbound: JoinHandle<()>,
    outbound: JoinHandle<()>,
    /// Tells the writer to write what is queued and stop.
    closing: CancellationToken,
    gate: Arc<Gate>,
}

impl Pumps {
    /// Stops reading, lets queued answers out (for a while), stops writing.
    async fn finish(self) {
        // The inbound side may sit in a blocking stdin read that nothing can
        // interrupt; the connection is over, so stop waiting for it.
        self.inbound.abort();
        let bridged: Vec<AbortHandle> = self
            .gate
            .in_flight
            .lock()
            .expect("in-flight table poisoned")
            .drain()
            .filter_map(|(_, request)| request.bridged)
            .collect();
        bridged.iter().for_each(AbortHandle::abort);
        drop(self.gate);
        self.closing.cancel();
        let mut outbound = self.outbound;
        // A client that stopped reading must not hold the exit.
        if tokio::time::timeout(FINAL_WRITE, &mut outbound).await.is_err() {
            tracing::info!("the client is not reading its last answers; dropping them");
            outbound.abort();
        }
    }
}

/// rmcp's side of the gate.
struct GateTransport {
    from_client: mpsc::Receiver<ClientJsonRpcMessage>,
    gate: Arc<Gate>,
}

impl rmcp::transport::Transport<RoleServer> for GateTransport {
    type Error = std::io::Error;

    fn send(&mut self, item: ServerJsonRpcMessage) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let gate = self.gate.clone();
        async move { gate.send_from_rmcp(item).await }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ClientJsonRpcMessage>> + Send {
        self.from_client.recv()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.from_client.close();
        Ok(())
    }
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

fn closed() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client connection is closed")
}

impl Gate {
    fn start<R, W>(server: Arc<McpServer>, owner: Agent, reader: R, writer: W) -> (GateTransport, Pumps)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out, queued) = mpsc::channel(OUTBOUND_QUEUE);
        // rmcp reads one message at a time; one waiting is enough.
        let (to_rmcp, from_client) = mpsc::channel(1);
        let gate = Arc::new(Gate {
            server,
            owner,
            out,
            in_flight: Mutex::default(),
            lifecycle: Mutex::new(Lifecycle::Fresh),
            v1: AtomicBool::new(false),
            warned_in_flight: AtomicBool::new(false),
            warned_line: AtomicBool::new(false),
        });
        let inbound = tokio::spawn(gate.clone().pump_inbound(reader, to_rmcp).in_current_span());
        let closing = CancellationToken::new();
        let outbound = tokio::spawn(pump_outbound(queued, writer, closing.clone()).in_current_span());
        (GateTransport { from_client, gate: gate.clone() }, Pumps { inbound, outbound, closing, gate })
    }

    /// Queues a line for the client; waits while the queue is full.
    async fn write(&self, line: Vec<u8>) -> Result<(), std::io::Error> {
        self.out.send(Outbound { line, then_open: None }).await.map_err(|_| closed())
    }

    async fn reject(&self, rejection: Rejection) -> Result<(), std::io::Error> {
        tracing::info!(code = rejection.code, id = %rejection.id, message = %rejection.message, "answered by the gate");
        self.write(rejection.to_line()).await
    }

    /// One of rmcp's messages, on its way to the client. A response frees
    /// its request's slot once it is queued (not before: the slots are
    /// what bounds rmcp's pending sends).
    async fn send_from_rmcp(&self, item: ServerJsonRpcMessage) -> Result<(), std::io::Error> {
        let id = match &item {
            JsonRpcMessage::Response(response) => Some(serde_json::to_value(&response.id).unwrap_or(Value::Null)),
            JsonRpcMessage::Error(error) => error.id.as_ref().map(|id| serde_json::to_value(id).unwrap_or(Value::Null)),
            _ => None,
        };
        let method = id.as_ref().and_then(|id| {
            self.in_flight.lock().expect("in-flight table poisoned").get(&id_key(id)).map(|r| r.method.clone())
        });
        let patch = self.v1.load(Ordering::Relaxed)
            && matches!(&item, JsonRpcMessage::Response(_))
            && matches!(method.as_deref(), Some("initialize" | "tools/list"));
        let mut line = if patch {
            let mut value = serde_json::to_value(&item).map_err(std::io::Error::other)?;
            if let Some(result) = value.get_mut("result") {
                tasks_v1::patch_result(&self.server, method.as_deref().unwrap_or_default(), result);
            }
            serde_json::to_vec(&value)
        } else {
            serde_json::to_vec(&item)
        }
        .map_err(std::io::Error::other)?;
        line.push(b'\n');
        // A tool listing opens the load gate once it is out (see the module docs).
        let then_open = (method.as_deref() == Some("tools/list") && !self.server.load_gate().is_open())
            .then(|| self.server.load_gate().clone());
        let written = self.out.send(Outbound { line, then_open }).await.map_err(|_| closed());
        if let Some(id) = id {
            self.in_flight.lock().expect("in-flight table poisoned").remove(&id_key(&id));
        }
        written
    }

    async fn pump_inbound<R>(self: Arc<Self>, reader: R, to_rmcp: mpsc::Sender<ClientJsonRpcMessage>)
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        let mut reader = BufReader::with_capacity(64 * 1024, reader);
        let mut line = Vec::new();
        loop {
            if line.capacity() > 1024 * 1024 {
                // One large message must not pin its buffer for the connection's life.
                line = Vec::new();
            }
            line.clear();
            let handled = match read_bounded_line(&mut reader, &mut line, MAX_LINE_BYTES).await {
                Ok(LineRead::Eof) => break,
                Ok(LineRead::Oversized(length)) => {
                    if !self.warned_line.swap(true, Ordering::Relaxed) {
                        tracing::warn!(length, limit = MAX_LINE_BYTES, "line length bound hit; skipping the line");
                    }
                    self.reject(Rejection::new(
                        Value::Null,
                        jsonrpc::PARSE_ERROR,
                        format!(
                            "Parse error: a message of {length} bytes or more exceeds the line length limit of \
                             {MAX_LINE_BYTES} bytes; it was ignored"
                        ),
                    ))
                    .await
                }
                Ok(LineRead::Line) => {
                    let content = line.strip_suffix(b"\n").unwrap_or(&line);
                    let content = content.strip_suffix(b"\r").unwrap_or(content);
                    if content.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    self.handle(content, &to_rmcp).await
                }
                Err(error) => {
                    tracing::info!(%error, "reading from the client failed");
                    break;
                }
            };
            if handled.is_err() {
                // The client or rmcp is gone: the connection is over.
                break;
            }
        }
        // Dropping `to_rmcp` is the end of input rmcp sees.
    }

    /// Checks one line and answers it or passes it on.
    async fn handle(
        self: &Arc<Self>,
        line: &[u8],
        to_rmcp: &mpsc::Sender<ClientJsonRpcMessage>,
    ) -> std::io::Result<()> {
        let checked = match jsonrpc::check(line) {
            Ok(checked) => checked,
            Err(rejection) => return self.reject(rejection).await,
        };
        let lifecycle = *self.lifecycle.lock().expect("lifecycle poisoned");
        match checked {
            Checked::Notification { method, message } => {
                if lifecycle == Lifecycle::Fresh {
                    tracing::debug!(%method, "ignoring a notification before initialize");
                    return Ok(());
                }
                if method == "notifications/cancelled" {
                    self.cancel(&message["params"]["requestId"]);
                }
                match jsonrpc::to_rmcp(None, &method, message) {
                    Ok(message) => to_rmcp.send(message).await.map_err(|_| closed()),
                    Err(rejection) => {
                        // Notifications are never answered.
                        tracing::info!(%method, error = %rejection.message, "ignoring a malformed notification");
                        Ok(())
                    }
                }
            }
            Checked::Response { message } => {
                if lifecycle == Lifecycle::Fresh {
                    tracing::debug!("ignoring a response before initialize");
                    return Ok(());
                }
                match serde_json::from_value::<ClientJsonRpcMessage>(message) {
                    Ok(message) => to_rmcp.send(message).await.map_err(|_| closed()),
                    Err(error) => {
                        tracing::info!(%error, "ignoring a malformed response");
                        Ok(())
                    }
                }
            }
            Checked::Request { id, method, message } => {
                if let Some(rejection) = self.lifecycle_rule(lifecycle, &id, &method, &message) {
                    return self.reject(rejection).await;
                }
                if self.v1.load(Ordering::Relaxed) && tasks_v1::intercepts(&method, &message) {
                    if let Err(rejection) = self.admit(&id, &method) {
                        return self.reject(rejection).await;
                    }
                    self.bridge(id, method, message);
                    return Ok(());
                }
                let version = message["params"]["protocolVersion"].as_str().map(str::to_string);
                let converted = match jsonrpc::to_rmcp(Some(&id), &method, message) {
                    Ok(converted) => converted,
                    Err(rejection) => return self.reject(rejection).await,
                };
                if let Err(rejection) = self.admit(&id, &method) {
                    return self.reject(rejection).await;
                }
                match method.as_str() {
                    "initialize" => {
                        *self.lifecycle.lock().expect("lifecycle poisoned") = Lifecycle::Handshake;
                        self.v1.store(version.as_deref() == Some(tasks_v1::PROTOCOL), Ordering::Relaxed);
                    }
                    // Neither chooses a protocol (rmcp answers both before one is chosen).
                    "ping" | "server/discover" => {}
                    _ if lifecycle == Lifecycle::Fresh => {
                        *self.lifecycle.lock().expect("lifecycle poisoned") = Lifecycle::PerRequest;
                    }
                    _ => {}
                }
                to_rmcp.send(converted).await.map_err(|_| closed())
            }
        }
    }

    /// The connection's protocol rule (module docs); `Some` refuses.
    fn lifecycle_rule(&self, lifecycle: Lifecycle, id: &Value, method: &str, message: &Value) -> Option<Rejection> {
        let refuse = |message: &str| Some(Rejection::new(id.clone(), INVALID_REQUEST, message));
        match (lifecycle, method) {
            (_, "ping") => None,
            (Lifecycle::Fresh, "initialize" | "server/discover") => None,
            (Lifecycle::Fresh, _) if carries_per_request_meta(message) => None,
            (Lifecycle::Fresh, _) => refuse(
                "Invalid request: this connection is not initialized. Send initialize first (or, on protocol \
                 2026-07-28, put io.modelcontextprotocol/protocolVersion and \
                 io.modelcontextprotocol/clientCapabilities in params._meta of every request)",
            ),
            (Lifecycle::Handshake, "initialize") => {
                refuse("Invalid request: this connection is already initialized; initialize is accepted once")
            }
            (Lifecycle::PerRequest, "initialize") => refuse(
                "Invalid request: this connection uses protocol 2026-07-28 (per-request _meta), chosen by its first \
                 request; initialize is not accepted on it. Open a new connection to use initialize",
            ),
            _ => None,
        }
    }

    /// Takes an in-flight slot for a request, or refuses it.
    fn admit(&self, id: &Value, method: &str) -> Result<(), Rejection> {
        let mut in_flight = self.in_flight.lock().expect("in-flight table poisoned");
        let key = id_key(id);
        if in_flight.contains_key(&key) {
            return Err(Rejection::new(
                id.clone(),
                INVALID_REQUEST,
                format!(
                    "Invalid request: request id {key} is already in flight on this connection; the first request \
                     keeps it. Use a fresh id for every request"
                ),
            ));
        }
        if in_flight.len() >= MAX_IN_FLIGHT {
            if !self.warned_in_flight.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    limit = MAX_IN_FLIGHT,
                    "requests-in-flight bound hit; refusing requests until answers drain"
                );
            }
            return Err(Rejection::new(
                id.clone(),
                LIMIT_EXCEEDED,
                format!(
                    "Too many requests in flight: this connection already has {MAX_IN_FLIGHT} unanswered requests \
                     (the per-connection limit); wait for answers, and read them, before sending more"
                ),
            ));
        }
        in_flight.insert(key, InFlight { method: method.to_string(), bridged: None });
        Ok(())
    }

    /// A `notifications/cancelled`: rmcp drops a cancelled request's answer,
    /// so its slot is freed here; a bridged request is stopped.
    fn cancel(&self, request_id: &Value) {
        if request_id.is_null() {
            return;
        }
        if let Some(request) = self.in_flight.lock().expect("in-flight table poisoned").remove(&id_key(request_id))
            && let Some(bridged) = request.bridged
        {
            bridged.abort();
        }
    }

    /// Runs a 2025-11-25 tasks request in the background and answers it.
    fn bridge(self: &Arc<Self>, id: Value, method: String, message: Value) {
        let gate = self.clone();
        let key = id_key(&id);
        let task = tokio::spawn(
            async move {
                let answer = match tasks_v1::answer(&gate.server, &gate.owner, &id, &method, &message).await {
                    Ok(result) => serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}),
                    Err(rejection) => rejection.to_value(),
                };
                let mut line = serde_json::to_vec(&answer).expect("a JSON value serializes");
                line.push(b'\n');
                let _ = gate.write(line).await;
                gate.in_flight.lock().expect("in-flight table poisoned").remove(&id_key(&id));
            }
            .in_current_span(),
        );
        if let Some(request) = self.in_flight.lock().expect("in-flight table poisoned").get_mut(&key) {
            request.bridged = Some(task.abort_handle());
        }
    }
}

/// Whether a request carries the 2026-07-28 per-request context, which
/// chooses that protocol for a fresh connection.
fn carries_per_request_meta(message: &Value) -> bool {
    let meta = &message["params"]["_meta"];
    let version = meta["io.modelcontextprotocol/protocolVersion"].as_str();
    version.is_some_and(|version| {
        rmcp::model::ProtocolVersion::KNOWN_VERSIONS
            .iter()
            .any(|known| known.as_str() == version && !known.has_initialize())
    }) && meta["io.modelcontextprotocol/clientCapabilities"].is_object()
}
