//! Clock helpers over `wasi:clocks/monotonic-clock`: the time source and the
//! pollables a task hands back from `subscribe`.
//!
//! An [`Instant`] is nanoseconds on the host's monotonic clock, comparable
//! only with other instants from it. Compute deadlines from a fixed start
//! instant (`start + n * interval`) rather than "now + interval" so that
//! periodic work does not drift.
//!
//! Every function returns a fresh [`Pollable`]; the host owns the waiting.

use core::time::Duration;

use crate::Pollable;
use crate::monotonic_clock;

/// Nanoseconds on the host's monotonic clock.
pub type Instant = monotonic_clock::Instant;

/// The current instant.
pub fn now() -> Instant {
    monotonic_clock::now()
}

/// A pollable that is ready at once. Return it from `subscribe` when `done`
/// already has an outcome (finished or cancelled), so the host calls `done`
/// without waiting.
pub fn ready_now() -> Pollable {
    monotonic_clock::subscribe_duration(0)
}

/// A pollable that becomes ready `delay` from now.
pub fn after(delay: Duration) -> Pollable {
    monotonic_clock::subscribe_duration(nanos(delay))
}

/// A pollable that becomes ready at `instant` (at once if it has passed).
pub fn at(instant: Instant) -> Pollable {
    monotonic_clock::subscribe_instant(instant)
}

/// `duration` in whole nanoseconds, saturating at `u64::MAX` (about 584
/// years), which is the unit of [`Instant`] arithmetic.
pub fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
