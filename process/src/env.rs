//! The environment a granted process sees.
//!
//! Model: the host's environment is not inherited, it is *allowed through*
//! by name. Layers, each overriding the one before:
//! 1. from the host's environment (when the grant inherits at all), only the
//!    variables named by [`DEFAULT_PASS`] or the grant's `env.pass`
//!    (exact names, or `PREFIX*` patterns), minus the scrub (below);
//! 2. the model-friendly terminal defaults ([`TERMINAL_DEFAULTS`]);
//! 3. the grant's `env.set`;
//! 4. the spawn request's own entries.
//!
//! The scrub is a second line behind the allowlist: an allowed variable is
//! still dropped when its name contains a scrub pattern (case-insensitive:
//! `KEY`, `TOKEN`, `PASSWORD`, `_PWD`, `AUTH`, `DSN`, `DATABASE_URL`, ...) or
//! its value is a URL with a password in it (`http://user:pass@proxy`). Only a
//! grant that names the variable exactly in `env.pass` passes it anyway: a
//! pattern such as `*` or `DBUS_*` never lets a credential through.
//!
//! Invariant: the result replaces the host's environment, never extends it;
//! so a credential or a host socket address (`SSH_AUTH_SOCK`, `TMUX`,
//! `DBUS_SESSION_BUS_ADDRESS`, `XDG_RUNTIME_DIR`) reaches a command only when
//! the configuration names it.

use std::collections::BTreeMap;
use std::ffi::OsString;

use super::grant::EnvPolicy;
use super::grant::pattern_matches;

/// A terminal that does not page, colour or ask questions: models read plain text.
pub const TERMINAL_DEFAULTS: [(&str, &str); 4] =
    [("NO_COLOR", "1"), ("TERM", "dumb"), ("PAGER", "cat"), ("GIT_PAGER", "cat")];

/// Host variables every grant that inherits lets through (`LC_*` is a
/// pattern): what a shell and ordinary programs need to find programs and
/// speak the user's locale, and nothing that addresses a host service.
pub const DEFAULT_PASS: [&str; 8] = ["PATH", "HOME", "LANG", "LC_*", "TERM", "TZ", "USER", "SHELL"];

/// True when `name` matches one of the scrub patterns.
pub(crate) fn is_scrubbed(name: &str, patterns: &[String]) -> bool {
    let upper = name.to_ascii_uppercase();
    patterns.iter().any(|p| !p.is_empty() && upper.contains(&p.to_ascii_uppercase()))
}

/// True when `value` holds a URL with a password (`scheme://user:pass@host`),
/// the way proxies and database URLs carry credentials.
pub(crate) fn has_url_credentials(value: &str) -> bool {
    value.split_whitespace().any(|word| {
        let Some((scheme, rest)) = word.split_once("://") else { return false };
        let scheme_ok = scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        scheme_ok && authority.rsplit_once('@').is_some_and(|(userinfo, _)| userinfo.contains(':'))
    })
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
            // A name that is not UTF-8 cannot be judged against the lists:
            // leave it out rather than risk passing a credential through.
            let Some(text) = name.to_str() else { continue };
            let named_exactly = policy.pass.iter().any(|p| p == text);
            let allowed = named_exactly
                || DEFAULT_PASS.iter().any(|p| pattern_matches(p, text))
                || policy.pass.iter().any(|p| pattern_matches(p, text));
            if !allowed {
                continue;
            }
            let credential = is_scrubbed(text, &policy.scrub) || has_url_credentials(&value.to_string_lossy());
            if credential && !named_exactly {
                continue;
            }
            env.insert(name, value);
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

    fn get<'a>(env: &'a BTreeMap<OsString, OsString>, name: &str) -> Option<&'a str> {
        env.get(OsString::from(name).as_os_str()).map(|v| v.to_str().unwrap())
    }

    /// What an ordinary desktop or CI session holds.
    fn session() -> Vec<(OsString, OsString)> {
        os(&[
            ("PATH", "/usr/bin:/bin"),
            ("HOME", "/home/u"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C.UTF-8"),
            ("TERM", "xterm"),
            ("USER", "u"),
            ("SSH_AUTH_SOCK", "/run/user/1000/ssh-agent"),
            ("TMUX", "/tmp/tmux-1000/default,1,0"),
            ("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/1000/bus"),
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
            ("OPENAI_API_KEY", "sk"),
            ("MYSQL_PWD", "p"),
            ("DATABASE_URL", "postgres://u:p@db/x"),
            ("HTTPS_PROXY", "http://u:p@proxy:3128"),
            ("SENTRY_DSN", "https://k@sentry.io/1"),
            ("NPM_CONFIG__AUTH", "dTpw"),
            ("EDITOR", "vim"),
        ])
    }

    #[test]
    fn only_the_allowlist_passes_by_default() {
        let env = build_env(&EnvPolicy::default(), session(), &[]);
        let names: Vec<&str> = env.keys().map(|k| k.to_str().unwrap()).collect();
        assert_eq!(names, ["GIT_PAGER", "HOME", "LANG", "LC_ALL", "NO_COLOR", "PAGER", "PATH", "TERM", "USER"]);
        assert_eq!(get(&env, "TERM"), Some("dumb"));
    }

    #[test]
    fn host_sockets_pass_only_when_named() {
        let policy =
            EnvPolicy { pass: vec!["SSH_AUTH_SOCK".into(), "DBUS_*".into(), "EDITOR".into()], ..EnvPolicy::default() };
        let env = build_env(&policy, session(), &[]);
        assert_eq!(get(&env, "SSH_AUTH_SOCK"), Some("/run/user/1000/ssh-agent"), "named exactly: passes the scrub");
        assert_eq!(get(&env, "DBUS_SESSION_BUS_ADDRESS"), Some("unix:path=/run/user/1000/bus"));
        assert_eq!(get(&env, "EDITOR"), Some("vim"));
        assert_eq!(get(&env, "TMUX"), None);
        assert_eq!(get(&env, "XDG_RUNTIME_DIR"), None);
    }

    #[test]
    fn credentials_never_pass_a_pattern_only_an_exact_name() {
        let everything = EnvPolicy { pass: vec!["*".into()], ..EnvPolicy::default() };
        let env = build_env(&everything, session(), &[]);
        for secret in ["OPENAI_API_KEY", "MYSQL_PWD", "DATABASE_URL", "HTTPS_PROXY", "SENTRY_DSN", "NPM_CONFIG__AUTH"] {
            assert_eq!(get(&env, secret), None, "{secret} passed a `*` pattern");
        }
        assert_eq!(get(&env, "TMUX"), Some("/tmp/tmux-1000/default,1,0"), "`*` passes what is not a credential");
        let named = EnvPolicy { pass: vec!["DATABASE_URL".into(), "HTTPS_PROXY".into()], ..EnvPolicy::default() };
        let env = build_env(&named, session(), &[]);
        assert_eq!(get(&env, "DATABASE_URL"), Some("postgres://u:p@db/x"));
        assert_eq!(get(&env, "HTTPS_PROXY"), Some("http://u:p@proxy:3128"));
    }

    #[test]
    fn url_credentials_are_told_from_plain_urls() {
        assert!(has_url_credentials("http://u:p@proxy:3128"));
        assert!(has_url_credentials("socks5h://user:pa%40ss@h"));
        assert!(!has_url_credentials("http://proxy:3128"));
        assert!(!has_url_credentials("https://k@sentry.io/1"), "a user without a password is not one");
        assert!(!has_url_credentials("http://h/a:b@c"), "an @ in the path is not userinfo");
        assert!(!has_url_credentials("/usr/bin:/bin"));
    }

    #[test]
    fn explicit_entries_win_over_scrub_and_defaults() {
        let mut policy = EnvPolicy::default();
        policy.set.insert("SERVICE_TOKEN".into(), "from-config".into());
        policy.scrub = vec!["HOME".into()];
        let env = build_env(
            &policy,
            os(&[("HOME", "/root"), ("API_KEY", "not allowlisted")]),
            &[("PAGER".into(), "less".into())],
        );
        assert_eq!(get(&env, "HOME"), None);
        assert_eq!(get(&env, "API_KEY"), None);
        assert_eq!(get(&env, "SERVICE_TOKEN"), Some("from-config"));
        assert_eq!(get(&env, "PAGER"), Some("less"));
    }

    #[test]
    fn no_inheritance_keeps_only_explicit_layers() {
        let policy = EnvPolicy { inherit: false, pass: vec!["*".into()], ..EnvPolicy::default() };
        let env = build_env(&policy, os(&[("HOME", "/root")]), &[]);
        assert_eq!(env.len(), TERMINAL_DEFAULTS.len());
    }
}
