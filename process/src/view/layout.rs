//! What a tree's view holds, from its resolved [`TreePolicy`] and the
//! workspace scan ([`super::workspace`]): an allow list.
//!
//! | Path | In the view |
//! |---|---|
//! | [`super::system::SYSTEM_READ`], `/sys/devices/system/cpu` | the host's, read-only (secrets in `/etc` hidden) |
//! | `/proc` | a fresh one of the tree's PID namespace |
//! | `/dev` | private ([`super::private_dev`]) |
//! | `/tmp`, `/var/tmp`, `/run` (`/var/run` → `/run`) | private, empty `tmpfs`es |
//! | `$HOME` | a private, empty `tmpfs`, with the home allow list bound read-only |
//! | the workspace and `read_write_paths` | the host's, read-write, with the read-only set held inside |
//! | `read_only_paths`, the granted programs | the host's, read-only |
//! | the owner's spill directory | the host's, read-only |
//! | anything else | nothing |
//!
//! Invariant: a path the view must keep read-only or hidden inside a
//! read-write root is *held*: every directory between the root and it is a
//! mount point of its own (bound onto itself), and `rename(2)` refuses to
//! move a mount point (`EBUSY`), so renaming an ancestor cannot carry the
//! protection away and leave the path to be made again.

use std::path::{Path, PathBuf};

use super::workspace::Found;
use super::{MountPlan, Over, SpillView, ViewBuilder};
use crate::fs_policy::TreePolicy;

/// Size of each private `tmpfs` a tree writes (`/tmp`, `/var/tmp`, `/run`,
/// `/dev/shm`, its home) when a memory cgroup holds the tree: they live in
/// memory, charged to the tree's memory bound, and are bounded each.
pub const PRIVATE_TMP_BYTES: u64 = 1 << 30;

/// What the private `tmpfs`es of a tree share when no memory cgroup holds it
/// (the rlimit fallback): their pages are then charged to no bound of the
/// tree, so their sizes are drawn from this one small budget (256 MiB; see
/// [`TmpfsSizes::BUDGETED`]).
pub const FALLBACK_TMPFS_BUDGET_BYTES: u64 = 256 << 20;

/// The sizes of a tree's private `tmpfs`es.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TmpfsSizes {
    pub tmp: u64,
    pub var_tmp: u64,
    pub run: u64,
    pub dev_shm: u64,
    pub home: u64,
}

impl TmpfsSizes {
    /// With a memory cgroup: [`PRIVATE_TMP_BYTES`] each.
    pub const CHARGED: Self = Self {
        tmp: PRIVATE_TMP_BYTES,
        var_tmp: PRIVATE_TMP_BYTES,
        run: PRIVATE_TMP_BYTES,
        dev_shm: PRIVATE_TMP_BYTES,
        home: PRIVATE_TMP_BYTES,
    };
    /// Without: [`FALLBACK_TMPFS_BUDGET_BYTES`] split as `/tmp` 96 MiB,
    /// `/var/tmp` 32 MiB, `/run` 16 MiB, `/dev/shm` 64 MiB, the home 48 MiB.
    pub const BUDGETED: Self =
        Self { tmp: 96 << 20, var_tmp: 32 << 20, run: 16 << 20, dev_shm: 64 << 20, home: 48 << 20 };

    /// Their sum: what one tree can hold in memory through them.
    pub const fn total(&self) -> u64 {
        self.tmp + self.var_tmp + self.run + self.dev_shm + self.home
    }
}

/// The view of one tree, and every host path it was planned from (see
/// [`crate::spawn_cache`]). `found`: the workspace scan's result;
/// `fresh_proc`: I mounts `/proc`; `read_root`: Landlock reads below the
/// view's root.
pub(crate) fn plan(
    policy: &TreePolicy,
    found: &Found,
    spill: SpillView<'_>,
    fresh_proc: bool,
    read_root: bool,
    sizes: TmpfsSizes,
) -> std::io::Result<(MountPlan, Vec<PathBuf>)> {
    let mut view = ViewBuilder::default();
    super::system::add(&mut view);
    let private = |mode: &str, size: u64| format!("mode={mode},size={size}");
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    for (dir, size) in [("/tmp", sizes.tmp), ("/var/tmp", sizes.var_tmp)] {
        view.tmpfs(Path::new(dir), private("1777", size), flags, false, true);
    }
    view.tmpfs(Path::new("/run"), private("0755", sizes.run), flags, false, true);
    view.symlink(Path::new("/var/run"), Path::new("/run"));
    super::private_dev(&mut view, private("1777", sizes.dev_shm));
    if let Some(home) = &policy.home {
        view.tmpfs(home, private("0700", sizes.home), flags, false, true);
        if let Some(alias) = &policy.home_alias {
            // `$HOME` names the home through a symlink (`/home` → `/var/home`).
            view.symlink(alias, home);
        }
        for (shown, host) in &policy.home_read {
            if shown != host {
                // Reached through a symlink: the link in the home, the
                // host's directory at its own path.
                view.symlink(shown, host);
            }
            view.bind_at(host, host, true);
        }
    }
    for path in &policy.read_only {
        view.bind(path, true, Over::ViewOnly);
    }
    for program in &policy.programs {
        view.bind(program, true, Over::ViewOnly);
    }
    let roots: Vec<&PathBuf> = policy.read_write.iter().chain(&found.git_dirs).collect();
    for root in &roots {
        view.bind(root, false, Over::Anything);
    }
    let read_only: Vec<&PathBuf> = found.read_only.iter().chain(&policy.write_protected).collect();
    // Holds every directory between a path and its root, unless an
    // ancestor is read-only itself (then nothing below it moves).
    let held = |view: &mut ViewBuilder, path: &Path| {
        if read_only.iter().any(|ro| path != ro.as_path() && path.starts_with(ro)) {
            return;
        }
        let Some(root) = roots.iter().filter(|r| path.starts_with(r)).max_by_key(|r| r.components().count()) else {
            return;
        };
        let between: Vec<&Path> = path.ancestors().skip(1).take_while(|a| *a != root.as_path()).collect();
        for dir in between.into_iter().rev() {
            view.bind(dir, false, Over::HostOnly);
        }
    };
    for path in &read_only {
        held(&mut view, path);
        view.bind(path, true, Over::HostOnly);
    }
    for path in &policy.deny {
        held(&mut view, path);
        view.hide(path);
    }
    // Every owner's spill files go where the view shows them; this owner's
    // come back, read-only (so `tail` of a path named in its output works).
    view.tmpfs_over_host(spill.hidden, "mode=0755,size=64k".into(), flags | libc::MS_NOEXEC, true);
    view.bind(spill.owner, true, Over::Anything);
    if !fresh_proc {
        view.bind_required(Path::new("/proc"), false);
    }
    let consulted = view.take_consulted();
    Ok((view.finish(fresh_proc, read_root)?, consulted))
}
