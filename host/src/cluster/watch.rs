//! Watching the other nodes: a node whose heartbeat this node has not seen
//! change for `node_timeout_ms` is declared gone (fenced in the roster),
//! and its live tasks are settled lost ([`super::sweep`]).
//!
//! Invariants:
//! - Silence is measured by this node's own clock, across rounds that ran
//!   back to back: after a failed read, or a gap in its own rounds (it was
//!   paused, or starved), it counts from zero again, so its own outage never
//!   passes for another's silence; and it judges only while it holds its
//!   own lease.
//! - The fence is a compare-and-set over the very beat it saw last: a node
//!   that beat meanwhile is not fenced.
//! - A fenced node whose records were not all settled (its settler died
//!   midway) is swept by any node that sees it so for a whole timeout.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::membership::Membership;
use super::roster::{self, NodeEntry};
use super::{output, sweep};

/// Starts watching on the cluster client's runtime.
pub fn start(membership: Arc<Membership>) {
    let client = membership.client.clone();
    client.spawn(async move { watch(membership).await });
}

async fn watch(membership: Arc<Membership>) {
    let me = membership.node.clone();
    let interval = membership.beat_interval();
    // node → (session, beat) last seen, and since when.
    let mut pulses: HashMap<String, ((String, u64), Instant)> = HashMap::new();
    // node → since when it is seen fenced with records not all settled.
    let mut unswept: HashMap<String, Instant> = HashMap::new();
    let mut last_round: Option<Instant> = None;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let roster = match roster::read(&membership.bucket).await {
            Ok(roster) => roster,
            Err(error) => {
                tracing::debug!(node = %me, %error, "the roster could not be read; silence is counted again from the next read");
                last_round = None;
                continue;
            }
        };
        let now = Instant::now();
        let back_to_back = last_round.is_some_and(|at| now.duration_since(at) <= interval * 2);
        last_round = Some(now);
        if !back_to_back || !membership.holds_lease() {
            pulses.clear();
            unswept.clear();
            continue;
        }
        pulses.retain(|name, _| roster.nodes.contains_key(name));
        unswept.retain(|name, _| roster.nodes.contains_key(name));
        for (name, entry) in &roster.nodes {
            if name == &me {
                continue;
            }
            match &entry.fenced_by {
                None => {
                    unswept.remove(name);
                    let pulse = (entry.session.clone(), entry.beat);
                    let since = match pulses.get(name) {
                        Some((seen, since)) if *seen == pulse => *since,
                        _ => {
                            pulses.insert(name.clone(), (pulse, now));
                            now
                        }
                    };
                    let silent = now.duration_since(since);
                    if silent >= membership.timeout {
                        fence(&membership, name, entry, silent).await;
                        pulses.remove(name);
                    }
                }
                Some(by) if !entry.swept => {
                    pulses.remove(name);
                    let since = *unswept.entry(name.clone()).or_insert(now);
                    if by == &me || now.duration_since(since) >= membership.timeout {
                        settle_gone(&membership, name).await;
                    }
                }
                Some(_) => {
                    pulses.remove(name);
                    unswept.remove(name);
                }
            }
        }
    }
}

/// Declares `name` gone if its entry still shows the beat seen last, then
/// settles its tasks.
async fn fence(membership: &Membership, name: &str, seen: &NodeEntry, silent: std::time::Duration) {
    let me = membership.node.clone();
    let fenced =
        roster::update(&membership.bucket, "declaring a silent node gone", |roster| match roster.nodes.get_mut(name) {
            Some(entry) if entry.pulse() == seen.pulse() && entry.fenced_by.is_none() => {
                entry.fenced_by = Some(me.clone());
                Ok(Some(()))
            }
            _ => Ok(None),
        })
        .await;
    match fenced {
        Ok(Some(())) => {
            tracing::warn!(node = %me, gone = name, silent_ms = silent.as_millis() as u64, "a silent node is declared gone");
            settle_gone(membership, name).await;
        }
        Ok(None) => {
            tracing::debug!(node = %me, other = name, "the silent node beat, or another node declared it gone first")
        }
        Err(error) => tracing::warn!(node = %me, other = name, %error, "a silent node could not be declared gone"),
    }
}

/// Settles a gone node's live tasks, takes in the ones this node settled,
/// and marks the node swept.
async fn settle_gone(membership: &Membership, name: &str) {
    let me = membership.node.clone();
    match sweep::sweep(&membership.bucket, name, &me, membership.timeout_ms()).await {
        Ok(settled) => {
            tracing::warn!(node = %me, gone = name, settled = settled.len(), "a gone node's live tasks are settled");
            let mut taken = Vec::with_capacity(settled.len());
            for task in settled {
                if !membership.copy_output {
                    taken.push((task, None));
                    continue;
                }
                let js = membership.bucket.jetstream();
                let output = match output::replay(js, &membership.cluster, membership.bucket.name(), &task.id).await {
                    Ok(output) => output,
                    Err(error) => {
                        tracing::warn!(node = %me, gone = name, task = %task.id, %error, "a gone node's task is taken in without its output");
                        None
                    }
                };
                taken.push((task, output));
            }
            membership.take_in(taken);
        }
        Err(error) => {
            tracing::warn!(node = %me, gone = name, %error, "a gone node's tasks could not all be settled; trying again");
            return;
        }
    }
    let marked =
        roster::update(&membership.bucket, "marking a gone node swept", |roster| match roster.nodes.get_mut(name) {
            Some(entry) if entry.fenced_by.is_some() && !entry.swept => {
                entry.swept = true;
                Ok(Some(()))
            }
            _ => Ok(None),
        })
        .await;
    if let Err(error) = marked {
        tracing::warn!(node = %me, gone = name, %error, "a gone node could not be marked swept");
    }
}
