//! Completion notices across nodes: an owner connected to one node is told
//! of the ends of its tasks that another node settled, with the answer to
//! its next call there, whatever that call is.
//!
//! Model: a node that holds a stable owner's notice (its task ended there,
//! or it took in a gone node's task of that owner) publishes a *hint* on
//! `taskhost.<cluster>.unread`: "node a holds unread notices for session
//! s". Every node keeps the hints it hears (session → nodes). When the
//! owner calls a node that holds hints for it, that node first takes the
//! notices from each hinted node (a forwarded [`TAKE_NOTICES`] call, which
//! drains the owner's unread messages there) and adds them to its answer.
//!
//! Invariants:
//! - Each notice is told once: it stays in the owner's unread messages on
//!   the node that holds it until one surface takes it (that node's own
//!   answer, a forwarded call's, or a [`TAKE_NOTICES`] drain, which is
//!   answered from its first run when asked again).
//! - A hint is only a pointer (core NATS, at most once): a lost one leaves
//!   the notice where it is, told by that node's next answer to the owner
//!   or by the owner's next listing, which asks every node.
//! - Bounds: `membership::MAX_HINTED_SESSIONS` sessions' hints (all
//!   dropped when full, as above), a hint at most [`MAX_HINT_BYTES`].

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use taskhost_core::agents::Agent;
use taskhost_core::tasks::{ListenerGuard, TaskDone};

use super::membership::Membership;

/// The forwarded call that takes the owner's unread notices on a node.
pub(super) const TAKE_NOTICES: &str = "taskhost/take-notices";
/// The largest hint a node reads.
const MAX_HINT_BYTES: usize = 4_096;
/// How long a node that holds notices has to hand them over.
const TAKE_WITHIN: Duration = Duration::from_secs(3);

/// "node holds unread notices for session".
#[derive(Serialize, Deserialize)]
struct Hint {
    node: String,
    session: String,
}

fn hint_subject(cluster: &str) -> String {
    format!("taskhost.{cluster}.unread")
}

/// Publishes hints for one node.
#[derive(Clone)]
pub(super) struct Hinter {
    node: String,
    subject: String,
    nats: async_nats::Client,
    /// The cluster client's runtime.
    client: tokio::runtime::Handle,
}

impl Hinter {
    /// Publishes that this node holds unread notices for `session`.
    pub(super) fn hint(&self, session: &str) {
        let hint = Hint { node: self.node.clone(), session: session.to_string() };
        let payload: bytes::Bytes = serde_json::to_vec(&hint).expect("a hint serializes").into();
        let (nats, subject) = (self.nats.clone(), self.subject.clone());
        self.client.spawn(async move {
            if let Err(error) = nats.publish(subject, payload).await {
                tracing::debug!(%error, "a notice hint was not published (the notice waits on this node)");
            }
        });
    }
}

impl Membership {
    pub(super) fn hinter(&self) -> Hinter {
        Hinter {
            node: self.node.clone(),
            subject: hint_subject(&self.cluster),
            nats: self.bucket.client(),
            client: self.client.clone(),
        }
    }

    /// Starts hinting, for as long as the node lives, at every end of a
    /// stable owner's task on `host` that its owner was not told of
    /// otherwise (its notice waits in the owner's unread messages here),
    /// and keeping the hints other nodes publish.
    pub(super) fn start_hinting(self: &Arc<Self>, host: &taskhost_core::Host) {
        let hinter = self.hinter();
        let guard: ListenerGuard = host.registry().on_task_done(Arc::new(move |done: &TaskDone| {
            let Some(owner) = done.owner.as_ref().filter(|owner| owner.is_durable()) else { return };
            if !done.snapshot.reported {
                hinter.hint(owner.session().as_str());
            }
        }));
        if self.hinting.set(guard).is_ok() {
            self.listen_for_hints();
        }
    }

    /// Keeps the hints other nodes publish, until the client closes.
    fn listen_for_hints(self: &Arc<Self>) {
        let membership = self.clone();
        let client = self.bucket.client();
        self.client.spawn(async move {
            let mut hints = match client.subscribe(hint_subject(&membership.cluster)).await {
                Ok(hints) => hints,
                Err(error) => {
                    tracing::error!(node = %membership.node, %error, "cannot hear of notices held on other nodes");
                    return;
                }
            };
            while let Some(message) = hints.next().await {
                if message.payload.len() > MAX_HINT_BYTES {
                    continue;
                }
                let Ok(hint) = serde_json::from_slice::<Hint>(&message.payload) else { continue };
                if hint.node != membership.node {
                    let Hint { node: holder, session } = hint;
                    membership.hints.add(session.clone(), holder.clone());
                    tracing::debug!(node = %membership.node, %holder, owner = %session, "another node holds notices for an owner");
                }
            }
        });
    }

    /// The notices other nodes hold for `owner` that hints pointed to,
    /// taken from them (each told here, once). A node that does not hand
    /// them over in time keeps them (a listing, which asks every node, or
    /// that node's next answer tells them).
    pub async fn notices_held_elsewhere(self: &Arc<Self>, owner: &Agent) -> Vec<String> {
        if !owner.is_durable() {
            return Vec::new();
        }
        let session = owner.session().as_str();
        let holders = self.hints.take(session);
        if holders.is_empty() {
            return Vec::new();
        }
        let asked = holders
            .iter()
            .map(|node| self.forward(node, owner, TAKE_NOTICES, serde_json::Value::Null, Duration::ZERO, TAKE_WITHIN));
        let mut notices = Vec::new();
        for (node, answer) in holders.iter().zip(futures::future::join_all(asked).await) {
            if answer.output.is_error {
                // Not asked again at every call (a dead node would slow
                // each one down): the notices wait there for a listing.
                tracing::info!(node = %self.node, holder = %node, error = %answer.output.text, "notices held on another node were not taken");
            }
            notices.extend(answer.notices);
        }
        notices
    }
}
