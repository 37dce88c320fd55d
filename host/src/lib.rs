//! taskhost: a runtime for the background tasks of AI agents.
//!
//! The module tree is the architecture:
//! - [`ids`]: branded ids (`TaskId`, `SessionId`, `AgentId`).
//! - [`agents`]: live agents (task owners), their session logs and awaited disposal.
//! - [`tasks`]: the task registry: ids, owner fence, reads, kill, wait, settlement.
//! - [`capabilities`]: what the host grants plugins (processes), and how it confines them.
//! - [`notices`]: completion notices injected into the owner's session.
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
pub mod plugin;
pub mod producer;
pub mod prompt;
pub mod reload;
pub mod setup;
pub mod surfaces;
pub mod tasks;
pub mod tools;

pub use host::Host;
