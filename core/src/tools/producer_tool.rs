//! The tool adapter: one model-facing tool per producer instance.
//!
//! `run_in_background` belongs to the host, not the producer: the adapter
//! adds it to the schema when the instance allows background runs, omits it
//! otherwise, and refuses a forced `run_in_background: true` on a disabled
//! instance (the omission advertises; the refusal enforces). Arguments are
//! validated against the producer's JSON Schema before anything is prepared,
//! after [`Producer::ready`] (a producer still loading is waited for, and is
//! checked against its real schema, not one it was listed with from a cache).
//! Background calls go through the registry and return a task id; foreground
//! calls run the task directly, bounded by the instance's timeout and the
//! caller's cancellation, and return its output with the status line.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use serde_json::{Value, json};

use super::{CallContext, Tool, ToolDefinition, ToolError, ToolOutput, json_kind};
use crate::ids::TaskId;
use crate::panics::panic_message;
use crate::producer::{Descriptor, Producer, RunMode};
use crate::tasks::{
    NotifyOn, ReadEndedTask, TTL_MS_RANGE, TaskControl, TaskHooks, TaskInput, TaskOptions, TaskOutcome, TaskRegistry,
    TaskSnapshot, TaskStart, TaskStatus, TerminalStatus, seconds,
};

/// The host's flag on producer tools.
pub const RUN_IN_BACKGROUND: &str = "run_in_background";

/// The host's flag asking a background task to keep its input open
/// (offered on kinds whose descriptor `takes_input`).
pub const INTERACTIVE: &str = "interactive";

/// The host's milestone option on background starts of stream kinds.
pub const NOTIFY_ON: &str = "notify_on";

/// The host's time-to-live option on background starts.
pub const TTL_MS: &str = "ttl_ms";

/// The longest `notify_on.pattern`, in bytes.
pub const MAX_PATTERN_BYTES: usize = 1024;

/// The most memory a compiled `notify_on.pattern` may take.
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// Bounds of `notify_on.stalled_ms`.
pub const STALLED_MS_RANGE: std::ops::RangeInclusive<u64> = 100..=86_400_000;

/// How long a foreground call may run, unless the instance says otherwise.
pub const DEFAULT_FOREGROUND_TIMEOUT_MS: u64 = 600_000;

/// When a foreground call still running moves to the background, unless the
/// instance says otherwise (`promote_after_ms`; 0 disables).
pub const DEFAULT_PROMOTE_AFTER_MS: u64 = 30_000;

/// Per-instance settings of a producer tool.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ProducerToolOptions {
    /// The model-facing tool name.
    pub name: String,
    /// Offer `run_in_background`.
    pub background: bool,
    /// A foreground call is cancelled when it runs longer than this.
    pub foreground_timeout: Duration,
    /// A foreground call still running after this long becomes a background
    /// task of the caller (when its cap has room) and the call returns the
    /// output so far. `None`: never; only meaningful with `background`.
    pub promote_after: Option<Duration>,
}

impl ProducerToolOptions {
    /// `name` with background runs offered, the default foreground timeout
    /// and promotion delay.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            background: true,
            foreground_timeout: Duration::from_millis(DEFAULT_FOREGROUND_TIMEOUT_MS),
            promote_after: Some(Duration::from_millis(DEFAULT_PROMOTE_AFTER_MS)),
        }
    }

    pub fn with_background(mut self, background: bool) -> Self {
        self.background = background;
        self
    }

    pub fn with_foreground_timeout(mut self, timeout: Duration) -> Self {
        self.foreground_timeout = timeout;
        self
    }

    pub fn with_promote_after(mut self, after: Option<Duration>) -> Self {
        self.promote_after = after;
        self
    }
}

/// A producer served as a tool.
pub struct ProducerTool {
    producer: Arc<dyn Producer>,
    options: ProducerToolOptions,
    registry: TaskRegistry,
    /// The validator of the last descriptor seen; rebuilt when a reload
    /// changes the descriptor.
    validator: Mutex<Option<(Arc<Descriptor>, Arc<jsonschema::Validator>)>>,
}

impl ProducerTool {
    pub fn new(producer: Arc<dyn Producer>, options: ProducerToolOptions, registry: TaskRegistry) -> Self {
        Self { producer, options, registry, validator: Mutex::new(None) }
    }

    pub fn producer(&self) -> &Arc<dyn Producer> {
        &self.producer
    }

    fn validator(&self, descriptor: &Arc<Descriptor>) -> Result<Arc<jsonschema::Validator>, ToolError> {
        let mut cached = self.validator.lock().expect("validator cache poisoned");
        if let Some((seen, validator)) = cached.as_ref()
            && (Arc::ptr_eq(seen, descriptor) || **seen == **descriptor)
        {
            return Ok(validator.clone());
        }
        let validator =
            Arc::new(jsonschema::validator_for(&descriptor.parameters).map_err(|error| ToolError::Failed {
                tool: self.options.name.clone(),
                message: format!("the producer's argument schema is not a valid JSON Schema: {error}"),
            })?);
        *cached = Some((descriptor.clone(), validator.clone()));
        Ok(validator)
    }

    /// The host's own options of a start (`interactive`, `notify_on`),
    /// taken out of the arguments before the producer's schema sees them.
    fn task_options(
        &self,
        descriptor: &Descriptor,
        background: bool,
        interactive: Option<Value>,
        notify_on: Option<Value>,
        ttl_ms: Option<Value>,
    ) -> Result<TaskOptions, ToolError> {
        let interactive = match interactive {
            None => false,
            Some(Value::Bool(flag)) => flag,
            Some(other) => {
                return Err(self.invalid(format!("{INTERACTIVE} must be a boolean, got {}", json_kind(&other))));
            }
        };
        let name = &self.options.name;
        if interactive && !descriptor.takes_input {
            return Err(self.invalid(format!("the {name} tool's tasks take no input; call it without {INTERACTIVE}")));
        }
        if interactive && !background {
            return Err(self.invalid(format!(
                "{INTERACTIVE} needs {RUN_IN_BACKGROUND}: true (a foreground call cannot be sent input); add it, or drop {INTERACTIVE}"
            )));
        }
        let notify_on = match notify_on {
            None | Some(Value::Null) => None,
            Some(value) => {
                if !descriptor.streams_output {
                    return Err(self.invalid(format!(
                        "the {name} tool's tasks have a final result, not streamed output; call it without {NOTIFY_ON}"
                    )));
                }
                if !background {
                    return Err(self
                        .invalid(format!("{NOTIFY_ON} needs {RUN_IN_BACKGROUND}: true; add it, or drop {NOTIFY_ON}")));
                }
                Some(self.parse_notify_on(value)?)
            }
        };
        let input = match (descriptor.takes_input, interactive) {
            (false, _) => TaskInput::Unsupported,
            (true, false) => TaskInput::NotRequested,
            (true, true) => TaskInput::Open,
        };
        let ttl = match ttl_ms {
            None | Some(Value::Null) => None,
            Some(value) => {
                if !background {
                    return Err(
                        self.invalid(format!("{TTL_MS} needs {RUN_IN_BACKGROUND}: true; add it, or drop {TTL_MS}"))
                    );
                }
                match value.as_u64().filter(|ms| TTL_MS_RANGE.contains(ms)) {
                    Some(ms) => Some(Duration::from_millis(ms)),
                    None => {
                        return Err(self.invalid(format!(
                            "{TTL_MS} must be an integer from {} to {} (milliseconds), got {value}",
                            TTL_MS_RANGE.start(),
                            TTL_MS_RANGE.end()
                        )));
                    }
                }
            }
        };
        Ok(TaskOptions::default().with_input(input).with_notify_on(notify_on).with_ttl(ttl))
    }

    fn parse_notify_on(&self, value: Value) -> Result<NotifyOn, ToolError> {
        let Value::Object(fields) = value else {
            return Err(self.invalid(format!(
                "{NOTIFY_ON} must be an object like {{\"pattern\": \"ready\", \"stalled_ms\": 30000}}, got {}",
                json_kind(&value)
            )));
        };
        let mut notify_on = NotifyOn::default();
        for (field, value) in fields {
            match (field.as_str(), value) {
                ("pattern", Value::String(pattern)) => {
                    if pattern.len() > MAX_PATTERN_BYTES {
                        return Err(self.invalid(format!(
                            "{NOTIFY_ON}.pattern is {} bytes; the limit is {MAX_PATTERN_BYTES}",
                            pattern.len()
                        )));
                    }
                    let regex = regex::RegexBuilder::new(&pattern)
                        .size_limit(PATTERN_SIZE_LIMIT)
                        .build()
                        .map_err(|error| self.invalid(format!("{NOTIFY_ON}.pattern is not a valid regex: {error}")))?;
                    notify_on.pattern = Some(regex);
                }
                ("stalled_ms", Value::Number(number)) => {
                    let ms = number.as_u64().filter(|ms| STALLED_MS_RANGE.contains(ms)).ok_or_else(|| {
                        self.invalid(format!(
                            "{NOTIFY_ON}.stalled_ms must be an integer from {} to {}, got {number}",
                            STALLED_MS_RANGE.start(),
                            STALLED_MS_RANGE.end()
                        ))
                    })?;
                    notify_on.stalled = Some(Duration::from_millis(ms));
                }
                ("pattern", other) => {
                    return Err(
                        self.invalid(format!("{NOTIFY_ON}.pattern must be a string, got {}", json_kind(&other)))
                    );
                }
                ("stalled_ms", other) => {
                    return Err(
                        self.invalid(format!("{NOTIFY_ON}.stalled_ms must be an integer, got {}", json_kind(&other)))
                    );
                }
                (other, _) => {
                    return Err(self.invalid(format!(
                        "{NOTIFY_ON} has an unknown field {other:?}; it takes pattern and stalled_ms"
                    )));
                }
            }
        }
        if notify_on.pattern.is_none() && notify_on.stalled.is_none() {
            return Err(self.invalid(format!("{NOTIFY_ON} needs pattern, stalled_ms or both")));
        }
        Ok(notify_on)
    }

    fn invalid(&self, message: impl Into<String>) -> ToolError {
        ToolError::InvalidArguments { tool: self.options.name.clone(), message: message.into() }
    }

    async fn run_foreground(
        &self,
        prepared: crate::producer::PreparedRun,
        kind: &str,
        context: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let name = &self.options.name;
        let crate::producer::PreparedRun { label, producer_info, run } = prepared;
        let prepared = crate::producer::PreparedRun::new(label.clone(), run).with_producer_info(producer_info.clone());
        // A foreground run is contained like a background one: a panic in
        // the producer fails the call (or the task), never the caller.
        let hooks = crate::panics::contained((prepared.run)())
            .await
            .map_err(|error| ToolError::Failed { tool: name.clone(), message: format!("{error:#}") })?;
        let control = hooks.control;
        let mut done = AssertUnwindSafe(hooks.done)
            .catch_unwind()
            .map(|finished| {
                finished.unwrap_or_else(|panic| {
                    Ok(TaskOutcome::failed(format!("producer panicked: {}", panic_message(panic))))
                })
            })
            .boxed();
        let timeout = tokio::time::sleep(self.options.foreground_timeout);
        tokio::pin!(timeout);
        let promote_after = self.options.promote_after.filter(|_| self.options.background);
        let mut promotion = promote_after.map(|after| Box::pin(tokio::time::sleep(after)));
        let stopped_because = loop {
            tokio::select! {
                outcome = &mut done => return Ok(foreground_result(&*control, outcome, None).await),
                _ = &mut timeout => {
                    break format!("timed out after {} ms", self.options.foreground_timeout.as_millis());
                }
                _ = context.cancel.cancelled() => break "the call was cancelled".to_string(),
                _ = async { promotion.as_mut().expect("guarded").await }, if promotion.is_some() => {
                    promotion = None;
                    let hooks = TaskHooks::new(control.clone(), done);
                    let start = TaskStart::new(kind.to_string(), label.clone(), Box::new(|| Box::pin(async { unreachable!("an adopted task is already running") }))).with_owner(context.caller.clone()).with_producer_info(producer_info.clone());
                    match self.registry.adopt(start, hooks) {
                        Ok(id) => {
                            let after = promote_after.expect("promotion was armed");
                            return self.promoted(&id, after, context).await;
                        }
                        // The cap is full (or the registry refuses): stay in
                        // the foreground until the call's own timeout.
                        Err((error, hooks)) => {
                            tracing::debug!(tool = %name, %error, "a long foreground call stays in the foreground");
                            done = hooks.done;
                        }
                    }
                }
            }
        };
        tracing::info!(tool = %name, reason = %stopped_because, "stopping a foreground task");
        let cancelled = crate::panics::contained(control.cancel(Some(&stopped_because))).await;
        if let Err(error) = cancelled {
            control.abandon();
            return Err(ToolError::Failed {
                tool: name.clone(),
                message: format!("{stopped_because}, and cancelling it failed: {error:#}"),
            });
        }
        // A cancelled task must settle; bound the wait anyway so a broken
        // producer cannot hold the call forever.
        match tokio::time::timeout(self.registry.config().teardown_timeout.unwrap_or(Duration::MAX), done).await {
            Ok(outcome) => Ok(foreground_result(&*control, outcome, Some(&stopped_because)).await),
            Err(_) => {
                control.abandon();
                Err(ToolError::Failed {
                    tool: name.clone(),
                    message: format!("{stopped_because}, and the task did not stop after cancellation"),
                })
            }
        }
    }
}

impl ProducerTool {
    /// The answer of a foreground call that moved to the background as task
    /// `id`: the output so far (consumed), then the promotion line.
    async fn promoted(&self, id: &TaskId, after: Duration, context: &CallContext) -> Result<ToolOutput, ToolError> {
        tracing::info!(tool = %self.options.name, task = %id, "a long foreground call moved to the background");
        let read = self.registry.read(id, context.caller.as_ref()).await?;
        let body = read.text.trim_end_matches('\n');
        if read.snapshot.status.is_terminal() {
            // It finished in between: answer as the foreground call would.
            let body = if body.is_empty() { "(no output)" } else { body };
            let is_error = read.snapshot.status != TaskStatus::Completed;
            return Ok(ToolOutput {
                text: format!("{body}\n{}", read.snapshot.status_line()),
                is_error,
                started: None,
            });
        }
        let line = format!(
            "[still running after {} s: moved to the background as task {id}. Read the rest with task_output.]",
            crate::tasks::seconds(after)
        );
        // The task is the caller's now: its id as data, as a background start's.
        Ok(ToolOutput::started(if body.is_empty() { line } else { format!("{body}\n{line}") }, id.clone()))
    }
}

/// The foreground result: everything the task produced, then its status line.
async fn foreground_result(
    control: &dyn TaskControl,
    outcome: anyhow::Result<TaskOutcome>,
    stopped_because: Option<&str>,
) -> ToolOutput {
    let outcome = outcome.unwrap_or_else(|error| TaskOutcome::failed(format!("producer error: {error:#}")));
    let mut text = String::new();
    if control.streams_output() {
        match crate::panics::contained(control.read_output()).await {
            Ok(output) => text.push_str(&output),
            Err(error) => match error.downcast::<ReadEndedTask>() {
                Ok(ended) => text.push_str(&ended.text),
                Err(error) => text.push_str(&format!("[reading the output failed: {error:#}]\n")),
            },
        }
    }
    if let Some(output) = &outcome.output {
        text.push_str(output);
    }
    let mut detail = outcome.detail.clone();
    if let Some(reason) = stopped_because {
        detail = Some(match detail {
            Some(detail) => format!("{detail}, {reason}"),
            None => reason.to_string(),
        });
    }
    let status = TaskStatus::from(outcome.status);
    let status_line = TaskSnapshot::status_line_of(status, detail.as_deref());
    let body = if text.is_empty() { "(no output)" } else { text.trim_end_matches('\n') };
    ToolOutput {
        text: format!("{body}\n{status_line}"),
        is_error: outcome.status != TerminalStatus::Completed,
        started: None,
    }
}

#[async_trait::async_trait]
impl Tool for ProducerTool {
    fn definition(&self) -> ToolDefinition {
        let descriptor = self.producer.descriptor();
        let mut schema = descriptor.parameters.clone();
        if self.options.background
            && let Some(properties) =
                schema.as_object_mut().and_then(|s| s.entry("properties").or_insert_with(|| json!({})).as_object_mut())
        {
            properties.insert(
                RUN_IN_BACKGROUND.to_string(),
                json!({
                    "type": "boolean",
                    "description": "Run in the background: the call returns a task id at once. Collect the output \
                                    later with task_output and stop the task with task_kill. Default false."
                }),
            );
            let config = self.registry.config();
            let default_ttl = match config.default_ttl {
                Some(ttl) => format!("{} s (this server's default)", seconds(ttl)),
                None => "none".to_string(),
            };
            let default_ttl = match config.stable_owner_ttl {
                Some(ttl) if config.stable_owner_ttl != config.default_ttl => {
                    format!("{default_ttl}; {} s for a task of a stable owner (one that reconnects)", seconds(ttl))
                }
                _ => default_ttl,
            };
            properties.insert(
                TTL_MS.to_string(),
                json!({
                    "type": "integer",
                    "minimum": TTL_MS_RANGE.start(),
                    "maximum": TTL_MS_RANGE.end(),
                    "description": format!(
                        "With run_in_background: stop the task when you have not read it (task_output, any view, a \
                         wait) for this many milliseconds; a notice comes first, and each read renews it. \
                         Default: {default_ttl}."
                    )
                }),
            );
            if descriptor.takes_input {
                properties.insert(
                    INTERACTIVE.to_string(),
                    json!({
                        "type": "boolean",
                        "description": "With run_in_background: keep the task's input open, so task_input can send \
                                        it text (a program that prompts or reads commands). Default false: its \
                                        input is empty, and a read of it gets end-of-file at once."
                    }),
                );
            }
            if descriptor.streams_output {
                properties.insert(
                    NOTIFY_ON.to_string(),
                    json!({
                        "type": "object",
                        "description": "With run_in_background: tell me while the task runs, without reading its \
                                        output. pattern: a regex; the first output line matching it brings a \
                                        notice (again after each task_output of the task). stalled_ms: a notice \
                                        when the task printed nothing for this long (once per stall).",
                        "properties": {
                            "pattern": {"type": "string", "maxLength": MAX_PATTERN_BYTES},
                            "stalled_ms": {
                                "type": "integer",
                                "minimum": STALLED_MS_RANGE.start(),
                                "maximum": STALLED_MS_RANGE.end()
                            }
                        },
                        "additionalProperties": false
                    }),
                );
            }
        }
        ToolDefinition {
            name: self.options.name.clone(),
            description: descriptor.description.clone(),
            input_schema: schema,
        }
    }

    async fn call(&self, args: Value, context: &CallContext) -> Result<ToolOutput, ToolError> {
        let mut args = if args.is_null() { json!({}) } else { args };
        let Some(object) = args.as_object_mut() else {
            return Err(self.invalid(format!("expected a JSON object, got {}", json_kind(&args))));
        };
        let background = match object.remove(RUN_IN_BACKGROUND) {
            None => false,
            Some(Value::Bool(flag)) => flag,
            Some(other) => {
                return Err(self.invalid(format!("{RUN_IN_BACKGROUND} must be a boolean, got {}", json_kind(&other))));
            }
        };
        if background && !self.options.background {
            return Err(self.invalid(format!(
                "{RUN_IN_BACKGROUND} is disabled for the {} tool in this deployment; call it without {RUN_IN_BACKGROUND}",
                self.options.name
            )));
        }
        self.producer
            .ready()
            .await
            .map_err(|error| ToolError::Failed { tool: self.options.name.clone(), message: format!("{error:#}") })?;
        let descriptor = self.producer.descriptor();
        let interactive = object.remove(INTERACTIVE);
        let notify_on = object.remove(NOTIFY_ON);
        let ttl_ms = object.remove(TTL_MS);
        let options = self.task_options(&descriptor, background, interactive, notify_on, ttl_ms)?;
        let validator = self.validator(&descriptor)?;
        let problems: Vec<String> = validator
            .iter_errors(&args)
            .map(|error| {
                let at = error.instance_path().to_string();
                if at.is_empty() { error.to_string() } else { format!("at {at}: {error}") }
            })
            .collect();
        if !problems.is_empty() {
            return Err(self.invalid(problems.join("; ")));
        }

        let mode = match (background, options.input) {
            (false, _) => RunMode::Foreground,
            (true, TaskInput::Open) => RunMode::Interactive,
            (true, _) => RunMode::Background,
        };
        if background && context.cancel.is_cancelled() {
            return Err(ToolError::Cancelled(self.options.name.clone()));
        }
        // The caller's session owns the spill files of the run's processes.
        let owner = context.caller.as_ref().map(|agent| agent.session().to_string()).unwrap_or_default();
        let stable = context.caller.as_ref().is_some_and(crate::agents::Agent::is_durable);
        let prepared = crate::panics::contained(crate::producer::prepare_for_owner(
            owner,
            stable,
            self.producer.prepare(args, mode),
        ))
        .await
        .map_err(|error| ToolError::Failed { tool: self.options.name.clone(), message: format!("{error:#}") })?;
        if !background {
            return self.run_foreground(prepared, &descriptor.kind, context).await;
        }
        // After the id is returned the call's cancellation is no longer wired
        // to the task: only task_kill and owner disposal stop it.
        let id = self
            .registry
            .start(
                TaskStart::new(descriptor.kind.clone(), prepared.label, prepared.run)
                    .with_owner(context.caller.clone())
                    .with_producer_info(prepared.producer_info)
                    .with_options(options),
            )
            .await?;
        let reply = self.producer.start_reply(&descriptor, &id);
        Ok(ToolOutput::started(reply, id))
    }
}
