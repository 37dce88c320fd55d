//! taskhost: a runtime for the background tasks of AI agents.
//!
//! The module tree is the architecture:
//! - [`ids`]: branded ids (`TaskId`, `SessionId`, `AgentId`).
//! - [`agents`]: live agents (task owners), their session logs and awaited disposal.
//! - [`tasks`]: the task registry: ids, owner fence, reads, kill, wait, settlement.
//! - [`capabilities`]: what the host grants plugins (processes), and how it confines them.
//! - [`notices`]: completion notices injected into the owner's session.
//! - [`panics`]: words for caught panics (every foreign-code boundary is contained).
//! - [`producer`]: the contract every kind of background work implements.
//! - [`capabilities`]: what plugins may reach beyond their sandbox (subagents).
//! - [`native`]: producers written in Rust, run in process.
//! - [`plugin`]: the WebAssembly plugin runtime: engine, loading, one store per task, drivers.
//! - [`reload`]: hot reload of wasm plugins (make-before-break) and file watching.
//! - [`tools`]: the model-facing tools (control tools, producer tools).
//! - [`prompt`]: the system-prompt section teaching the background-task habit.
//! - [`config`]: the configuration file.
//! - [`host`]: the facade that wires all of it together.
//! - [`builtin`]: the plugins built into the binary (embedded components).
//! - [`setup`]: a host from a configuration (which producers serve which tools).
//! - [`surfaces`]: the MCP server (`taskhost serve`).
//! - [`cli`]: the `taskhost` command line (`serve`, `dev`, `demo`).

pub mod agents;
pub mod builtin;
pub mod capabilities;
pub mod cli;
pub mod config;
pub mod host;
pub mod http_client;
pub mod ids;
pub mod native;
pub mod notices;
pub mod panics;
pub mod plugin;
pub mod producer;
pub mod prompt;
pub mod reload;
pub mod setup;
pub mod surfaces;
pub mod tasks;
pub mod tools;

pub use host::Host;

// The crates the public API speaks in, re-exported so an embedder uses the
// very versions taskhost was built with (`taskhost::tokio_util::sync::
// CancellationToken`, `#[taskhost::async_trait::async_trait]`, ...).
pub use {anyhow, async_trait, futures, serde_json, tokio, tokio_util};

/// What an embedder needs in one import: `use taskhost::prelude::*;`.
pub mod prelude {
    pub use crate::agents::{Agent, AgentRegistry, SessionMessage};
    pub use crate::config::TasksSettings;
    pub use crate::host::Host;
    pub use crate::ids::{AgentId, SessionId, TaskId};
    pub use crate::native::ticker::TickerProducer;
    pub use crate::producer::{Descriptor, PreparedRun, Producer, RunMode, runner};
    pub use crate::tasks::{
        KillResult, OutputSignal, ReadEndedTask, TaskControl, TaskError, TaskEvent, TaskHooks, TaskOutcome, TaskRead,
        TaskRegistry, TaskSnapshot, TaskStart, TaskStatus, TerminalStatus,
    };
    pub use crate::tools::producer_tool::ProducerToolOptions;
    pub use crate::tools::{CallContext, ToolDefinition, ToolError, ToolOutput};
    pub use async_trait::async_trait;
    pub use tokio_util::sync::CancellationToken;
}
