//! What a confined spawn computes from the host's filesystem, kept between
//! spawns: each grant's resolved policy ([`TreePolicy`]) and each view plan
//! ([`MountPlan`]), reused until a path they were computed from changes.
//!
//! Model: one [`PathWatch`] serves the whole cache. A lookup first reads
//! its events; a change to any watched path drops every entry and the watch
//! (recomputing is the rare path, and one instance keeps the host's inotify
//! budget untouched by the number of grants and owners). A miss computes,
//! watches every path the computation read, computes again, and keeps the
//! second result if it read the same paths (the watch's invariant: nothing
//! that changes after the watch goes unseen, nothing before it is missed).
//!
//! Invariants:
//! - A cached value is never older than [`RECHECK_EVERY`] without a check:
//!   a policy's paths are `stat`ed again (device, inode, type), a plan is
//!   computed again. This bounds what inotify cannot report (a mount or
//!   unmount on the host).
//! - Without inotify (or for a path it cannot watch), a policy is checked
//!   by `stat` on every spawn, as before this cache had a watch, and a plan
//!   is computed on every spawn.
//! - At most [`SpawnCache::POLICIES`] policies and [`SpawnCache::PLANS`]
//!   plans are kept; the least recently used goes first.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::fs_policy::{PolicyInputs, Resolutions, TreePolicy};
use crate::view::workspace::Found;
use crate::view::{MountPlan, SpillView, TmpfsSizes};
use crate::watch::PathWatch;

/// How long a cached value is used without being checked again.
pub(crate) const RECHECK_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct CachedPolicy {
    inputs: PolicyInputs,
    paths: Resolutions,
    policy: Arc<TreePolicy>,
    /// Its paths are watched: no `stat` needed until [`RECHECK_EVERY`].
    watched: bool,
    checked: Instant,
}

/// Everything a view plan is computed from besides the filesystem.
#[derive(Debug, PartialEq, Eq)]
struct PlanKey {
    policy: Arc<TreePolicy>,
    found: Found,
    spill_hidden: PathBuf,
    spill_owner: PathBuf,
    fresh_proc: bool,
    read_root: bool,
    sizes: TmpfsSizes,
}

#[derive(Debug)]
struct CachedPlan {
    key: PlanKey,
    plan: Arc<MountPlan>,
    checked: Instant,
}

#[derive(Debug, Default)]
struct Entries {
    /// `None` until a miss needs it, and after a change dropped it.
    watch: Option<PathWatch>,
    policies: Vec<CachedPolicy>,
    plans: Vec<CachedPlan>,
}

impl Entries {
    /// Drops everything if a watched path changed.
    fn forget_if_changed(&mut self) {
        if self.watch.as_mut().is_some_and(PathWatch::changed) {
            tracing::debug!("a path the spawn cache watches changed: policies and views are resolved again");
            *self = Self::default();
        }
    }

    /// Watches `paths` (a watch is made if there is none); `false` if one
    /// cannot be watched.
    fn watch<'a>(&mut self, paths: impl IntoIterator<Item = &'a Path>) -> bool {
        if self.watch.is_none() {
            self.watch = PathWatch::new();
        }
        self.watch.as_mut().is_some_and(|watch| watch.watch(paths))
    }
}

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct SpawnCache {
    entries: Mutex<Entries>,
}

impl SpawnCache {
    /// Policies kept (one per grant in practice).
    pub(crate) const POLICIES: usize = 8;
    /// View plans kept (one per grant and owner in practice).
    pub(crate) const PLANS: usize = 64;

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.forget_if_changed();
        entries
    }

    /// The policy [`TreePolicy::resolve`] would give now.
    pub(crate) fn policy(&self, inputs: PolicyInputs) -> Arc<TreePolicy> {
        let mut entries = self.lock();
        if let Some(index) = entries.policies.iter().position(|e| e.inputs == inputs) {
            let entry = &mut entries.policies[index];
            let fresh = entry.watched && entry.checked.elapsed() < RECHECK_EVERY;
            if fresh || entry.paths.all_hold() {
                if !fresh {
                    entry.checked = Instant::now();
                }
                let policy = entry.policy.clone();
                let entry = entries.policies.remove(index);
                entries.policies.push(entry);
                return policy;
            }
            entries.policies.remove(index);
        }
        let mut paths = Resolutions::default();
        let mut policy = TreePolicy::resolve(&inputs, &mut paths);
        let mut watched = entries.watch(paths.paths());
        if watched {
            // Resolved again under the watch (see the module doc).
            let mut again = Resolutions::default();
            let second = TreePolicy::resolve(&inputs, &mut again);
            watched = again.paths().eq(paths.paths());
            policy = second;
            paths = again;
        }
        let policy = Arc::new(policy);
        entries.policies.push(CachedPolicy { inputs, paths, policy: policy.clone(), watched, checked: Instant::now() });
        if entries.policies.len() > Self::POLICIES {
            entries.policies.remove(0);
        }
        policy
    }

    /// The view [`crate::view::plan`] would give now, for `policy` as
    /// returned by [`Self::policy`].
    pub(crate) fn plan(
        &self,
        policy: &Arc<TreePolicy>,
        found: &Found,
        spill: SpillView<'_>,
        fresh_proc: bool,
        read_root: bool,
        sizes: TmpfsSizes,
    ) -> std::io::Result<Arc<MountPlan>> {
        let key = PlanKey {
            policy: policy.clone(),
            found: found.clone(),
            spill_hidden: spill.hidden.to_path_buf(),
            spill_owner: spill.owner.to_path_buf(),
            fresh_proc,
            read_root,
            sizes,
        };
        let mut entries = self.lock();
        if let Some(index) = entries.plans.iter().position(|e| e.key == key) {
            let entry = entries.plans.remove(index);
            if entry.checked.elapsed() < RECHECK_EVERY {
                let plan = entry.plan.clone();
                entries.plans.push(entry);
                return Ok(plan);
            }
        }
        let compute = || crate::view::plan(policy, found, spill, fresh_proc, read_root, sizes);
        let (plan, consulted) = compute()?;
        if !entries.watch(consulted.iter().map(PathBuf::as_path)) {
            return Ok(Arc::new(plan));
        }
        let (again, consulted_again) = compute()?;
        let plan = Arc::new(again);
        if consulted_again == consulted {
            entries.plans.push(CachedPlan { key, plan: plan.clone(), checked: Instant::now() });
            if entries.plans.len() > Self::PLANS {
                entries.plans.remove(0);
            }
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs_policy::FsPolicy;

    fn grant_with(filesystem: FsPolicy) -> crate::ProcessGrant {
        crate::ProcessGrant { filesystem, ..crate::ProcessGrant::default() }
    }

    /// A cached policy is reused while its paths hold, and resolved again
    /// when a denied path appears, disappears or is replaced by a link.
    #[test]
    fn the_cache_sees_every_change_of_a_denied_path() {
        let dir = std::env::temp_dir().join(format!("taskhost-fs-policy-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let dir = dir.canonicalize().unwrap();
        let (cred, elsewhere) = (dir.join("cred"), dir.join("elsewhere"));
        std::fs::create_dir_all(&elsewhere).unwrap();
        let grant = grant_with(FsPolicy { deny_read: vec![cred.clone()], allow_read: vec![] });
        let cache = SpawnCache::default();
        let inputs = |grant: &crate::ProcessGrant| PolicyInputs::new(grant, std::slice::from_ref(&dir), &[], &[]);
        let policy = || cache.policy(inputs(&grant));
        let uncached = || TreePolicy::new(&inputs(&grant));

        let first = policy();
        assert!(!first.deny.contains(&cred), "a missing path is not mounted over");
        assert!(Arc::ptr_eq(&first, &policy()), "nothing changed: the resolution is reused");

        std::fs::create_dir(&cred).unwrap();
        let created = policy();
        assert!(created.deny.contains(&cred), "a credential directory created after the first spawn is denied");
        assert_eq!(*created, uncached());

        std::fs::remove_dir(&cred).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &cred).unwrap();
        let linked = policy();
        assert!(linked.deny.contains(&elsewhere), "a link to a directory denies the directory it names");
        assert!(!linked.deny.contains(&cred));
        assert_eq!(*linked, uncached());

        std::fs::remove_file(&cred).unwrap();
        let removed = policy();
        assert!(!removed.deny.contains(&elsewhere) && !removed.deny.contains(&cred));
        assert_eq!(*removed, uncached());

        let other = grant_with(FsPolicy { deny_read: vec![elsewhere.clone()], allow_read: vec![] });
        let by_grant = cache.policy(inputs(&other));
        assert!(by_grant.deny.contains(&elsewhere), "another grant is another entry");
        assert!(Arc::ptr_eq(&removed, &policy()), "the first grant's entry is still there");
        std::fs::remove_dir_all(&dir).unwrap();
    }
    /// A cached view is reused while nothing it was planned from changes,
    /// and planned again when a file it hides appears in the workspace.
    #[test]
    fn a_cached_view_is_planned_again_when_a_path_it_read_changes() {
        let dir = std::env::temp_dir().join(format!("taskhost-spawn-cache-view-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("spill/owner")).unwrap();
        let dir = dir.canonicalize().unwrap();
        let work = dir.join("work");
        std::fs::create_dir(&work).unwrap();
        let secret = work.join("secret");
        let grant = grant_with(FsPolicy { deny_read: vec![secret.clone()], allow_read: vec![] });
        let cache = SpawnCache::default();
        let policy = || cache.policy(PolicyInputs::new(&grant, std::slice::from_ref(&work), &[], &[]));
        let spill = SpillView { hidden: &dir.join("spill"), owner: &dir.join("spill/owner") };
        let sizes = crate::view::TmpfsSizes::BUDGETED;
        let found = Found::default();
        let plan = |policy: &Arc<TreePolicy>| cache.plan(policy, &found, spill, true, true, sizes).unwrap();
        let uncached =
            |policy: &Arc<TreePolicy>| crate::view::plan(policy, &found, spill, true, true, sizes).unwrap().0;
        let hides_secret = |plan: &MountPlan| {
            plan.ops.iter().any(|op| matches!(op, crate::view::MountOp::Bind { target, .. } if target.to_bytes() == secret.as_os_str().as_encoded_bytes()))
        };

        let first_policy = policy();
        let first = plan(&first_policy);
        assert!(!hides_secret(&first), "nothing to hide yet");
        assert!(Arc::ptr_eq(&first, &plan(&policy())), "nothing changed: the plan is reused");

        std::fs::write(&secret, "x").unwrap();
        let created_policy = policy();
        let created = plan(&created_policy);
        assert!(hides_secret(&created), "a file created after the first spawn is hidden at the next");
        assert_eq!(*created, uncached(&created_policy));

        std::fs::remove_file(&secret).unwrap();
        let removed_policy = policy();
        let removed = plan(&removed_policy);
        assert!(!hides_secret(&removed));
        assert_eq!(*removed, uncached(&removed_policy));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
