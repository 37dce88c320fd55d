//! The kind-agnostic control tools: `task_output`, `task_list`, `task_kill`,
//! `task_input` (and `task_wait`).
//!
//! They are the registry's control surface: constructing [`ControlTools`]
//! attaches the surface fence and starts completion notices; dropping it
//! detaches both. Their texts are the behaviour contract's (README,
//! "Model-facing texts"), kept exact so transcripts compare.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use super::{CallContext, Tool, ToolDefinition, ToolError, ToolOutput, Toolbox, parse_arguments};
use crate::ids::TaskId;
use crate::notices::deliver_completion_notices;
use crate::tasks::{KillResult, ListenerGuard, SurfaceGuard, TaskRegistry};

/// How long `task_output(wait: true)` waits when the call gives no `timeout_ms`.
pub const DEFAULT_WAIT_TIMEOUT_MS: u64 = 30_000;

/// The most a wait may last unless `[tasks] max_wait_timeout_ms` says otherwise.
pub const DEFAULT_MAX_WAIT_TIMEOUT_MS: u64 = 600_000;

/// Settings of the control tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlToolsConfig {
    /// How long `task_output(wait: true)` waits when no `timeout_ms` is given.
    pub wait_timeout_ms: u64,
    /// The most any wait may last; larger `timeout_ms` values are clamped.
    pub max_wait_timeout_ms: u64,
}

impl Default for ControlToolsConfig {
    fn default() -> Self {
        Self { wait_timeout_ms: DEFAULT_WAIT_TIMEOUT_MS, max_wait_timeout_ms: DEFAULT_MAX_WAIT_TIMEOUT_MS }
    }
}

impl ControlToolsConfig {
    /// Rejects a default wait longer than the cap.
    pub fn validate(&self) -> Result<(), String> {
        if self.wait_timeout_ms > self.max_wait_timeout_ms {
            return Err(format!(
                "wait_timeout_ms ({}) is larger than max_wait_timeout_ms ({}); lower it or raise the cap",
                self.wait_timeout_ms, self.max_wait_timeout_ms
            ));
        }
        Ok(())
    }
}

/// The attached control surface. Keep it alive as long as its tools serve.
pub struct ControlTools {
    registry: TaskRegistry,
    config: ControlToolsConfig,
    _surface: SurfaceGuard,
    _notices: ListenerGuard,
}

impl ControlTools {
    pub fn attach(registry: &TaskRegistry, config: ControlToolsConfig) -> Result<Arc<Self>, String> {
        config.validate()?;
        Ok(Arc::new(Self {
            registry: registry.clone(),
            config,
            _surface: registry.attach_surface("control tools"),
            _notices: deliver_completion_notices(registry),
        }))
    }

    /// Adds `task_output`, `task_list` and `task_kill` to a toolbox.
    pub fn install(self: &Arc<Self>, toolbox: &Toolbox) {
        toolbox.insert_control(Arc::new(TaskOutput(self.clone())));
        toolbox.insert_control(Arc::new(TaskList(self.clone())));
        toolbox.insert_control(Arc::new(TaskKill(self.clone())));
        toolbox.insert_control(Arc::new(TaskInputTool(self.clone())));
    }
}

/// The most text one `task_input` call may send.
pub const MAX_INPUT_BYTES: usize = 64 * 1024;

struct TaskOutput(Arc<ControlTools>);
struct TaskList(Arc<ControlTools>);
struct TaskKill(Arc<ControlTools>);
struct TaskInputTool(Arc<ControlTools>);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskInputArgs {
    task_id: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    close: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskOutputArgs {
    task_id: String,
    #[serde(default)]
    wait: bool,
    timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskListArgs {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskKillArgs {
    task_id: String,
    reason: Option<String>,
}

fn task_id(tool: &str, raw: String) -> Result<TaskId, ToolError> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err(ToolError::InvalidArguments {
            tool: tool.to_string(),
            message: "task_id is empty; pass an id from a start reply or from task_list".to_string(),
        });
    }
    Ok(TaskId::new(trimmed))
}

#[async_trait::async_trait]
impl Tool for TaskOutput {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: "task_output".to_string(),
            description: format!(
                "Read the output of a background task. For tasks that stream output (commands) it returns only what is new \
                 since your previous read; for tasks with a final result (subagents) it returns the result once the task \
                 finished. The last line is the task's status, e.g. [status: running] or [status: completed, exit code: 0]. \
                 Non-blocking by default; pass wait: true to block until the task finishes or timeout_ms passes \
                 (default {} ms, at most {} ms). A timed-out wait leaves the task running.",
                self.0.config.wait_timeout_ms, self.0.config.max_wait_timeout_ms
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "task_id": {"type": "string", "description": "The id of the task, as returned when it started."},
                    "wait": {"type": "boolean", "description": "Block until the task finishes or the timeout passes. Default false."},
                    "timeout_ms": {"type": "integer", "minimum": 0, "description": "How long wait may block, in milliseconds."}
                },
                "required": ["task_id"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(&self, args: serde_json::Value, context: &CallContext) -> Result<ToolOutput, ToolError> {
        let args: TaskOutputArgs = parse_arguments("task_output", args)?;
        let id = task_id("task_output", args.task_id)?;
        let caller = context.caller.as_ref();
        let tools = &self.0;
        if args.wait {
            let timeout_ms =
                args.timeout_ms.unwrap_or(tools.config.wait_timeout_ms).min(tools.config.max_wait_timeout_ms);
            tools.registry.wait(&id, Duration::from_millis(timeout_ms), caller, Some(&context.cancel)).await?;
        }
        let read = tools.registry.read(&id, caller).await?;
        let body = if read.text.is_empty() { "(no new output)" } else { read.text.trim_end_matches('\n') };
        Ok(ToolOutput::ok(format!("{body}\n{}", read.snapshot.status_line())))
    }
}

#[async_trait::async_trait]
impl Tool for TaskList {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: "task_list".to_string(),
            description: "List your background tasks, one per line: id, [kind], status and label.".to_string(),
            input_schema: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        }
    }

    async fn call(&self, args: serde_json::Value, context: &CallContext) -> Result<ToolOutput, ToolError> {
        let TaskListArgs {} = parse_arguments("task_list", args)?;
        let caller = context.caller.as_ref();
        let tasks = self.0.registry.list(caller);
        let mut lines: Vec<String> =
            tasks.iter().map(|t| format!("{} [{}] {} — {}", t.id, t.kind, t.status, one_line(&t.label))).collect();
        if lines.is_empty() {
            lines.push("(no background tasks)".to_string());
        }
        match self.0.registry.dropped_from_history(caller) {
            0 => {}
            1 => lines.push("(1 older finished task was dropped from this list)".to_string()),
            n => lines.push(format!("({n} older finished tasks were dropped from this list)")),
        }
        Ok(ToolOutput::ok(lines.join("\n")))
    }
}

#[async_trait::async_trait]
impl Tool for TaskKill {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: "task_kill".to_string(),
            description: "Stop a background task that no longer matters. Returns at once; the task shows as stopping \
                          until it has stopped."
                .to_string(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "task_id": {"type": "string", "description": "The id of the task to stop."},
                    "reason": {"type": "string", "description": "Why the task is stopped (logged)."}
                },
                "required": ["task_id"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(&self, args: serde_json::Value, context: &CallContext) -> Result<ToolOutput, ToolError> {
        let args: TaskKillArgs = parse_arguments("task_kill", args)?;
        let id = task_id("task_kill", args.task_id)?;
        let text = match self.0.registry.kill(&id, context.caller.as_ref(), args.reason.as_deref()).await? {
            KillResult::Requested(_) => format!("requested cancellation of task {id}"),
            KillResult::AlreadyTerminal(snapshot) => {
                format!("task {id} had already finished {}", snapshot.status_line())
            }
        };
        Ok(ToolOutput::ok(text))
    }
}

#[async_trait::async_trait]
impl Tool for TaskInputTool {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: "task_input".to_string(),
            description: format!(
                "Send text to the input of a background task started with interactive: true (a program waiting at a \
                 prompt, a REPL, a command reading lines). The text is sent as is: end it with \\n to finish a line. \
                 close: true closes the task's input after the text (the program then reads end-of-file). At most {} \
                 bytes per call. Read what the task answers with task_output.",
                MAX_INPUT_BYTES
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "task_id": {"type": "string", "description": "The id of the interactive task."},
                    "text": {"type": "string", "description": "The text to send (may be empty with close: true)."},
                    "close": {"type": "boolean", "description": "Close the task's input after sending. Default false."}
                },
                "required": ["task_id"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(&self, args: serde_json::Value, context: &CallContext) -> Result<ToolOutput, ToolError> {
        let args: TaskInputArgs = parse_arguments("task_input", args)?;
        let id = task_id("task_input", args.task_id)?;
        if args.text.len() > MAX_INPUT_BYTES {
            return Err(ToolError::InvalidArguments {
                tool: "task_input".to_string(),
                message: format!(
                    "text is {} bytes; send at most {MAX_INPUT_BYTES} bytes per call (split it over several calls)",
                    args.text.len()
                ),
            });
        }
        if args.text.is_empty() && !args.close {
            return Err(ToolError::InvalidArguments {
                tool: "task_input".to_string(),
                message: "text is empty and close is false: nothing to do; pass text, close: true, or both".to_string(),
            });
        }
        self.0.registry.input(&id, context.caller.as_ref(), args.text.as_bytes(), args.close).await?;
        let closed = if args.close { " and closed its input" } else { "" };
        Ok(ToolOutput::ok(format!("sent {} bytes to task {id}{closed}", args.text.len())))
    }
}

/// Labels are one line in listings, whatever the producer gave.
fn one_line(label: &str) -> String {
    label.lines().map(str::trim_end).collect::<Vec<_>>().join(" ")
}
