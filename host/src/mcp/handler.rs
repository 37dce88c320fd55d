//! The rmcp [`ServerHandler`]: tools/list and tools/call over a shared
//! [`McpServer`].
//!
//! Invariants:
//! - A handler never owns state that must outlive a request; it points at
//!   the shared server and says how to find the caller's owner agent.
//! - Every tools/call answer is a tool result (never a JSON-RPC error), so
//!   clients show the model the message; notices ride on every answer.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, GetTaskParams,
    GetTaskResult, Implementation, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use tracing::Instrument;

use super::McpServer;
use taskhost_core::agents::Agent;
use taskhost_core::tools::producer_tool::RUN_IN_BACKGROUND;
use taskhost_core::tools::{CallContext, ToolDefinition, ToolError, ToolOutput};

/// The owner a verified HTTP request runs as. The auth layer puts it in
/// the request's extensions; nothing a client sends can set it.
#[derive(Clone, Debug)]
pub struct AuthenticatedOwner(pub Agent);

#[derive(Clone)]
enum OwnerSource {
    /// The connection is the owner (stdio, in-process transports).
    Connection(Agent),
    /// Each request carries its owner, set by the HTTP auth layer.
    HttpAuth,
}

/// One protocol handler over the shared server.
#[derive(Clone)]
pub struct McpHandler {
    server: Arc<McpServer>,
    owner: OwnerSource,
    /// A `tools/list` answer opens the server's load gate here; else the
    /// transport opens it once the answer is written (stdio).
    listing_opens_gate: bool,
}

impl McpHandler {
    /// A handler whose every call runs as `owner` (one connection, one
    /// owner). Its transport opens the server's load gate once the first
    /// `tools/list` answer is written ([`super::stdio`]).
    pub fn for_connection(server: Arc<McpServer>, owner: Agent) -> Self {
        Self { server, owner: OwnerSource::Connection(owner), listing_opens_gate: false }
    }

    /// A handler that takes each request's owner from its HTTP authentication.
    pub fn for_http(server: Arc<McpServer>) -> Self {
        Self { server, owner: OwnerSource::HttpAuth, listing_opens_gate: true }
    }

    fn owner(&self, context: &RequestContext<RoleServer>) -> Result<Agent, McpError> {
        match &self.owner {
            OwnerSource::Connection(agent) => Ok(agent.clone()),
            OwnerSource::HttpAuth => context
                .extensions
                .get::<http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<AuthenticatedOwner>())
                .map(|owner| owner.0.clone())
                // Unreachable behind the auth layer; refuse rather than run
                // a call without an owner.
                .ok_or_else(|| McpError::invalid_request("unauthenticated request: no owner for this call", None)),
        }
    }
}

/// An MCP tool from a library tool definition.
pub fn mcp_tool(definition: ToolDefinition) -> Tool {
    let schema = match definition.input_schema {
        serde_json::Value::Object(object) => object,
        // Definitions are object schemas by contract; keep a broken one
        // visible instead of dropping the tool.
        other => {
            let mut object = serde_json::Map::new();
            object.insert("type".into(), "object".into());
            object.insert("description".into(), format!("invalid schema from the producer: {other}").into());
            object
        }
    };
    Tool::new(definition.name, definition.description, Arc::new(schema))
}

impl ServerHandler for McpHandler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
            .with_server_info(Implementation::new("taskhost", env!("CARGO_PKG_VERSION")))
            .with_instructions(self.server.host().system_prompt_section())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = self.server.host().tool_definitions().into_iter().map(mcp_tool).collect();
        // The start's work is done once the tools are listed: background
        // plugin loads may have the CPU now (on stdio, once the answer is
        // written: the transport opens the gate then).
        if self.listing_opens_gate {
            self.server.load_gate().open();
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let owner = self.owner(&context)?;
        let span = tracing::info_span!(
            "mcp_call",
            owner = %owner.session(),
            tool = %request.name,
            request = %context.id,
        );
        Ok(self.server.call_tool(&owner, request, &context).instrument(span).await)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let owner = self.owner(&context)?;
        self.server.confirm_membership().await.map_err(|refusal| McpError::internal_error(refusal, None))?;
        self.server.tasks.get(self.server.host().registry(), &owner, &request.task_id)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let owner = self.owner(&context)?;
        self.server.confirm_membership().await.map_err(|refusal| McpError::internal_error(refusal, None))?;
        self.server.tasks.cancel(self.server.host().registry(), &owner, &request.task_id).await
    }
}

/// The `_meta` key of a tools/call result that started a background task:
/// the task's id (a string), as data.
pub const STARTED_TASK_META: &str = "taskhost/started-task";

impl McpServer {
    /// Runs one tools/call as `owner` and builds its result, notices included.
    async fn call_tool(
        &self,
        owner: &Agent,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let name = request.name.as_ref();
        let mut forwarded_notices = Vec::new();
        // A node that cannot confirm it is still a member of its cluster
        // reports nothing, notices included: the cluster may have handed
        // their tasks to another node, which tells them.
        if let Err(refusal) = self.confirm_membership().await {
            return CallToolResult::error(vec![ContentBlock::text(refusal)]).into();
        }
        let admitted = self.check_argument_size(name, request.arguments.as_ref());
        let serving = admitted.is_ok();
        let (text, is_error, started) = match admitted {
            Err(refusal) => (refusal, true, None),
            Ok(()) if self.answers_as_task(name, request.arguments.as_ref(), context) => {
                let mut args = request.arguments.unwrap_or_default();
                args.insert(RUN_IN_BACKGROUND.to_string(), true.into());
                // The task outlives this request: only tasks/cancel,
                // task_kill or the owner's disposal stop it.
                let call = CallContext::for_agent(owner);
                match self.start_task(owner, name, args, &call).await {
                    Ok(created) => return CallToolResponse::Task(created),
                    Err(Ok(output)) => (output.text, output.is_error, output.started),
                    Err(Err(error)) => (error.to_string(), true, None),
                }
            }
            Ok(()) => {
                let args = serde_json::Value::Object(request.arguments.unwrap_or_default());
                // On a cluster, a call about another node's task is answered there.
                let forwarded = match self.membership() {
                    Some(membership) => membership.route(owner, name, &args, self.host()).await,
                    None => None,
                };
                if let Some(forwarded) = forwarded {
                    forwarded_notices = forwarded.notices;
                    (forwarded.output.text, forwarded.output.is_error, forwarded.output.started)
                } else {
                    // The request's token is cancelled on notifications/cancelled,
                    // on a closed HTTP stream and when the connection ends.
                    let call = CallContext::for_agent(owner).with_cancel(context.ct.clone());
                    let progress = context.meta.get_progress_token().map(|token| (token, context.peer.clone()));
                    let interval = Duration::from_millis(self.settings().progress_interval_ms);
                    let started = Instant::now();
                    let outcome =
                        with_progress(self.host().call_tool(name, args, &call), progress, interval, name).await;
                    match outcome {
                        Ok(output) => {
                            tracing::debug!(
                                elapsed_ms = started.elapsed().as_millis() as u64,
                                is_error = output.is_error,
                                "tool call answered"
                            );
                            (output.text, output.is_error, output.started)
                        }
                        Err(error) => {
                            tracing::info!(%error, "tool call refused");
                            (error.to_string(), true, None)
                        }
                    }
                }
            }
        };
        // Notices other nodes hold for this owner (a cluster's hints).
        if let Some(membership) = self.membership().filter(|_| serving) {
            forwarded_notices.extend(membership.notices_held_elsewhere(owner).await);
        }
        let mut content = vec![ContentBlock::text(text)];
        let notices = owner.take_unread();
        if !notices.is_empty() {
            tracing::debug!(count = notices.len(), "delivering notices with the result");
        }
        content.extend(notices.into_iter().map(|message| ContentBlock::text(message.text)));
        content.extend(forwarded_notices.into_iter().map(ContentBlock::text));
        let mut result = if is_error { CallToolResult::error(content) } else { CallToolResult::success(content) };
        if let Some(id) = started {
            // The started task's id as data, so no client parses the text
            // (whose wording is the producer's).
            let mut meta = rmcp::model::JsonObject::new();
            meta.insert(STARTED_TASK_META.into(), id.to_string().into());
            result.meta = Some(rmcp::model::MetaObject(meta));
        }
        result.into()
    }

    /// A foreground call of a producer tool that allows background runs,
    /// from a client that declared the tasks extension.
    fn answers_as_task(
        &self,
        tool: &str,
        arguments: Option<&rmcp::model::JsonObject>,
        context: &RequestContext<RoleServer>,
    ) -> bool {
        let declared = context.client_capabilities().is_some_and(|capabilities| capabilities.supports_tasks());
        let foreground =
            arguments.and_then(|args| args.get(RUN_IN_BACKGROUND)).is_none_or(|flag| flag == &serde_json::json!(false));
        declared
            && foreground
            && self.host().tool_definitions().iter().any(|definition| {
                definition.name == tool && definition.input_schema["properties"].get(RUN_IN_BACKGROUND).is_some()
            })
    }

    /// Starts the call as a registry background task and tracks it as an MCP
    /// task. `Err(Ok(output))` is a start that answered without a task (a
    /// refusal the producer phrased as a result).
    pub(super) async fn start_task(
        &self,
        owner: &Agent,
        tool: &str,
        args: rmcp::model::JsonObject,
        call: &CallContext,
    ) -> Result<rmcp::model::CreateTaskResult, Result<ToolOutput, ToolError>> {
        let output = self.host().call_tool(tool, serde_json::Value::Object(args), call).await.map_err(Err)?;
        if output.is_error {
            return Err(Ok(output));
        }
        // A background start names its task as data; the registry confirms
        // it is this owner's task.
        let registry = self.host().registry();
        let id = output.started.clone();
        match id {
            Some(id) if registry.get(&id, Some(owner)).is_ok() => {
                tracing::info!(task = %id, "answered as an MCP task");
                Ok(self.tasks.track(registry, owner, id))
            }
            _ => Err(Ok(output)),
        }
    }

    /// Refuses arguments over `[serve] max_argument_bytes`, before any tool
    /// parses, validates or echoes them.
    pub(super) fn check_argument_size(
        &self,
        tool: &str,
        arguments: Option<&rmcp::model::JsonObject>,
    ) -> Result<(), String> {
        let Some(arguments) = arguments else { return Ok(()) };
        let limit = self.settings().max_argument_bytes;
        let mut counter = ByteCounter(0);
        // Writing to a counter cannot fail; a failure would only undercount.
        let _ = serde_json::to_writer(&mut counter, arguments);
        if counter.0 > limit {
            return Err(format!(
                "arguments for {tool} are {} bytes, over this server's limit of {limit} bytes \
                 ([serve] max_argument_bytes); send less data",
                counter.0
            ));
        }
        Ok(())
    }
}

struct ByteCounter(usize);

impl std::io::Write for ByteCounter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Awaits `call`, sending a progress notification every `interval` while it
/// runs when the client asked for progress. Progress is the elapsed time in
/// seconds: producers report no fraction done, and it only ever grows.
async fn with_progress<F: Future>(
    call: F,
    progress: Option<(ProgressToken, Peer<RoleServer>)>,
    interval: Duration,
    tool: &str,
) -> F::Output {
    let Some((token, peer)) = progress else { return call.await };
    let started = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval_at(started + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut call = std::pin::pin!(call);
    loop {
        tokio::select! {
            output = &mut call => return output,
            _ = ticks.tick() => {
                let elapsed = started.elapsed();
                let notification = ProgressNotificationParam::new(token.clone(), elapsed.as_secs_f64())
                    .with_message(format!("{tool} running for {} s", elapsed.as_secs()));
                if let Err(error) = peer.notify_progress(notification).await {
                    // The client may be gone; the call itself decides what happens.
                    tracing::debug!(%error, "progress notification not sent");
                }
            }
        }
    }
}
