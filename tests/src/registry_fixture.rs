//! A bare task registry with one owner and a control surface, for suites
//! that drive a producer through the registry itself (no `Host`, no tools).

use taskhost::agents::{Agent, AgentRegistry};
use taskhost::ids::TaskId;
use taskhost::producer::{PreparedRun, Producer, RunMode};
use taskhost::tasks::{RegistryConfig, SurfaceGuard, TaskRegistry, TaskStart};

/// The registry, its owner agent, and the surface that lets tasks start.
pub struct OwnedRegistry {
    pub registry: TaskRegistry,
    pub agent: Agent,
    _surface: SurfaceGuard,
}

impl OwnedRegistry {
    /// Ten live tasks per owner, no teardown bound.
    pub fn new() -> Self {
        let agents = AgentRegistry::new();
        let agent = agents.create("agent", "session").expect("agent");
        let registry = TaskRegistry::new(
            agents,
            RegistryConfig { max_live_tasks_per_owner: 10, teardown_timeout: None, ..RegistryConfig::default() },
        );
        let surface = registry.attach_surface("test");
        Self { registry, agent, _surface: surface }
    }

    /// Prepares `args` on `producer` in the background; the prepared run is
    /// returned so a test can look at it before [`Self::start`].
    pub async fn prepare(producer: &dyn Producer, args: serde_json::Value) -> PreparedRun {
        producer.prepare(args, RunMode::Background).await.expect("prepare")
    }

    /// Starts a prepared run of `producer` as the owner's task.
    pub async fn start(&self, producer: &dyn Producer, prepared: PreparedRun) -> TaskId {
        self.registry
            .start(
                TaskStart::new(producer.descriptor().kind.clone(), prepared.label, prepared.run)
                    .with_owner(Some(self.agent.clone()))
                    .with_producer_info(prepared.producer_info),
            )
            .await
            .expect("start")
    }
}

impl Default for OwnedRegistry {
    fn default() -> Self {
        Self::new()
    }
}
