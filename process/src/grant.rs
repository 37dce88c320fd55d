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
/// read_write_paths = ["/work/cache"]     # more read-write roots besides the workspace
/// home_read = ["~/.gradle/caches"]       # more of the home, read-only (besides the defaults)
/// env.pass = ["SSH_AUTH_SOCK"]  # host variables beyond PATH HOME LANG LC_* TERM TZ USER SHELL
/// env.set = { LANG = "C.UTF-8" }
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
        Self { inherit: true, pass: Vec::new(), scrub: DEFAULT_SCRUB.map(String::from).to_vec(), set: BTreeMap::new() }
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

    /// Everything checked when the grant is loaded: its programs
    /// ([`Self::resolve_programs`]), its workspace (never `/`, the home
    /// directory or an ancestor of it) and its home allow list. The error
    /// says what to pass instead.
    pub fn check_at_load(&self) -> anyhow::Result<()> {
        let home = super::fs_policy::home();
        self.check_workspace(home.as_deref()).map_err(anyhow::Error::msg)?;
        self.check_home_read().map_err(anyhow::Error::msg)?;
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

    /// The granted programs' files, resolved (those that exist).
    pub(crate) fn program_files(&self) -> Vec<PathBuf> {
        self.resolution().entries.iter().filter_map(|(_, r)| r.as_ref().ok().cloned()).collect()
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

    /// Checks the name of an environment entry a plugin asked for: well
    /// formed, and not one that changes how programs load or start
    /// ([`LOADER_ENV`]).
    pub(crate) fn check_env_name(name: &OsStr) -> Result<(), Refusal> {
        let bytes = name.as_encoded_bytes();
        if bytes.is_empty() || bytes.contains(&b'=') || bytes.contains(&0) {
            return Err(Refusal::EnvName(name.to_string_lossy().into_owned()));
        }
        let upper = name.to_string_lossy().to_ascii_uppercase();
        for (pattern, why) in LOADER_ENV {
            let hit = match pattern.strip_suffix('*') {
                Some(prefix) => upper.starts_with(prefix),
                None => upper == *pattern,
            };
            if hit {
                return Err(Refusal::EnvLoader { name: name.to_string_lossy().into_owned(), why });
            }
        }
        Ok(())
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
    fn loader_and_startup_variables_are_refused_with_the_fix() {
        for name in
            ["LD_PRELOAD", "ld_audit", "BASH_ENV", "ENV", "BASH_FUNC_cat%%", "PATH", "NODE_OPTIONS", "GCONV_PATH"]
        {
            let refusal = ProcessGrant::check_env_name(OsStr::new(name)).unwrap_err();
            assert!(matches!(refusal, Refusal::EnvLoader { .. }), "{name}: {refusal}");
            let text = refusal.to_string();
            assert!(text.contains(&format!("{name:?}")) && text.contains("`env.set`"), "{text}");
        }
        for name in ["MY_API_KEY", "RUST_LOG", "LANG", "PATHS", "ENVIRONMENT"] {
            assert_eq!(ProcessGrant::check_env_name(OsStr::new(name)), Ok(()), "{name}");
        }
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
