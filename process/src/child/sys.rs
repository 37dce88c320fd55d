//! Descriptors and `errno` for the code that runs after `fork`.
//!
//! Invariant: async-signal-safe, no allocation (see [`super`]).

use std::os::fd::RawFd;

/// Closes every descriptor `>= low` except those in `keep` (negative
/// entries are ignored; at most twelve are kept).
///
/// # Safety
/// In a forked child that owns nothing it needs among the descriptors it
/// closes (no Rust value may still hold one of them).
pub(super) unsafe fn close_from(low: RawFd, keep: &[RawFd]) {
    // SAFETY: closes descriptor numbers only, with a stack array; async-signal-safe.
    unsafe {
        let mut sorted = [-1; 12];
        let mut n = 0;
        for &fd in keep.iter().filter(|&&fd| fd >= low) {
            if n < sorted.len() {
                sorted[n] = fd;
                n += 1;
            }
        }
        let sorted = &mut sorted[..n];
        sorted.sort_unstable();
        let mut first = low as u32;
        for &fd in sorted.iter() {
            close_range(first, fd as u32 - 1);
            first = fd as u32 + 1;
        }
        close_range(first, u32::MAX);
    }
}

/// Closes the descriptors `first..=last` (`close_range`, else one by one).
///
/// # Safety
/// As [`close_from`].
unsafe fn close_range(first: u32, last: u32) {
    if first > last {
        return;
    }
    // SAFETY: close_range / close on descriptor numbers only.
    unsafe {
        if libc::syscall(libc::SYS_close_range, first, last, 0) != 0 {
            // Kernels before 5.9: close what could be open.
            let max = libc::sysconf(libc::_SC_OPEN_MAX).clamp(0, 65_536) as u32;
            for fd in first..=last.min(max) {
                libc::close(fd as RawFd);
            }
        }
    }
}

pub(super) fn errno() -> libc::c_int {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() }
}

/// Writes `taskhost: <what>: errno <n>` to stderr and exits 126.
pub(super) fn setup_fail(what: &[u8]) -> ! {
    // SAFETY: async-signal-safe (see [`super::exit`]).
    unsafe { super::exit::fail(super::exit::EXIT_SETUP_FAILED, what) }
}

/// `fork` without the C library's `fork`: a raw `clone(SIGCHLD)`. The
/// library's runs the handlers other code registered with `pthread_atfork`
/// in the child, and those are not ours to trust after a fork: wasmtime's
/// opens `/proc/self/pagemap` and aborts where there is none (inside a
/// tree's view before its `/proc`), and `dup2`s it onto a descriptor number
/// without close-on-exec (which a command would inherit). Nothing here
/// relies on what the library's `fork` maintains for threads (the child has
/// one and never calls into threading code).
///
/// # Safety
/// In a tree's process (or the probe's) after the first fork: the child
/// may only run async-signal-safe code.
pub(super) unsafe fn fork_raw() -> libc::pid_t {
    // SAFETY: clone with only SIGCHLD as flags is fork (same stack, copied
    // address space); the other arguments are unused with these flags.
    unsafe {
        libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0usize, 0usize, 0usize, 0usize) as libc::pid_t
    }
}
