//! The process grant: what one plugin instance may start, where, and with
//! which environment. Part of the host configuration (serde), checked on every
//! spawn.
//!
//! Invariants: a grant refuses by default (no programs); every refusal says
//! what was asked, what the grant allows and where to change it; programs and
//! directories are compared after resolving symlinks, so `/bin/bash` and
//! `/usr/bin/bash` are the same program and `..` cannot climb out of a root.

mod arguments;
mod env_names;
mod programs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use arguments::ArgumentRule;
pub use env_names::LOADER_ENV;
pub(crate) use env_names::pattern_matches;
pub use programs::Resolved;

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
/// arguments = {}                        # per program: allowed leading arguments and patterns
/// working_dirs = ["/work/project"]
/// network = false
/// read_write_paths = ["/work/cache"]     # more read-write roots besides the workspace
/// home_read = ["~/.gradle/caches"]       # more of the home, read-only (besides the defaults)
/// env.pass = ["SSH_AUTH_SOCK"]  # host variables beyond PATH HOME LANG LC_* TERM TZ USER SHELL
/// env.set = { LANG = "C.UTF-8" }
/// env.plugin_may_set = ["MY_API_KEY"]  # names the plugin may set in a spawn request
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessGrant {
    /// Programs that may be started: absolute paths, or bare names looked up
    /// on the host's `PATH` once, when the grant is loaded. Compared after
    /// resolving symlinks. A bare name found through a directory the server
    /// cannot trust (writable by group or others, or inside the workspace
    /// that process trees write) is refused: name its absolute path if that
    /// is really the program meant. Empty: nothing may run.
    pub programs: Vec<String>,
    /// Rules on the arguments of a program, keyed by its `programs` entry
    /// (written the same way): see [`ArgumentRule`]. A program without a rule
    /// takes any arguments. A rule narrows what the plugin may pass, never
    /// what the program may do: a grant of a program is a grant of
    /// everything that program can start.
    pub arguments: BTreeMap<String, ArgumentRule>,
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
    /// Host paths bound read-only into the tree's view, besides the system
    /// directories and the home allow list (see [`super::view`]); when set,
    /// Landlock also narrows reading to them (and the workspace). `"/"`
    /// means "everything the view shows" and binds nothing.
    pub read_only_paths: Vec<PathBuf>,
    /// Paths readable and writable below, besides the working directories
    /// (always read-write) and the tree's private `/tmp`: bound read-write
    /// at their paths, with the same mandatory read-only set inside as a
    /// workspace. Never `/`, the home directory or one of its ancestors.
    pub read_write_paths: Vec<PathBuf>,
    /// Paths below the home directory (`~/…`) bound read-only into the
    /// tree's private home, besides [`super::view::DEFAULT_HOME_READ`] (unless
    /// `home_read_defaults = false`). An entry that is or lies inside a
    /// credential ([`super::fs_policy::DEFAULT_DENY_READ`]) is refused at
    /// load unless `filesystem.allow_read` names it too; credentials inside
    /// an entry stay hidden.
    pub home_read: Vec<PathBuf>,
    /// Bind [`super::view::DEFAULT_HOME_READ`] into the home (default
    /// `true`); `false` leaves only `home_read`.
    pub home_read_defaults: bool,
    /// Changes to the default deny-read list ([`super::fs_policy::FsPolicy`]).
    pub filesystem: super::fs_policy::FsPolicy,
    /// Resource limits; a spawn may ask for less, never for more.
    pub limits: ProcessLimits,
    /// `programs`, resolved once (see [`ProcessGrant::resolve_programs`]).
    /// Not configuration: filled on first use and kept by clones.
    #[serde(skip)]
    pub resolved: ResolvedPrograms,
}

/// What a grant's `programs` resolved to, once (empty until first used).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvedPrograms(std::sync::OnceLock<std::sync::Arc<Resolved>>);

impl Default for ProcessGrant {
    fn default() -> Self {
        Self {
            programs: Vec::new(),
            arguments: BTreeMap::new(),
            working_dirs: Vec::new(),
            env: EnvPolicy::default(),
            network: false,
            pid_namespace: true,
            read_only_paths: Vec::new(),
            read_write_paths: Vec::new(),
            home_read: Vec::new(),
            home_read_defaults: true,
            filesystem: Default::default(),
            limits: ProcessLimits::default(),
            resolved: ResolvedPrograms::default(),
        }
    }
}

/// The environment policy of a grant (see [`super::env`] for the layers).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvPolicy {
    /// Let host variables through at all (those of [`super::env::DEFAULT_PASS`]
    /// and `pass`). Default `true`; `false` leaves only the terminal
    /// defaults, `set` and the spawn's own entries.
    pub inherit: bool,
    /// More host variables to let through, besides `PATH HOME LANG LC_* TERM
    /// TZ USER SHELL`: exact names, `PREFIX*` patterns, or `*` for all. A
    /// variable the scrub would drop passes only when named exactly here.
    /// Default: none. Host sockets (`SSH_AUTH_SOCK`, `TMUX`, `DBUS_*`,
    /// `XDG_RUNTIME_DIR`, `DISPLAY`, `WAYLAND_DISPLAY`) reach a command only
    /// through this list.
    pub pass: Vec<String>,
    /// Case-insensitive substrings: a host variable whose name contains one
    /// is dropped even when allowed, unless `pass` names it exactly. So is
    /// one whose value is a URL with a password (`http://user:pass@proxy`).
    /// Default: [`DEFAULT_SCRUB`].
    pub scrub: Vec<String>,
    /// Variables set for every process. They win over the host's and over
    /// the terminal defaults (`NO_COLOR=1 TERM=dumb PAGER=cat GIT_PAGER=cat`).
    pub set: BTreeMap<String, String>,
    /// Names a plugin may set in a spawn request's own environment: exact
    /// names, `PREFIX*` patterns, or `*`. Default: none. Whatever is listed,
    /// names that change how programs load or start ([`LOADER_ENV`]) stay
    /// refused: the configuration sets those, with `set`.
    pub plugin_may_set: Vec<String>,
}

/// The default scrub patterns: names that carry credentials.
pub const DEFAULT_SCRUB: [&str; 12] = [
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "_PWD",
    "AUTH",
    "CREDENTIAL",
    "COOKIE",
    "DSN",
    "DATABASE_URL",
    "PRIVATE",
];

impl Default for EnvPolicy {
    fn default() -> Self {
        Self {
            inherit: true,
            pass: Vec::new(),
            scrub: DEFAULT_SCRUB.map(String::from).to_vec(),
            set: BTreeMap::new(),
            plugin_may_set: Vec::new(),
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
    #[error(
        "the process grant refuses environment variable {name:?}: it {why}, so a plugin may not set it; \
         the host configuration can set it for every process with the grant's `env.set`"
    )]
    EnvLoader { name: String, why: &'static str },
    #[error(
        "the process grant does not let this plugin set environment variable {name:?} (it may set: {allowed}); \
         the host configuration can allow it with `env.plugin_may_set` in the tool's [producer.grants.process], \
         or set it for every process with `env.set`"
    )]
    EnvNotGranted { name: String, allowed: String },
    #[error("the process grant refuses these arguments to {program}: {why}; allowed: {allowed}")]
    Arguments { program: String, why: String, allowed: String },
    #[error("the process grant refuses this spawn: {0} processes are already live for this task (limit)")]
    TooMany(usize),
}

impl ProcessGrant {
    /// Everything checked when the grant is loaded: its programs
    /// ([`Self::resolve_programs`]), its workspace (never `/`, the home
    /// directory or an ancestor of it) and its home allow list. The error
    /// says what to pass instead.
    pub fn check_at_load(&self) -> anyhow::Result<()> {
        let home = super::fs_policy::home();
        self.check_workspace(home.as_deref()).map_err(anyhow::Error::msg)?;
        self.check_home_read().map_err(anyhow::Error::msg)?;
        self.check_argument_rules().map_err(anyhow::Error::msg)?;
        self.resolve_programs()
    }

    /// Refuses a workspace (working directory or read-write path) that is
    /// `/`, the server's home or an ancestor of it: a command could rewrite
    /// every file there, shell start-up files and taskhost's own state
    /// included.
    pub(crate) fn check_workspace(&self, home: Option<&Path>) -> Result<(), String> {
        let home = home.and_then(|h| h.canonicalize().ok());
        let roots =
            self.working_roots().into_iter().chain(self.read_write_paths.iter().filter_map(|p| p.canonicalize().ok()));
        for root in roots {
            let what = if root == Path::new("/") {
                "the filesystem root"
            } else if home.as_deref() == Some(root.as_path()) {
                "the home directory"
            } else if home.as_deref().is_some_and(|h| h.starts_with(&root)) {
                "an ancestor of the home directory"
            } else {
                continue;
            };
            let how = if self.working_dirs.is_empty() && self.working_roots().first() == Some(&root) {
                "start `taskhost serve` from a project directory (the workspace is the directory it starts in), or \
                 set `working_dirs = [\"/path/to/project\"]` in the tool's [producer.grants.process]"
            } else {
                "name a project directory in the grant's `working_dirs` / `read_write_paths` instead"
            };
            return Err(format!(
                "process grant: the workspace {} is {what}: every command could rewrite everything in it (shell \
                 start-up files, credentials, taskhost's own state). Give it a project directory: {how}",
                root.display()
            ));
        }
        Ok(())
    }

    /// Checks `home_read`: entries below `~/`, none a credential unless
    /// `filesystem.allow_read` names it.
    pub(crate) fn check_home_read(&self) -> Result<(), String> {
        for entry in &self.home_read {
            let Ok(rest) = entry.strip_prefix("~") else {
                return Err(format!(
                    "process grant: home_read entry {} is not below the home directory (write it as ~/…); \
                     other host paths go in `read_only_paths`",
                    entry.display()
                ));
            };
            if rest.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
                return Err(format!(
                    "process grant: home_read entry {} climbs out of the home directory",
                    entry.display()
                ));
            }
            let credential =
                super::fs_policy::DEFAULT_DENY_READ.iter().map(Path::new).find(|cred| entry.starts_with(cred));
            if let Some(cred) = credential
                && !self.filesystem.allow_read.iter().any(|a| a == entry)
            {
                return Err(format!(
                    "process grant: home_read entry {} is the credential {}: add it to \
                     [producer.grants.process.filesystem] allow_read too if this tool must read it",
                    entry.display(),
                    cred.display()
                ));
            }
        }
        Ok(())
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
    /// directory) against `roots`, the grant's [`Self::working_roots`];
    /// returns the canonical directory to run in.
    pub(crate) fn check_cwd(&self, roots: &[PathBuf], asked: Option<&str>) -> Result<PathBuf, Refusal> {
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
}

#[cfg(test)]
mod home_read_tests {
    use super::*;

    #[test]
    fn home_read_refuses_credentials_unless_allowed_and_paths_outside_the_home() {
        let grant = |entries: &[&str], allow: &[&str]| ProcessGrant {
            home_read: entries.iter().map(PathBuf::from).collect(),
            filesystem: super::super::fs_policy::FsPolicy {
                allow_read: allow.iter().map(PathBuf::from).collect(),
                ..Default::default()
            },
            ..ProcessGrant::default()
        };
        assert_eq!(grant(&["~/.gradle/caches", "~/.config"], &[]).check_home_read(), Ok(()));
        let error = grant(&["~/.ssh/config"], &[]).check_home_read().unwrap_err();
        assert!(error.contains("credential ~/.ssh") && error.contains("allow_read"), "{error}");
        assert_eq!(grant(&["~/.npmrc"], &["~/.npmrc"]).check_home_read(), Ok(()));
        assert!(grant(&["/etc/passwd"], &[]).check_home_read().unwrap_err().contains("read_only_paths"));
        assert!(grant(&["~/../other"], &[]).check_home_read().unwrap_err().contains("climbs out"));
    }
}
