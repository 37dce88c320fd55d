//! The cgroup filesystem under the limits: finding this process's cgroups
//! in `/proc/self/mountinfo`, probing v2 then v1 for the controllers a tree
//! needs, creating and sweeping bases, and writing, reading, killing and
//! removing a cgroup.
//!
//! Invariant: nothing here decides a policy; [`super::TreeLimiter`] and
//! [`super::owner_cpu`] do.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Backend, Mechanism, TreeLimits};

/// The value of `key` in a flat-keyed cgroup file (`key value` lines); 0
/// when absent.
pub(super) fn counter(file: &Path, key: &str) -> u64 {
    let Ok(text) = std::fs::read_to_string(file) else { return 0 };
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

pub(super) fn write_control(file: &Path, value: &str) -> io::Result<()> {
    std::fs::write(file, value)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {value:?} to {}: {e}", file.display())))
}

pub(super) fn kill_cgroup(dir: &Path, v2: bool) {
    if v2 && std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    // v1 (or v2 before Linux 5.14): kill each listed process. A pid is
    // listed only while its process is in the cgroup (a zombie is not), so
    // it names one of the tree's processes.
    for _ in 0..64 {
        let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) else { return };
        let pids: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            // SAFETY: plain syscall.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Removes a tree's cgroup (killing what is still in it first); false when
/// it is still busy (a process has not finished exiting).
pub(super) fn remove_cgroup(dir: &Path, v2: bool) -> bool {
    match std::fs::remove_dir(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => true,
        Err(_) => {
            kill_cgroup(dir, v2);
            std::fs::remove_dir(dir).is_ok()
        }
    }
}

/// Removes a base and every cgroup below it (trees, owners and the trees
/// inside owners), deepest first.
pub(super) fn remove_base(base: &Path) {
    let v2 = base.join("cgroup.subtree_control").exists();
    fn remove_below(dir: &Path, v2: bool) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_below(&entry.path(), v2);
                remove_cgroup(&entry.path(), v2);
            }
        }
    }
    remove_below(base, v2);
    if let Err(e) = std::fs::remove_dir(base)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::debug!(dir = %base.display(), error = %e, "cannot remove the process trees' cgroup base");
    }
}

/// Removes `taskhost-<pid>-<n>` bases below `parent` whose server is gone.
pub(super) fn sweep_dead_bases(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("taskhost-")) else { continue };
        let Some((pid, n)) = rest.split_once('-') else { continue };
        if pid.parse::<u32>().is_err() || n.parse::<u64>().is_err() || Path::new("/proc").join(pid).exists() {
            continue;
        }
        tracing::debug!(dir = %entry.path().display(), "removing the cgroup base of a dead server");
        remove_base(&entry.path());
    }
}

/// A fresh base `taskhost-<pid>-<n>` below `parent` (stale ones swept first).
pub(super) fn create_base(parent: &Path) -> Result<PathBuf, String> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    sweep_dead_bases(parent);
    let base = parent.join(format!("taskhost-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    match std::fs::create_dir(&base) {
        Ok(()) => Ok(base),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(base),
        Err(e) => Err(format!("cannot create {}: {e}", base.display())),
    }
}

/// One mount of a cgroup file system: where, which of its paths it shows,
/// and its super options (the v1 controllers).
pub(super) struct CgroupMount {
    point: PathBuf,
    root: String,
    v2: bool,
    options: String,
}

pub(super) fn cgroup_mounts() -> Vec<CgroupMount> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let options = right.nth(1).unwrap_or("").to_string();
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(CgroupMount {
                point: PathBuf::from(unescape_mountinfo(fields.get(4)?)),
                root: unescape_mountinfo(fields.get(3)?),
                v2: fstype == "cgroup2",
                options,
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
pub(super) fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if bytes[i] == b'\\'
            && let Some(digits) = octal
        {
            out.push(digits.iter().fold(0u8, |v, d| v.wrapping_mul(8).wrapping_add(d - b'0')));
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of this process's cgroup `path` (as `/proc/self/cgroup`
/// lists it) under `mount`.
pub(super) fn own_dir(mount: &CgroupMount, path: &str) -> Option<PathBuf> {
    let rest = if mount.root == "/" { path } else { path.strip_prefix(mount.root.as_str())? };
    Some(mount.point.join(rest.trim_start_matches('/')))
}

pub(super) fn probe(limits: &TreeLimits) -> Result<(Backend, Mechanism), String> {
    let own =
        std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let mounts = cgroup_mounts();
    let v2 = match probe_v2(limits, &own, &mounts) {
        Ok(base) => return Ok((Backend::V2 { base }, Mechanism::CgroupV2)),
        Err(reason) => reason,
    };
    let v1 = match probe_v1(limits, &own, &mounts) {
        Ok(backend) => return Ok((backend, Mechanism::CgroupV1)),
        Err(reason) => reason,
    };
    Err(format!("{v2}; {v1}"))
}

pub(super) fn needed_controllers(limits: &TreeLimits) -> Vec<&'static str> {
    let mut needed = Vec::new();
    if limits.max_pids != 0 {
        needed.push("pids");
    }
    if limits.max_memory_bytes != 0 {
        needed.push("memory");
    }
    needed
}

pub(super) fn probe_v2(limits: &TreeLimits, own: &str, mounts: &[CgroupMount]) -> Result<PathBuf, String> {
    let path = own.lines().find_map(|l| l.strip_prefix("0::")).ok_or("cgroup v2: this process is in none")?;
    let mount = mounts.iter().find(|m| m.v2).ok_or("cgroup v2: not mounted")?;
    let dir = own_dir(mount, path).ok_or("cgroup v2: this process's cgroup is outside the mount")?;
    let available = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let needed = needed_controllers(limits);
    let missing: Vec<_> = needed.iter().filter(|c| !available.split_whitespace().any(|a| a == **c)).copied().collect();
    if !missing.is_empty() {
        return Err(format!("cgroup v2 at {} has no {} controller", dir.display(), missing.join(" or ")));
    }
    // Children get the controllers only when this cgroup enables them for
    // its subtree, which the kernel allows in a delegated or root cgroup.
    let enable: String = needed.iter().map(|c| format!("+{c} ")).collect();
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    if !needed.iter().all(|c| enabled.split_whitespace().any(|e| e == *c)) {
        std::fs::write(dir.join("cgroup.subtree_control"), enable.trim()).map_err(|e| {
            format!("cgroup v2: cannot enable {} for the children of {}: {e}", needed.join(" and "), dir.display())
        })?;
    }
    let base = create_base(&dir).map_err(|e| format!("cgroup v2: {e}"))?;
    if let Err(e) = std::fs::write(base.join("cgroup.subtree_control"), enable.trim()) {
        remove_base(&base);
        return Err(format!("cgroup v2: cannot enable the controllers in {}: {e}", base.display()));
    }
    Ok(base)
}

/// This process's cgroup directory in the v1 hierarchy of `controller`,
/// from `own` (`/proc/self/cgroup`: `id:controllers:path` lines, the path
/// may hold ':') and the cgroup mounts.
pub(super) fn own_v1_dir(own: &str, mounts: &[CgroupMount], controller: &str) -> Result<PathBuf, String> {
    let path = own
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            parts.next();
            parts.next().zip(parts.next())
        })
        .find(|(controllers, _)| controllers.split(',').any(|c| c == controller))
        .map(|(_, path)| path)
        .ok_or_else(|| format!("cgroup v1: no {controller} hierarchy"))?;
    let mount = mounts
        .iter()
        .find(|m| !m.v2 && m.options.split(',').any(|o| o == controller))
        .ok_or_else(|| format!("cgroup v1: the {controller} hierarchy is not mounted"))?;
    own_dir(mount, path).ok_or_else(|| format!("cgroup v1: this process's {controller} cgroup is outside the mount"))
}

pub(super) fn probe_v1(limits: &TreeLimits, own: &str, mounts: &[CgroupMount]) -> Result<Backend, String> {
    let mut dirs = Vec::new();
    for controller in needed_controllers(limits) {
        let dir = own_v1_dir(own, mounts, controller)?;
        match create_base(&dir) {
            Ok(base) => dirs.push((controller, base)),
            Err(e) => {
                for (_, base) in &dirs {
                    remove_base(base);
                }
                return Err(format!("cgroup v1: {e}"));
            }
        }
    }
    let find = |name: &str| dirs.iter().find(|(c, _)| *c == name).map(|(_, b)| b.clone());
    let memory = find("memory");
    let memsw = memory.as_ref().is_some_and(|m| m.join("memory.memsw.limit_in_bytes").exists());
    Ok(Backend::V1 { pids: find("pids"), memory, memsw })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo(r"/a\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }
}
