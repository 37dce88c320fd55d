//! The process grant: what one plugin instance may start, where, and with
//! which environment. Part of the host configuration (serde), checked on every
//! spawn.
//!
//! Invariants: a grant refuses by default (no programs); every refusal says
//! what was asked, what the grant allows and where to change it; programs and
//! directories are compared after resolving symlinks, so `/bin/bash` and
//! `/usr/bin/bash` are the same program and `..` cannot climb out of a root.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Default in-memory cap per output stream, in bytes.
pub const DEFAULT_MEMORY_CAP: usize = 64_000;
/// Default cap of a spill file, per stream, in bytes (64 MiB).
pub const DEFAULT_SPILL_CAP: u64 = 64 * 1024 * 1024;
/// Default grace between SIGTERM and SIGKILL, in milliseconds.
pub const DEFAULT_KILL_GRACE_MS: u64 = 3_000;
/// Default cap on live processes per task store.
pub const DEFAULT_MAX_LIVE: usize = 16;

/// What a plugin instance may do with the `process` capability.
///
/// ```toml
/// [producer.grants.process]  # in the [[producer]] entry of the bash tool
/// programs = ["/bin/bash"]
/// working_dirs = ["/work/project"]
/// network = false
/// read_write_paths = ["/work/project", "/tmp"]
/// read_only_paths = ["/"]
/// env.scrub = ["KEY", "PASSWORD", "SECRET", "TOKEN"]
/// env.set = { LANG = "C.UTF-8" }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessGrant {
    /// Programs that may be started: absolute paths, or bare names looked up
    /// on the host's `PATH`. Compared after resolving symlinks. Empty: nothing
    /// may run.
    pub programs: Vec<String>,
    /// Directories a process may run in (or below). The first is the default
    /// working directory. Empty: the host's current directory (and below).
    pub working_dirs: Vec<PathBuf>,
    /// The environment processes see.
    pub env: EnvPolicy,
    /// Network access. `false` (the default): each process tree gets its own
    /// network namespace with only a loopback interface, where the kernel
    /// allows it.
    pub network: bool,
    /// Run each process tree in its own PID namespace where the kernel allows
    /// it, so no descendant (`setsid`, `nohup`, double fork) outlives it.
    /// Default `true`; turning it off leaves only process groups.
    pub pid_namespace: bool,
    /// Paths readable (and executable) below. Empty (the default):
    /// everything is readable but the deny-read paths (see
    /// [`super::fs_policy`]).
    pub read_only_paths: Vec<PathBuf>,
    /// Paths readable and writable below, besides the working directories
    /// (always read-write) and the tree's private `/tmp`.
    pub read_write_paths: Vec<PathBuf>,
    /// Changes to the default deny-read list ([`super::fs_policy::FsPolicy`]).
    pub filesystem: super::fs_policy::FsPolicy,
    /// Resource limits; a spawn may ask for less, never for more.
    pub limits: ProcessLimits,
}

impl Default for ProcessGrant {
    fn default() -> Self {
        Self {
            programs: Vec::new(),
            working_dirs: Vec::new(),
            env: EnvPolicy::default(),
            network: false,
            pid_namespace: true,
            read_only_paths: Vec::new(),
            read_write_paths: Vec::new(),
            filesystem: Default::default(),
            limits: ProcessLimits::default(),
        }
    }
}

/// The environment policy of a grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvPolicy {
    /// Inherit the host's environment (minus scrubbed variables). Default `true`.
    pub inherit: bool,
    /// Case-insensitive substrings: an inherited variable whose name contains
    /// one is removed. Default `KEY`, `PASSWORD`, `SECRET`, `TOKEN`.
    pub scrub: Vec<String>,
    /// Variables set for every process. They win over the scrub and over the
    /// terminal defaults (`NO_COLOR=1 TERM=dumb PAGER=cat GIT_PAGER=cat`).
    pub set: BTreeMap<String, String>,
}

impl Default for EnvPolicy {
    fn default() -> Self {
        Self {
            inherit: true,
            scrub: ["KEY", "PASSWORD", "SECRET", "TOKEN"].map(String::from).to_vec(),
            set: BTreeMap::new(),
        }
    }
}

/// Limits of one process, per grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessLimits {
    /// Unread bytes kept in memory per stream; older unread bytes are dropped
    /// (the spill file keeps them).
    pub memory_cap_bytes: usize,
    /// Bytes written to a stream's spill file at most.
    pub spill_cap_bytes: u64,
    /// Grace between SIGTERM and SIGKILL when a process is killed.
    pub kill_grace_ms: u64,
    /// Live processes per task at most.
    pub max_live_processes: usize,
}

impl Default for ProcessLimits {
    fn default() -> Self {
        Self {
            memory_cap_bytes: DEFAULT_MEMORY_CAP,
            spill_cap_bytes: DEFAULT_SPILL_CAP,
            kill_grace_ms: DEFAULT_KILL_GRACE_MS,
            max_live_processes: DEFAULT_MAX_LIVE,
        }
    }
}

/// Why a grant refused a spawn. The message is meant for the plugin (and
/// through it, the model): it names what was refused and what is allowed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("the process grant refuses this spawn: argv is empty")]
    EmptyArgv,
    #[error("the process grant allows no programs for this plugin (grant `programs` in its configuration)")]
    NoPrograms,
    #[error("the process grant refuses program {asked:?}: {why}; allowed programs: {allowed}")]
    Program { asked: String, why: String, allowed: String },
    #[error("the process grant refuses working directory {asked:?}: {why}; allowed directories: {allowed}")]
    WorkingDir { asked: String, why: String, allowed: String },
    #[error("the process grant refuses environment variable {0:?}: names must be non-empty and hold no '=' or NUL")]
    EnvName(String),
    #[error("the process grant refuses this spawn: {0} processes are already live for this task (limit)")]
    TooMany(usize),
}

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
        let path_var = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        std::env::split_paths(&path_var)
            .map(|dir| dir.join(program))
            .find(|path| is_executable(path))
            .ok_or_else(|| format!("{program} was not found on the host's PATH"))?
    };
    candidate.canonicalize().map_err(|e| format!("cannot resolve {}: {e}", candidate.display()))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl ProcessGrant {
    /// The canonical programs this grant allows (entries that do not resolve
    /// are skipped: they cannot match anything).
    pub(crate) fn allowed_programs(&self, cwd: &Path) -> Vec<PathBuf> {
        self.programs.iter().filter_map(|p| resolve_program(p, cwd).ok()).collect()
    }

    /// Checks a program against the grant; returns the canonical path to execute.
    pub(crate) fn check_program(&self, program: &str, cwd: &Path) -> Result<PathBuf, Refusal> {
        if self.programs.is_empty() {
            return Err(Refusal::NoPrograms);
        }
        let allowed = self.allowed_programs(cwd);
        let allowed_text = || self.programs.join(", ");
        let resolved = resolve_program(program, cwd).map_err(|why| Refusal::Program {
            asked: program.to_string(),
            why,
            allowed: allowed_text(),
        })?;
        if allowed.contains(&resolved) {
            Ok(resolved)
        } else {
            Err(Refusal::Program {
                asked: program.to_string(),
                why: format!("it resolves to {}, which is not granted", resolved.display()),
                allowed: allowed_text(),
            })
        }
    }

    /// The canonical roots processes may run in, the first being the default.
    pub(crate) fn working_roots(&self) -> Vec<PathBuf> {
        if self.working_dirs.is_empty() {
            std::env::current_dir().and_then(|d| d.canonicalize()).into_iter().collect()
        } else {
            self.working_dirs.iter().filter_map(|d| d.canonicalize().ok()).collect()
        }
    }

    /// Checks a working directory (relative ones are taken from the default
    /// directory); returns the canonical directory to run in.
    pub(crate) fn check_cwd(&self, asked: Option<&str>) -> Result<PathBuf, Refusal> {
        let roots = self.working_roots();
        let allowed_text = || {
            if self.working_dirs.is_empty() {
                roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
            } else {
                self.working_dirs.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
            }
        };
        let Some(default) = roots.first() else {
            return Err(Refusal::WorkingDir {
                asked: asked.unwrap_or("").to_string(),
                why: "none of the granted directories exists".into(),
                allowed: allowed_text(),
            });
        };
        let Some(asked) = asked.filter(|a| !a.is_empty()) else {
            return Ok(default.clone());
        };
        let refuse = |why: String| Refusal::WorkingDir { asked: asked.to_string(), why, allowed: allowed_text() };
        let dir = default.join(asked).canonicalize().map_err(|e| refuse(format!("it cannot be resolved ({e})")))?;
        if !dir.is_dir() {
            return Err(refuse("it is not a directory".into()));
        }
        if roots.iter().any(|root| dir.starts_with(root)) {
            Ok(dir)
        } else {
            Err(refuse(format!("it resolves to {}, outside every granted directory", dir.display())))
        }
    }

    /// Checks an explicit environment entry's name.
    pub(crate) fn check_env_name(name: &OsStr) -> Result<(), Refusal> {
        let bytes = name.as_encoded_bytes();
        if bytes.is_empty() || bytes.contains(&b'=') || bytes.contains(&0) {
            Err(Refusal::EnvName(name.to_string_lossy().into_owned()))
        } else {
            Ok(())
        }
    }
}
