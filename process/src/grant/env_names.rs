//! The names a plugin may set in a child's environment: an allow list per
//! grant (`env.plugin_may_set`), behind which loader and start-up variables
//! stay refused.
//!
//! Invariant: a spawn request's own entry reaches a command only when its
//! name is well formed, not in [`LOADER_ENV`] and listed by the grant; the
//! configuration's own `env.set` is not limited by either list.

use std::ffi::OsStr;

use super::{ProcessGrant, Refusal};

/// Environment names a plugin may not set in a spawn request (upper-cased
/// comparison; `*` ends a prefix), with why. Each one makes a program load
/// or run code it names, or changes which program a name starts: with any of
/// them, a grant of `cat` would be a grant of everything.
pub const LOADER_ENV: &[(&str, &str)] = &[
    ("LD_*", "changes what the dynamic loader loads (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT)"),
    ("DYLD_*", "changes what the dynamic loader loads"),
    ("GLIBC_TUNABLES", "configures the C library at load time"),
    ("GCONV_PATH", "makes the C library load character-set modules from a directory"),
    ("LOCPATH", "makes the C library load locale data from a directory"),
    ("NLSPATH", "makes programs load message catalogs from a path"),
    ("HOSTALIASES", "redirects host name lookups"),
    ("PATH", "changes which program every bare command name starts"),
    ("BASH_ENV", "names a script bash runs at start"),
    ("ENV", "names a script sh runs at start"),
    ("BASH_FUNC_*", "defines shell functions that replace commands"),
    ("SHELLOPTS", "changes shell options at start"),
    ("BASHOPTS", "changes shell options at start"),
    ("PS4", "is expanded (and its command substitutions run) by a tracing shell"),
    ("PROMPT_COMMAND", "is a command an interactive shell runs"),
    ("ZDOTDIR", "names the directory zsh loads start-up files from"),
    ("IFS", "changes how a shell splits every command"),
    ("PYTHONSTARTUP", "names a script Python runs at start"),
    ("PYTHONPATH", "makes Python import modules from a path first"),
    ("PYTHONHOME", "makes Python load its standard library from a path"),
    ("PYTHONUSERBASE", "makes Python import modules from a path"),
    ("PYTHONINSPECT", "makes Python read commands after the script"),
    ("PERL5OPT", "gives perl options (including modules to load) at start"),
    ("PERL5LIB", "makes perl load modules from a path first"),
    ("PERLLIB", "makes perl load modules from a path first"),
    ("PERL5DB", "names code perl runs as its debugger"),
    ("RUBYOPT", "gives ruby options (including libraries to load) at start"),
    ("RUBYLIB", "makes ruby load libraries from a path first"),
    ("NODE_OPTIONS", "gives node options (including --require) at start"),
    ("NODE_PATH", "makes node load modules from a path"),
    ("JAVA_TOOL_OPTIONS", "gives the JVM options (including agents) at start"),
    ("_JAVA_OPTIONS", "gives the JVM options (including agents) at start"),
    ("JDK_JAVA_OPTIONS", "gives the java launcher options at start"),
    ("CLASSPATH", "makes the JVM load classes from a path"),
    ("LUA_INIT*", "names code lua runs at start"),
    ("LUA_PATH*", "makes lua load modules from a path"),
    ("LUA_CPATH*", "makes lua load native modules from a path"),
    ("PHPRC", "makes php load its configuration (and extensions) from a path"),
    ("PHP_INI_SCAN_DIR", "makes php load configuration from a directory"),
    ("TCLLIBPATH", "makes tcl load packages from a path"),
    ("GIT_CONFIG*", "gives git configuration, which can name commands to run"),
    ("GIT_EXEC_PATH", "changes where git finds its sub-commands"),
    ("GIT_SSH*", "names a command git runs"),
    ("GIT_PROXY_COMMAND", "names a command git runs"),
    ("GIT_EXTERNAL_DIFF", "names a command git runs"),
    ("GIT_ASKPASS", "names a command git runs"),
    ("SSH_ASKPASS", "names a command ssh runs"),
    ("GIT_EDITOR", "names a command git runs"),
    ("GIT_PAGER", "names a command git runs"),
    ("EDITOR", "names a command programs run"),
    ("VISUAL", "names a command programs run"),
    ("PAGER", "names a command programs run"),
    ("MANPAGER", "names a command man runs"),
    ("LESSOPEN", "names a command less runs on every file"),
    ("LESSCLOSE", "names a command less runs"),
];

/// Whether `name` is matched by `pattern`: exact (case-sensitive, as the
/// environment is), `PREFIX*`, or `*` for every name.
pub(crate) fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

impl ProcessGrant {
    /// Checks the name of an environment entry a plugin asked for: well
    /// formed, not one that changes how programs load or start
    /// ([`LOADER_ENV`]), and allowed by `env.plugin_may_set`.
    pub(crate) fn check_env_name(&self, name: &OsStr) -> Result<(), Refusal> {
        let bytes = name.as_encoded_bytes();
        let lossy = || name.to_string_lossy().into_owned();
        if bytes.is_empty() || bytes.contains(&b'=') || bytes.contains(&0) {
            return Err(Refusal::EnvName(lossy()));
        }
        let upper = name.to_string_lossy().to_ascii_uppercase();
        for (pattern, why) in LOADER_ENV {
            let hit = match pattern.strip_suffix('*') {
                Some(prefix) => upper.starts_with(prefix),
                None => upper == *pattern,
            };
            if hit {
                return Err(Refusal::EnvLoader { name: lossy(), why });
            }
        }
        let allowed = &self.env.plugin_may_set;
        let listed = name.to_str().is_some_and(|text| allowed.iter().any(|p| pattern_matches(p, text)));
        if !listed {
            let allowed = if allowed.is_empty() { "nothing".to_string() } else { allowed.join(", ") };
            return Err(Refusal::EnvNotGranted { name: lossy(), allowed });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowing(names: &[&str]) -> ProcessGrant {
        let mut grant = ProcessGrant::default();
        grant.env.plugin_may_set = names.iter().map(|n| n.to_string()).collect();
        grant
    }

    #[test]
    fn loader_and_startup_variables_are_refused_with_the_fix() {
        let everything = allowing(&["*"]);
        for name in
            ["LD_PRELOAD", "ld_audit", "BASH_ENV", "ENV", "BASH_FUNC_cat%%", "PATH", "NODE_OPTIONS", "GCONV_PATH"]
        {
            let refusal = everything.check_env_name(OsStr::new(name)).unwrap_err();
            assert!(matches!(refusal, Refusal::EnvLoader { .. }), "{name}: {refusal}");
            let text = refusal.to_string();
            assert!(text.contains(&format!("{name:?}")) && text.contains("`env.set`"), "{text}");
        }
        for name in ["MY_API_KEY", "RUST_LOG", "LANG", "PATHS", "ENVIRONMENT"] {
            assert_eq!(everything.check_env_name(OsStr::new(name)), Ok(()), "{name}");
        }
        let exact = allowing(&["LD_PRELOAD"]).check_env_name(OsStr::new("LD_PRELOAD")).unwrap_err();
        assert!(matches!(exact, Refusal::EnvLoader { .. }), "naming a loader variable does not allow it: {exact}");
    }

    #[test]
    fn only_the_names_a_grant_lists_may_be_set() {
        let refusal = ProcessGrant::default().check_env_name(OsStr::new("MY_API_KEY")).unwrap_err();
        let text = refusal.to_string();
        assert!(matches!(refusal, Refusal::EnvNotGranted { .. }), "{text}");
        assert!(text.contains("\"MY_API_KEY\"") && text.contains("may set: nothing"), "{text}");
        assert!(text.contains("`env.plugin_may_set`") && text.contains("`env.set`"), "the fix is named: {text}");
        let grant = allowing(&["MY_API_KEY", "APP_*"]);
        for name in ["MY_API_KEY", "APP_MODE", "APP_"] {
            assert_eq!(grant.check_env_name(OsStr::new(name)), Ok(()), "{name}");
        }
        for name in ["my_api_key", "MY_API_KEY2", "OTHER", "XAPP_MODE"] {
            let refusal = grant.check_env_name(OsStr::new(name)).unwrap_err();
            assert!(refusal.to_string().contains("may set: MY_API_KEY, APP_*"), "{name}: {refusal}");
        }
    }
}
