//! The producer contract: how a kind of background work plugs into taskhost.
//!
//! A [`Producer`] describes one model-facing tool (its kind, description and
//! argument schema) and prepares invocations of it. Two implementations
//! exist: native Rust producers ([`crate::native`]) and WebAssembly plugins
//! ([`crate::plugin`]); the tool adapter ([`crate::tools::producer_tool`])
//! treats them alike. Preparing never starts work: it validates what only the
//! producer can validate and computes the label. Starting happens in the
//! returned [`PreparedRun::run`], which the registry calls exactly once, after
//! its own preflight.

use std::sync::Arc;

use crate::tasks::{TaskHooks, TaskRunner};

/// What the model sees of a producer's tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Task kind and id prefix.
    pub kind: String,
    /// Model-facing tool description.
    pub description: String,
    /// JSON Schema of the arguments, without `run_in_background`.
    pub parameters: serde_json::Value,
    /// True: output is read as a consuming stream; false: final output only.
    pub streams_output: bool,
}

/// Whether a call waits for its task (foreground) or returns its id (background).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    Foreground,
    Background,
}

/// An invocation that passed the producer's own checks and is ready to start.
pub struct PreparedRun {
    /// The task's one-line model-facing label.
    pub label: String,
    /// Facts for hosts, not the model (the plugin version a wasm task runs on).
    pub producer_info: Option<String>,
    /// Starts the work. Dropping a `PreparedRun` without calling it starts nothing.
    pub run: TaskRunner,
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
}

/// Wraps a future that starts work into a [`TaskRunner`].
pub fn runner<F>(start: F) -> TaskRunner
where
    F: std::future::Future<Output = anyhow::Result<TaskHooks>> + Send + 'static,
{
    Box::new(move || Box::pin(start))
}
