//! The system part of every tree's view: the directories programs run
//! from, read-only, and what a stock Debian, Ubuntu, Fedora or NixOS needs
//! besides; everything else of the host's root (`/home`, `/root`, `/mnt`,
//! `/media`, `/srv`, `/boot`, `/var`, the rest of `/sys`, sockets under
//! `/run`) does not exist in it.
//!
//! Invariant: a host symlink among these (merged `/usr`: `/bin → usr/bin`)
//! is a symlink in the view too, so paths resolve as on the host.

use std::path::Path;

use super::{Over, ViewBuilder};

/// Host directories every view shows read-only at their paths (those that
/// exist; symlinks as symlinks): programs, libraries, the loader,
/// configuration (its secrets hidden: [`crate::fs_policy::SYSTEM_DENY_READ`]),
/// `/opt`, and the Nix store.
pub const SYSTEM_READ: &[&str] =
    &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/nix/store"];

/// Of `/sys`, only the CPU topology, read-only: `get_nprocs` (so Python's
/// `os.cpu_count`), `lscpu` and runtimes sizing thread pools read it
/// (`nproc` and Rust's `available_parallelism` ask the scheduler).
pub const SYS_READ: &[&str] = &["/sys/devices/system/cpu"];

pub(crate) fn add(view: &mut ViewBuilder) {
    for path in SYSTEM_READ.iter().map(Path::new) {
        view.consult(path);
        match std::fs::read_link(path) {
            Ok(target) => view.symlink(path, &target),
            Err(_) => view.bind(path, true, Over::Anything),
        }
    }
    for path in SYS_READ.iter().map(Path::new) {
        view.bind(path, true, Over::Anything);
    }
    // A resolver configuration kept under /run (systemd-resolved's stub):
    // the file itself, in the tree's private /run.
    view.consult(Path::new("/etc/resolv.conf"));
    if let Ok(target) = Path::new("/etc/resolv.conf").canonicalize()
        && target.starts_with("/run")
    {
        view.bind(&target, true, Over::Anything);
    }
}
