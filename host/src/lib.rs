//! taskhost: a runtime for the background tasks of AI agents.
//!
//! The module tree is the architecture:
//! - [`ids`]: branded ids (`TaskId`, `SessionId`, `AgentId`).
//! - [`agents`]: live agents (task owners), their session logs and awaited disposal.
//! - [`tasks`]: the task registry: ids, owner fence, reads, kill, wait, settlement.
//! - [`capabilities`]: what the host grants plugins (processes), and how it confines them.
//! - [`producer`]: the contract every kind of background work implements.

pub mod agents;
pub mod capabilities;
pub mod ids;
pub mod producer;
pub mod tasks;
