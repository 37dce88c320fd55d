//! The tree's last set-up step: `no_new_privs`, Landlock, no capabilities,
//! the seccomp filter; and the one raw Landlock rule K adds for a directory
//! that exists only in the tree's mount namespace.
//!
//! Invariant: async-signal-safe, no allocation (see [`super`]).

use std::io;

use super::sys::{errno, setup_fail as fail};
use crate::sandbox::SeccompPrograms;

/// The last step before the command: `no_new_privs`, Landlock (`ruleset`,
/// -1: none), no capabilities (bounding, ambient, effective, permitted,
/// inheritable), then the seccomp filter. Async-signal-safe.
///
/// # Safety
/// In a forked child (I, or the command before `exec`).
pub(crate) unsafe fn lock_down(ruleset: libc::c_int, seccomp: Option<&SeccompPrograms>) {
    // SAFETY: in a forked child (the caller's contract); prctl, landlock and seccomp syscalls on data
    // prepared before the fork.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            fail(b"cannot set no_new_privs");
        }
        if ruleset >= 0 && libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0) != 0 {
            fail(b"cannot apply the Landlock rules");
        }
        for cap in 0..64 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno() != libc::EINVAL {
                fail(b"cannot drop the capability bounding set");
            }
        }
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
        #[repr(C)]
        struct CapHeader {
            version: u32,
            pid: libc::c_int,
        }
        #[repr(C)]
        struct CapData {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let header = CapHeader { version: 0x2008_0522, pid: 0 };
        let data = [
            CapData { effective: 0, permitted: 0, inheritable: 0 },
            CapData { effective: 0, permitted: 0, inheritable: 0 },
        ];
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) != 0 {
            fail(b"cannot drop capabilities");
        }
        if let Some(seccomp) = seccomp
            && seccomp.install().is_err()
        {
            fail(b"cannot install the seccomp filter");
        }
    }
}

impl SeccompPrograms {
    /// Installs the filters on the calling thread. Async-signal-safe;
    /// needs `no_new_privs`.
    ///
    /// # Safety
    /// In a tree's process (or the probe's) before `exec`, with `no_new_privs`
    /// set: the filters bind this process and every child it forks.
    pub(crate) unsafe fn install(&self) -> io::Result<()> {
        for program in &self.programs {
            let prog = libc::sock_fprog { len: program.len() as libc::c_ushort, filter: program.as_ptr() as *mut _ };
            // SAFETY: a valid program that outlives the call.
            if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const _) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Adds a rule granting `rights` beneath `path` to the ruleset `ruleset`,
/// in the keeper, for a directory that exists only in the tree's view (its
/// root, a private `tmpfs`, its `devpts`): a rule on the host's directory
/// below it would not apply (Landlock's rules follow inodes, and the walk
/// up from a file in the view never meets the host's root). Async-signal-safe:
/// the crate's builder allocates, so this is the one raw rule.
///
/// # Safety
/// In the forked (or exec'd) keeper.
pub(crate) unsafe fn add_path_rule(ruleset: libc::c_int, path: &std::ffi::CStr, rights: u64) -> bool {
    #[repr(C, packed)]
    struct PathBeneathAttr {
        allowed_access: u64,
        parent_fd: i32,
    }
    // SAFETY: plain syscalls on a valid C string and struct.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | libc::O_DIRECTORY);
        if fd < 0 {
            return false;
        }
        let attr = PathBeneathAttr { allowed_access: rights, parent_fd: fd };
        let rc = libc::syscall(libc::SYS_landlock_add_rule, ruleset, 1, &attr as *const PathBeneathAttr, 0);
        libc::close(fd);
        rc == 0
    }
}
