//! taskhost: a runtime for the background tasks of AI agents.
//!
//! The module tree is the architecture:
//! - [`ids`]: branded ids (`TaskId`, `SessionId`, `AgentId`).
//! - [`agents`]: live agents (task owners), their session logs and awaited disposal.
//! - [`tasks`]: the task registry: ids, owner fence, reads, kill, wait, settlement.
//! - [`producer`]: the contract every kind of background work implements.
//! - [`builtin`]: the plugins built into the binary (embedded components).

pub mod agents;
pub mod builtin;
pub mod ids;
pub mod producer;
pub mod tasks;
