//! Host capabilities: what a plugin may reach beyond its sandbox.
//!
//! A plugin has no ambient authority. Each capability is a WIT interface the
//! host implements and grants per plugin instance; a plugin that calls one it
//! was not granted gets an error that says so. Every resource a capability
//! hands out lives in the calling task's store, so dropping the store (the
//! task settled, faulted or was abandoned) releases it.
//!
//! - [`subagents`]: child agent runs (scripted, OpenAI-compatible, ACP).

pub mod subagents;
