//! The MCP surface: every tool of a [`Host`] served over the Model Context Protocol (rmcp), on
//! stdio ([`stdio`]) and streamable HTTP ([`http`], which also serves the web [`dashboard`] on
//! the same listener, behind the same tokens).
//!
//! Invariants:
//! - One [`McpServer`] per process holds the host (registry, agents, producers) and the serve
//!   settings. Protocol handlers ([`McpHandler`]) are cheap views onto it that rmcp builds per
//!   connection (per HTTP request under 2026-07-28): nothing that outlives a request lives there.
//! - Every tool call runs as an owner agent: on stdio the connection's (created at connect,
//!   disposed, its tasks cancelled and awaited, at disconnect); on HTTP the authenticated
//!   bearer token's name (one long-lived agent per token), never a string the client picks.
//! - After each call the owner's unread session messages (completion notices) are appended to
//!   the result, one text block each; the agent hands each out once, so the model sees it once.
//! - A refused call (unknown tool, bad arguments, foreign or unknown task) is a tool result with
//!   `isError: true` and the library's message: the model can fix it, the server keeps serving.
//! - A request's cancellation (`notifications/cancelled`, a closed HTTP stream or stdio
//!   connection) cancels [`taskhost_core::tools::CallContext::cancel`]: a foreground run stops.
//! - A client that declares the tasks extension gets foreground producer calls answered as MCP
//!   tasks backed by the registry ([`tasks`]); a 2025-11-25 client gets them as that
//!   revision's experimental tasks ([`tasks_v1`]).
//! - Every message passes a JSON-RPC gate ([`jsonrpc`]) before rmcp: each request gets exactly
//!   one answer with its id, and a connection's bounds (line length, nesting, requests in
//!   flight, queued answers) are the gate's (`docs/mcp.md` lists them).
//! - A plugin served from its cached descriptor loads in the background only once the server's
//!   [`LoadGate`] opens: at the first `tools/list` answer (on stdio once it is written to the
//!   client), or at that tool's first call.

pub mod admission;
pub mod dashboard;
pub mod handler;
pub mod http;
pub mod jsonrpc;
pub mod settings;
pub mod standard_headers;
pub mod stdio;
pub mod tasks;
pub mod tasks_v1;
pub mod tokens;

use std::sync::Arc;

pub use handler::{McpHandler, STARTED_TASK_META};
use settings::ServeSettings;

use crate::plugin::producer::LoadGate;
use crate::reload::ReloadablePlugin;
use taskhost_core::Host;

/// What every connection and request of one `taskhost serve` shares.
pub struct McpServer {
    host: Host,
    settings: ServeSettings,
    tasks: Arc<tasks::McpTasks>,
    /// The reloadable wasm plugins the host serves (for the dashboard).
    /// A plugin still loading at start is added when its load ends.
    plugins: std::sync::RwLock<Vec<Arc<ReloadablePlugin>>>,
    /// Opened by the first tool listing (see [`Self::with_load_gate`]).
    load_gate: LoadGate,
    /// This node's cluster membership, on a cluster: every call and task
    /// request is answered only once it confirms the node still holds its
    /// lease (see [`Self::confirm_membership`]).
    membership: std::sync::OnceLock<Arc<crate::cluster::membership::Membership>>,
}

impl McpServer {
    pub fn new(host: Host, settings: ServeSettings) -> Arc<Self> {
        Self::with_plugins(host, settings, Vec::new())
    }

    /// A server that also knows the host's reloadable plugins, so the web
    /// dashboard can show their versions and reloads.
    pub fn with_plugins(host: Host, settings: ServeSettings, plugins: Vec<Arc<ReloadablePlugin>>) -> Arc<Self> {
        Self::with_load_gate(host, settings, plugins, LoadGate::open_now())
    }

    /// As [`Self::with_plugins`], opening `gate` (held by plugins still to be
    /// loaded in the background, see [`crate::setup`]) once the first
    /// `tools/list` is answered: until then a start has the CPU to itself.
    pub fn with_load_gate(
        host: Host,
        settings: ServeSettings,
        plugins: Vec<Arc<ReloadablePlugin>>,
        gate: LoadGate,
    ) -> Arc<Self> {
        Arc::new(Self {
            host,
            settings,
            tasks: Arc::default(),
            plugins: std::sync::RwLock::new(plugins),
            load_gate: gate,
            membership: std::sync::OnceLock::new(),
        })
    }

    /// Makes every call wait for `membership`'s confirmation (a cluster node).
    pub fn set_membership(&self, membership: Arc<crate::cluster::membership::Membership>) {
        let _ = self.membership.set(membership);
    }

    /// This node's cluster membership, on a cluster.
    pub fn membership(&self) -> Option<&Arc<crate::cluster::membership::Membership>> {
        self.membership.get()
    }

    /// Ok when this server may answer a call now: always, off a cluster; on
    /// one, while the node holds its lease (renewed first when it lapsed, and
    /// its tasks settled first when the cluster declared it gone), so a node
    /// never reports as running a task the cluster settled. The error says
    /// "cluster unavailable, retry".
    pub async fn confirm_membership(&self) -> Result<(), String> {
        match self.membership.get() {
            Some(membership) => membership.confirm().await,
            None => Ok(()),
        }
    }

    /// The gate background plugin loads wait for.
    pub fn load_gate(&self) -> &LoadGate {
        &self.load_gate
    }

    /// The reloadable plugins known so far.
    pub fn plugins(&self) -> Vec<Arc<ReloadablePlugin>> {
        self.plugins.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Adds a plugin whose load ended after the server was built.
    pub fn add_plugin(&self, plugin: Arc<ReloadablePlugin>) {
        self.plugins.write().unwrap_or_else(|e| e.into_inner()).push(plugin);
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    pub fn settings(&self) -> &ServeSettings {
        &self.settings
    }
}
