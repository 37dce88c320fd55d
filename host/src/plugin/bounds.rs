//! Bounds on what a plugin hands the host: every string it returns, and how
//! often a task that never finishes may be polled.
//!
//! Model: a guest's memory cap bounds one string to tens of MiB, still far
//! more than any model context, log or status line should carry. Each
//! string is cut where the host takes it over, at a UTF-8 boundary, with a
//! visible notice saying what was cut and by how much, so nobody mistakes a
//! truncated text for the whole. A parameter schema cannot be cut (it would
//! no longer be JSON): one over its bound refuses the plugin.
//!
//! | what | bound | over it |
//! | --- | --- | --- |
//! | description (`describe`) | [`MAX_DESCRIPTION_BYTES`] | truncated, notice |
//! | parameter schema (`describe`) | [`MAX_SCHEMA_BYTES`] | plugin refused |
//! | label (`label`) | [`MAX_LABEL_BYTES`], then one line of 200 chars | truncated |
//! | outcome detail (`done`) | [`MAX_DETAIL_BYTES`] | truncated, notice |
//! | error message (`describe`, `label`, `run`) | [`MAX_DETAIL_BYTES`] | truncated, notice |
//! | each `read-output` result, final output | [`MAX_CHUNK_BYTES`] | truncated, notice, warning |
//! | each log line (`host-log`) | [`MAX_LOG_LINE_BYTES`] | truncated, notice |
//! | forwarded process output not yet in the task's log (`process.forward-output`) | [`MAX_FORWARDED_WAITING_BYTES`] | the process's next write waits |
//!
//! A task whose pollable is ready at once (in less than [`SPIN_WAIT`])
//! while `done` keeps answering `none` is backed off: after [`SPIN_ROUNDS`]
//! such rounds in a row, the driver waits [`BACKOFF_MIN`] before the next,
//! doubling up to [`BACKOFF_MAX`]. A read or cancel from a client, or a
//! round that really waited (at least [`IDLE_WAIT`]), starts the count
//! again; a round in between leaves it as it is. So a task that sleeps
//! between events is never slowed, and one that spins cannot escape the
//! back-off because a loaded machine delayed one of its rounds.

use std::time::Duration;

/// Longest tool description kept, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 16 * 1024;
/// Longest parameter schema accepted, in bytes of JSON.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Longest label taken from a plugin, in bytes (then flattened to one line
/// of at most 200 characters).
pub const MAX_LABEL_BYTES: usize = 1024;
/// Longest outcome detail or error message kept, in bytes.
pub const MAX_DETAIL_BYTES: usize = 4 * 1024;
/// Longest `read-output` result (or final output) kept, in bytes. The
/// contract asks plugins for incremental chunks; more than this at once is a
/// violation.
pub const MAX_CHUNK_BYTES: usize = 1024 * 1024;
/// Forwarded output waiting for the host's drain into the task's log, in
/// bytes, beyond which the forwarding reader waits (and so the program's
/// writes). Small, so a live streaming task holds little: the drain takes
/// it within one wake-up.
pub const MAX_FORWARDED_WAITING_BYTES: usize = 256 * 1024;
/// Longest log line kept, in bytes.
pub const MAX_LOG_LINE_BYTES: usize = 8 * 1024;

/// Rounds of "ready at once, still not done" tolerated before backing off.
pub const SPIN_ROUNDS: u32 = 16;
/// The first back-off delay.
pub const BACKOFF_MIN: Duration = Duration::from_millis(1);
/// The longest back-off delay.
pub const BACKOFF_MAX: Duration = Duration::from_millis(100);
/// A readiness wait shorter than this is no wait: the round spun.
pub const SPIN_WAIT: Duration = Duration::from_millis(1);
/// A readiness wait at least this long is a real one: the count restarts.
pub const IDLE_WAIT: Duration = BACKOFF_MAX;

/// The delay before the next round after `empty_rounds` rounds in a row
/// that were ready at once and not done; zero up to [`SPIN_ROUNDS`].
pub fn backoff(empty_rounds: u32) -> Duration {
    if empty_rounds < SPIN_ROUNDS {
        return Duration::ZERO;
    }
    let doublings = (empty_rounds - SPIN_ROUNDS).min(16);
    (BACKOFF_MIN * 2u32.pow(doublings)).min(BACKOFF_MAX)
}

/// `text` cut to at most `max` bytes (at a character boundary) with a notice
/// naming `what` appended; `text` itself when it fits.
pub fn cap(mut text: String, max: usize, what: &str) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(&format!("… [taskhost: {what} truncated to {cut} of {total} bytes; the limit is {max}]"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_cuts_at_a_char_boundary_with_a_notice() {
        assert_eq!(cap("short".into(), 10, "label"), "short");
        let capped = cap("ééééé".into(), 5, "detail");
        assert_eq!(capped, "éé… [taskhost: detail truncated to 4 of 10 bytes; the limit is 5]");
    }

    #[test]
    fn backoff_starts_after_the_spin_rounds_and_is_capped() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(SPIN_ROUNDS - 1), Duration::ZERO);
        assert_eq!(backoff(SPIN_ROUNDS), BACKOFF_MIN);
        assert_eq!(backoff(SPIN_ROUNDS + 3), Duration::from_millis(8));
        assert_eq!(backoff(SPIN_ROUNDS + 100), BACKOFF_MAX);
    }
}
