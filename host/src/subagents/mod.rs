//! The `subagents` capability: child agent runs on the host's backends. [`Subagents`] is the
//! service a host builds once from its [`SubagentsConfig`]; [`Subagents::start`] creates a
//! child run, a real agent of the host ([`AgentRegistry`], its own id and session).
//!
//! Backends, chosen by the profile: [`scripted`] (deterministic offline replies, optional tool
//! calls), [`openai`] (an OpenAI-compatible chat-completions loop in which the child calls the
//! host's tools as itself), [`acp`] (any Agent Client Protocol agent, as a child process).
//! [`producer`] serves the capability natively as a `subagent` tool (the twin of the
//! `plugins/subagent` guest) and holds [`producer::outcome_of`] (stop reason → task outcome).
//! The WIT host implementation is `crate::plugin::host::subagents`: this module knows nothing
//! of WebAssembly.
//!
//! Invariants:
//! - A [`SubagentRun`] gives the result (final text + [`StopReason`]), `cancel`, and `dispose`,
//!   which resolves only after the child agent is disposed, and so (as
//!   [`taskhost_core::agents::Agent::dispose`] awaits them) after the child's own tasks.
//! - A child never outlives its run: whoever owns the run awaits disposal (the subagent
//!   producer settles its task only after it), and dropping the owning [`RunGuard`] (a plugin
//!   store dropped for any reason) starts it.
//! - A child's tool calls carry the child agent as caller: the tasks it starts are its own and
//!   fenced from everyone else.
//! - The service holds the toolbox weakly: a host that is dropped is not kept alive by the
//!   tools that reach it.

pub mod acp;
pub mod config;
pub mod openai;
pub mod producer;
pub mod run;
pub mod scripted;
pub mod types;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use config::{AcpConfig, BackendConfig, OpenAiConfig, ScriptedConfig, SubagentsConfig, SubagentsGrant};
pub use producer::{SubagentProducer, outcome_of};
pub use run::{RunGuard, SubagentRun};
pub use types::{RunResult, StopReason};

use taskhost_core::agents::{Agent, AgentRegistry};
use taskhost_core::tools::{CallContext, ToolDefinition, ToolError, ToolOutput, WeakToolbox};

/// How long a cancelled backend may take to stop on its own before its work
/// is dropped (scripted and openai stop at once; acp overrides it).
const DEFAULT_CANCEL_GRACE: Duration = Duration::from_millis(500);

/// What a start asks for.
#[derive(Clone, Debug, Default)]
pub struct StartRequest {
    /// Short description (the task label).
    pub description: String,
    /// The child's instructions.
    pub prompt: String,
    /// The backend to use; None: the configured default.
    pub profile: Option<String>,
}

/// The subagents service of one host. Cheap to clone.
#[derive(Clone)]
pub struct Subagents {
    inner: Arc<Inner>,
}

struct Inner {
    agents: AgentRegistry,
    toolbox: WeakToolbox,
    default_backend: String,
    backends: BTreeMap<String, Arc<dyn Backend>>,
}

/// Numbers child agents process-wide, so two services on one host (or one
/// agent registry) never pick the same child id.
static NEXT_CHILD: AtomicU64 = AtomicU64::new(1);

/// A backend drives one child run to its result.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// `scripted`, `openai`, `acp`.
    fn kind(&self) -> &'static str;

    /// How long a cancelled run may take to stop on its own.
    fn cancel_grace(&self) -> Duration {
        DEFAULT_CANCEL_GRACE
    }

    /// Runs the child to its result. Must watch `child.cancelled()` and
    /// return `aborted` soon after it fires; when it does not, the driver
    /// drops this future after [`Backend::cancel_grace`].
    async fn run(&self, child: ChildContext) -> RunResult;
}

/// What a backend gets for one run.
pub struct ChildContext {
    pub agent: Agent,
    pub description: String,
    pub prompt: String,
    cancel: CancellationToken,
    toolbox: WeakToolbox,
}

impl ChildContext {
    /// Resolves when the run is cancelled.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The host's tools the child may call (`allow`: a name allowlist).
    pub fn tool_definitions(&self, allow: Option<&[String]>) -> Vec<ToolDefinition> {
        let Some(toolbox) = self.toolbox.upgrade() else { return Vec::new() };
        toolbox
            .definitions()
            .into_iter()
            .filter(|definition| allow.is_none_or(|allow| allow.contains(&definition.name)))
            .collect()
    }

    /// Calls a host tool as the child agent. The call is cancelled with the run.
    pub async fn call_tool(&self, name: &str, args: serde_json::Value) -> Result<ToolOutput, ToolError> {
        let Some(toolbox) = self.toolbox.upgrade() else {
            return Err(ToolError::Failed { tool: name.to_string(), message: "the host is gone".into() });
        };
        let context = CallContext::for_agent(&self.agent).with_cancel(self.cancel.child_token());
        toolbox.call(name, args, &context).await
    }
}

impl Subagents {
    /// The service for `host`: [`Subagents::new`] with its agents and tools.
    pub fn for_host(host: &taskhost_core::Host, config: &SubagentsConfig) -> anyhow::Result<Self> {
        Self::new(host.agents(), host.toolbox().downgrade(), config)
    }

    /// The service for a host: its agents, and (weakly) its tools, which
    /// children call as themselves.
    pub fn new(agents: &AgentRegistry, toolbox: WeakToolbox, config: &SubagentsConfig) -> anyhow::Result<Self> {
        config.validate()?;
        let mut backends: BTreeMap<String, Arc<dyn Backend>> = BTreeMap::new();
        for (name, backend) in config.effective_backends() {
            let built: Arc<dyn Backend> = match backend {
                BackendConfig::Scripted(scripted) => Arc::new(scripted::ScriptedBackend::new(scripted)),
                BackendConfig::Openai(openai) => Arc::new(
                    openai::OpenAiBackend::new(openai)
                        .map_err(|e| anyhow::anyhow!("[subagents.backends.{name}] {e:#}"))?,
                ),
                BackendConfig::Acp(acp) => Arc::new(acp::AcpBackend::new(acp)),
            };
            backends.insert(name, built);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                agents: agents.clone(),
                toolbox,
                default_backend: config.default_backend_name(),
                backends,
            }),
        })
    }

    /// The service limited to the backends a `[producer.grants.subagents]`
    /// names (all of them when it names none). A name that is not configured
    /// is an error at load time, never a run that fails later; when the
    /// default backend is not granted, the first granted one is the default.
    pub fn restricted_to(&self, grant: &SubagentsGrant) -> anyhow::Result<Self> {
        if grant.backends.is_empty() {
            return Ok(self.clone());
        }
        let mut backends = BTreeMap::new();
        for name in &grant.backends {
            let Some(backend) = self.inner.backends.get(name) else {
                anyhow::bail!(
                    "the subagents grant names backend {name:?}, which is not configured; configured: {} \
                     (add it under [subagents.backends])",
                    self.profiles().join(", ")
                );
            };
            backends.insert(name.clone(), backend.clone());
        }
        let default_backend = if backends.contains_key(&self.inner.default_backend) {
            self.inner.default_backend.clone()
        } else {
            grant.backends[0].clone()
        };
        Ok(Self {
            inner: Arc::new(Inner {
                agents: self.inner.agents.clone(),
                toolbox: self.inner.toolbox.clone(),
                default_backend,
                backends,
            }),
        })
    }

    /// The configured backend names.
    pub fn profiles(&self) -> Vec<String> {
        self.inner.backends.keys().cloned().collect()
    }

    /// Creates the child agent and starts its run. An error (unknown
    /// profile) starts nothing.
    pub fn start(&self, request: StartRequest) -> anyhow::Result<SubagentRun> {
        let profile = request.profile.clone().unwrap_or_else(|| self.inner.default_backend.clone());
        let Some(backend) = self.inner.backends.get(&profile).cloned() else {
            anyhow::bail!(
                "no subagent backend named {profile:?}; configured: {} (add it under [subagents.backends])",
                self.profiles().join(", ")
            );
        };
        let n = NEXT_CHILD.fetch_add(1, Ordering::Relaxed);
        let child = self
            .inner
            .agents
            .create(format!("subagent-{n}"), format!("subagent-{n}-session"))
            .map_err(|e| anyhow::anyhow!("cannot create the child agent: {e}"))?;
        let span = tracing::info_span!(
            "subagent_run",
            child = %child.id(),
            child_session = %child.session(),
            profile = %profile,
            backend = backend.kind(),
        );
        tracing::info!(parent: &span, description = %request.description, "starting a subagent run");
        let cancel = CancellationToken::new();
        let context = ChildContext {
            agent: child.clone(),
            description: request.description,
            prompt: request.prompt,
            cancel: cancel.clone(),
            toolbox: self.inner.toolbox.clone(),
        };
        let grace = backend.cancel_grace();
        Ok(SubagentRun::spawn(child, profile, cancel, grace, span, async move { backend.run(context).await }))
    }
}
