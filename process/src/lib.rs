//! taskhost-process: the `process` capability, confined process trees for
//! plugins.
//!
//! Model: a [`ProcessHost`] (one per host) checks each [`SpawnRequest`]
//! against the plugin's [`ProcessGrant`], builds the environment, confines
//! the tree ([`confine`]: its own process group always; its own PID and
//! network namespaces and Landlock rules where the kernel allows), and
//! returns a [`Process`]: consuming, non-blocking reads of stdout and stderr
//! into bounded buffers that spill to files in the host's private spill
//! directory, within per-tree pids and memory limits ([`limits`]), a readiness future, the exit status, and kill (SIGTERM to the
//! group, SIGKILL after the grace).
//!
//! Invariants:
//! - Nothing starts that the grant does not allow; refusals say why.
//! - stdin is `/dev/null` unless the request asks for a pipe
//!   ([`StdinMode::Pipe`], written without ever blocking: [`stdin`]); the
//!   environment is rebuilt, never inherited as is ([`env`]).
//! - No task process outlives its [`Process`], its task, or the host: the
//!   handle kills on drop; with PID namespaces, the tree dies with its
//!   command; a death signal ties every tree to the host process. The
//!   exception is asked for: a durable tree ([`durable`]) outlives the
//!   host, never its deadline.
//! - A tree's output can be forwarded ([`Process::forward_output`]): then
//!   it goes, formatted, into the task's [`OutputSink`] as it is read,
//!   bounded there rather than in per-stream buffers ([`forward`]).
//! - Spill files live in a 0700 directory of this host and are removed when
//!   their last holder (the process, or whoever took
//!   [`Process::spill_files`]) drops them, and with the directory when the
//!   [`ProcessHost`] drops. Each owner session's files are in a directory of
//!   its own, which only its trees can read; the host keeps the
//!   [`RECENT_OWNER_SPILL_DIRS`] most recently used ones between tasks
//!   (empty once their files are gone).

mod child;
pub mod confine;
pub mod durable;
pub mod durable_follow;
pub mod env;
pub mod forward;
pub mod fs_policy;
pub mod grant;
mod handle;
pub mod keeper;
mod landlock;
mod launch;
pub mod limits;
pub mod output;
mod plan;
mod sandbox;
mod spawn;
use spawn::Spawned;
mod spawn_cache;
mod stdin;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod view;
mod watch;
pub use keeper::zygote;

#[cfg(test)]
mod tests;

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use confine::{Applied, ConfinementSupport};
pub use durable::{AdoptError, DurableExit, DurableProcess, DurableRecord, DurableSpawn};
pub use durable_follow::{FollowedTree, LogOffsets, LogRelease, TreeCursor, TreeEnd};
pub use forward::{OutputSink, StreamSections};
pub use grant::{ArgumentRule, EnvPolicy, ProcessGrant, ProcessLimits, Refusal};
pub use handle::{ExitStatus, Process, ProcessWatch, Stream, kill_all, live_count, signal_name};
pub use limits::{CpuShare, Mechanism as LimitMechanism, TreeLimits};
pub use output::{OwnerSpill, SpillFile, StreamChunk};
pub use stdin::{STDIN_BUFFER_BYTES, StdinError, StdinMode};

/// One process to start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpawnRequest {
    /// Program and arguments; `argv[0]` is checked against the grant.
    pub argv: Vec<String>,
    /// Working directory (relative to the grant's default); `None`: the default.
    pub cwd: Option<String>,
    /// Explicit variables; they win over every other layer.
    pub env: Vec<(String, String)>,
    /// Unread bytes kept in memory per stream (at most the grant's limit).
    pub memory_cap: Option<usize>,
    /// Spill file cap per stream (at most the grant's limit).
    pub spill_cap: Option<u64>,
    /// Grace between SIGTERM and SIGKILL (at most the grant's limit).
    pub kill_grace: Option<Duration>,
    /// Kill the tree (as [`Process::kill`]) when it runs longer than this.
    pub timeout: Option<Duration>,
    /// `/dev/null` (the default) or a pipe written with
    /// [`Process::write_stdin`].
    pub stdin: StdinMode,
}

/// Why a spawn did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("could not start {program}: {source}")]
    Failed {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// Host-wide settings of the process capability.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessHostConfig {
    /// Where the private spill directory is created; default: the system's
    /// temporary directory.
    pub spill_root: Option<PathBuf>,
    /// Paths no process tree may read (nor write): taskhost's own state.
    /// The host fills it when it builds the process host (the configuration
    /// file, HTTP token files, the compile cache directory, the spill root;
    /// see `setup::PluginRuntime`); a configuration may add more.
    /// `~/.cache/taskhost` is always among them; `~/` is the server's home.
    /// They stay hidden wherever they are, a workspace included.
    pub protected_paths: Vec<PathBuf>,
    /// Paths every tree may read but never write, replace, rename or remove:
    /// the configuration files and plugin files the server loads (and
    /// whatever else it must be able to trust later). Each one that exists
    /// at a spawn is bound read-only at its own path in the tree's view,
    /// inside a workspace too. The host fills it (see `setup::PluginRuntime`);
    /// a configuration may add more. A path listed here and in
    /// `protected_paths` stays hidden.
    pub write_protected_paths: Vec<PathBuf>,
    /// Bytes the spill files of one owner session may hold together
    /// (default 256 MiB); output beyond it is cut with a notice in the file.
    pub spill_bytes_per_owner: u64,
    /// Processes (threads included) one tree may hold at once (default 512;
    /// 0: no limit, at least 8 otherwise). A fork beyond it fails.
    pub max_pids_per_tree: u64,
    /// Memory one tree may use together, page cache included (default
    /// 2 GiB; 0: no limit, at least 16 MiB otherwise). Beyond it the kernel
    /// kills the tree's largest process; with the rlimit fallback it bounds
    /// each process's data instead (see [`limits`]).
    pub max_memory_bytes_per_tree: u64,
    /// Files one process of a tree may hold open (`RLIMIT_NOFILE`, soft and
    /// hard; default 1024; 0: the server's own limit). It bounds each
    /// process, so a tree holds at most this × `max_pids_per_tree` (1024 ×
    /// 512 = 524 288 by default, against the host's `fs.file-max`: see
    /// ARCHITECTURE.md's limits). Never above the server's own hard limit.
    pub max_open_files_per_tree: u64,
    /// The largest file a process of a tree may write or extend
    /// (`RLIMIT_FSIZE`, `fallocate` included; default 2 GiB; 0: no limit).
    /// A write beyond it fails with `EFBIG` (the writer gets `SIGXFSZ`). It
    /// bounds each file, not the disk a tree fills.
    pub max_file_bytes_per_tree: u64,
    /// The CPU weight of each owner session's cgroup (default 100, 1..=10000;
    /// 0: no CPU share): every owner's trees share one cgroup, siblings of
    /// equal weight, so one owner's busy trees cannot starve another's
    /// (cgroup v2 `cpu.weight`; v1 `cpu.shares` = weight × 1024 / 100).
    /// Where no cgroup can be made, trees get none and the server says so
    /// (see [`ProcessHost::describe_bounds`]).
    pub cpu_weight_per_owner: u64,
}

impl Default for ProcessHostConfig {
    fn default() -> Self {
        Self {
            spill_root: None,
            protected_paths: Vec::new(),
            write_protected_paths: Vec::new(),
            spill_bytes_per_owner: DEFAULT_SPILL_BYTES_PER_OWNER,
            max_pids_per_tree: limits::DEFAULT_MAX_PIDS_PER_TREE,
            max_memory_bytes_per_tree: limits::DEFAULT_MAX_MEMORY_BYTES_PER_TREE,
            max_open_files_per_tree: limits::DEFAULT_MAX_OPEN_FILES_PER_TREE,
            max_file_bytes_per_tree: limits::DEFAULT_MAX_FILE_BYTES_PER_TREE,
            cpu_weight_per_owner: limits::DEFAULT_CPU_WEIGHT_PER_OWNER,
        }
    }
}

impl ProcessHostConfig {
    /// The per-tree limits it configures.
    pub fn tree_limits(&self) -> TreeLimits {
        TreeLimits { max_pids: self.max_pids_per_tree, max_memory_bytes: self.max_memory_bytes_per_tree }
    }

    /// Checks what can be checked without creating anything.
    pub fn validate(&self) -> Result<(), String> {
        self.tree_limits().validate()?;
        if self.max_open_files_per_tree != 0 && self.max_open_files_per_tree < limits::MIN_OPEN_FILES_PER_TREE {
            return Err(format!(
                "[process] max_open_files_per_tree = {} is too small: a shell and its pipes need at least {}; \
                 use 0 for the server's own limit",
                self.max_open_files_per_tree,
                limits::MIN_OPEN_FILES_PER_TREE
            ));
        }
        if self.max_file_bytes_per_tree != 0 && self.max_file_bytes_per_tree < limits::MIN_FILE_BYTES_PER_TREE {
            return Err(format!(
                "[process] max_file_bytes_per_tree = {} is too small: at least {} (1 MiB); use 0 for no limit",
                self.max_file_bytes_per_tree,
                limits::MIN_FILE_BYTES_PER_TREE
            ));
        }
        if self.cpu_weight_per_owner > 10_000 {
            return Err(format!(
                "[process] cpu_weight_per_owner = {} is out of range: 1..=10000 (cgroup cpu.weight), or 0 for no CPU share",
                self.cpu_weight_per_owner
            ));
        }
        Ok(())
    }
}

/// Default of [`ProcessHostConfig::spill_bytes_per_owner`] (256 MiB).
pub const DEFAULT_SPILL_BYTES_PER_OWNER: u64 = 256 << 20;

/// The host side of the `process` capability.
pub struct ProcessHost {
    spill_dir: PathBuf,
    /// The configured protected paths.
    protected: Vec<PathBuf>,
    /// The configured write-protected paths.
    write_protected: Vec<PathBuf>,
    /// The spill directory of each owner session that has one.
    owners: std::sync::Mutex<Owners>,
    next_owner: AtomicU64,
    spill_bytes_per_owner: u64,
    next_id: AtomicU64,
    /// Spill files with no task record to live in (foreground runs), newest last.
    retained: std::sync::Mutex<std::collections::VecDeque<Arc<SpillFile>>>,
    /// Every tree's pids and memory limits, as configured.
    tree_limits: TreeLimits,
    /// `RLIMIT_NOFILE` and `RLIMIT_FSIZE` of every tree's processes (0: as
    /// the server's), NOFILE already capped at the server's hard limit.
    open_files: u64,
    file_bytes: u64,
    /// The configured CPU weight of each owner (0: none).
    cpu_weight: u64,
    /// How they are enforced: decided (cgroups probed, a base created, dead
    /// servers' bases swept) off the start's path, by [`Self::start_ahead`]'s
    /// thread, or by the first spawn or query that needs it.
    limiter: Arc<std::sync::OnceLock<Arc<limits::TreeLimiter>>>,
    /// The start-ahead housekeeping thread (the limiter, then the removal of
    /// dead hosts' spill directories): its spill root until started, then
    /// its handle until waited for.
    cleanup: std::sync::Mutex<Cleanup>,
    /// Resolved filesystem policies and view plans of recent spawns, kept
    /// while the paths they were computed from are unchanged.
    spawn_cache: spawn_cache::SpawnCache,
    /// The workspaces' read-only sets, their listings remembered.
    scanner: view::workspace::Scanner,
}

/// The state of [`ProcessHost`]'s start-ahead housekeeping thread.
enum Cleanup {
    /// Not started: the spill root to sweep.
    Pending(PathBuf),
    Running(std::thread::JoinHandle<()>),
    Done,
}

/// The owner sessions' spill directories.
#[derive(Default)]
struct Owners {
    /// Every live directory, by owner key.
    by_key: std::collections::HashMap<String, std::sync::Weak<OwnerSpill>>,
    /// The directories of the [`RECENT_OWNER_SPILL_DIRS`] owners that asked
    /// last, held so that an owner's next tree does not make its directory
    /// again (most recent last).
    recent: std::collections::VecDeque<Arc<OwnerSpill>>,
}

/// How many owners' (empty) spill directories the host keeps between their
/// tasks; the least recently used goes first.
pub const RECENT_OWNER_SPILL_DIRS: usize = 16;

/// How many spill files of foreground runs the host keeps (the oldest go first).
pub const RETAINED_FOREGROUND_SPILLS: usize = 64;

impl std::fmt::Debug for ProcessHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessHost").field("spill_dir", &self.spill_dir).finish()
    }
}

impl ProcessHost {
    /// Probes confinement (logged once per host process) and creates the
    /// private spill directory.
    pub fn new(config: &ProcessHostConfig) -> std::io::Result<Arc<Self>> {
        let host = Self::new_unstarted(config)?;
        host.start_ahead();
        Ok(host)
    }

    /// Starts, in the background, what the first spawn would otherwise wait
    /// for: the tree limiter, the confinement probe and the first warm
    /// keeper; and the removal of dead hosts' spill directories. Idempotent.
    pub fn start_ahead(&self) {
        self.start_housekeeping();
        confine::probe_in_background();
        // The first tree's keeper is started (and waits) ahead of need.
        zygote::start_ahead();
    }

    /// As [`Self::new`], without [`Self::start_ahead`]: for a start that
    /// wants no background work competing with it yet. It only creates the
    /// spill directory; the first spawn still works (it decides the tree
    /// limits, probes and starts a keeper itself), and dead hosts' spill
    /// directories are removed once [`Self::start_ahead`] runs.
    pub fn new_unstarted(config: &ProcessHostConfig) -> std::io::Result<Arc<Self>> {
        config.validate().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let root = config.spill_root.clone().unwrap_or_else(std::env::temp_dir);
        let spill_dir = create_private_dir(&root)?;
        tracing::debug!(spill_dir = %spill_dir.display(), "process spill directory");
        Ok(Arc::new(Self {
            spill_dir,
            protected: config.protected_paths.clone(),
            write_protected: config.write_protected_paths.clone(),
            owners: Default::default(),
            next_owner: AtomicU64::new(1),
            spill_bytes_per_owner: config.spill_bytes_per_owner,
            next_id: AtomicU64::new(1),
            retained: Default::default(),
            tree_limits: config.tree_limits(),
            open_files: capped_open_files(config.max_open_files_per_tree),
            file_bytes: config.max_file_bytes_per_tree,
            cpu_weight: config.cpu_weight_per_owner,
            limiter: Default::default(),
            cleanup: std::sync::Mutex::new(Cleanup::Pending(root)),
            spawn_cache: Default::default(),
            scanner: Default::default(),
        }))
    }

    /// Starts the housekeeping thread, once: it decides the tree limiter
    /// (so the first spawn finds it ready), then removes dead hosts' spill
    /// directories (scanning a busy temp dir takes milliseconds; no directory
    /// it removes can be this host's, whose pid is alive). Without a thread,
    /// both run here.
    fn start_housekeeping(&self) {
        let mut cleanup = self.cleanup.lock().unwrap_or_else(|e| e.into_inner());
        let Cleanup::Pending(root) = &*cleanup else { return };
        let root = root.clone();
        let (limiter, limits, cpu_weight) = (self.limiter.clone(), self.tree_limits, self.cpu_weight);
        let work = move |root: &Path| {
            limiter.get_or_init(|| Arc::new(limits::TreeLimiter::new(limits, cpu_weight)));
            remove_orphaned_dirs(root);
        };
        let (in_thread, fallback) = (work.clone(), root.clone());
        *cleanup =
            match std::thread::Builder::new().name("taskhost-spill-cleanup".into()).spawn(move || in_thread(&root)) {
                Ok(handle) => Cleanup::Running(handle),
                Err(_) => {
                    work(&fallback);
                    Cleanup::Done
                }
            };
    }

    /// Waits until the spill directories of dead hosts, which
    /// [`Self::start_ahead`] removes on a thread of its own, are gone
    /// (starting that removal if nothing started it).
    pub fn wait_for_spill_cleanup(&self) {
        self.start_housekeeping();
        let cleanup = std::mem::replace(&mut *self.cleanup.lock().unwrap_or_else(|e| e.into_inner()), Cleanup::Done);
        if let Cleanup::Running(handle) = cleanup {
            let _ = handle.join();
        }
    }

    /// The tree limiter, decided now unless the housekeeping thread did (or
    /// is doing: then this waits for it).
    fn limiter(&self) -> &Arc<limits::TreeLimiter> {
        self.limiter.get_or_init(|| Arc::new(limits::TreeLimiter::new(self.tree_limits, self.cpu_weight)))
    }

    /// How the trees' bounds are enforced here, as a line for `describe`
    /// and the logs: the pids and memory mechanism, the CPU share per owner
    /// (or why there is none), the open-file and file-size rlimits.
    pub fn describe_bounds(&self) -> String {
        let limiter = self.limiter();
        let rlimit = |value: u64| if value == 0 { "as the server's".to_string() } else { value.to_string() };
        format!(
            "tree limits: {} by {}; CPU share per owner: {}; open files per process: {}; file size: {}",
            limits::describe(&self.tree_limits),
            limiter.mechanism(),
            limiter.cpu_share(),
            rlimit(self.open_files),
            if self.file_bytes == 0 { "no limit".to_string() } else { limits::human_bytes(self.file_bytes) },
        )
    }

    /// The sizes of each tree's private `tmpfs`es here (large each under a
    /// memory cgroup, else from [`view::FALLBACK_TMPFS_BUDGET_BYTES`]).
    pub fn tmpfs_sizes(&self) -> view::TmpfsSizes {
        self.limiter().tmpfs_sizes()
    }

    /// How each owner's CPU share is enforced here (or why it is not).
    pub fn cpu_share(&self) -> &CpuShare {
        self.limiter().cpu_share()
    }

    /// How the per-tree limits are enforced here.
    pub fn limit_mechanism(&self) -> &LimitMechanism {
        self.limiter().mechanism()
    }

    /// The per-tree limits.
    pub fn tree_limits(&self) -> TreeLimits {
        self.tree_limits
    }

    /// What confinement the kernel allows here.
    pub fn support(&self) -> &'static ConfinementSupport {
        confine::support()
    }

    /// Keeps spill files that no task record holds (a foreground run's output
    /// may name them) for as long as this host lives, up to
    /// [`RETAINED_FOREGROUND_SPILLS`] files: the oldest are deleted first.
    pub fn retain_spill_files(&self, files: Vec<Arc<SpillFile>>) {
        let mut retained = self.retained.lock().unwrap_or_else(|e| e.into_inner());
        retained.extend(files);
        while retained.len() > RETAINED_FOREGROUND_SPILLS {
            retained.pop_front();
        }
    }

    /// The private directory spill files are written to.
    pub fn spill_dir(&self) -> &Path {
        &self.spill_dir
    }

    /// The private spill directory of `owner` (an owner session's key; `""`
    /// for host-level callers), created on first use (mode 0700, below this
    /// host's spill directory). It lives while anything holds it: the
    /// owner's stores and spill files, and this host for the
    /// [`RECENT_OWNER_SPILL_DIRS`] owners that asked last.
    pub fn owner_spill(&self, owner: &str) -> std::io::Result<Arc<OwnerSpill>> {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        let spill = match owners.by_key.get(owner).and_then(std::sync::Weak::upgrade) {
            Some(live) => live,
            None => {
                owners.by_key.retain(|_, weak| weak.strong_count() > 0);
                let n = self.next_owner.fetch_add(1, Ordering::Relaxed);
                let spill = OwnerSpill::create(self.spill_dir.join(format!("owner-{n}")), self.spill_bytes_per_owner)?;
                owners.by_key.insert(owner.to_string(), Arc::downgrade(&spill));
                spill
            }
        };
        owners.recent.retain(|held| !Arc::ptr_eq(held, &spill));
        owners.recent.push_back(spill.clone());
        let evicted = (owners.recent.len() > RECENT_OWNER_SPILL_DIRS).then(|| owners.recent.pop_front());
        // An evicted directory nothing else holds is removed: not under the lock.
        drop(owners);
        drop(evicted);
        Ok(spill)
    }

    /// [`Self::spawn_for`] a host-level caller (no owner session).
    pub async fn spawn(
        &self,
        grant: &ProcessGrant,
        request: SpawnRequest,
        parent: &tracing::Span,
    ) -> Result<Process, SpawnError> {
        let owner = self.owner_spill("").map_err(|source| SpawnError::Failed {
            program: request.argv.first().cloned().unwrap_or_default(),
            source,
        })?;
        self.spawn_for(&owner, grant, request, parent).await
    }

    /// Checks `request` against `grant` and starts it. Needs a tokio runtime.
    /// `parent` is the caller's span (plugin, task); the process's span is
    /// its child. Spill files go to `owner`'s directory, which the tree may
    /// read (read-only); other owners' directories it cannot see.
    pub async fn spawn_for(
        &self,
        owner: &Arc<OwnerSpill>,
        grant: &ProcessGrant,
        request: SpawnRequest,
        parent: &tracing::Span,
    ) -> Result<Process, SpawnError> {
        match self.spawn_tree(owner, grant, request, None, parent)? {
            Spawned::Process(process) => Ok(process),
            Spawned::Durable(_) => unreachable!("a tree spawned without durable options is not durable"),
        }
    }

    /// As [`Self::spawn_for`], a durable tree ([`durable`]): it outlives
    /// this server (until `durable.ttl`), its output goes to logs in
    /// `durable.dir`, and a later server re-adopts it by
    /// [`DurableProcess::record`]. Its keeper is always forked (the warm
    /// and exec'd keepers do not take these duties yet), and its pids and
    /// memory are bounded by rlimits, not by this server's cgroups (which go
    /// with the server). `request.timeout` is not used: the ttl is the bound.
    pub async fn spawn_durable(
        &self,
        owner: &Arc<OwnerSpill>,
        grant: &ProcessGrant,
        request: SpawnRequest,
        durable: DurableSpawn,
        parent: &tracing::Span,
    ) -> Result<DurableProcess, SpawnError> {
        match self.spawn_tree(owner, grant, request, Some(durable), parent)? {
            Spawned::Durable(process) => Ok(process),
            Spawned::Process(_) => unreachable!("a tree spawned with durable options is durable"),
        }
    }
}

impl Drop for ProcessHost {
    fn drop(&mut self) {
        // The housekeeping thread holds the limiter while it decides it:
        // wait, so the limiter (and its cgroup base) goes with this host.
        if let Cleanup::Running(handle) =
            std::mem::replace(&mut *self.cleanup.lock().unwrap_or_else(|e| e.into_inner()), Cleanup::Done)
        {
            let _ = handle.join();
        }
        if let Err(e) = std::fs::remove_dir_all(&self.spill_dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.spill_dir.display(), error = %e, "could not remove the spill directory");
        }
    }
}

/// `RLIMIT_NOFILE` for trees: `configured` (0: leave the server's), never
/// above the server's own hard limit (which an unprivileged server cannot
/// raise, so a tree's keeper could not either).
fn capped_open_files(configured: u64) -> u64 {
    if configured == 0 {
        return 0;
    }
    let mut own = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain syscall into a local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut own) } != 0 {
        return configured;
    }
    #[allow(clippy::unnecessary_cast, reason = "rlim_t is not u64 on every target")]
    configured.min(own.rlim_max as u64)
}

/// Removes spill directories (`taskhost-<pid>-<n>`) whose host process is
/// gone: a host killed by a signal cannot remove its own. A directory whose
/// pid is alive is left alone, even if that pid now names another process.
fn remove_orphaned_dirs(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("taskhost-")) else { continue };
        let Some((pid, n)) = rest.split_once('-') else { continue };
        if pid.parse::<u32>().is_err() || n.parse::<u64>().is_err() {
            continue;
        }
        if Path::new("/proc").join(pid).exists() {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_dir_all(&path) {
            Ok(()) => tracing::debug!(dir = %path.display(), "removed the spill directory of a dead host"),
            Err(e) => tracing::debug!(dir = %path.display(), error = %e, "cannot remove a stale spill directory"),
        }
    }
}

/// Creates `<root>/taskhost-<pid>-<n>` with mode 0700.
fn create_private_dir(root: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    for attempt in 0..100u32 {
        let dir = root.join(format!("taskhost-{}-{}", std::process::id(), nanos.wrapping_add(attempt)));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(std::io::Error::new(e.kind(), format!("cannot create {}: {e}", dir.display())));
            }
        }
    }
    Err(std::io::Error::other(format!("cannot create a spill directory under {}", root.display())))
}
