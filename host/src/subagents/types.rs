//! The vocabulary of a child run: how it stopped and what it answered.
//!
//! The stop reason set is merge-extensible: anything a backend reports that is
//! not one of the five named reasons travels as [`StopReason::Other`] and is
//! never silently mapped to success.

use std::fmt;

/// Why a child run stopped.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The child finished its turn normally.
    Completed,
    /// The run was cancelled (by `cancel`, `task_kill`, or disposal).
    Aborted,
    /// The backend failed (transport, HTTP status, protocol); see the detail.
    Error,
    /// The model hit its output token limit.
    MaxTokens,
    /// The model refused.
    Refusal,
    /// Any other reason a backend reported, verbatim.
    Other(String),
}

impl StopReason {
    /// Parses the names used in configuration and logs: `completed`,
    /// `aborted`, `error`, `max-tokens`, `refusal`; anything else is `Other`.
    pub fn parse(name: &str) -> Self {
        match name {
            "completed" => Self::Completed,
            "aborted" => Self::Aborted,
            "error" => Self::Error,
            "max-tokens" => Self::MaxTokens,
            "refusal" => Self::Refusal,
            other => Self::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Completed => "completed",
            Self::Aborted => "aborted",
            Self::Error => "error",
            Self::MaxTokens => "max-tokens",
            Self::Refusal => "refusal",
            Self::Other(other) => other,
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of a child run: its final message and why it stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunResult {
    /// The child's final message text (may be empty, e.g. when aborted).
    pub text: String,
    pub stop_reason: StopReason,
    /// What went wrong or why it stopped, when there is more to say than the
    /// reason: an HTTP status and body excerpt, a cancellation reason.
    pub detail: Option<String>,
}

impl RunResult {
    pub fn completed(text: impl Into<String>) -> Self {
        Self { text: text.into(), stop_reason: StopReason::Completed, detail: None }
    }

    pub fn error(detail: impl Into<String>) -> Self {
        Self { text: String::new(), stop_reason: StopReason::Error, detail: Some(detail.into()) }
    }

    pub fn aborted(reason: Option<String>) -> Self {
        Self { text: String::new(), stop_reason: StopReason::Aborted, detail: reason }
    }

    pub fn stopped(text: impl Into<String>, stop_reason: StopReason) -> Self {
        Self { text: text.into(), stop_reason, detail: None }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// `max-tokens`, `error: HTTP 500 …`: the reason with its detail, for
    /// status lines and error results.
    pub fn reason_text(&self) -> String {
        match &self.detail {
            Some(detail) if !detail.is_empty() => format!("{}: {detail}", self.stop_reason),
            _ => self.stop_reason.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_round_trip_and_unknown_reasons_stay_other() {
        for name in ["completed", "aborted", "error", "max-tokens", "refusal"] {
            assert_eq!(StopReason::parse(name).as_str(), name);
            assert!(!matches!(StopReason::parse(name), StopReason::Other(_)));
        }
        assert_eq!(StopReason::parse("context-overflow"), StopReason::Other("context-overflow".into()));
        assert_eq!(RunResult::error("HTTP 500").reason_text(), "error: HTTP 500");
        assert_eq!(RunResult::stopped("x", StopReason::MaxTokens).reason_text(), "max-tokens");
    }
}
