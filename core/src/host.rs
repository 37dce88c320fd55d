//! The library facade: one object that owns the agents, the task registry,
//! the control tools and the producer tools.
//!
//! Dropping order matters only at [`Host::dispose`]: agents first (each
//! awaits its tasks' quiescence), then the registry (unowned tasks), so no
//! task outlives the host.

use std::sync::Arc;

use crate::agents::{Agent, AgentError, AgentRegistry};
use crate::ids::{AgentId, SessionId};
use crate::notices::completion_notice;
use crate::producer::Producer;
use crate::settings::TasksSettings;
use crate::tasks::TaskRegistry;
use crate::tasks::store::{MemoryStore, TaskStore};
use crate::tools::control::ControlTools;
use crate::tools::producer_tool::{ProducerTool, ProducerToolOptions};
use crate::tools::{CallContext, ToolDefinition, ToolError, ToolNameError, ToolOutput, Toolbox};

/// A running taskhost.
#[derive(Clone)]
pub struct Host {
    agents: AgentRegistry,
    registry: TaskRegistry,
    toolbox: Toolbox,
    _control: Arc<ControlTools>,
}

impl Host {
    /// A host with the control tools attached and no producers yet.
    pub fn new(settings: &TasksSettings) -> anyhow::Result<Self> {
        Self::with_store(settings, Arc::new(MemoryStore::new()))
    }

    /// A host whose registry records in `store`, with what the store kept
    /// from an earlier process restored (see [`TaskRegistry::with_store`]).
    pub fn with_store(settings: &TasksSettings, store: Arc<dyn TaskStore>) -> anyhow::Result<Self> {
        settings.validate()?;
        let agents = AgentRegistry::new();
        let registry = TaskRegistry::with_store(agents.clone(), settings.registry(), store)?;
        let toolbox = Toolbox::new();
        let control = ControlTools::attach(&registry, settings.control_tools())?;
        control.install(&toolbox);
        Ok(Self { agents, registry, toolbox, _control: control })
    }

    pub fn agents(&self) -> &AgentRegistry {
        &self.agents
    }

    pub fn registry(&self) -> &TaskRegistry {
        &self.registry
    }

    pub fn toolbox(&self) -> &Toolbox {
        &self.toolbox
    }

    /// Registers a new agent (an owner session).
    pub fn create_agent(&self, id: impl Into<AgentId>, session: impl Into<SessionId>) -> Result<Agent, AgentError> {
        self.agents.create(id, session)
    }

    /// Registers a new agent for a stable owner (an HTTP token, `serve
    /// --owner`): the store keeps its session's records across restarts.
    /// The records an earlier process left for the session are handed to
    /// it, and each end nobody was told of (a task lost by a crash among
    /// them) is told once, by a completion notice in its session.
    pub fn create_durable_agent(
        &self,
        id: impl Into<AgentId>,
        session: impl Into<SessionId>,
    ) -> Result<Agent, AgentError> {
        let agent = self.agents.create_durable(id, session)?;
        for snapshot in self.registry.attach_owner(&agent) {
            self.registry.inject_completion_notice(&snapshot.id, completion_notice(&snapshot));
        }
        Ok(agent)
    }

    /// Takes in ended records another node of a cluster settled for this
    /// host to keep ([`TaskRegistry::take_in_ended`]): a stable owner whose
    /// session is live here is handed them at once, each told once by a
    /// completion notice; others are handed them when they next appear.
    pub fn take_in_ended(&self, tasks: Vec<crate::tasks::store::StoredTask>) {
        self.take_in_ended_with_output(tasks.into_iter().map(|task| (task, None)).collect());
    }

    /// As [`Self::take_in_ended`], each task with the output its old
    /// registry's replica kept ([`crate::tasks::replica`]), when it kept any.
    pub fn take_in_ended_with_output(
        &self,
        tasks: Vec<(crate::tasks::store::StoredTask, Option<crate::tasks::replica::ReplayedOutput>)>,
    ) {
        let sessions = self.registry.take_in_ended_with_output(tasks);
        if sessions.is_empty() {
            return;
        }
        for agent in self.agents.list() {
            if agent.is_durable() && sessions.contains(agent.session()) {
                for snapshot in self.registry.attach_owner(&agent) {
                    self.registry.inject_completion_notice(&snapshot.id, completion_notice(&snapshot));
                }
            }
        }
    }

    /// Serves a producer as a tool (replacing a producer tool of the same
    /// name). Refuses names that break the tool-name rule or belong to the
    /// control tools.
    pub fn add_producer(&self, producer: Arc<dyn Producer>, options: ProducerToolOptions) -> Result<(), ToolNameError> {
        self.toolbox.insert(Arc::new(ProducerTool::new(producer, options, self.registry.clone())))
    }

    /// Serves a producer under `name` with background runs on and the default
    /// foreground timeout.
    pub fn add_producer_named(&self, name: &str, producer: Arc<dyn Producer>) -> Result<(), ToolNameError> {
        self.add_producer(producer, ProducerToolOptions::new(name))
    }

    pub fn tool_definitions(&self) -> Vec<ToolDefinition> {
        self.toolbox.definitions()
    }

    /// Calls a tool as `context.caller`.
    pub async fn call_tool(
        &self,
        name: &str,
        args: serde_json::Value,
        context: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        self.toolbox.call(name, args, context).await
    }

    /// The system-prompt section that teaches the background-task habit.
    pub fn system_prompt_section(&self) -> &'static str {
        crate::prompt::BACKGROUND_TASKS_SECTION
    }

    /// Disposes every agent (awaiting their tasks), then every unowned task.
    pub async fn dispose(&self) {
        // Stable owners' handed-over trees outlive the process: the next one
        // re-adopts them.
        self.registry.begin_shutdown();
        self.agents.dispose_all().await;
        self.registry.dispose().await;
    }
}
