//! The environment a granted process sees.
//!
//! Layers, each overriding the one before: the host's environment (when the
//! grant inherits it) minus every variable whose name contains a scrub
//! pattern (case-insensitive); the model-friendly terminal defaults; the
//! grant's `env.set`; the spawn request's own entries. So an explicit entry
//! always wins and a credential never leaks by inheritance.

use std::collections::BTreeMap;
use std::ffi::OsString;

use super::grant::EnvPolicy;

/// A terminal that does not page, colour or ask questions: models read plain text.
pub const TERMINAL_DEFAULTS: [(&str, &str); 4] =
    [("NO_COLOR", "1"), ("TERM", "dumb"), ("PAGER", "cat"), ("GIT_PAGER", "cat")];

/// True when `name` matches one of the scrub patterns.
pub(crate) fn is_scrubbed(name: &str, patterns: &[String]) -> bool {
    let upper = name.to_ascii_uppercase();
    patterns.iter().any(|p| !p.is_empty() && upper.contains(&p.to_ascii_uppercase()))
}

/// Builds the complete environment of a process (it replaces, never extends,
/// the host's).
pub(crate) fn build_env(
    policy: &EnvPolicy,
    ambient: impl IntoIterator<Item = (OsString, OsString)>,
    explicit: &[(String, String)],
) -> BTreeMap<OsString, OsString> {
    let mut env = BTreeMap::new();
    if policy.inherit {
        for (name, value) in ambient {
            // A name that is not UTF-8 cannot be judged against the patterns:
            // leave it out rather than risk passing a credential through.
            let Some(text) = name.to_str() else { continue };
            if !is_scrubbed(text, &policy.scrub) {
                env.insert(name, value);
            }
        }
    }
    for (name, value) in TERMINAL_DEFAULTS {
        env.insert(name.into(), value.into());
    }
    for (name, value) in &policy.set {
        env.insert(name.into(), value.into());
    }
    for (name, value) in explicit {
        env.insert(name.into(), value.into());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect()
    }

    #[test]
    fn scrubs_credentials_and_sets_terminal_defaults() {
        let policy = EnvPolicy::default();
        let env = build_env(
            &policy,
            os(&[
                ("HOME", "/root"),
                ("OPENAI_API_KEY", "x"),
                ("db_password", "y"),
                ("GH_TOKEN", "z"),
                ("TERM", "xterm"),
            ]),
            &[],
        );
        assert_eq!(env.get(OsString::from("HOME").as_os_str()).unwrap(), "/root");
        assert!(!env.contains_key(OsString::from("OPENAI_API_KEY").as_os_str()));
        assert!(!env.contains_key(OsString::from("db_password").as_os_str()));
        assert!(!env.contains_key(OsString::from("GH_TOKEN").as_os_str()));
        assert_eq!(env.get(OsString::from("TERM").as_os_str()).unwrap(), "dumb");
        assert_eq!(env.get(OsString::from("NO_COLOR").as_os_str()).unwrap(), "1");
    }

    #[test]
    fn explicit_entries_win_over_scrub_and_defaults() {
        let mut policy = EnvPolicy::default();
        policy.set.insert("SERVICE_TOKEN".into(), "from-config".into());
        policy.scrub = vec!["HOME".into()];
        let env = build_env(
            &policy,
            os(&[("HOME", "/root"), ("API_KEY", "kept: not a pattern now")]),
            &[("PAGER".into(), "less".into())],
        );
        assert!(!env.contains_key(OsString::from("HOME").as_os_str()));
        assert!(env.contains_key(OsString::from("API_KEY").as_os_str()));
        assert_eq!(env.get(OsString::from("SERVICE_TOKEN").as_os_str()).unwrap(), "from-config");
        assert_eq!(env.get(OsString::from("PAGER").as_os_str()).unwrap(), "less");
    }

    #[test]
    fn no_inheritance_keeps_only_explicit_layers() {
        let policy = EnvPolicy { inherit: false, ..EnvPolicy::default() };
        let env = build_env(&policy, os(&[("HOME", "/root")]), &[]);
        assert_eq!(env.len(), TERMINAL_DEFAULTS.len());
    }
}
