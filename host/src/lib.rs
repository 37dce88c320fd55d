//! taskhost: a runtime for the background tasks of AI agents.
//!
//! Three crates, dependencies pointing one way (see `ARCHITECTURE.md`):
//! - `taskhost-core`: ids, agents, the task registry, notices, the producer
//!   contract, the model-facing tools, the [`Host`] facade and the native
//!   ticker. Re-exported here under the same paths ([`tasks`], [`tools`],
//!   [`producer`], ...), so `taskhost::tasks::TaskRegistry` is
//!   `taskhost_core::tasks::TaskRegistry`.
//! - `taskhost-process`: the `process` capability (confined process trees),
//!   re-exported as [`process`].
//! - this crate, for what needs a WebAssembly runtime, a network or a
//!   terminal:
//!   - [`plugin`]: the WebAssembly plugin runtime: engine, loading, one store
//!     per task, drivers, and the host side of the WIT world.
//!   - [`subagents`]: the `subagents` capability (scripted, OpenAI-compatible
//!     and ACP backends) and its native producer.
//!   - [`reload`]: hot reload of wasm plugins (make-before-break) and file watching.
//!   - [`builtin`]: the plugins built into the binary (embedded components).
//!   - [`config`]: the configuration file, and which files need trust.
//!   - [`cluster`]: nodes sharing one registry on NATS JetStream (`[cluster]`).
//!   - [`state`]: taskhost's own state directory (trust records, the
//!     compile cache's key, the spill root).
//!   - [`setup`]: a host from a configuration (which producers serve which tools).
//!   - [`task_logs`]: where stream tasks' output log files go (each owner's
//!     own spill directory).
//!   - [`mcp`]: the MCP server (`taskhost serve`) over stdio and HTTP.
//!   - [`cli`]: the `taskhost` command line (`serve`, `dev`, `demo`).
//!   - [`http_client`]: the one way HTTP clients are built.

pub mod builtin;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod durable_tasks;
pub mod http_client;
pub mod mcp;
pub mod outbound;
pub mod plugin;
pub mod reload;
pub mod setup;
pub mod state;
pub mod subagents;
pub mod task_logs;

pub use taskhost_core::{Host, agents, host, ids, native, notices, panics, producer, prompt, settings, tasks, tools};

/// The `process` capability: the `taskhost-process` crate, under the path
/// an embedder of this crate expects (`taskhost::process::ProcessHost`). The
/// per-store state of its WIT glue is [`plugin::resources::ProcessCapability`].
pub use taskhost_process as process;

// The crates the public API speaks in, re-exported so an embedder uses the
// very versions taskhost was built with (`taskhost::tokio_util::sync::
// CancellationToken`, `#[taskhost::async_trait::async_trait]`, ...).
pub use taskhost_core::{anyhow, async_trait, futures, serde_json, tokio, tokio_util};

/// What an embedder needs in one import: `use taskhost::prelude::*;`.
pub mod prelude {
    pub use taskhost_core::prelude::*;
}
