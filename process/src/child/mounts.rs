//! The tree's filesystem view, applied from a [`MountPlan`] prepared
//! before the fork (see [`crate::view`]): K builds the new root and runs
//! its steps, I mounts a fresh `/proc`, and whichever of them comes last
//! detaches the host's root and seals the view. Also the probe's test of
//! the same steps.
//!
//! Invariant: async-signal-safe, no allocation (see [`super`]). A planned
//! step that fails ends the set-up with its path on the tree's stderr; a
//! tree never runs with less than its plan says.

use std::ffi::CStr;

use super::exit::{EXIT_SETUP_FAILED, fail_at};
use super::sys::{errno, setup_fail as fail};
use crate::view::{MountOp, MountPlan};

const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Where the new root's `tmpfs` is mounted before `pivot_root` makes it
/// the root (the host's `/tmp` is then visible again below the old root).
const STAGING: &CStr = c"/tmp";
const STAGING_OLD_ROOT: &CStr = c"/tmp/.oldroot";
const OLD_ROOT: &CStr = c"/.oldroot";
const ROOT_OPTIONS: &CStr = c"mode=0755,size=1m,nr_inodes=4096";

impl MountPlan {
    /// K's part: the new root, then every step in order. Async-signal-safe.
    ///
    /// # Safety
    /// In a forked (or exec'd) keeper that just entered its own user and
    /// mount namespaces.
    pub(crate) unsafe fn build_in_keeper(&self) {
        // SAFETY: in a keeper inside its own mount namespace (the caller's
        // contract); plain syscalls on C strings prepared before.
        unsafe {
            if !make_mounts_private() {
                fail(b"cannot make the mounts private");
            }
            if !new_root() {
                fail(b"cannot make the tree's root");
            }
            for op in &self.ops {
                apply(op);
            }
            if !self.fresh_proc {
                self.finish();
            }
        }
    }

    /// Lets the Landlock `ruleset` (-1: none) write below the view's own
    /// writable directories and, with [`MountPlan::read_root`], read below
    /// its root: rules on host directories do not reach mounts made over
    /// them. Async-signal-safe.
    ///
    /// # Safety
    /// In the keeper, after [`Self::build_in_keeper`].
    pub(crate) unsafe fn add_landlock_rules(&self, ruleset: libc::c_int, write_rights: u64, read_rights: u64) {
        if ruleset < 0 {
            return;
        }
        for path in &self.writable {
            // SAFETY: forwarded.
            if !unsafe { super::lockdown::add_path_rule(ruleset, path, write_rights) } {
                fail(b"cannot add a Landlock rule for a private directory");
            }
        }
        // SAFETY: forwarded.
        if self.read_root && !unsafe { super::lockdown::add_path_rule(ruleset, c"/", read_rights) } {
            fail(b"cannot add the Landlock rule of the tree's root");
        }
    }

    /// I's part: a fresh `/proc` for its PID namespace, then the end of the
    /// view. Async-signal-safe.
    ///
    /// # Safety
    /// In the init of a new PID namespace, inside the plan's mount
    /// namespace, after K built it.
    pub(crate) unsafe fn finish_in_init(&self) {
        if !self.fresh_proc {
            return;
        }
        // SAFETY: plain syscalls on static C strings (the caller's contract).
        unsafe {
            mount_proc();
            self.finish();
        }
    }

    /// Detaches the host's root and seals the view.
    ///
    /// # Safety
    /// In K or I, once every step ran (and `/proc` is mounted).
    unsafe fn finish(&self) {
        // SAFETY: plain syscalls on prepared C strings.
        unsafe {
            if libc::umount2(OLD_ROOT.as_ptr(), libc::MNT_DETACH) != 0 {
                fail(b"cannot detach the host's root");
            }
            libc::rmdir(OLD_ROOT.as_ptr());
            for path in &self.sealed {
                if !read_only(path, 0) {
                    fail_at(EXIT_SETUP_FAILED, b"cannot seal", path);
                }
            }
            if !read_only(c"/", 0) {
                fail(b"cannot seal the tree's root");
            }
        }
    }
}

/// Mounts the new root's `tmpfs` and `pivot_root`s into it, the host's root
/// at [`OLD_ROOT`].
///
/// # Safety
/// In a process of a tree's own (private) mount namespace.
unsafe fn new_root() -> bool {
    // SAFETY: plain syscalls on static C strings.
    unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            STAGING.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            ROOT_OPTIONS.as_ptr().cast(),
        ) == 0
            && libc::mkdir(STAGING_OLD_ROOT.as_ptr(), 0o700) == 0
            && libc::syscall(libc::SYS_pivot_root, STAGING.as_ptr(), STAGING_OLD_ROOT.as_ptr()) == 0
            && libc::chdir(c"/".as_ptr()) == 0
    }
}

/// One step (see [`MountOp`]).
///
/// # Safety
/// In K, inside the new root.
unsafe fn apply(op: &MountOp) {
    // SAFETY: plain syscalls on the plan's C strings (the caller's contract).
    unsafe {
        match op {
            MountOp::Dir { path } => {
                if libc::mkdir(path.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                    fail_at(EXIT_SETUP_FAILED, b"cannot create the directory", path);
                }
            }
            MountOp::File { path } => {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644);
                if fd < 0 {
                    fail_at(EXIT_SETUP_FAILED, b"cannot create the mount point", path);
                }
                libc::close(fd);
            }
            MountOp::Symlink { target, link } => {
                if libc::symlink(target.as_ptr(), link.as_ptr()) != 0 && errno() != libc::EEXIST {
                    fail_at(EXIT_SETUP_FAILED, b"cannot create the link", link);
                }
            }
            MountOp::Tmpfs { path, options, flags } => {
                if libc::mount(c"tmpfs".as_ptr(), path.as_ptr(), c"tmpfs".as_ptr(), *flags, options.as_ptr().cast())
                    != 0
                {
                    fail_at(EXIT_SETUP_FAILED, b"cannot mount a tmpfs on", path);
                }
            }
            MountOp::Bind { source, target, read_only: ro, optional } => {
                let flags = libc::MS_BIND | libc::MS_REC;
                if libc::mount(source.as_ptr(), target.as_ptr(), std::ptr::null(), flags, std::ptr::null()) != 0 {
                    if *optional && errno() == libc::ENOENT {
                        return;
                    }
                    fail_at(EXIT_SETUP_FAILED, b"cannot bind", target);
                }
                if *ro && !read_only(target, AT_RECURSIVE) {
                    fail_at(EXIT_SETUP_FAILED, b"cannot make read-only", target);
                }
            }
            MountOp::Devpts { path, options } => {
                if libc::mount(
                    c"devpts".as_ptr(),
                    path.as_ptr(),
                    c"devpts".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NOEXEC,
                    options.as_ptr().cast(),
                ) != 0
                {
                    fail_at(EXIT_SETUP_FAILED, b"cannot mount a devpts instance on", path);
                }
            }
        }
    }
}

/// A fresh `/proc` of this PID namespace, `/proc/sys` and
/// `/proc/sysrq-trigger` read-only.
///
/// # Safety
/// In I, inside the view, before the host's root is detached (the kernel
/// mounts a `proc` in a user namespace only where one is fully visible).
unsafe fn mount_proc() {
    // SAFETY: plain syscalls on static C strings.
    unsafe {
        if libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ) != 0
        {
            fail(b"cannot mount a fresh /proc");
        }
        for path in [c"/proc/sys", c"/proc/sysrq-trigger"] {
            if libc::mount(
                path.as_ptr(),
                path.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ) != 0
            {
                // A kernel without magic SysRq has no trigger file.
                if errno() == libc::ENOENT {
                    continue;
                }
                fail(b"cannot make /proc/sys read-only");
            }
            if !read_only(path, AT_RECURSIVE) {
                fail(b"cannot make /proc/sys read-only");
            }
        }
    }
}

/// Makes the mount at `path` read-only (`AT_RECURSIVE`: and every mount
/// below). Async-signal-safe.
///
/// # Safety
/// In a process of a tree's own mount namespace (a host mount must never be
/// touched): K, I, or the probe's child.
unsafe fn read_only(path: &CStr, flags: libc::c_uint) -> bool {
    let attr = MountAttr { attr_set: MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
    // SAFETY: a valid C string and attribute struct.
    unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags,
            &attr,
            std::mem::size_of::<MountAttr>(),
        ) == 0
    }
}

/// Makes every mount below `/` private to this mount namespace, so nothing
/// the tree mounts propagates to the host. Async-signal-safe.
fn make_mounts_private() -> bool {
    // SAFETY: a plain syscall on a static C string.
    unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) == 0
    }
}

/// The probe's test of K's steps (in a fresh user and mount namespace):
/// private mounts, the new root, a read-only bind of a host directory, a
/// `devpts` instance, and `/proc`'s mount point. Async-signal-safe.
pub(crate) fn probe_mounts() -> bool {
    // SAFETY: plain syscalls on static C strings, in the probe's child.
    unsafe {
        make_mounts_private()
            && new_root()
            && libc::mkdir(c"/host".as_ptr(), 0o755) == 0
            && libc::mount(
                c"/.oldroot/tmp".as_ptr(),
                c"/host".as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ) == 0
            && read_only(c"/host", AT_RECURSIVE)
            && libc::mkdir(c"/pts".as_ptr(), 0o755) == 0
            && libc::mount(
                c"devpts".as_ptr(),
                c"/pts".as_ptr(),
                c"devpts".as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"newinstance,ptmxmode=0666,mode=0620,max=2".as_ptr().cast(),
            ) == 0
            && libc::mkdir(c"/proc".as_ptr(), 0o755) == 0
    }
}

/// The probe's test of a fresh `/proc` (in the init of a new PID namespace,
/// after [`probe_mounts`]).
pub(crate) fn probe_proc() -> bool {
    // SAFETY: plain syscall on static C strings, in the probe's child.
    unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ) == 0
    }
}

/// The probe's test of the view's end: the host's root detached and the
/// root sealed (after [`probe_mounts`], and [`probe_proc`] when tried).
pub(crate) fn probe_finish() -> bool {
    // SAFETY: plain syscalls on static C strings, in the probe's child.
    unsafe { libc::umount2(OLD_ROOT.as_ptr(), libc::MNT_DETACH) == 0 && read_only(c"/", 0) }
}
