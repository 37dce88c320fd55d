//! The dashboard on a cluster node: the listing holds every node's tasks
//! the token sees, and a task another node runs is read and stopped there
//! ([`crate::cluster::dashboard`]); this node answers other nodes' asks.
//!
//! Invariants: what another node answers is shown as it answered it (its
//! status, its JSON); a node that does not answer leaves its tasks out of
//! the listing, named in `unreachable`, and a call about one of its tasks
//! gets `503` "cluster unavailable, retry"; an ask is answered from this
//! node alone, never passed on.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Dashboard, Viewer, error, task_json};
use crate::cluster::dashboard::{DashboardAnswer, DashboardCall};

/// The most of another node's answer this node reads back from its own
/// dashboard's response (a forwarded answer is at most 1 MiB anyway).
const MAX_ANSWER_BYTES: usize = 1 << 20;

impl Dashboard {
    /// Lets other nodes' dashboards reach this one, on a cluster.
    pub(super) fn answer_other_nodes(self: &Arc<Self>) {
        let Some(membership) = self.server.membership() else { return };
        let dashboard = Arc::downgrade(self);
        membership.answer_dashboard_with(Arc::new(move |token, call| {
            let dashboard = dashboard.clone();
            Box::pin(async move {
                match dashboard.upgrade() {
                    Some(dashboard) => dashboard.answer_ask(&token, call).await,
                    None => DashboardAnswer { status: 503, body: json!({"error": "the dashboard is shutting down"}) },
                }
            })
        }));
    }

    /// Another node's ask, answered from this node alone.
    async fn answer_ask(&self, token: &str, call: DashboardCall) -> DashboardAnswer {
        let Some(viewer) = self.tokens.entries().iter().find(|entry| entry.name == token).map(Viewer::of) else {
            return DashboardAnswer {
                status: StatusCode::FORBIDDEN.as_u16(),
                body: json!({"error": format!("no token {token:?} on this node: every node needs the same [serve.http] tokens")}),
            };
        };
        let response = match call {
            DashboardCall::Tasks => axum::Json(json!({"tasks": self.local_tasks(&viewer)})).into_response(),
            DashboardCall::Output { task_id, since } => self.output_here(&viewer, &task_id, since).await,
            DashboardCall::Kill { task_id } => self.kill_here(&viewer, &task_id).await,
        };
        let status = response.status().as_u16();
        let body = match axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES).await {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            Err(error) => json!({"error": format!("the answer could not be read: {error}")}),
        };
        DashboardAnswer { status, body }
    }

    /// This node's tasks `viewer` sees, as the page shows them.
    fn local_tasks(&self, viewer: &Viewer) -> Vec<Value> {
        self.visible_tasks(viewer).iter().map(task_json).collect()
    }

    /// `{"tasks": [...]}` of this node and, on a cluster, of every other
    /// live node (each task with its `node`; nodes that did not answer in
    /// `unreachable`).
    pub(super) async fn tasks_everywhere(&self, viewer: &Viewer) -> String {
        let Some(membership) = self.server.membership() else {
            return super::tasks_body(&self.visible_tasks(viewer));
        };
        let mut tasks = self.local_tasks(viewer);
        let here = membership.node_name().to_string();
        for task in &mut tasks {
            task["node"] = Value::String(here.clone());
        }
        let mut unreachable = Vec::new();
        let answers = match membership.ask_dashboards(&viewer.owner, &viewer.name, DashboardCall::Tasks).await {
            Ok(answers) => answers,
            Err(error) => {
                unreachable.push(json!({"node": "(every other node: the roster)", "error": error}));
                Vec::new()
            }
        };
        for (node, answer) in answers {
            match answer {
                Ok(DashboardAnswer { status: 200, body }) => {
                    let listed = body.get("tasks").and_then(Value::as_array).cloned().unwrap_or_default();
                    tasks.extend(listed.into_iter().map(|mut task| {
                        task["node"] = Value::String(node.clone());
                        task
                    }));
                }
                Ok(DashboardAnswer { body, .. }) => unreachable.push(json!({"node": node, "error": body["error"]})),
                Err(error) => unreachable.push(json!({"node": node, "error": error})),
            }
        }
        tasks.sort_by(|a, b| a["started_at_ms"].as_u64().cmp(&b["started_at_ms"].as_u64()));
        let mut body = json!({"tasks": tasks});
        if !unreachable.is_empty() {
            body["unreachable"] = Value::Array(unreachable);
        }
        body.to_string()
    }

    /// `call` answered by the node whose record holds task `id`, on a
    /// cluster; `None` when no other node has it.
    pub(super) async fn on_its_node(&self, viewer: &Viewer, id: &str, call: DashboardCall) -> Option<Response> {
        let membership = self.server.membership()?;
        match membership.ask_task_dashboard(&viewer.owner, &viewer.name, id, call).await? {
            Ok(DashboardAnswer { status, body }) => {
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
                Some((status, axum::Json(body)).into_response())
            }
            Err(refusal) => Some(error(StatusCode::SERVICE_UNAVAILABLE, refusal)),
        }
    }
}
