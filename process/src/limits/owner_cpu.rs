//! A CPU share per owner session: one cgroup per owner holds the CPU time of
//! all its trees, every owner's with the same weight, so a busy host is split
//! between owners by the kernel's scheduler, not between their trees.
//!
//! Layout. cgroup v1 (the `cpu` hierarchy, apart from `pids` and `memory`):
//! a base `taskhost-<server pid>-<n>` below the server's own `cpu` cgroup,
//! `owner-<n>` below it with `cpu.shares`; a tree's keeper writes itself into
//! its owner's `cgroup.procs` beside its tree cgroups. cgroup v2 (one
//! hierarchy, a process is in one cgroup): `owner-<n>` in the tree limiter's
//! base with `cpu.weight`, and each tree's cgroup is made inside it.
//!
//! Invariants:
//! - An owner's cgroup lives while any of its trees' cgroups does (each
//!   `TreeCgroup` holds it), and for the [`RECENT_OWNER_CGROUPS`]
//!   owners that spawned last (so an owner's next tree does not make it
//!   again); then it is removed, and one whose removal fails is retried with
//!   the trees' leftovers.
//! - Where none can be made, trees run without one and [`CpuShare`] says why
//!   (logged once, and in [`crate::ProcessHost::describe_bounds`]).

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// How many owners' CPU cgroups are kept between their trees (as
/// [`crate::RECENT_OWNER_SPILL_DIRS`] for their spill directories).
pub const RECENT_OWNER_CGROUPS: usize = 16;

/// How each owner's CPU share is enforced on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuShare {
    /// `[process] cpu_weight_per_owner = 0`.
    Off,
    /// One cgroup v2 per owner with this `cpu.weight`.
    CgroupV2 { weight: u64 },
    /// One cgroup v1 per owner with these `cpu.shares`.
    CgroupV1 { shares: u64 },
    /// None could be made: why.
    Unavailable(String),
}

impl std::fmt::Display for CpuShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Off => f.write_str("off ([process] cpu_weight_per_owner = 0)"),
            Self::CgroupV2 { weight } => write!(f, "cgroup v2, cpu.weight {weight} per owner"),
            Self::CgroupV1 { shares } => write!(f, "cgroup v1, cpu.shares {shares} per owner"),
            Self::Unavailable(why) => {
                write!(f, "UNAVAILABLE ({why}): one owner's busy commands can slow every other owner's")
            }
        }
    }
}

#[derive(Debug)]
enum Backend {
    None,
    V1 { base: PathBuf, shares: u64 },
    V2 { base: PathBuf, weight: u64 },
}

/// The owners' CPU cgroups of one process host.
#[derive(Debug)]
pub(crate) struct OwnerCgroups {
    backend: Backend,
    share: CpuShare,
    next: AtomicU64,
    live: Mutex<HashMap<PathBuf, Weak<OwnerCgroup>>>,
    /// The cgroups of the owners that spawned last, most recent last.
    recent: Mutex<std::collections::VecDeque<Arc<OwnerCgroup>>>,
    leftovers: Arc<Mutex<Vec<PathBuf>>>,
}

/// One owner's CPU cgroup.
#[derive(Debug)]
pub(crate) struct OwnerCgroup {
    dir: PathBuf,
    /// v1: the `cgroup.procs` a keeper joins (in v2 the tree's cgroup is
    /// inside `dir`, so joining that is enough).
    procs: Option<CString>,
    v2: bool,
    leftovers: Arc<Mutex<Vec<PathBuf>>>,
}

impl OwnerCgroup {
    /// In v2, the directory the owner's trees' cgroups are made in.
    pub(crate) fn v2_dir(&self) -> Option<&Path> {
        self.v2.then_some(self.dir.as_path())
    }

    pub(crate) fn procs(&self) -> Option<&CString> {
        self.procs.as_ref()
    }
}

impl Drop for OwnerCgroup {
    fn drop(&mut self) {
        if std::fs::remove_dir(&self.dir).is_err() && self.dir.exists() {
            self.leftovers.lock().unwrap_or_else(|e| e.into_inner()).push(self.dir.clone());
        }
    }
}

impl OwnerCgroups {
    /// Decides how owners get their share. `v2_base`: the tree limiter's
    /// cgroup v2 base, when it has one; `weight`: `cpu_weight_per_owner`.
    pub(crate) fn new(weight: u64, v2_base: Option<&Path>, leftovers: Arc<Mutex<Vec<PathBuf>>>) -> Self {
        let (backend, share) = if weight == 0 {
            (Backend::None, CpuShare::Off)
        } else {
            match probe(weight, v2_base) {
                Ok((backend, share)) => (backend, share),
                Err(why) => (Backend::None, CpuShare::Unavailable(why)),
            }
        };
        Self {
            backend,
            share,
            next: AtomicU64::new(1),
            live: Default::default(),
            recent: Default::default(),
            leftovers,
        }
    }

    pub(crate) fn share(&self) -> &CpuShare {
        &self.share
    }

    /// The CPU cgroup of the owner whose spill directory is `owner`, made on
    /// its first tree; `None` when owners get none.
    pub(crate) fn owner(&self, owner: &Path) -> io::Result<Option<Arc<OwnerCgroup>>> {
        let cgroup = self.find_or_make(owner)?;
        if let Some(cgroup) = &cgroup {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if recent.back().is_none_or(|last| !Arc::ptr_eq(last, cgroup)) {
                recent.retain(|held| !Arc::ptr_eq(held, cgroup));
                recent.push_back(cgroup.clone());
            }
            let evicted = (recent.len() > RECENT_OWNER_CGROUPS).then(|| recent.pop_front());
            // Removed (if no tree holds it) outside the lock.
            drop(recent);
            drop(evicted);
        }
        Ok(cgroup)
    }

    fn find_or_make(&self, owner: &Path) -> io::Result<Option<Arc<OwnerCgroup>>> {
        let (base, v2, file, value) = match &self.backend {
            Backend::None => return Ok(None),
            Backend::V1 { base, shares } => (base, false, "cpu.shares", shares),
            Backend::V2 { base, weight } => (base, true, "cpu.weight", weight),
        };
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cgroup) = live.get(owner).and_then(Weak::upgrade) {
            return Ok(Some(cgroup));
        }
        live.retain(|_, weak| weak.strong_count() > 0);
        let dir = base.join(format!("owner-{}", self.next.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&dir).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot create the owner's CPU cgroup {}: {e}", dir.display()))
        })?;
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a cgroup path holds a NUL byte"))?;
        let cgroup = Arc::new(OwnerCgroup {
            dir: dir.clone(),
            procs: (!v2).then_some(procs),
            v2,
            leftovers: self.leftovers.clone(),
        });
        super::write_control(&dir.join(file), &value.to_string())?;
        if v2 {
            // The tree cgroups inside get the limits' controllers.
            let controllers = std::fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
            let enable: Vec<String> =
                controllers.split_whitespace().filter(|c| *c != "cpu").map(|c| format!("+{c}")).collect();
            if !enable.is_empty() {
                super::write_control(&dir.join("cgroup.subtree_control"), &enable.join(" "))?;
            }
        }
        live.insert(owner.to_path_buf(), Arc::downgrade(&cgroup));
        Ok(Some(cgroup))
    }

    /// The v1 base, removed with the limiter (v2 owners live in the limits'
    /// base, removed with it).
    pub(crate) fn v1_base(&self) -> Option<&Path> {
        match &self.backend {
            Backend::V1 { base, .. } => Some(base),
            _ => None,
        }
    }
}

/// cgroup v1 `cpu.shares` for a v2-style weight (100 ↔ 1024, the defaults).
pub(crate) fn shares_for_weight(weight: u64) -> u64 {
    (weight * 1024 / 100).max(2)
}

fn probe(weight: u64, v2_base: Option<&Path>) -> Result<(Backend, CpuShare), String> {
    if let Some(base) = v2_base {
        return probe_v2(base)
            .map(|()| (Backend::V2 { base: base.to_path_buf(), weight }, CpuShare::CgroupV2 { weight }));
    }
    let own =
        std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let mounts = super::cgroup_mounts();
    // No v2 base to hold owners (the trees' limits did not find one).
    let dir = super::own_v1_dir(&own, &mounts, "cpu")?;
    let base = super::create_base(&dir).map_err(|e| format!("cgroup v1 cpu: {e}"))?;
    let shares = shares_for_weight(weight);
    Ok((Backend::V1 { base, shares }, CpuShare::CgroupV1 { shares }))
}

/// Enables the `cpu` controller for the owners' cgroups in the v2 base.
fn probe_v2(base: &Path) -> Result<(), String> {
    let parent = base.parent().ok_or("cgroup v2: the base has no parent")?;
    let available = std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
    if !available.split_whitespace().any(|c| c == "cpu") {
        return Err(format!("cgroup v2 at {} has no cpu controller", parent.display()));
    }
    let enabled = std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
    if !enabled.split_whitespace().any(|c| c == "cpu") {
        std::fs::write(parent.join("cgroup.subtree_control"), "+cpu")
            .map_err(|e| format!("cgroup v2: cannot enable cpu for the children of {}: {e}", parent.display()))?;
    }
    std::fs::write(base.join("cgroup.subtree_control"), "+cpu")
        .map_err(|e| format!("cgroup v2: cannot enable cpu in {}: {e}", base.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_weight_as_v2_maps_them() {
        assert_eq!(shares_for_weight(100), 1024);
        assert_eq!(shares_for_weight(50), 512);
        assert_eq!(shares_for_weight(1), 10);
    }

    #[test]
    fn an_unavailable_share_says_what_it_costs() {
        let text = CpuShare::Unavailable("cgroup v1: no cpu".into()).to_string();
        assert!(text.contains("UNAVAILABLE (cgroup v1: no cpu)") && text.contains("slow every other owner"), "{text}");
    }
}
