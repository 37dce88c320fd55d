//! Landlock filesystem rules for a process tree, through the raw syscalls.
//!
//! Model: the host builds a ruleset (a file descriptor) from the grant's
//! read-only and read-write paths before forking; the forked keeper applies
//! it to itself with [`restrict_self`], so the whole tree inherits it and no
//! process of it can lift it. Everything not granted is denied for the
//! access rights the running kernel's ABI knows; newer rights stay allowed
//! (Landlock's best-effort compatibility).
//!
//! `/dev/null` is always writable: shells redirect into it.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: libc::c_int = 1;

const EXECUTE: u64 = 1 << 0;
const WRITE_FILE: u64 = 1 << 1;
const READ_FILE: u64 = 1 << 2;
const READ_DIR: u64 = 1 << 3;
const TRUNCATE: u64 = 1 << 14;
const IOCTL_DEV: u64 = 1 << 15;
/// Rights that apply to a file (not a directory) in a path-beneath rule.
const FILE_RIGHTS: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The Landlock ABI version, or `None` when the kernel has it disabled.
pub(crate) fn abi() -> Option<u32> {
    // SAFETY: the version query takes no pointers.
    let v = unsafe {
        libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<RulesetAttr>(), 0, CREATE_RULESET_VERSION)
    };
    (v > 0).then_some(v as u32)
}

/// Every filesystem right the ABI version knows.
fn handled_rights(abi: u32) -> u64 {
    let mut rights = (1 << 13) - 1; // ABI 1: EXECUTE ..= MAKE_SYM
    if abi >= 2 {
        rights |= 1 << 13; // REFER
    }
    if abi >= 3 {
        rights |= TRUNCATE;
    }
    if abi >= 5 {
        rights |= IOCTL_DEV;
    }
    rights
}

/// Builds the ruleset for a grant; `None` when the grant has no filesystem
/// rules or the kernel has no Landlock (the probe logged that already).
pub(crate) fn ruleset(read_only: &[PathBuf], read_write: &[PathBuf]) -> io::Result<Option<OwnedFd>> {
    if read_only.is_empty() && read_write.is_empty() {
        return Ok(None);
    }
    let Some(abi) = abi() else { return Ok(None) };
    let handled = handled_rights(abi);
    let attr = RulesetAttr { handled_access_fs: handled };
    // SAFETY: a valid attribute struct and its size.
    let fd = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, &attr, std::mem::size_of::<RulesetAttr>(), 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a fresh descriptor we own (O_CLOEXEC).
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let read = EXECUTE | READ_FILE | READ_DIR;
    let rules = read_only
        .iter()
        .map(|p| (p.as_path(), read))
        .chain(read_write.iter().map(|p| (p.as_path(), handled)))
        .chain([(Path::new("/dev/null"), READ_FILE | WRITE_FILE | TRUNCATE)]);
    for (path, rights) in rules {
        add_rule(&ruleset, path, rights & handled)?;
    }
    Ok(Some(ruleset))
}

fn add_rule(ruleset: &OwnedFd, path: &Path, rights: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    // SAFETY: open with a valid C string; the result is checked.
    let fd = unsafe { libc::open(c_path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        // A granted path that does not exist grants nothing; say so, go on.
        tracing::debug!(path = %path.display(), error = %e, "Landlock rule skipped");
        return Ok(());
    }
    // SAFETY: fd is a fresh descriptor we own.
    let parent = unsafe { OwnedFd::from_raw_fd(fd) };
    let is_dir = std::fs::metadata(path).is_ok_and(|m| m.is_dir());
    let attr = PathBeneathAttr {
        allowed_access: if is_dir { rights } else { rights & FILE_RIGHTS },
        parent_fd: parent.as_raw_fd(),
    };
    // SAFETY: a valid ruleset descriptor and attribute struct.
    let rc = unsafe { libc::syscall(libc::SYS_landlock_add_rule, ruleset.as_raw_fd(), RULE_PATH_BENEATH, &attr, 0) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("Landlock rule for {}: {e}", path.display())));
    }
    Ok(())
}

/// Applies the ruleset to the calling process (and its future children).
///
/// # Safety
/// Async-signal-safe; meant for a forked child before exec.
pub(crate) unsafe fn restrict_self(ruleset: RawFd) -> io::Result<()> {
    // SAFETY: plain syscalls.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
