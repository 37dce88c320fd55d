//! Host capabilities: the only ways a plugin reaches the outside world.
//!
//! A plugin has no ambient authority. Each capability is a WIT interface the
//! host implements and grants per plugin instance in the host configuration;
//! it is enforced on every call, and a plugin that calls one it was not
//! granted gets an error that says so. Every object a capability hands out is
//! owned by the calling task's store, so dropping the store (the task settled,
//! faulted or was abandoned) releases it: processes are killed, child runs
//! disposed.
//!
//! - [`process`]: start and supervise confined process trees.
//! - [`subagents`]: child agent runs (scripted, OpenAI-compatible, ACP).

pub mod process;
pub mod subagents;
