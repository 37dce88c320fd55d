//! Branded identifiers.
//!
//! `TaskId` is `<kind>-N`, issued by the registry from a per-kind counter.
//! `SessionId` names an agent's session and is the unit of owner isolation.
//! `AgentId` names a live agent slot in the [`crate::agents::AgentRegistry`];
//! an id can be reused after disposal, so identity is the agent *instance*,
//! never the id alone. The newtypes keep these strings from being mixed up.

use std::fmt;
use std::sync::Arc;

macro_rules! branded_string {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(value: impl Into<Arc<str>>) -> Self {
                Self(value.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self::new(value)
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self::new(value)
            }
        }
    };
}

branded_string!(
    /// A registry-issued task id, `<kind>-N`.
    TaskId
);
branded_string!(
    /// The id of an agent's session: the owner of the tasks the agent starts.
    SessionId
);
branded_string!(
    /// The id under which an agent is registered; reusable after disposal.
    AgentId
);

impl TaskId {
    /// The id `<kind>-<n>`, formatted without the `fmt` machinery (one is
    /// issued per start). `kind` is a valid kind, so at most 64 bytes.
    pub(crate) fn issue(kind: &str, n: u64) -> Self {
        if kind.len() > 64 {
            return Self::new(format!("{kind}-{n}"));
        }
        let mut buffer = [0u8; 64 + 1 + 20];
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut rest = n;
        loop {
            at -= 1;
            digits[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        let digits = &digits[at..];
        let len = kind.len() + 1 + digits.len();
        buffer[..kind.len()].copy_from_slice(kind.as_bytes());
        buffer[kind.len()] = b'-';
        buffer[kind.len() + 1..len].copy_from_slice(digits);
        // ASCII digits and '-' after a whole `str`.
        Self::new(std::str::from_utf8(&buffer[..len]).expect("a kind, '-' and digits are UTF-8"))
    }
}

/// Whether `kind` is usable as a task kind (and so as an id prefix).
///
/// Lowercase ASCII letters, digits, `_` and `-`, starting with a letter, at
/// most 64 bytes: ids stay readable in transcripts and unambiguous to parse.
pub fn is_valid_kind(kind: &str) -> bool {
    let mut chars = kind.chars();
    matches!(chars.next(), Some('a'..='z'))
        && kind.len() <= 64
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_ids_are_kind_dash_number() {
        assert_eq!(TaskId::issue("bash", 1).as_str(), "bash-1");
        assert_eq!(TaskId::issue("subagent_fork", 0).as_str(), "subagent_fork-0");
        assert_eq!(TaskId::issue("t", 1_234_567_890).as_str(), "t-1234567890");
        assert_eq!(TaskId::issue("t", u64::MAX).as_str(), format!("t-{}", u64::MAX));
        let long = "a".repeat(64);
        assert_eq!(TaskId::issue(&long, 42).as_str(), format!("{long}-42"));
    }

    #[test]
    fn kinds() {
        assert!(is_valid_kind("bash"));
        assert!(is_valid_kind("subagent_fork"));
        assert!(!is_valid_kind(""));
        assert!(!is_valid_kind("Bash"));
        assert!(!is_valid_kind("1bash"));
        assert!(!is_valid_kind("ba sh"));
        assert!(!is_valid_kind(&"a".repeat(65)));
    }
}
