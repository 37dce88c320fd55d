//! Who asked a task to stop: data on the task and its settlement, from
//! which every surface words an end the owner's model did not ask for.
//!
//! Invariant: surfaces word the end from [`StopCause`], never from a
//! reason string; only [`StopCause::Owner`] is an end the model asked for.

/// Who asked a task to stop. Data on the task (and its settlement), so
/// surfaces word the end from it, never from a reason string.
///
/// Only [`StopCause::Owner`] is an end the owner's model asked for: the
/// kill's own answer reports it. Every other cause is an end the model did
/// not ask for, and its owner is told with one completion notice
/// ([`crate::notices::completion_notice`]: `… was killed from the
/// dashboard [status: killed, …]`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "by", rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopCause {
    /// The owner, in its own session: the model's `task_kill`, an MCP
    /// client's `tasks/cancel`, a console's Ctrl-C.
    Owner,
    /// A viewer of the web dashboard (the name of its token).
    Dashboard { viewer: String },
    /// The task outlived its time to live.
    TimeToLive { ttl_ms: u64 },
    /// A limit the server enforces (the limit's name, e.g. its setting).
    Limit { limit: String },
    /// An operator's action on the server (what it was).
    Operator { action: String },
}

impl StopCause {
    /// Whether the stop is the owner's own request, which its answer
    /// reports (no notice follows).
    pub fn is_owner(&self) -> bool {
        matches!(self, Self::Owner)
    }

    /// How a notice tells a `killed` (or force-failed) end:
    /// `was killed from the dashboard`.
    pub fn ended_phrase(&self) -> String {
        match self {
            Self::Owner => "was killed at your request".to_string(),
            Self::Dashboard { .. } => "was killed from the dashboard".to_string(),
            Self::TimeToLive { ttl_ms } => {
                format!(
                    "was stopped when its time to live ({} s) ran out",
                    crate::tasks::seconds(std::time::Duration::from_millis(*ttl_ms))
                )
            }
            Self::Limit { limit } => format!("was stopped by a server limit ({limit})"),
            Self::Operator { action } => format!("was stopped by an operator ({action})"),
        }
    }
}
