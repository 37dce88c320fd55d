//! What a tree's view holds, from its resolved [`TreePolicy`]: the host's
//! root read-only, private `tmpfs`es over `/tmp` and the runtime
//! directories, a private `/dev`, the read-write roots at their paths, the
//! host's write-protected paths read-only and its protected paths hidden
//! where the view shows them, and the owner's own spill directory.

use std::path::Path;

use super::{MountPlan, Over, SpillView, ViewBuilder};
use crate::fs_policy::TreePolicy;

/// Size of each private `tmpfs` a tree writes (`/tmp`, `/dev/shm`, the
/// runtime directories): they live in memory, so they are bounded.
pub const PRIVATE_TMP_BYTES: u64 = 1 << 30;

/// Host root entries the view never takes from the host: it has its own.
const OWN_ROOT_ENTRIES: [&str; 3] = ["proc", "dev", "tmp"];

/// The view of one tree. `fresh_proc`: I mounts `/proc`; `read_root`:
/// Landlock reads below the view's root.
pub(crate) fn plan(
    policy: &TreePolicy,
    spill: SpillView<'_>,
    fresh_proc: bool,
    read_root: bool,
) -> std::io::Result<MountPlan> {
    let mut view = ViewBuilder::default();
    for entry in std::fs::read_dir("/")?.flatten() {
        let name = entry.file_name();
        if OWN_ROOT_ENTRIES.iter().any(|own| name == *own) {
            continue;
        }
        let path = Path::new("/").join(&name);
        match std::fs::read_link(&path) {
            Ok(target) => view.symlink(&path, &target),
            Err(_) => view.bind(&path, true, Over::Anything),
        }
    }
    let private = |mode: &str| format!("mode={mode},size={PRIVATE_TMP_BYTES}");
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    view.tmpfs(Path::new("/tmp"), private("1777"), flags, false, true);
    for dir in policy.private.iter().filter(|d| *d != Path::new("/tmp")) {
        view.tmpfs(dir, private("0755"), flags, false, true);
    }
    super::private_dev(&mut view, private("1777"));
    for root in &policy.read_write {
        view.bind(root, false, Over::Anything);
    }
    for path in &policy.write_protected {
        view.bind(path, true, Over::HostOnly);
    }
    for path in &policy.deny {
        view.hide(path);
    }
    // Every owner's spill files go; this owner's come back, read-only (so
    // `tail` of a path named in its output works).
    view.tmpfs(spill.hidden, "mode=0755,size=64k".into(), flags | libc::MS_NOEXEC, true, false);
    view.bind(spill.owner, true, Over::Anything);
    view.finish(fresh_proc, read_root)
}
