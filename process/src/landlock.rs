//! Landlock filesystem rules for a process tree, built with the `landlock`
//! crate (maintained by the Landlock authors).
//!
//! Model: the host builds a ruleset (a file descriptor) before forking:
//! read (and execute) beneath the readable roots, every right beneath the
//! read-write roots, the usual character devices (`/dev/null`, `/dev/tty`,
//! `/dev/pts`…) writable, and, where the kernel's ABI has them (6+), the
//! scopes that keep the tree from connecting to abstract Unix sockets or
//! signalling processes outside it. The tree's init applies it
//! (`lock_down` in [`crate::child`], one raw `landlock_restrict_self` call:
//! the forked child may not allocate), so the whole tree inherits it and no
//! process of it can lift it. Rights the running kernel does not know stay
//! allowed (the crate's best-effort compatibility); [`abi`] says which
//! version is in force, and the probe logs it.
//!
//! Landlock only ever *allows* beneath a path: it cannot deny a path below
//! an allowed one. Deny-read paths are therefore hidden by the tree's mount
//! namespace instead ([`super::sandbox`]).

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use landlock::{ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, path_beneath_rules};

/// The newest ABI whose rights we have vetted; newer kernels enforce these.
const TARGET: ABI = ABI::V6;

/// Character devices every tree may write to (and `ioctl`: terminals).
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts"];

/// The Landlock ABI version of the running kernel, or `None` when it has
/// Landlock disabled. (A version query: the one thing the crate keeps
/// private, so that rules never depend on it.)
pub(crate) fn abi() -> Option<u32> {
    // SAFETY: the version query takes no pointers.
    let v = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0, 1u32) };
    (v > 0).then_some(v as u32)
}

/// The read-write rights the ruleset handles on this kernel (what
/// [`ruleset`] asks for, cut to what the kernel knows), for the rules the
/// keeper adds in the child ([`add_private_rule`]).
pub(crate) fn handled_bits() -> u64 {
    let kernel = abi().map_or(0, |v| v as i32);
    (AccessFs::from_all(TARGET) & AccessFs::from_all(ABI::from(kernel))).bits()
}

/// The rights of a read-only rule on this kernel (for the rule the keeper
/// adds on the view's root).
pub(crate) fn read_bits() -> u64 {
    let kernel = abi().map_or(0, |v| v as i32);
    (AccessFs::from_read(TARGET) & AccessFs::from_all(ABI::from(kernel))).bits()
}

/// Builds the ruleset; `None` when the kernel has no Landlock (the probe
/// logged that already). Paths that do not exist grant nothing.
pub(crate) fn ruleset(read: &[PathBuf], read_write: &[PathBuf]) -> io::Result<Option<OwnedFd>> {
    if abi().is_none() {
        return Ok(None);
    }
    let err = |e: landlock::RulesetError| io::Error::other(format!("Landlock: {e}"));
    let all = AccessFs::from_all(TARGET);
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
    let ruleset = Ruleset::default()
        .handle_access(all)
        .map_err(err)?
        .scope(Scope::from_all(TARGET))
        .map_err(err)?
        .create()
        .map_err(err)?
        .add_rules(path_beneath_rules(read, AccessFs::from_read(TARGET)))
        .map_err(err)?
        .add_rules(path_beneath_rules(read_write, all))
        .map_err(err)?
        .add_rules(path_beneath_rules(DEVICES, device))
        .map_err(err)?;
    Ok(ruleset.into())
}
