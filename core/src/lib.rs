//! taskhost-core: the background-task registry and everything the model
//! touches, with no plugin runtime.
//!
//! An embedder who writes its producers in Rust needs only this crate: the
//! registry, owners, control tools, completion notices, the producer
//! contract and the [`Host`] facade. WebAssembly plugins, the process
//! capability, subagents, the MCP server and the CLI live in the `taskhost`
//! crate, which re-exports every module here under the same paths.
//!
//! The module tree is the architecture (dependencies point up this list):
//! - [`ids`]: branded ids (`TaskId`, `SessionId`, `AgentId`).
//! - [`panics`]: words for caught panics (every foreign-code boundary is contained).
//! - [`agents`]: live agents (task owners), their session logs and awaited disposal.
//! - [`tasks`]: the task registry: ids, owner fence, reads, kill, wait, settlement, events.
//! - [`notices`]: completion notices injected into the owner's session.
//! - [`producer`]: the contract every kind of background work implements.
//! - [`tools`]: the model-facing tools (control tools, the producer tool adapter).
//! - [`prompt`]: the system-prompt section teaching the background-task habit.
//! - [`settings`]: `[tasks]`, the registry's and control tools' settings.
//! - [`host`]: the facade that wires all of it together.
//! - [`native`]: producers written in Rust (`ticker`; `scripted` with the
//!   `testing` feature).

#![forbid(unsafe_code)]

pub mod agents;
pub mod host;
pub mod ids;
pub mod native;
pub mod notices;
pub mod panics;
pub mod producer;
pub mod prompt;
pub mod settings;
pub mod tasks;
pub mod tools;

pub use host::Host;

// The crates the public API speaks in, re-exported so an embedder uses the
// very versions taskhost was built with (`taskhost_core::tokio_util::sync::
// CancellationToken`, `#[taskhost_core::async_trait::async_trait]`, ...).
pub use {anyhow, async_trait, futures, serde_json, tokio, tokio_util};

/// What an embedder needs in one import: `use taskhost_core::prelude::*;`.
pub mod prelude {
    pub use crate::agents::{Agent, AgentRegistry, SessionMessage};
    pub use crate::host::Host;
    pub use crate::ids::{AgentId, SessionId, TaskId};
    pub use crate::native::ticker::TickerProducer;
    pub use crate::producer::{Descriptor, PreparedRun, Producer, RunMode, runner};
    pub use crate::settings::TasksSettings;
    pub use crate::tasks::{
        KillResult, OutputSignal, ReadEndedTask, TaskControl, TaskError, TaskEvent, TaskHooks, TaskOutcome, TaskRead,
        TaskRegistry, TaskSnapshot, TaskStart, TaskStatus, TerminalStatus,
    };
    pub use crate::tools::producer_tool::ProducerToolOptions;
    pub use crate::tools::{CallContext, ToolDefinition, ToolError, ToolOutput};
    pub use async_trait::async_trait;
    pub use tokio_util::sync::CancellationToken;
}
