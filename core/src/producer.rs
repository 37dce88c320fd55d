//! The producer contract: how a kind of background work plugs into taskhost.
//!
//! A [`Producer`] describes one model-facing tool (its kind, description and
//! argument schema) and prepares invocations of it. Two implementations
//! exist: native Rust producers ([`crate::native`]) and WebAssembly plugins
//! (`taskhost::plugin`); the tool adapter ([`crate::tools::producer_tool`])
//! treats them alike. Preparing never starts work: it validates what only the
//! producer can validate and computes the label. Starting happens in the
//! returned [`PreparedRun::run`], which the registry calls exactly once, after
//! its own preflight.

use std::sync::Arc;

use crate::ids::TaskId;
use crate::tasks::{TaskHooks, TaskRunner};

/// What the model sees of a producer's tool.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Descriptor {
    /// Task kind and id prefix.
    pub kind: String,
    /// Model-facing tool description.
    pub description: String,
    /// JSON Schema of the arguments, without `run_in_background`.
    pub parameters: serde_json::Value,
    /// True: output is read as a consuming stream; false: final output only.
    pub streams_output: bool,
    /// True: a task of this kind can take input while it runs
    /// ([`crate::tasks::TaskControl::write_input`]); the host then offers
    /// `interactive` on background starts and serves `task_input`.
    pub takes_input: bool,
}

impl Descriptor {
    /// A final-output kind that takes no input; see the `with_*` methods.
    pub fn new(kind: impl Into<String>, description: impl Into<String>, parameters: serde_json::Value) -> Self {
        Self {
            kind: kind.into(),
            description: description.into(),
            parameters,
            streams_output: false,
            takes_input: false,
        }
    }

    pub fn with_streams_output(mut self, streams_output: bool) -> Self {
        self.streams_output = streams_output;
        self
    }

    pub fn with_takes_input(mut self, takes_input: bool) -> Self {
        self.takes_input = takes_input;
        self
    }
}

/// Whether a call waits for its task (foreground) or returns its id (background).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    Foreground,
    Background,
    /// A background run that keeps its input open for `task_input` (asked
    /// with `interactive: true`; only for kinds whose descriptor
    /// `takes_input`). Without it a task's input is empty from the start.
    Interactive,
}

impl RunMode {
    /// The call returns a task id instead of waiting.
    pub fn is_background(self) -> bool {
        !matches!(self, Self::Foreground)
    }
}

/// An invocation that passed the producer's own checks and is ready to start.
#[non_exhaustive]
pub struct PreparedRun {
    /// The task's one-line model-facing label.
    pub label: String,
    /// Facts for hosts, not the model (the plugin version a wasm task runs on).
    pub producer_info: Option<String>,
    /// Starts the work. Dropping a `PreparedRun` without calling it starts nothing.
    pub run: TaskRunner,
}

impl PreparedRun {
    pub fn new(label: impl Into<String>, run: TaskRunner) -> Self {
        Self { label: label.into(), producer_info: None, run }
    }

    pub fn with_producer_info(mut self, producer_info: Option<String>) -> Self {
        self.producer_info = producer_info;
        self
    }
}

/// A kind of background work.
#[async_trait::async_trait]
pub trait Producer: Send + Sync + 'static {
    /// The current tool description. May change over the producer's life
    /// (a plugin reload can change the schema); callers must not cache it.
    fn descriptor(&self) -> Arc<Descriptor>;

    /// Prepares one invocation. `args` already passed the descriptor's JSON
    /// Schema and no longer holds `run_in_background`. An error refuses the
    /// call with a message for the model; nothing was started.
    async fn prepare(&self, args: serde_json::Value, mode: RunMode) -> anyhow::Result<PreparedRun>;

    /// Resolves once the producer can serve calls, or with why it cannot.
    /// A call awaits it before reading [`Self::descriptor`] and validating
    /// its arguments, so a producer still loading (whose descriptor may come
    /// from a cache) is checked against its real schema. Default: at once.
    async fn ready(&self) -> anyhow::Result<()> {
        Ok(())
    }

    /// The reply to a background start, for the model:
    /// `started background subagent task subagent-1` unless the producer
    /// words it otherwise. Text for the model only: the id travels as data
    /// in `ToolOutput::started`.
    fn start_reply(&self, descriptor: &Descriptor, id: &TaskId) -> String {
        format!("started background {} task {id}", descriptor.kind)
    }
}

tokio::task_local! {
    /// The owner session (its key) a [`Producer::prepare`] runs for, set by
    /// the tool adapter around every call. Producers that keep per-owner
    /// state (the process capability's private spill directory) read it with
    /// [`preparing_for`]; it is unset outside a tool call.
    static PREPARING_FOR: String;
    /// Whether the owner [`PREPARING_FOR`] names is stable (its tasks may
    /// outlive this process: see [`preparing_for_stable_owner`]).
    static PREPARING_FOR_STABLE: bool;
}

/// The owner session the current [`Producer::prepare`] runs for, if any.
pub fn preparing_for() -> Option<String> {
    PREPARING_FOR.try_with(Clone::clone).ok()
}

/// Whether the owner the current [`Producer::prepare`] runs for is stable
/// (an HTTP token, `serve --owner`): its tasks may outlive this process, so
/// a producer may make their work durable. False outside a tool call.
pub fn preparing_for_stable_owner() -> bool {
    PREPARING_FOR_STABLE.try_with(|stable| *stable).unwrap_or(false)
}

/// Runs `prepare` as a prepare for `owner` (see [`preparing_for`]), an
/// owner that is not stable.
pub async fn prepare_for<F: std::future::Future>(owner: String, prepare: F) -> F::Output {
    prepare_for_owner(owner, false, prepare).await
}

/// Runs `prepare` as a prepare for `owner`, stable or not (see
/// [`preparing_for_stable_owner`]).
pub async fn prepare_for_owner<F: std::future::Future>(owner: String, stable: bool, prepare: F) -> F::Output {
    PREPARING_FOR.scope(owner, PREPARING_FOR_STABLE.scope(stable, prepare)).await
}

/// Wraps a future that starts work into a [`TaskRunner`].
pub fn runner<F>(start: F) -> TaskRunner
where
    F: std::future::Future<Output = anyhow::Result<TaskHooks>> + Send + 'static,
{
    Box::new(move || Box::pin(start))
}
