//! The dashboard across nodes: a node's dashboard lists, reads and stops
//! the tasks other nodes run by asking them (a forwarded [`DASHBOARD_CALL`]),
//! and each answers as its own dashboard answers the same token.
//!
//! Invariants:
//! - The asked node finds the token by its name in its own token table
//!   (every node serves the same `[serve.http] tokens`), so it shows and
//!   stops only what that token may see there; a node that serves no
//!   dashboard, or no such token, answers with an error, never a guess.
//! - Answers are typed ([`DashboardAnswer`]: the HTTP status and JSON body
//!   the asked node's dashboard gave), never text parsed back.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use taskhost_core::agents::Agent;

use super::membership::Membership;

/// The forwarded call's name (never a tool's: tool names have no `/`).
pub(super) const DASHBOARD_CALL: &str = "taskhost/dashboard";

/// What one node's dashboard asks another.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum DashboardCall {
    /// The tasks the token sees there (`{"tasks": [...]}`).
    Tasks,
    /// A task's output after `since`, never consumed.
    Output { task_id: String, since: u64 },
    /// Stops a task, as the dashboard's kill.
    Kill { task_id: String },
}

/// What the asked node's dashboard answered.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DashboardAnswer {
    pub status: u16,
    pub body: Value,
}

/// A node's dashboard as other nodes reach it: the token's name and the call.
pub type DashboardAnswerer = Arc<dyn Fn(String, DashboardCall) -> BoxFuture<'static, DashboardAnswer> + Send + Sync>;

#[derive(Serialize, Deserialize)]
struct Asked {
    token: String,
    call: DashboardCall,
}

impl Membership {
    /// This node's name.
    pub fn node_name(&self) -> &str {
        &self.node
    }

    /// Lets other nodes' dashboards reach this one's (set once, by the
    /// dashboard).
    pub fn answer_dashboard_with(&self, answerer: DashboardAnswerer) {
        let hook: super::membership::DashboardHook = Arc::new(move |arguments| {
            let answerer = answerer.clone();
            Box::pin(async move {
                let asked: Asked = serde_json::from_value(arguments)
                    .map_err(|error| format!("an unreadable dashboard call: {error}"))?;
                let answer = answerer(asked.token, asked.call).await;
                Ok(serde_json::to_value(answer).expect("an answer serializes"))
            })
        });
        let _ = self.dashboard.set(hook);
    }

    /// Asks every other live node's dashboard, as token `token` (of
    /// `owner`); each node's answer, or why it gave none. Err: the roster,
    /// which names the nodes, could not be read.
    pub async fn ask_dashboards(
        self: &Arc<Self>,
        owner: &Agent,
        token: &str,
        call: DashboardCall,
    ) -> Result<Vec<(String, Result<DashboardAnswer, String>)>, String> {
        let Some(others) = self.other_live_nodes().await else {
            return Err("cluster unavailable, retry: the roster could not be read".into());
        };
        let asked = others.iter().map(|node| self.ask_dashboard(node, owner, token, call.clone()));
        Ok(others.iter().cloned().zip(futures::future::join_all(asked).await).collect())
    }

    /// Asks the dashboard of the node whose record holds `task_id`; `None`
    /// when no record does, or this node's does (nothing to ask).
    pub async fn ask_task_dashboard(
        self: &Arc<Self>,
        owner: &Agent,
        token: &str,
        task_id: &str,
        call: DashboardCall,
    ) -> Option<Result<DashboardAnswer, String>> {
        match self.node_of(task_id).await {
            Ok(Some(node)) if node != self.node => Some(self.ask_dashboard(&node, owner, token, call).await),
            Ok(_) => None,
            Err(error) => Some(Err(error)),
        }
    }

    async fn ask_dashboard(
        self: &Arc<Self>,
        node: &str,
        owner: &Agent,
        token: &str,
        call: DashboardCall,
    ) -> Result<DashboardAnswer, String> {
        let arguments = serde_json::to_value(Asked { token: token.to_string(), call }).expect("a call serializes");
        let answer =
            self.forward(node, owner, DASHBOARD_CALL, arguments, Duration::ZERO, super::membership::LIST_WITHIN).await;
        match answer.data {
            Some(data) => serde_json::from_value(data).map_err(|error| format!("node {node} answered oddly ({error})")),
            None => Err(answer.output.text),
        }
    }

    /// Answers another node's dashboard call with this node's dashboard
    /// (a [`DashboardAnswer`] as JSON), or says why it cannot.
    pub(super) async fn answer_dashboard(&self, arguments: Value) -> Result<Value, String> {
        let Some(hook) = self.dashboard.get().cloned() else {
            return Err(format!("node {} serves no dashboard (no serve --http)", self.node));
        };
        hook(arguments).await
    }
}
