//! The grant's programs: resolved once when the grant is loaded, compared after
//! resolving symlinks on every spawn.
//!
//! Invariant: a bare name is trusted only when found through directories no
//! process tree can write; a granted name means what it meant at load.

use std::path::{Path, PathBuf};

use super::{ProcessGrant, Refusal};

/// Resolves `program` the way the grant compares it: a path with a `/` is
/// taken as is (relative to `cwd`), a bare name is searched on the host's
/// `PATH`; the result is canonical.
///
/// Successful resolutions are cached for the life of the host process (a
/// spawn checks its program and every granted one; the PATH walk and
/// `realpath` would otherwise dominate its cost). A program that disappears
/// later fails at exec with exit code 127 and a message on stderr.
pub(crate) fn resolve_program(program: &str, cwd: &Path) -> Result<PathBuf, String> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Cache = Mutex<HashMap<(String, PathBuf), PathBuf>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    // Only relative paths depend on the working directory.
    let key_dir = if program.contains('/') && !program.starts_with('/') { cwd.to_path_buf() } else { PathBuf::new() };
    let key = (program.to_string(), key_dir);
    if let Some(hit) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(hit.clone());
    }
    let resolved = resolve_program_uncached(program, cwd)?;
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= 1024 {
        cache.clear();
    }
    cache.insert(key, resolved.clone());
    Ok(resolved)
}

fn resolve_program_uncached(program: &str, cwd: &Path) -> Result<PathBuf, String> {
    if program.is_empty() {
        return Err("empty program name".into());
    }
    let candidate = if program.contains('/') {
        let path = cwd.join(program);
        if !is_executable(&path) {
            return Err(format!("{} is not an executable file", path.display()));
        }
        path
    } else {
        // Agent clients launch servers with pruned environments; with no
        // PATH at all, search where execvp(3) would (the POSIX default).
        let path_var = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
        std::env::split_paths(&path_var)
            .map(|dir| dir.join(program))
            .find(|path| is_executable(path))
            .ok_or_else(|| format!("{program} was not found on the host's PATH"))?
    };
    candidate.canonicalize().map_err(|e| format!("cannot resolve {}: {e}", candidate.display()))
}

/// Where `execvp(3)` searches without a `PATH` (the POSIX default); agent
/// clients launch servers with pruned environments.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The grant's programs, resolved once.
#[derive(Debug, PartialEq, Eq)]
pub struct Resolved {
    /// Each `programs` entry and what it resolved to.
    entries: Vec<(String, Result<PathBuf, Unresolved>)>,
}

/// Why a granted program resolves to nothing runnable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum Unresolved {
    #[error("{0}")]
    Missing(String),
    #[error("{0}")]
    Untrusted(String),
}

/// Resolves one `programs` entry against `path_var`. An absolute path is the
/// operator's explicit choice and only has to exist; anything else must be
/// found through directories no process tree can write.
fn resolve_entry(entry: &str, path_var: &std::ffi::OsStr, workspace: &[PathBuf]) -> Result<PathBuf, Unresolved> {
    if entry.starts_with('/') {
        if !is_executable(Path::new(entry)) {
            return Err(Unresolved::Missing(format!("{entry} is not an executable file")));
        }
        return Path::new(entry)
            .canonicalize()
            .map_err(|e| Unresolved::Missing(format!("cannot resolve {entry}: {e}")));
    }
    let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let found = if entry.contains('/') {
        let path = here.join(entry);
        is_executable(&path).then_some(path)
    } else {
        std::env::split_paths(path_var).map(|dir| here.join(dir).join(entry)).find(|path| is_executable(path))
    };
    let Some(found) = found else {
        return Err(Unresolved::Missing(format!("{entry} was not found on the host's PATH")));
    };
    let canonical =
        found.canonicalize().map_err(|e| Unresolved::Missing(format!("cannot resolve {}: {e}", found.display())))?;
    // The directory it was found in, and the one the real file is in.
    for dir in [found.parent(), canonical.parent()].into_iter().flatten() {
        if let Some(why) = untrusted_dir(dir, workspace) {
            return Err(Unresolved::Untrusted(format!(
                "resolves to {} through {}, {why}; a command could replace it. Name the absolute path \
                 of the program you mean in the grant's `programs` (e.g. \"/usr/bin/{entry}\")",
                canonical.display(),
                dir.display()
            )));
        }
    }
    if let Some(why) = untrusted_file(&canonical) {
        return Err(Unresolved::Untrusted(format!(
            "resolves to {}, which is {why}; name the absolute path of the program you mean in the grant's \
             `programs`",
            canonical.display()
        )));
    }
    Ok(canonical)
}

/// Why a directory's programs cannot be trusted, if they cannot.
fn untrusted_dir(dir: &Path, workspace: &[PathBuf]) -> Option<String> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let canonical = dir.canonicalize().ok()?;
    if let Some(root) = workspace.iter().find(|root| canonical.starts_with(root)) {
        return Some(format!("a directory inside the workspace {} that process trees can write", root.display()));
    }
    let meta = std::fs::metadata(&canonical).ok()?;
    let mode = meta.permissions().mode();
    if mode & 0o022 != 0 {
        return Some(format!("a directory writable by group or others (mode {:04o})", mode & 0o7777));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != me {
        return Some(format!("a directory owned by uid {}, neither root nor the server's user", meta.uid()));
    }
    None
}

/// Why a program file cannot be trusted, if it cannot.
fn untrusted_file(file: &Path) -> Option<String> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let meta = std::fs::metadata(file).ok()?;
    let mode = meta.permissions().mode();
    if mode & 0o022 != 0 {
        return Some(format!("writable by group or others (mode {:04o})", mode & 0o7777));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != me {
        return Some(format!("owned by uid {}, neither root nor the server's user", meta.uid()));
    }
    None
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl ProcessGrant {
    /// Resolves `programs` against the host's `PATH` (once per grant: later
    /// calls and every spawn reuse the result). An entry that cannot be found
    /// matches nothing (logged); an entry found through an untrusted directory
    /// is an error that names the directory and the fix.
    pub fn resolve_programs(&self) -> anyhow::Result<()> {
        let resolved = self.resolution();
        let refused: Vec<String> = resolved
            .entries
            .iter()
            .filter_map(|(name, r)| match r {
                Err(Unresolved::Untrusted(why)) => Some(format!("program {name:?} {why}")),
                _ => None,
            })
            .collect();
        anyhow::ensure!(refused.is_empty(), "process grant: {}", refused.join("; "));
        for (name, r) in &resolved.entries {
            if let Err(Unresolved::Missing(why)) = r {
                tracing::warn!(program = %name, "granted program cannot be resolved and matches nothing: {why}");
            }
        }
        Ok(())
    }

    /// The granted programs' files, resolved (those that exist).
    pub(crate) fn program_files(&self) -> Vec<PathBuf> {
        self.resolution().entries.iter().filter_map(|(_, r)| r.as_ref().ok().cloned()).collect()
    }

    /// The `programs` entries that resolved to `program` (canonical).
    pub(crate) fn entries_granting<'a>(&'a self, program: &'a Path) -> impl Iterator<Item = &'a String> + 'a {
        let entries = &self.resolution().entries;
        entries.iter().filter(move |(_, r)| r.as_ref().is_ok_and(|p| p == program)).map(|(name, _)| name)
    }

    fn resolution(&self) -> &Resolved {
        self.resolved.0.get_or_init(|| {
            let path_var = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
            let workspace = self.workspace();
            let entries =
                self.programs.iter().map(|name| (name.clone(), resolve_entry(name, &path_var, &workspace))).collect();
            std::sync::Arc::new(Resolved { entries })
        })
    }

    /// Where process trees of this grant can write: no program may be
    /// trusted from there. The filesystem root never counts (a server run
    /// from `/` would otherwise trust nothing).
    fn workspace(&self) -> Vec<PathBuf> {
        let mut roots = self.working_roots();
        roots.extend(self.read_write_paths.iter().filter_map(|p| p.canonicalize().ok()));
        roots.retain(|r| r != Path::new("/"));
        roots
    }

    /// Checks a program against the grant; returns the canonical path to execute.
    pub(crate) fn check_program(&self, program: &str, cwd: &Path) -> Result<PathBuf, Refusal> {
        if self.programs.is_empty() {
            return Err(Refusal::NoPrograms);
        }
        let resolved = self.resolution();
        let allowed_text = || self.programs.join(", ");
        let refuse = |why: String| Refusal::Program { asked: program.to_string(), why, allowed: allowed_text() };
        // A granted name means what it meant when the grant was loaded.
        if let Some((_, entry)) = resolved.entries.iter().find(|(name, _)| name == program) {
            return entry.clone().map_err(|e| refuse(e.to_string()));
        }
        let asked = resolve_program(program, cwd).map_err(refuse)?;
        if resolved.entries.iter().any(|(_, r)| r.as_ref().is_ok_and(|p| *p == asked)) {
            Ok(asked)
        } else {
            Err(refuse(format!("it resolves to {}, which is not granted", asked.display())))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// A fresh directory with `mode` holding an executable `name`.
    fn planted(tag: &str, mode: u32, name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("taskhost-grant-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let program = dir.join(name);
        std::fs::write(&program, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        dir.canonicalize().unwrap()
    }

    #[test]
    fn a_program_found_through_a_directory_others_can_write_is_refused() {
        let dir = planted("open", 0o777, "cat");
        let path_var = std::env::join_paths([dir.as_path(), Path::new("/usr/bin"), Path::new("/bin")]).unwrap();
        let Err(Unresolved::Untrusted(why)) = resolve_entry("cat", &path_var, &[]) else {
            panic!("a world-writable PATH directory must not be trusted")
        };
        assert!(why.contains(&format!("through {}", dir.display())), "{why}");
        assert!(why.contains("writable by group or others (mode 0777)") && why.contains("/usr/bin/cat"), "{why}");
        // Named by its absolute path, it is the operator's explicit choice.
        assert_eq!(resolve_entry(&format!("{}/cat", dir.display()), &path_var, &[]), Ok(dir.join("cat")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_program_found_inside_the_workspace_is_refused() {
        let dir = planted("workspace", 0o755, "tool");
        let path_var = std::env::join_paths([dir.as_path(), Path::new("/usr/bin")]).unwrap();
        assert_eq!(resolve_entry("tool", &path_var, &[]), Ok(dir.join("tool")), "outside the workspace it is trusted");
        let Err(Unresolved::Untrusted(why)) = resolve_entry("tool", &path_var, std::slice::from_ref(&dir)) else {
            panic!("a program the trees can rewrite must not be trusted")
        };
        assert!(why.contains("inside the workspace"), "{why}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn granted_names_keep_the_program_they_resolved_to_at_load() {
        let grant = ProcessGrant { programs: vec!["sh".into()], ..ProcessGrant::default() };
        grant.resolve_programs().unwrap();
        let at_load = grant.check_program("sh", Path::new("/")).unwrap();
        assert!(at_load.is_absolute());
        let clone = grant.clone();
        assert_eq!(clone.check_program("sh", Path::new("/")).unwrap(), at_load, "a clone keeps the resolution");
        let refusal = grant.check_program("definitely-not-a-program", Path::new("/")).unwrap_err();
        assert!(refusal.to_string().contains("not found on the host's PATH"), "{refusal}");
    }
}
