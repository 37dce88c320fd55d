//! Limits per process tree: how many processes a tree may hold at once and
//! how much memory it may use together, enforced by the first mechanism that
//! works: a cgroup v2 child, a cgroup v1 child (pids, memory), else rlimits.
//!
//! One [`TreeLimiter`] per [`super::ProcessHost`] decides the mechanism once,
//! off the start's path. Cgroups: a base `taskhost-<server pid>-<n>` with one
//! `tree-<id>` child per tree (`pids.max`, `memory.max` and no swap, or the
//! v1 equivalents). Rlimits (one warning, with the reason): `RLIMIT_NPROC`
//! and `RLIMIT_DATA`, set in the keeper right after it entered its user
//! namespace; weaker (`RLIMIT_DATA` bounds each process, not the tree, and
//! without a user namespace `RLIMIT_NPROC` counts the server's whole user).
//! The keeper joins its cgroups before it unshares or forks, so every process
//! of the tree starts inside them.
//!
//! Invariants:
//! - A tree whose cgroup cannot be created or joined does not start (the
//!   spawn fails, or the keeper exits 126 with `taskhost: …`).
//! - A tree's cgroup outlives the tree only while processes it could not kill
//!   at once are still exiting; it is removed when the tree is reaped, else
//!   retried at the next spawn and at shutdown. The base goes with the
//!   [`TreeLimiter`]; bases of dead servers are swept when it is created.
//! - Killing a tree with SIGKILL also kills everything in its cgroup.
//! - A spawn does not wait for the kernel to create a cgroup: the limiter
//!   keeps one made ahead (on a blocking thread, after each spawn) and hands
//!   it out; only when two spawns race does one create its own.
//! - Each owner session's trees share one CPU cgroup ([`owner_cpu`]); in v2
//!   a tree's cgroup is made inside its owner's.
//! - Every tree also gets `RLIMIT_NOFILE` and `RLIMIT_FSIZE` (per process,
//!   whatever the mechanism), set by its keeper with the fallback's.

mod cgroupfs;
pub mod owner_cpu;

pub use owner_cpu::CpuShare;

use cgroupfs::{
    cgroup_mounts, counter, create_base, kill_cgroup, own_v1_dir, probe, remove_base, remove_cgroup, write_control,
};

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Default of `[process] max_pids_per_tree`.
pub const DEFAULT_MAX_PIDS_PER_TREE: u64 = 512;
/// Default of `[process] max_memory_bytes_per_tree` (2 GiB).
pub const DEFAULT_MAX_MEMORY_BYTES_PER_TREE: u64 = 2 << 30;
/// Default of `[process] max_open_files_per_tree` (`RLIMIT_NOFILE`): 1024
/// × 512 pids = 524 288 open files per tree at most.
pub const DEFAULT_MAX_OPEN_FILES_PER_TREE: u64 = 1024;
/// Default of `[process] max_file_bytes_per_tree` (`RLIMIT_FSIZE`, 2 GiB).
pub const DEFAULT_MAX_FILE_BYTES_PER_TREE: u64 = 2 << 30;
/// Default of `[process] cpu_weight_per_owner` (cgroup v2's default weight).
pub const DEFAULT_CPU_WEIGHT_PER_OWNER: u64 = 100;
/// The smallest accepted open-files limit: a shell, its pipes and a
/// pipeline's stages.
pub const MIN_OPEN_FILES_PER_TREE: u64 = 64;
/// The smallest accepted file-size limit (1 MiB).
pub const MIN_FILE_BYTES_PER_TREE: u64 = 1 << 20;
/// The smallest accepted pids limit: the keeper, the init, the command and a
/// few pipeline stages must fit.
pub const MIN_PIDS_PER_TREE: u64 = 8;
/// The smallest accepted memory limit (16 MiB): a shell and the keeper must fit.
pub const MIN_MEMORY_BYTES_PER_TREE: u64 = 16 << 20;

/// The limits of every tree; 0 means no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeLimits {
    pub max_pids: u64,
    pub max_memory_bytes: u64,
}

impl TreeLimits {
    /// Checks the configured values; the error names the key and the fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_pids != 0 && self.max_pids < MIN_PIDS_PER_TREE {
            return Err(format!(
                "[process] max_pids_per_tree = {} is too small: a tree needs at least {MIN_PIDS_PER_TREE} \
                 (its keeper, init, the command and a few pipeline stages); use 0 for no limit",
                self.max_pids
            ));
        }
        if self.max_memory_bytes != 0 && self.max_memory_bytes < MIN_MEMORY_BYTES_PER_TREE {
            return Err(format!(
                "[process] max_memory_bytes_per_tree = {} is too small: a tree needs at least \
                 {MIN_MEMORY_BYTES_PER_TREE} (16 MiB); use 0 for no limit",
                self.max_memory_bytes
            ));
        }
        Ok(())
    }

    fn none(&self) -> bool {
        self.max_pids == 0 && self.max_memory_bytes == 0
    }
}

/// `512 processes, 2 GiB of memory`, for the logs.
pub(crate) fn describe(limits: &TreeLimits) -> String {
    let pids =
        if limits.max_pids == 0 { "no process limit".to_string() } else { format!("{} processes", limits.max_pids) };
    let memory = if limits.max_memory_bytes == 0 {
        "no memory limit".to_string()
    } else {
        format!("{} of memory", human_bytes(limits.max_memory_bytes))
    };
    format!("{pids}, {memory}")
}

/// How this host enforces [`TreeLimits`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// No limit is configured.
    Unlimited,
    CgroupV2,
    CgroupV1,
    /// The fallback; the reason no cgroup could be used.
    Rlimits(String),
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unlimited => f.write_str("none configured"),
            Self::CgroupV2 => f.write_str("cgroup v2"),
            Self::CgroupV1 => f.write_str("cgroup v1"),
            Self::Rlimits(_) => f.write_str("rlimits"),
        }
    }
}

#[derive(Debug)]
enum Backend {
    None,
    Rlimits,
    V2 { base: PathBuf },
    V1 { pids: Option<PathBuf>, memory: Option<PathBuf>, memsw: bool },
}

/// Creates the cgroups of trees (see the module doc). One per process host.
#[derive(Debug)]
pub(crate) struct TreeLimiter {
    limits: TreeLimits,
    backend: Backend,
    mechanism: Mechanism,
    next: AtomicU64,
    /// Tree cgroups whose removal failed (a process was still exiting).
    leftovers: Arc<Mutex<Vec<PathBuf>>>,
    /// A tree cgroup made ahead, limits set, for the next spawn, with the
    /// directory it was made in (an owner's, in v2 with a CPU share).
    ready: Mutex<Option<(PathBuf, TreeCgroup)>>,
    /// The owners' CPU cgroups.
    cpu: owner_cpu::OwnerCgroups,
}

impl TreeLimiter {
    /// Sweeps the bases of dead servers and picks the mechanism; logs which
    /// (a warning with the reason when it falls back to rlimits, once per
    /// process).
    pub(crate) fn new(limits: TreeLimits, cpu_weight: u64) -> Self {
        let (backend, mechanism) = if limits.none() {
            (Backend::None, Mechanism::Unlimited)
        } else {
            match probe(&limits) {
                Ok((backend, mechanism)) => (backend, mechanism),
                Err(reason) => (Backend::Rlimits, Mechanism::Rlimits(reason)),
            }
        };
        static LOGGED: std::sync::Once = std::sync::Once::new();
        LOGGED.call_once(|| match &mechanism {
            Mechanism::Rlimits(reason) => tracing::warn!(
                max_pids_per_tree = limits.max_pids,
                max_memory_bytes_per_tree = limits.max_memory_bytes,
                "no cgroup for process trees ({reason}); limiting each tree with rlimits instead \
                 (RLIMIT_NPROC per tree, RLIMIT_DATA per process)"
            ),
            mechanism => tracing::info!(
                max_pids_per_tree = limits.max_pids,
                max_memory_bytes_per_tree = limits.max_memory_bytes,
                %mechanism,
                "process tree limits"
            ),
        });
        let leftovers: Arc<Mutex<Vec<PathBuf>>> = Default::default();
        let v2_base = match &backend {
            Backend::V2 { base } => Some(base.as_path()),
            _ => None,
        };
        let cpu = owner_cpu::OwnerCgroups::new(cpu_weight, v2_base, leftovers.clone());
        static CPU_LOGGED: std::sync::Once = std::sync::Once::new();
        CPU_LOGGED.call_once(|| match cpu.share() {
            CpuShare::Unavailable(_) => tracing::warn!(cpu_share = %cpu.share(), "no CPU share per owner"),
            share => tracing::info!(cpu_share = %share, "CPU share per owner"),
        });
        let limiter =
            Self { limits, backend, mechanism, next: AtomicU64::new(1), leftovers, ready: Mutex::new(None), cpu };
        static TMPFS_LOGGED: std::sync::Once = std::sync::Once::new();
        if !limiter.charges_memory() {
            TMPFS_LOGGED.call_once(|| {
                tracing::warn!(
                    budget = %human_bytes(crate::view::FALLBACK_TMPFS_BUDGET_BYTES),
                    "no memory cgroup holds the process trees: each tree's private /tmp, /var/tmp, /run, /dev/shm \
                     and home share a small budget, and memory is bounded less strictly (per process, not per tree)"
                )
            });
        }
        limiter
    }

    pub(crate) fn cpu_share(&self) -> &CpuShare {
        self.cpu.share()
    }

    /// Whether a memory cgroup holds each tree (then its `tmpfs` pages are
    /// charged to the tree's memory bound).
    pub(crate) fn charges_memory(&self) -> bool {
        match &self.backend {
            Backend::V2 { .. } => self.limits.max_memory_bytes != 0,
            Backend::V1 { memory, .. } => memory.is_some(),
            Backend::None | Backend::Rlimits => false,
        }
    }

    /// The sizes of a tree's private `tmpfs`es: large each under a memory
    /// cgroup, else from one small budget.
    pub(crate) fn tmpfs_sizes(&self) -> crate::view::TmpfsSizes {
        if self.charges_memory() { crate::view::TmpfsSizes::CHARGED } else { crate::view::TmpfsSizes::BUDGETED }
    }

    pub(crate) fn mechanism(&self) -> &Mechanism {
        &self.mechanism
    }

    /// The rlimits a tree's keeper sets (`RLIMIT_NPROC`, `RLIMIT_DATA`; 0:
    /// leave as is), in the fallback only.
    pub(crate) fn rlimits(&self) -> (u64, u64) {
        match self.backend {
            Backend::Rlimits => (self.limits.max_pids, self.limits.max_memory_bytes),
            _ => (0, 0),
        }
    }

    /// The cgroup(s) of a new tree of the owner whose spill directory is
    /// `owner`, limits set (the one made ahead, else a fresh one), joined to
    /// the owner's CPU cgroup; `None` when trees get no cgroup.
    pub(crate) fn tree(self: &Arc<Self>, owner: &Path) -> io::Result<Option<TreeCgroup>> {
        let owner_cgroup = self.cpu.owner(owner)?;
        if matches!(self.backend, Backend::None | Backend::Rlimits) {
            return Ok(owner_cgroup.map(|cgroup| self.empty_tree().with_owner(cgroup)));
        }
        let parent = self.parent_of_trees(owner_cgroup.as_deref());
        let ahead = {
            let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
            match ready.take() {
                Some((made_in, tree)) if made_in == parent => Some(tree),
                other => {
                    *ready = other;
                    None
                }
            }
        };
        let tree = match ahead {
            Some(tree) => tree,
            None => match self.create(&parent)? {
                Some(tree) => tree,
                None => return Ok(None),
            },
        };
        Ok(Some(match owner_cgroup {
            Some(cgroup) => tree.with_owner(cgroup),
            None => tree,
        }))
    }

    /// Where a tree's cgroup is made: its owner's CPU cgroup in v2, else the
    /// base.
    fn parent_of_trees(&self, owner: Option<&owner_cpu::OwnerCgroup>) -> PathBuf {
        match (owner.and_then(owner_cpu::OwnerCgroup::v2_dir), &self.backend) {
            (Some(dir), _) => dir.to_path_buf(),
            (None, Backend::V2 { base }) => base.clone(),
            (None, Backend::V1 { .. } | Backend::None | Backend::Rlimits) => PathBuf::new(),
        }
    }

    fn empty_tree(&self) -> TreeCgroup {
        TreeCgroup {
            dirs: Vec::new(),
            procs: Vec::new(),
            limits: self.limits,
            v2: matches!(self.backend, Backend::V2 { .. }),
            memory_dir: None,
            pids_dir: None,
            leftovers: self.leftovers.clone(),
            owner: None,
        }
    }

    /// Makes the next tree's cgroup on a blocking thread of the current
    /// tokio runtime. Called once the tree started: creating a cgroup while
    /// the keeper is being spawned slows the spawn.
    /// `owner`: the spill directory of the owner who spawned last (in v2
    /// with a CPU share, the next tree is made in that owner's cgroup).
    pub(crate) fn make_ahead_in_background(self: &Arc<Self>, owner: &Path) {
        if matches!(self.backend, Backend::None | Backend::Rlimits) {
            return;
        }
        let Ok(owner_cgroup) = self.cpu.owner(owner) else { return };
        let parent = self.parent_of_trees(owner_cgroup.as_deref());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let limiter = self.clone();
            runtime.spawn_blocking(move || {
                limiter.make_ahead(&parent);
                // The owner's cgroup stays until the made-ahead tree is used.
                drop(owner_cgroup);
            });
        }
    }

    /// Fills the slot of the cgroup made ahead (in `parent`), if it is empty.
    fn make_ahead(&self, parent: &Path) {
        if self.ready.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            return;
        }
        match self.create(parent) {
            Ok(tree) => {
                let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
                if ready.is_none() {
                    *ready = tree.map(|tree| (parent.to_path_buf(), tree));
                }
                // Else another thread won; ours drops (removed).
            }
            Err(error) => tracing::debug!(%error, "cannot make a tree cgroup ahead"),
        }
    }

    /// Creates the cgroup(s) of a new tree, limits set; in v2 in `parent`.
    fn create(&self, parent: &Path) -> io::Result<Option<TreeCgroup>> {
        self.retry_leftovers();
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("tree-{n}");
        let mut tree = self.empty_tree();
        // On failure, `tree` drops and removes what was created.
        match &self.backend {
            Backend::None | Backend::Rlimits => return Ok(None),
            Backend::V2 { .. } => {
                let dir = tree.add_dir(parent.join(&name))?;
                if self.limits.max_pids != 0 {
                    write_control(&dir.join("pids.max"), &self.limits.max_pids.to_string())?;
                }
                if self.limits.max_memory_bytes != 0 {
                    write_control(&dir.join("memory.max"), &self.limits.max_memory_bytes.to_string())?;
                    let swap = dir.join("memory.swap.max");
                    if swap.exists() {
                        write_control(&swap, "0")?;
                    }
                }
                tree.memory_dir = Some(dir.clone());
                tree.pids_dir = Some(dir);
            }
            Backend::V1 { pids, memory, memsw } => {
                if let Some(base) = pids {
                    let dir = tree.add_dir(base.join(&name))?;
                    write_control(&dir.join("pids.max"), &self.limits.max_pids.to_string())?;
                    tree.pids_dir = Some(dir);
                }
                if let Some(base) = memory {
                    let dir = tree.add_dir(base.join(&name))?;
                    let bytes = self.limits.max_memory_bytes.to_string();
                    write_control(&dir.join("memory.limit_in_bytes"), &bytes)?;
                    if *memsw {
                        write_control(&dir.join("memory.memsw.limit_in_bytes"), &bytes)?;
                    }
                    tree.memory_dir = Some(dir);
                }
            }
        }
        Ok(Some(tree))
    }

    fn retry_leftovers(&self) {
        let mut leftovers = self.leftovers.lock().unwrap_or_else(|e| e.into_inner());
        leftovers.retain(|dir| !remove_cgroup(dir, !matches!(self.backend, Backend::V2 { .. })));
    }

    fn bases(&self) -> Vec<&Path> {
        let mut bases: Vec<&Path> = match &self.backend {
            Backend::V2 { base } => vec![base],
            Backend::V1 { pids, memory, .. } => pids.iter().chain(memory).map(PathBuf::as_path).collect(),
            Backend::None | Backend::Rlimits => Vec::new(),
        };
        bases.extend(self.cpu.v1_base());
        bases
    }
}

impl Drop for TreeLimiter {
    fn drop(&mut self) {
        drop(self.ready.lock().unwrap_or_else(|e| e.into_inner()).take());
        self.retry_leftovers();
        for base in self.bases() {
            remove_base(base);
        }
    }
}

/// The cgroup(s) of one tree. Dropping it kills what is left in them and
/// removes them.
#[derive(Debug)]
pub(crate) struct TreeCgroup {
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` of each directory, for the keeper to join.
    procs: Vec<CString>,
    limits: TreeLimits,
    v2: bool,
    memory_dir: Option<PathBuf>,
    pids_dir: Option<PathBuf>,
    leftovers: Arc<Mutex<Vec<PathBuf>>>,
    /// The owner's CPU cgroup, held while this tree's cgroups exist (dropped
    /// after them: a v2 owner's cgroup can go only once its trees' have).
    owner: Option<Arc<owner_cpu::OwnerCgroup>>,
}

impl TreeCgroup {
    /// Joins (and holds) the owner's CPU cgroup: in v1 the keeper writes
    /// itself into it too.
    fn with_owner(mut self, owner: Arc<owner_cpu::OwnerCgroup>) -> Self {
        if let Some(procs) = owner.procs() {
            self.procs.push(procs.clone());
        }
        self.owner = Some(owner);
        self
    }

    fn add_dir(&mut self, dir: PathBuf) -> io::Result<PathBuf> {
        std::fs::create_dir(&dir)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot create the tree's cgroup {}: {e}", dir.display())))?;
        self.dirs.push(dir.clone());
        self.procs.push(
            CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a cgroup path holds a NUL byte"))?,
        );
        Ok(dir)
    }

    /// The `cgroup.procs` files the keeper writes itself into.
    pub(crate) fn procs_files(&self) -> &[CString] {
        &self.procs
    }

    /// SIGKILLs everything in the tree's cgroups: v2 `cgroup.kill`, else each
    /// listed pid, until the lists are empty (bounded: forks that race the
    /// kill are capped by `pids.max`).
    pub(crate) fn kill(&self) {
        for dir in &self.dirs {
            kill_cgroup(dir, self.v2);
        }
    }

    /// What the tree ran into, as lines for its stderr: the memory limit when
    /// the kernel OOM-killed one of its processes, the pids limit when a fork
    /// was refused.
    pub(crate) fn limits_reached(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if let Some(dir) = &self.memory_dir {
            let (file, key) = if self.v2 { ("memory.events", "oom_kill") } else { ("memory.oom_control", "oom_kill") };
            if counter(&dir.join(file), key) > 0 {
                notes.push(format!(
                    "taskhost: memory limit ({}) of this process tree reached: the kernel killed a process of it \
                     ([process] max_memory_bytes_per_tree)",
                    human_bytes(self.limits.max_memory_bytes)
                ));
            }
        }
        if let Some(dir) = &self.pids_dir
            && counter(&dir.join("pids.events"), "max") > 0
        {
            notes.push(format!(
                "taskhost: process limit ({}) of this process tree reached: some forks were refused \
                 ([process] max_pids_per_tree)",
                self.limits.max_pids
            ));
        }
        notes
    }
}

impl Drop for TreeCgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            if !remove_cgroup(dir, self.v2) {
                self.leftovers.lock().unwrap_or_else(|e| e.into_inner()).push(dir.clone());
            }
        }
    }
}

/// `64 MiB`, `2 GiB`, or bytes.
pub(crate) fn human_bytes(bytes: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_below_the_minimum_are_refused_with_the_key() {
        let small = TreeLimits { max_pids: 3, max_memory_bytes: 0 };
        assert!(small.validate().unwrap_err().contains("max_pids_per_tree = 3"));
        let small = TreeLimits { max_pids: 0, max_memory_bytes: 1 << 20 };
        assert!(small.validate().unwrap_err().contains("max_memory_bytes_per_tree"));
        assert!(TreeLimits { max_pids: 0, max_memory_bytes: 0 }.validate().is_ok());
        assert!(TreeLimits { max_pids: 512, max_memory_bytes: 2 << 30 }.validate().is_ok());
    }

    #[test]
    fn the_host_configuration_refuses_a_tiny_limit_by_name() {
        use crate::ProcessHostConfig;
        let error = ProcessHostConfig { max_pids_per_tree: 2, ..Default::default() }.validate().unwrap_err();
        assert!(error.contains("max_pids_per_tree = 2 is too small"), "{error}");
        let config = ProcessHostConfig { max_memory_bytes_per_tree: 0, ..Default::default() };
        assert!(config.validate().is_ok());
        assert_eq!(config.tree_limits(), TreeLimits { max_pids: 512, max_memory_bytes: 0 });
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(2 << 30), "2 GiB");
        assert_eq!(human_bytes(64 << 20), "64 MiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
    }
}
