//! Argument rules: what a grant lets a plugin pass to one granted program
//! (fixed leading arguments, then patterns every other argument must match).
//!
//! Invariants: a rule only narrows; a program granted through an entry with
//! no rule takes any arguments (grants add up, they never subtract). Rules are
//! checked at load (their key must be a `programs` entry, their patterns must
//! parse) and on every spawn, against the program the request resolved to.
//! A rule constrains this program's own arguments only: whatever the program
//! itself starts (`bash -c`, `git -c alias.x=!cmd`, `find -exec`) is granted
//! with it, which is why the docs say a grant of a program is a grant of
//! everything that program can start.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{ProcessGrant, Refusal};

/// Constraints on the arguments (`argv[1..]`) of one granted program.
///
/// ```toml
/// [producer.grants.process]
/// programs = ["git"]
/// [producer.grants.process.arguments.git]
/// prefixes = [["status"], ["diff", "--stat"], ["log", "--oneline"]]
/// patterns = ["[!-]*", "--", "-n*"]   # every later argument: no option but these
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArgumentRule {
    /// The arguments must begin with one of these sequences, word for word.
    /// Empty: any beginning.
    pub prefixes: Vec<Vec<String>>,
    /// Every argument after the matched prefix must match one of these
    /// shell-style patterns (`*`, `?`, `[abc]`, `[!-]`; `*` also matches
    /// `/`). Empty: any arguments after the prefix.
    pub patterns: Vec<String>,
}

impl ArgumentRule {
    /// Why `args` break this rule, if they do.
    fn refuses(&self, args: &[String]) -> Option<String> {
        let rest = if self.prefixes.is_empty() {
            args
        } else {
            let Some(prefix) = self.prefixes.iter().find(|p| args.starts_with(p)) else {
                return Some("they do not begin with an allowed prefix".into());
            };
            &args[prefix.len()..]
        };
        if self.patterns.is_empty() {
            return None;
        }
        let patterns: Vec<glob::Pattern> = self.patterns.iter().filter_map(|p| glob::Pattern::new(p).ok()).collect();
        rest.iter()
            .find(|arg| !patterns.iter().any(|pattern| pattern.matches(arg)))
            .map(|arg| format!("{arg:?} matches none of the allowed patterns"))
    }

    /// The rule in words, for a refusal.
    fn describe(&self) -> String {
        let prefixes = if self.prefixes.is_empty() {
            "any first arguments".to_string()
        } else {
            let each: Vec<String> = self.prefixes.iter().map(|p| format!("{:?}", p.join(" "))).collect();
            format!("first arguments {}", each.join(" or "))
        };
        if self.patterns.is_empty() {
            prefixes
        } else {
            format!("{prefixes}, then only arguments matching {}", self.patterns.join(" "))
        }
    }
}

impl ProcessGrant {
    /// Checks `arguments` at load: each key names a `programs` entry, each
    /// pattern parses.
    pub(crate) fn check_argument_rules(&self) -> Result<(), String> {
        for (program, rule) in &self.arguments {
            if !self.programs.contains(program) {
                return Err(format!(
                    "process grant: `arguments.{program:?}` names no entry of `programs` ({}); write the rule's key \
                     exactly as the program is written there",
                    self.programs.join(", ")
                ));
            }
            for pattern in &rule.patterns {
                glob::Pattern::new(pattern).map_err(|e| {
                    format!("process grant: `arguments.{program:?}` pattern {pattern:?} is not a valid pattern: {e}")
                })?;
            }
        }
        Ok(())
    }

    /// Checks `argv[1..]` against the rules of `program` (canonical, as
    /// [`Self::check_program`] returned it): allowed when one of the entries
    /// that grants the program has no rule, or its rule holds.
    pub(crate) fn check_arguments(&self, program: &Path, argv: &[String]) -> Result<(), Refusal> {
        if self.arguments.is_empty() {
            return Ok(());
        }
        let args = argv.get(1..).unwrap_or_default();
        let mut refusals = Vec::new();
        for entry in self.entries_granting(program) {
            let Some(rule) = self.arguments.get(entry) else { return Ok(()) };
            match rule.refuses(args) {
                None => return Ok(()),
                Some(why) => refusals.push((why, rule.describe())),
            }
        }
        let (why, allowed) =
            refusals.into_iter().next().unwrap_or_else(|| ("no entry grants it".into(), String::new()));
        Err(Refusal::Arguments { program: program.display().to_string(), why, allowed })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        std::iter::once("git").chain(words.iter().copied()).map(String::from).collect()
    }

    fn git_grant(rule: ArgumentRule) -> (ProcessGrant, std::path::PathBuf) {
        let grant = ProcessGrant {
            programs: vec!["sh".into()],
            arguments: BTreeMap::from([("sh".to_string(), rule)]),
            ..ProcessGrant::default()
        };
        grant.check_argument_rules().unwrap();
        let program = grant.check_program("sh", Path::new("/")).unwrap();
        (grant, program)
    }

    #[test]
    fn prefixes_and_patterns_narrow_the_arguments() {
        let (grant, sh) = git_grant(ArgumentRule {
            prefixes: vec![vec!["status".into()], vec!["log".into(), "--oneline".into()]],
            patterns: vec!["[!-]*".into(), "-n*".into()],
        });
        for ok in [&["status"][..], &["status", "src/"], &["log", "--oneline", "-n5", "main"]] {
            assert_eq!(grant.check_arguments(&sh, &args(ok)), Ok(()), "{ok:?}");
        }
        let refusal = grant.check_arguments(&sh, &args(&["-c", "alias.x=!id", "x"])).unwrap_err();
        let text = refusal.to_string();
        assert!(text.contains("do not begin with an allowed prefix"), "{text}");
        assert!(
            text.contains("\"status\" or \"log --oneline\"") && text.contains("[!-]* -n*"),
            "the rule is told: {text}"
        );
        let refusal = grant.check_arguments(&sh, &args(&["status", "--porcelain"])).unwrap_err();
        assert!(refusal.to_string().contains("\"--porcelain\" matches none of the allowed patterns"), "{refusal}");
        assert!(grant.check_arguments(&sh, &args(&[])).is_err(), "no arguments is no allowed prefix");
    }

    #[test]
    fn an_entry_without_a_rule_grants_any_arguments() {
        let (mut grant, sh) = git_grant(ArgumentRule { prefixes: vec![vec!["-n".into()]], patterns: vec![] });
        assert!(grant.check_arguments(&sh, &args(&["-c", "id"])).is_err());
        let path = sh.display().to_string();
        // A new grant: a clone would keep the old resolution of `programs`.
        grant = ProcessGrant {
            programs: vec!["sh".into(), path],
            arguments: grant.arguments.clone(),
            ..ProcessGrant::default()
        };
        assert_eq!(grant.check_arguments(&sh, &args(&["-c", "id"])), Ok(()), "grants add up");
    }

    #[test]
    fn rules_are_checked_at_load() {
        let grant = |key: &str, pattern: &str| ProcessGrant {
            programs: vec!["sh".into()],
            arguments: BTreeMap::from([(
                key.to_string(),
                ArgumentRule { prefixes: vec![], patterns: vec![pattern.into()] },
            )]),
            ..ProcessGrant::default()
        };
        assert_eq!(grant("sh", "*").check_argument_rules(), Ok(()));
        let error = grant("/bin/sh", "*").check_argument_rules().unwrap_err();
        assert!(error.contains("names no entry of `programs` (sh)"), "{error}");
        let error = grant("sh", "[").check_argument_rules().unwrap_err();
        assert!(error.contains("\"[\" is not a valid pattern"), "{error}");
    }
}
