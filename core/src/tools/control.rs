//! The kind-agnostic control tools: `task_output`, `task_list`, `task_kill`,
//! `task_input` (and `task_wait`).
//!
//! They are the registry's control surface: constructing [`ControlTools`]
//! attaches the surface fence and starts completion notices; dropping it
//! detaches both. Their texts are the behaviour contract's (README,
//! "Model-facing texts"), kept exact so transcripts compare.
//!
//! A call whose cancellation fired has its answer dropped (an MCP client
//! drops the answer to a request it cancelled), so a cancelled wait
//! (`task_output` with `wait`, `task_wait`) never reports an end: it fails,
//! and the completion notice stays due ([`AbortedWait::Fail`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use serde_json::json;

use super::{CallContext, Tool, ToolDefinition, ToolError, ToolOutput, Toolbox, parse_arguments};
use crate::ids::TaskId;
use crate::notices::deliver_completion_notices;
use crate::tasks::{
    AbortedWait, DEFAULT_VIEW_LINES, KillResult, ListenerGuard, MAX_VIEW_LINES, SurfaceGuard, TaskRegistry,
    TaskSnapshot, VIEW_LIMIT, ViewKind, ViewRequest,
};

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

/// Why a [`ControlToolsConfig`] is refused; the message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlToolsConfigError {
    #[error(
        "wait_timeout_ms ({wait_timeout_ms}) is larger than max_wait_timeout_ms ({max_wait_timeout_ms}); lower it or raise the cap"
    )]
    WaitOverCap { wait_timeout_ms: u64, max_wait_timeout_ms: u64 },
}

impl ControlToolsConfig {
    /// Rejects a default wait longer than the cap.
    pub fn validate(&self) -> Result<(), ControlToolsConfigError> {
        if self.wait_timeout_ms > self.max_wait_timeout_ms {
            return Err(ControlToolsConfigError::WaitOverCap {
                wait_timeout_ms: self.wait_timeout_ms,
                max_wait_timeout_ms: self.max_wait_timeout_ms,
            });
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
    pub fn attach(registry: &TaskRegistry, config: ControlToolsConfig) -> Result<Arc<Self>, ControlToolsConfigError> {
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
        toolbox.insert_control(Arc::new(TaskWait(self.clone())));
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
    view: Option<String>,
    lines: Option<u64>,
    grep: Option<String>,
    from: Option<u64>,
    to: Option<u64>,
}

/// The longest `grep` pattern, in bytes.
pub const MAX_GREP_BYTES: usize = 1024;

/// `task_wait` takes 1 to this many ids.
pub const MAX_WAIT_IDS: usize = 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskWaitArgs {
    task_ids: Vec<String>,
    timeout_ms: Option<u64>,
}

struct TaskWait(Arc<ControlTools>);

fn invalid(tool: &str, message: impl Into<String>) -> ToolError {
    ToolError::InvalidArguments { tool: tool.to_string(), message: message.into() }
}

/// The view a `task_output` call asks for, or `None` for the consuming read.
fn view_request(args: &TaskOutputArgs) -> Result<Option<ViewRequest>, ToolError> {
    if args.view.as_deref() == Some("lines") {
        return lines_request(args).map(Some);
    }
    if args.from.is_some() || args.to.is_some() {
        return Err(invalid("task_output", "from and to work with view \"lines\"; add it, or drop them"));
    }
    let kind = match (args.view.as_deref(), &args.grep) {
        (None | Some("new"), None) => {
            if args.lines.is_some() {
                return Err(invalid(
                    "task_output",
                    "lines works with view \"tail\", \"head\" or \"all\"; add a view, or drop lines",
                ));
            }
            return Ok(None);
        }
        (Some("new"), Some(_)) => {
            return Err(invalid(
                "task_output",
                "grep works with view \"tail\", \"head\" or \"all\" (views never consume); drop view \"new\"",
            ));
        }
        // A grep alone searches everything kept.
        (None, Some(_)) | (Some("all"), _) => ViewKind::All,
        (Some("tail"), _) => ViewKind::Tail,
        (Some("head"), _) => ViewKind::Head,
        (Some(other), _) => {
            return Err(invalid(
                "task_output",
                format!("unknown view {other:?}; use \"new\" (the default), \"tail\", \"head\", \"all\" or \"lines\""),
            ));
        }
    };
    let lines = match args.lines {
        None => DEFAULT_VIEW_LINES,
        Some(0) => return Err(invalid("task_output", "lines must be at least 1")),
        Some(n) => (n as usize).min(MAX_VIEW_LINES),
    };
    let grep = match &args.grep {
        None => None,
        Some(pattern) if pattern.len() > MAX_GREP_BYTES => {
            return Err(invalid(
                "task_output",
                format!("grep is {} bytes; the limit is {MAX_GREP_BYTES}", pattern.len()),
            ));
        }
        Some(pattern) => Some(
            regex::RegexBuilder::new(pattern)
                .size_limit(1 << 20)
                .build()
                .map_err(|error| invalid("task_output", format!("grep is not a valid regex: {error}")))?,
        ),
    };
    Ok(Some(ViewRequest { kind, lines, grep }))
}

/// `view: "lines"`: `from` (required) to `to` (default: as far as the view
/// holds), exactly as printed.
fn lines_request(args: &TaskOutputArgs) -> Result<ViewRequest, ToolError> {
    if args.lines.is_some() || args.grep.is_some() {
        return Err(invalid(
            "task_output",
            "view \"lines\" takes from and to (line numbers), not lines or grep; drop them",
        ));
    }
    let from = match args.from {
        None => {
            return Err(invalid("task_output", "view \"lines\" needs from: the first line to show (1 is the first)"));
        }
        Some(0) => return Err(invalid("task_output", "from must be at least 1 (line numbers start at 1)")),
        Some(from) => from,
    };
    let to = args.to.unwrap_or(u64::MAX);
    if to < from {
        return Err(invalid("task_output", format!("to ({to}) is before from ({from}); lines run from, to")));
    }
    Ok(ViewRequest { kind: ViewKind::Lines { from, to }, lines: 0, grep: None })
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
                 since your previous read, at most {} KiB: when more is new, it returns the latest and a first line \
                 [<n> bytes of output skipped here (lines <a>-<b>); …] that says how to read the rest: view \"lines\" \
                 with from <a> and to <b>, or the full output file it names, which your own commands can read. \
                 A read that begins inside stderr starts with [stderr]. For tasks with a final result (subagents) it \
                 returns the result once the task finished. The last line is the task's status, e.g. [status: running] or \
                 [status: completed, exit code: 0]. Non-blocking by default; pass wait: true to block until the task \
                 finishes or timeout_ms passes (default {} ms, at most {} ms). A timed-out wait leaves the task running. \
                 To look without consuming, pass view: \"tail\" or \"head\" (the last or first lines, default {}, at \
                 most {}), \"all\" (everything kept), or \"lines\" with from (and to): those lines exactly as printed \
                 (numbered from 1); each view returns at most {} KiB and says where to continue. tail, head and all take \
                 grep: a regex that keeps only matching lines, each prefixed with its line number. A view works on \
                 running and finished tasks and never changes what the next plain read returns.",
                self.0.registry.config().output.read_bytes / 1024,
                self.0.config.wait_timeout_ms,
                self.0.config.max_wait_timeout_ms,
                DEFAULT_VIEW_LINES,
                MAX_VIEW_LINES,
                VIEW_LIMIT / 1024
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "task_id": {"type": "string", "description": "The id of the task, as returned when it started."},
                    "wait": {"type": "boolean", "description": "Block until the task finishes or the timeout passes. Default false."},
                    "timeout_ms": {"type": "integer", "minimum": 0, "description": "How long wait may block, in milliseconds."},
                    "view": {
                        "type": "string",
                        "enum": ["new", "tail", "head", "all", "lines"],
                        "description": "new (default): what is new since your previous read, consumed. tail, head, all, lines: a view that consumes nothing."
                    },
                    "lines": {"type": "integer", "minimum": 1, "description": "Lines of a tail or head view (default 40)."},
                    "grep": {"type": "string", "description": "A regex: the view keeps only matching lines, numbered. Alone it searches everything kept."},
                    "from": {"type": "integer", "minimum": 1, "description": "view \"lines\": the first line to show (1 is the first line the task printed)."},
                    "to": {"type": "integer", "minimum": 1, "description": "view \"lines\": the last line to show (default: as many as the view holds)."}
                },
                "required": ["task_id"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(&self, args: serde_json::Value, context: &CallContext) -> Result<ToolOutput, ToolError> {
        let args: TaskOutputArgs = parse_arguments("task_output", args)?;
        let view = view_request(&args)?;
        let id = task_id("task_output", args.task_id)?;
        let caller = context.caller.as_ref();
        let tools = &self.0;
        if args.wait {
            let timeout_ms =
                args.timeout_ms.unwrap_or(tools.config.wait_timeout_ms).min(tools.config.max_wait_timeout_ms);
            // A cancelled call's answer is dropped (an MCP client drops the
            // answer to a request it cancelled): its wait never reports.
            let timeout = Duration::from_millis(timeout_ms);
            tools.registry.wait_with(&id, timeout, caller, Some(&context.cancel), AbortedWait::Fail).await?;
        }
        if let Some(view) = view {
            let (text, snapshot) = tools.registry.view(&id, caller, &view).await?;
            return Ok(ToolOutput::ok(format!("{text}\n{}", snapshot.status_line())));
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
        let mut lines: Vec<String> = tasks.iter().map(list_row).collect();
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
        let killed = self.0.registry.kill(&id, context.caller.as_ref(), args.reason.as_deref()).await?;
        Ok(ToolOutput::ok(kill_reply(&id, &killed)))
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

#[async_trait::async_trait]
impl Tool for TaskWait {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: "task_wait".to_string(),
            description: format!(
                "Wait until at least one of several background tasks finished, or the timeout passed (default {} ms, at \
                 most {} ms). The first line says which finished first (or that none did), then one line per task as \
                 task_list shows it. Consumes no output: read it with task_output.",
                self.0.config.wait_timeout_ms, self.0.config.max_wait_timeout_ms
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "task_ids": {
                        "type": "array",
                        "items": {"type": "string"},
                        "minItems": 1,
                        "maxItems": MAX_WAIT_IDS,
                        "description": "The ids of the tasks to wait for."
                    },
                    "timeout_ms": {"type": "integer", "minimum": 0, "description": "How long to wait at most, in milliseconds."}
                },
                "required": ["task_ids"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(&self, args: serde_json::Value, context: &CallContext) -> Result<ToolOutput, ToolError> {
        let args: TaskWaitArgs = parse_arguments("task_wait", args)?;
        if args.task_ids.is_empty() || args.task_ids.len() > MAX_WAIT_IDS {
            return Err(invalid(
                "task_wait",
                format!("task_ids must hold 1 to {MAX_WAIT_IDS} ids, got {}", args.task_ids.len()),
            ));
        }
        let mut ids: Vec<TaskId> = Vec::with_capacity(args.task_ids.len());
        for raw in args.task_ids {
            let id = task_id("task_wait", raw)?;
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let config = &self.0.config;
        let timeout_ms = args.timeout_ms.unwrap_or(config.wait_timeout_ms).min(config.max_wait_timeout_ms);
        let caller = context.caller.as_ref();
        let timeout = Duration::from_millis(timeout_ms);
        let (first, tasks) =
            self.0.registry.wait_any_with(&ids, timeout, caller, Some(&context.cancel), AbortedWait::Fail).await?;
        let mut lines = vec![match first {
            Some(id) => format!("{id} finished first"),
            None => format!("none finished within {timeout_ms} ms"),
        }];
        lines.extend(tasks.iter().map(list_row));
        Ok(ToolOutput::ok(lines.join("\n")))
    }
}

/// `task_kill`'s answer: `requested cancellation of task <id>`, or `task
/// <id> had already finished [status: …]`. Other stops (the dashboard's)
/// answer the same.
pub fn kill_reply(id: &TaskId, result: &KillResult) -> String {
    match result {
        KillResult::Requested(_) => format!("requested cancellation of task {id}"),
        KillResult::AlreadyTerminal(snapshot) => format!("task {id} had already finished {}", snapshot.status_line()),
    }
}

/// One task as `task_list` shows it.
fn list_row(task: &TaskSnapshot) -> String {
    let expiry = match task.expires_at.map(|at| at.duration_since(SystemTime::now()).unwrap_or_default()) {
        Some(left) => format!(" (stopped in {} unless read)", time_left(left)),
        None => String::new(),
    };
    format!("{} [{}] {} — {}{expiry}", task.id, task.kind, task.status, one_line(&task.label))
}

/// A time left as people read it: `42 s`, `4 min 10 s`, `23 h 59 min`.
fn time_left(left: Duration) -> String {
    let secs = left.as_secs_f64().ceil() as u64;
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min {} s", secs / 60, secs % 60),
        _ => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
    }
}

/// Labels are one line in listings, whatever the producer gave.
fn one_line(label: &str) -> String {
    label.lines().map(str::trim_end).collect::<Vec<_>>().join(" ")
}
