//! `[cluster] placement = "spread"`: which node runs a stable owner's
//! background start: the live node with the fewest live tasks that serves
//! the tool, counting the starts this node sent each node since its last
//! beat (beats carry a node's live count); ties are taken in turn.
//!
//! The tally ([`super::membership::Placed`]) lives with the membership.
//!
//! Invariants: a fenced node, or one that does not serve the tool (a
//! `[[producer]]` whose `node_labels` it lacks), is never chosen; this node
//! is chosen when no other qualifies (or the roster cannot be read: the
//! start then runs here, as with `local`, and a tool it does not serve is
//! refused as unknown).

use std::sync::Arc;

use super::membership::Membership;
use super::roster;

impl Membership {
    /// The node that should run a background start of `tool`.
    pub(super) async fn place(self: &Arc<Self>, tool: &str) -> String {
        let membership = self.clone();
        let roster = match self.on_client(async move { roster::read(&membership.bucket).await }).await {
            Ok(Ok(roster)) => roster,
            _ => return self.node.clone(),
        };
        // This node's tools as last counted (none counted yet: it serves it).
        let served_here = self
            .load
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(|(_, tools)| tools.iter().any(|served| served == tool));
        let mut placed = self.placed.lock().unwrap_or_else(|e| e.into_inner());
        let mut candidates: Vec<(u64, &String)> = Vec::new();
        for (name, entry) in &roster.nodes {
            let serves = if name == &self.node { served_here } else { entry.tools.iter().any(|served| served == tool) };
            if entry.fenced_by.is_some() || !serves {
                continue;
            }
            let sent = match placed.since_beat.get(name) {
                Some((beat, sent)) if *beat == entry.beat => *sent,
                _ => 0,
            };
            candidates.push((entry.live.saturating_add(sent), name));
        }
        let Some(fewest) = candidates.iter().map(|(load, _)| *load).min() else { return self.node.clone() };
        let tied: Vec<&String> = candidates.iter().filter(|(load, _)| *load == fewest).map(|(_, name)| *name).collect();
        let chosen = tied[placed.turn % tied.len()].clone();
        placed.turn = placed.turn.wrapping_add(1);
        let beat = roster.nodes.get(&chosen).map_or(0, |entry| entry.beat);
        let slot = placed.since_beat.entry(chosen.clone()).or_insert((beat, 0));
        if slot.0 != beat {
            *slot = (beat, 0);
        }
        slot.1 += 1;
        chosen
    }
}
