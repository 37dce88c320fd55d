//! Task id counters shared by every node: `counter.<kind>` holds the last
//! number issued for a kind, raised only by compare-and-set on its revision.
//!
//! Invariants: a number is issued to one caller only (two nodes racing for
//! the same revision: one update wins, the other reads again); a counter
//! never goes down, and outlives every record, so an id is never reused.

use taskhost_core::tasks::store::StoreError;

use super::bucket::{Bucket, Patience, WriteError};

/// How many lost races one call takes before it gives up (each lost race
/// means another node issued a number meanwhile).
const MAX_RACES: usize = 1_000;

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
    let key = counter_key(kind);
    let doing = format!("raising the {kind} id counter");
    let mut patience = Patience::starting_now();
    let mut races = 0;
    loop {
        let read = async { Ok::<_, String>((bucket.last_sequence().await?, bucket.read(&key).await?)) };
        let (sequence, entry) = match read.await {
            Ok(read) => read,
            Err(error) => {
                patience.again(&doing, error).await?;
                continue;
            }
        };
        let last = match &entry {
            Some((value, _)) => parse(value, kind)?,
            None => 0,
        };
        let next = want(last);
        if next <= last {
            return Ok(last);
        }
        // A try whose answer was lost but was applied shows as a conflict
        // next time: the number it wrote is skipped, never issued twice.
        match bucket.write(&key, next.to_string().into(), sequence).await {
            Ok(_) => return Ok(next),
            Err(WriteError::Conflict) => {
                races += 1;
                if races > MAX_RACES {
                    return Err(StoreError::new(format!("cluster: {doing} lost {MAX_RACES} races in a row; retry")));
                }
            }
            Err(WriteError::Failed(error)) => patience.again(&doing, error).await?,
        }
    }
}

/// A counter's stored number.
pub fn parse(value: &[u8], kind: &str) -> Result<u64, StoreError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| StoreError::new(format!("cluster: the {kind} id counter holds no number")))
}
