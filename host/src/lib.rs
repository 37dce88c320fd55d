//! taskhost: a runtime for the background tasks of AI agents.
//!
//! The module tree is the architecture:
//! - [`ids`]: branded ids (`TaskId`, `SessionId`, `AgentId`).
//! - [`agents`]: live agents (task owners), their session logs and awaited disposal.
//! - [`tasks`]: the task registry: ids, owner fence, reads, kill, wait, settlement.
//! - [`producer`]: the contract every kind of background work implements.
//! - [`plugin`]: the WebAssembly plugin runtime: engine, loading, one store per task, drivers.

pub mod agents;
pub mod ids;
pub mod plugin;
pub mod producer;
pub mod tasks;
