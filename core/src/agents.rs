//! Agents: the owners of background tasks.
//!
//! An [`Agent`] is a live instance registered under an [`AgentId`], with its
//! own session ([`SessionId`]) and session log. Identity is the *instance*:
//! after an agent is disposed its id may be registered again, and the old
//! handle can never act as the new agent ([`AgentRegistry::is_current`]).
//!
//! Disposal is an awaited scope: [`Agent::dispose`] first detaches the agent
//! (it accepts no more messages and no more cleanups, and is unregistered),
//! then runs every registered cleanup and returns only when all of them
//! finished. The task registry uses this to cancel an owner's tasks and await
//! their quiescence. Disposal is memoized: concurrent callers await the same run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use futures::future::BoxFuture;
use tokio::sync::{Notify, watch};

use crate::ids::{AgentId, SessionId, TaskId};

/// An async cleanup run when its agent is disposed.
pub type Cleanup = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// Identifies a registered cleanup, to remove it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CleanupKey(u64);

/// One message in an agent's session log.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionMessage {
    pub at: SystemTime,
    pub text: String,
    /// The task the message is about (a completion notice), if any.
    pub about: Option<TaskId>,
}

/// The most messages a session log keeps. Beyond it the oldest messages a
/// surface already delivered are dropped; undelivered ones are never lost.
pub const SESSION_LOG_CAP: usize = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("agent id {0} is already in use by a live agent; dispose it first or pick another id")]
    IdInUse(AgentId),
    #[error("agent {0} is disposed")]
    Disposed(AgentId),
}

/// The live agents, by id.
#[derive(Clone, Default)]
pub struct AgentRegistry {
    shared: Arc<RegistryShared>,
}

#[derive(Default)]
struct RegistryShared {
    live: Mutex<HashMap<AgentId, Agent>>,
    next_instance: AtomicU64,
}

impl AgentRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a new live agent. Fails while another live agent holds `id`.
    pub fn create(&self, id: impl Into<AgentId>, session: impl Into<SessionId>) -> Result<Agent, AgentError> {
        self.create_as(id.into(), session.into(), false)
    }

    /// Registers a new live agent for a *stable owner* (an HTTP token, a
    /// `serve --owner` name): a task store keeps its session's records
    /// across restarts and hands them to the session's next durable agent
    /// (see [`crate::tasks::store`]). Fails while another live agent holds `id`.
    pub fn create_durable(&self, id: impl Into<AgentId>, session: impl Into<SessionId>) -> Result<Agent, AgentError> {
        self.create_as(id.into(), session.into(), true)
    }

    fn create_as(&self, id: AgentId, session: SessionId, durable: bool) -> Result<Agent, AgentError> {
        let mut live = self.shared.live.lock().expect("agent registry poisoned");
        if live.contains_key(&id) {
            return Err(AgentError::IdInUse(id));
        }
        let agent = Agent(Arc::new(AgentInner {
            id: id.clone(),
            session,
            durable,
            instance: self.shared.next_instance.fetch_add(1, Ordering::Relaxed),
            registry: Arc::downgrade(&self.shared),
            state: Mutex::new(AgentState::default()),
            messages: Notify::new(),
            disposal: watch::channel(false).0,
        }));
        live.insert(id, agent.clone());
        Ok(agent)
    }

    /// The live agent registered under `id`, if any.
    pub fn get(&self, id: &AgentId) -> Option<Agent> {
        self.shared.live.lock().expect("agent registry poisoned").get(id).cloned()
    }

    /// True if `agent` was created by this registry (live or not).
    pub fn owns(&self, agent: &Agent) -> bool {
        agent.0.registry.upgrade().is_some_and(|registry| Arc::ptr_eq(&registry, &self.shared))
    }

    /// True if `agent` is the exact instance currently registered under its id.
    pub fn is_current(&self, agent: &Agent) -> bool {
        self.get(&agent.0.id).is_some_and(|current| current.same_instance(agent))
    }

    pub fn list(&self) -> Vec<Agent> {
        self.shared.live.lock().expect("agent registry poisoned").values().cloned().collect()
    }

    /// The live durable agents of stable owner `session` (one per
    /// connection it holds), without copying the others.
    pub fn durable_of(&self, session: &str) -> Vec<Agent> {
        let live = self.shared.live.lock().expect("agent registry poisoned");
        live.values().filter(|agent| agent.is_durable() && agent.session().as_str() == session).cloned().collect()
    }

    /// Disposes every live agent, awaiting each one's cleanups.
    pub async fn dispose_all(&self) {
        let agents = self.list();
        futures::future::join_all(agents.iter().map(Agent::dispose)).await;
    }
}

/// A handle to one agent instance. Cloning shares the instance.
#[derive(Clone)]
pub struct Agent(Arc<AgentInner>);

struct AgentInner {
    id: AgentId,
    session: SessionId,
    /// A stable owner's agent ([`AgentRegistry::create_durable`]).
    durable: bool,
    instance: u64,
    registry: Weak<RegistryShared>,
    state: Mutex<AgentState>,
    messages: Notify,
    /// Flips to true once disposal has finished.
    disposal: watch::Sender<bool>,
}

#[derive(Default)]
struct AgentState {
    lifecycle: Lifecycle,
    log: Vec<SessionMessage>,
    /// How much of `log` a surface has already taken with `take_unread`.
    unread_from: usize,
    cleanups: Vec<(CleanupKey, Cleanup)>,
    next_cleanup: u64,
}

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum Lifecycle {
    #[default]
    Live,
    Disposing,
    Disposed,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("id", &self.0.id)
            .field("session", &self.0.session)
            .field("instance", &self.0.instance)
            .finish()
    }
}

impl Agent {
    pub fn id(&self) -> &AgentId {
        &self.0.id
    }

    pub fn session(&self) -> &SessionId {
        &self.0.session
    }

    /// Whether this agent is a stable owner's ([`AgentRegistry::create_durable`]).
    pub fn is_durable(&self) -> bool {
        self.0.durable
    }

    /// A number unique to this instance within its registry.
    pub fn instance(&self) -> u64 {
        self.0.instance
    }

    /// True for the very same instance (not merely the same id or session).
    pub fn same_instance(&self, other: &Agent) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A weak reference that does not keep the agent alive.
    pub fn downgrade(&self) -> WeakAgent {
        WeakAgent(Arc::downgrade(&self.0))
    }

    /// True until disposal starts.
    pub fn is_live(&self) -> bool {
        self.state().lifecycle == Lifecycle::Live
    }

    /// Appends a message to the session log, for the next model request to
    /// see. Refused once the agent is being disposed.
    pub fn inject(&self, text: impl Into<String>) -> Result<(), AgentError> {
        self.push(text.into(), None)
    }

    /// Like [`Agent::inject`], for a message about one task (a completion
    /// notice), which [`Agent::retract_unread_about`] can take back.
    pub fn inject_about(&self, task: &TaskId, text: impl Into<String>) -> Result<(), AgentError> {
        self.push(text.into(), Some(task.clone()))
    }

    fn push(&self, text: String, about: Option<TaskId>) -> Result<(), AgentError> {
        {
            let mut state = self.state();
            if state.lifecycle != Lifecycle::Live {
                return Err(AgentError::Disposed(self.0.id.clone()));
            }
            state.log.push(SessionMessage { at: SystemTime::now(), text, about });
            let excess = state.log.len().saturating_sub(SESSION_LOG_CAP).min(state.unread_from);
            if excess > 0 {
                state.log.drain(..excess);
                state.unread_from -= excess;
            }
        }
        self.0.messages.notify_waiters();
        Ok(())
    }

    /// Removes the messages about `task` that no surface has delivered yet
    /// (the task's end was reported explicitly, so its notice is redundant).
    /// Returns how many were removed.
    pub fn retract_unread_about(&self, task: &TaskId) -> usize {
        let mut state = self.state();
        let from = state.unread_from;
        let before = state.log.len();
        let mut index = 0;
        state.log.retain(|message| {
            let keep = index < from || message.about.as_ref() != Some(task);
            index += 1;
            keep
        });
        before - state.log.len()
    }

    /// The whole session log.
    pub fn session_log(&self) -> Vec<SessionMessage> {
        self.state().log.clone()
    }

    /// Messages injected since the previous call: what a surface still has to
    /// deliver. Each message is returned exactly once.
    pub fn take_unread(&self) -> Vec<SessionMessage> {
        let mut state = self.state();
        let unread = state.log[state.unread_from..].to_vec();
        state.unread_from = state.log.len();
        unread
    }

    /// Resolves once a message was injected after this call, or the agent
    /// was disposed.
    pub async fn message_injected(&self) {
        let notified = self.0.messages.notified();
        if self.is_live() {
            notified.await;
        }
    }

    /// Registers a cleanup to run (and be awaited) at disposal.
    pub fn add_cleanup(&self, cleanup: Cleanup) -> Result<CleanupKey, AgentError> {
        let mut state = self.state();
        if state.lifecycle != Lifecycle::Live {
            return Err(AgentError::Disposed(self.0.id.clone()));
        }
        let key = CleanupKey(state.next_cleanup);
        state.next_cleanup += 1;
        state.cleanups.push((key, cleanup));
        Ok(key)
    }

    /// Removes a cleanup that has not run yet. Returns whether it was there.
    pub fn remove_cleanup(&self, key: CleanupKey) -> bool {
        let mut state = self.state();
        let before = state.cleanups.len();
        state.cleanups.retain(|(k, _)| *k != key);
        state.cleanups.len() != before
    }

    /// Detaches the agent, then runs and awaits every cleanup. Memoized.
    pub async fn dispose(&self) {
        let cleanups = {
            let mut state = self.state();
            if state.lifecycle == Lifecycle::Live {
                state.lifecycle = Lifecycle::Disposing;
                Some(std::mem::take(&mut state.cleanups))
            } else {
                None
            }
        };
        let Some(cleanups) = cleanups else {
            let mut done = self.0.disposal.subscribe();
            // The sender lives in `self`, so this cannot fail early.
            let _ = done.wait_for(|finished| *finished).await;
            return;
        };
        if let Some(registry) = self.0.registry.upgrade() {
            let mut live = registry.live.lock().expect("agent registry poisoned");
            if live.get(&self.0.id).is_some_and(|current| current.same_instance(self)) {
                live.remove(&self.0.id);
            }
        }
        self.0.messages.notify_waiters();
        tracing::debug!(agent = %self.0.id, session = %self.0.session, cleanups = cleanups.len(), "disposing agent");
        futures::future::join_all(cleanups.into_iter().map(|(_, cleanup)| cleanup())).await;
        self.state().lifecycle = Lifecycle::Disposed;
        self.0.disposal.send_replace(true);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, AgentState> {
        self.0.state.lock().expect("agent state poisoned")
    }
}

/// A non-owning reference to an agent instance.
#[derive(Clone, Debug, Default)]
pub struct WeakAgent(Weak<AgentInner>);

impl WeakAgent {
    /// A reference to no agent (upgrades to `None`).
    pub fn none() -> Self {
        Self(Weak::new())
    }
}

impl std::fmt::Debug for AgentInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.id, self.instance)
    }
}

impl WeakAgent {
    pub fn upgrade(&self) -> Option<Agent> {
        self.0.upgrade().map(Agent)
    }
}
