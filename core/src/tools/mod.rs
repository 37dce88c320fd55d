//! The model-facing tools: the three control tools and one tool per producer.
//!
//! A [`Toolbox`] maps tool names to tools and is what surfaces (the library,
//! MCP, the dev console) call. Every call names its caller — the agent whose
//! session owns the tasks it starts and fences the tasks it may touch — and
//! carries a cancellation token that ends the call's own waiting (never a
//! background task). Results are text: the exact formats the model learns.

pub mod control;
pub mod producer_tool;

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::agents::Agent;
use crate::tasks::TaskError;

/// A tool as the model sees it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ToolDefinition {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub input_schema: serde_json::Value,
}

/// A tool's answer. `is_error` marks results the model should read as a
/// failed call (a foreground task that did not complete).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ToolOutput {
    pub text: String,
    pub is_error: bool,
    /// The task a background start registered, as data: callers that need
    /// the id (the MCP tasks surface, the demo) read it here, never out of
    /// `text`, which is worded for the model.
    pub started: Option<crate::ids::TaskId>,
}

impl ToolOutput {
    pub fn ok(text: impl Into<String>) -> Self {
        Self { text: text.into(), is_error: false, started: None }
    }

    /// The reply to a background start of task `id`.
    pub fn started(text: impl Into<String>, id: crate::ids::TaskId) -> Self {
        Self { text: text.into(), is_error: false, started: Some(id) }
    }
}

/// Why a call was refused. Every message says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("unknown tool {name:?}; available tools: {available}")]
    UnknownTool { name: String, available: String },
    #[error("invalid arguments for {tool}: {message}")]
    InvalidArguments { tool: String, message: String },
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error("{tool} failed: {message}")]
    Failed { tool: String, message: String },
    #[error("the call to {0} was cancelled")]
    Cancelled(String),
}

/// The names of taskhost's control tools. No producer may serve a tool
/// under one of them, on any path (library, configuration, `dev`, a
/// plugin's kind): `task_wait` and `task_input` are kept for the control
/// tools to come.
pub const RESERVED_TOOL_NAMES: &[&str] = &["task_output", "task_list", "task_kill", "task_wait", "task_input"];

/// Why a tool name cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolNameError {
    #[error(
        "tool name {0:?} cannot be served: use 1 to 64 ASCII letters, digits, '_' or '-' \
         (MCP clients and model APIs refuse other names)"
    )]
    Invalid(String),
    #[error("tool name {0:?} is reserved for taskhost's control tools; serve the producer under another name")]
    Reserved(String),
}

/// Checks a producer tool's name: the MCP / model-API rule
/// `^[a-zA-Z0-9_-]{1,64}$`, and not one of [`RESERVED_TOOL_NAMES`].
pub fn check_tool_name(name: &str) -> Result<(), ToolNameError> {
    check_name_rule(name)?;
    if RESERVED_TOOL_NAMES.contains(&name) {
        return Err(ToolNameError::Reserved(name.to_string()));
    }
    Ok(())
}

fn check_name_rule(name: &str) -> Result<(), ToolNameError> {
    let valid =
        (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid { Ok(()) } else { Err(ToolNameError::Invalid(name.to_string())) }
}

/// Who is calling, and how to cancel the call.
#[derive(Clone, Debug, Default)]
pub struct CallContext {
    /// The calling agent; `None` for a host-level caller with no session.
    pub caller: Option<Agent>,
    /// Cancels the call's own waiting (a `wait`, a foreground run).
    pub cancel: CancellationToken,
}

impl CallContext {
    pub fn for_agent(agent: &Agent) -> Self {
        Self { caller: Some(agent.clone()), cancel: CancellationToken::new() }
    }

    /// The same call, cancelled by `cancel`.
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }
}

/// One model-facing tool.
#[async_trait::async_trait]
pub trait Tool: Send + Sync + 'static {
    fn definition(&self) -> ToolDefinition;
    async fn call(&self, args: serde_json::Value, context: &CallContext) -> Result<ToolOutput, ToolError>;
}

/// The tools a host serves, by name.
#[derive(Clone, Default)]
pub struct Toolbox {
    tools: Arc<std::sync::RwLock<BTreeMap<String, Arc<dyn Tool>>>>,
}

impl Toolbox {
    pub fn new() -> Self {
        Self::default()
    }

    /// A reference that does not keep the tools alive (for services the
    /// tools themselves hold, such as the subagents capability).
    pub fn downgrade(&self) -> WeakToolbox {
        WeakToolbox(Arc::downgrade(&self.tools))
    }

    /// Adds or replaces the tool under its definition's name. Refuses a
    /// name that breaks the tool-name rule or is reserved for the control
    /// tools (see [`check_tool_name`]).
    pub fn insert(&self, tool: Arc<dyn Tool>) -> Result<(), ToolNameError> {
        let name = tool.definition().name;
        check_tool_name(&name)?;
        self.tools.write().expect("toolbox poisoned").insert(name, tool);
        Ok(())
    }

    /// Adds a control tool under its reserved name.
    pub(crate) fn insert_control(&self, tool: Arc<dyn Tool>) {
        let name = tool.definition().name;
        debug_assert!(RESERVED_TOOL_NAMES.contains(&name.as_str()) && check_name_rule(&name).is_ok());
        self.tools.write().expect("toolbox poisoned").insert(name, tool);
    }

    /// Removes a tool; running tasks it started are unaffected.
    pub fn remove(&self, name: &str) -> bool {
        self.tools.write().expect("toolbox poisoned").remove(name).is_some()
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.read().expect("toolbox poisoned").get(name).cloned()
    }

    /// Current definitions, sorted by name.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        let tools: Vec<Arc<dyn Tool>> = self.tools.read().expect("toolbox poisoned").values().cloned().collect();
        tools.iter().map(|tool| tool.definition()).collect()
    }

    pub async fn call(
        &self,
        name: &str,
        args: serde_json::Value,
        context: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let Some(tool) = self.get(name) else {
            let available = self.tools.read().expect("toolbox poisoned").keys().cloned().collect::<Vec<_>>().join(", ");
            return Err(ToolError::UnknownTool { name: name.to_string(), available });
        };
        let span = tracing::info_span!(
            "tool_call",
            tool = name,
            owner = context.caller.as_ref().map(|a| a.session().as_str()).unwrap_or("-"),
        );
        // Tools run code the host does not own (producers): a panic fails
        // this call, never the caller's task.
        let call = std::panic::AssertUnwindSafe(tracing::Instrument::instrument(tool.call(args, context), span));
        match futures::FutureExt::catch_unwind(call).await {
            Ok(result) => result,
            Err(panic) => {
                let message = crate::panics::panic_message(panic);
                tracing::error!(tool = name, %message, "a tool panicked; the call fails, the host goes on");
                Err(ToolError::Failed { tool: name.to_string(), message: format!("the tool panicked: {message}") })
            }
        }
    }
}

/// A non-owning reference to a [`Toolbox`].
#[derive(Clone, Default)]
pub struct WeakToolbox(std::sync::Weak<std::sync::RwLock<BTreeMap<String, Arc<dyn Tool>>>>);

impl WeakToolbox {
    pub fn upgrade(&self) -> Option<Toolbox> {
        self.0.upgrade().map(|tools| Toolbox { tools })
    }
}

/// Deserializes a tool's arguments, turning serde's message into one that
/// names the tool. `null` counts as `{}`: some clients send no arguments.
pub(crate) fn parse_arguments<T: serde::de::DeserializeOwned>(
    tool: &str,
    args: serde_json::Value,
) -> Result<T, ToolError> {
    let args = if args.is_null() { serde_json::Value::Object(Default::default()) } else { args };
    if !args.is_object() {
        return Err(ToolError::InvalidArguments {
            tool: tool.to_string(),
            message: format!("expected a JSON object, got {}", json_kind(&args)),
        });
    }
    serde_json::from_value(args)
        .map_err(|error| ToolError::InvalidArguments { tool: tool.to_string(), message: error.to_string() })
}

pub(crate) fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
