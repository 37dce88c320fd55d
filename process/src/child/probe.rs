//! The probe's children: each tries one combination of namespaces (and
//! the mount set-up, a fresh `/proc`, the seccomp filter) and exits with the
//! bits of what worked ([`crate::confine::support`] forks them).
//!
//! Invariant: async-signal-safe, no allocation (see [`super`]).

use std::os::fd::RawFd;

use crate::plan::IdMaps;
use crate::sandbox::SeccompPrograms;

/// The namespaces could be created (and a first process forked in them).
pub(crate) const PROBE_NS: i32 = 1;
/// The keeper's mount steps work.
pub(crate) const PROBE_MOUNTS: i32 = 2;
/// A fresh `/proc` can be mounted.
pub(crate) const PROBE_PROC: i32 = 4;
/// The seccomp filter installs and answers.
pub(crate) const PROBE_SECCOMP: i32 = 8;
/// The view can be finished: the host's root detached, the root sealed.
pub(crate) const PROBE_FINISH: i32 = 16;
pub(crate) const PROBE_ALL: i32 = PROBE_NS | PROBE_MOUNTS | PROBE_PROC | PROBE_SECCOMP | PROBE_FINISH;

/// One probe, prepared before the fork.
pub(crate) struct ProbePlan<'a> {
    /// `unshare` flags.
    pub flags: libc::c_int,
    /// With a user namespace: the id maps to write.
    pub maps: Option<&'a IdMaps>,
    /// The filter to try.
    pub seccomp: Option<&'a SeccompPrograms>,
    /// Try the mount steps (`flags` has `CLONE_NEWNS`).
    pub mounts: bool,
    /// Try a fresh `/proc` (`flags` also has `CLONE_NEWPID`).
    pub proc: bool,
    /// `/dev/null`, the probe's stderr.
    pub devnull: RawFd,
}

/// Runs the probe and exits with the `PROBE_*` bits of what worked.
///
/// # Safety
/// Only in a freshly forked child of the probe (it ends the process).
pub(crate) unsafe fn run(plan: &ProbePlan<'_>) -> ! {
    // SAFETY: in the probe's forked child (the caller's contract): plain
    // syscalls on the prepared plan, then `_exit`.
    unsafe {
        libc::dup2(plan.devnull, 2);
        if plan.flags != 0 && libc::unshare(plan.flags) != 0 {
            libc::_exit(0);
        }
        if let Some(maps) = plan.maps
            && maps.write().is_err()
        {
            libc::_exit(0);
        }
        let mut bits = PROBE_NS;
        if plan.mounts && super::mounts::probe_mounts() {
            bits |= PROBE_MOUNTS;
        }
        let child = super::sys::fork_raw();
        if child < 0 {
            libc::_exit(0);
        }
        if child == 0 {
            let mut bits = 0;
            if plan.proc && super::mounts::probe_proc() {
                bits |= PROBE_PROC;
            }
            if plan.mounts && super::mounts::probe_finish() {
                bits |= PROBE_FINISH;
            }
            if let Some(programs) = plan.seccomp
                && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                && programs.install().is_ok()
                // The filter answers: a refused call fails with EPERM.
                && libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) < 0
                && *libc::__errno_location() == libc::EPERM
            {
                bits |= PROBE_SECCOMP;
            }
            libc::_exit(bits | 0x80);
        }
        let mut status = 0;
        if libc::waitpid(child, &mut status, 0) != child
            || !libc::WIFEXITED(status)
            || libc::WEXITSTATUS(status) & 0x80 == 0
        {
            libc::_exit(0);
        }
        libc::_exit(bits | (libc::WEXITSTATUS(status) & !0x80))
    }
}
