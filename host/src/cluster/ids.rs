//! Task id counters shared by every node: `counter.<kind>` holds the last
//! number any node took for a kind, raised only by compare-and-set. A node
//! takes [`ID_BLOCK`] numbers at once and issues them itself, so most starts
//! touch no counter; ids of different nodes interleave by blocks (node a
//! issues bash-1 … bash-16 while node b issues bash-17 …).
//!
//! Invariants: a number is issued to one caller only (two nodes racing for
//! the same counter: one raise wins, the other reads again); a counter
//! never goes down, and outlives every record, so an id is never reused
//! (the numbers left in a block when its node stops are skipped).

use taskhost_core::tasks::store::StoreError;

use super::bucket::{Bucket, Change};

/// Numbers a node takes from a kind's counter at once.
pub const ID_BLOCK: u64 = 16;

/// A node's block of numbers for a kind: `next` to `last`, not issued yet.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    pub next: u64,
    pub last: u64,
}

fn counter_key(kind: &str) -> String {
    format!("counter.{kind}")
}

/// The kind a counter key is of.
pub fn kind_of(key: &str) -> Option<&str> {
    key.strip_prefix("counter.")
}

/// Raises `kind`'s counter to `want(last)` (which must exceed `last` to
/// change it) and returns the number then stored: the new one when this
/// call raised it, or the stored one when it was already at least that.
pub async fn raise(bucket: &Bucket, kind: &str, want: impl Fn(u64) -> u64) -> Result<u64, StoreError> {
    let doing = format!("raising the {kind} id counter");
    // A try whose answer was lost but was applied shows as a conflict next
    // time: the number it wrote is skipped, never issued twice.
    bucket
        .update(&counter_key(kind), &doing, |value| {
            let last = value.map_or(Ok(0), |value| parse(value, kind))?;
            let next = want(last);
            Ok(if next <= last { Change::Keep(last) } else { Change::Write(next.to_string().into(), next) })
        })
        .await
}

/// A counter's stored number.
pub fn parse(value: &[u8], kind: &str) -> Result<u64, StoreError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| StoreError::new(format!("cluster: the {kind} id counter holds no number")))
}
