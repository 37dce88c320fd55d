//! The mount namespace's set-up, applied from a [`MountPlan`] prepared
//! before the fork: K's part (private mounts, the read-only host, private
//! `tmpfs`es, the read-write roots, the hidden paths) and I's (a fresh
//! `/proc`), and the probe's test of both (see [`crate::sandbox`]).
//!
//! Invariant: async-signal-safe, no allocation (see [`super`]).

use super::sys::{errno, setup_fail as fail};
use crate::sandbox::{MAX_RW_ROOTS, MountPlan};

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

impl MountPlan {
    /// K's part (see the module doc). Async-signal-safe.
    ///
    /// # Safety
    /// In a forked (or exec'd) keeper that just entered its own user and
    /// mount namespaces.
    pub(crate) unsafe fn apply_in_keeper(&self) {
        // SAFETY: in a keeper that just entered its own user and mount namespaces (the caller's
        // contract); plain syscalls on C strings prepared before.
        unsafe {
            if !make_mounts_private() {
                fail(b"cannot make the mounts private");
            }
            let mut clones = [-1; MAX_RW_ROOTS];
            for (slot, root) in clones.iter_mut().zip(&self.rw) {
                let fd = libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    root.path.as_ptr(),
                    OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint,
                );
                if fd < 0 {
                    fail(b"cannot copy a read-write root");
                }
                *slot = fd as libc::c_int;
            }
            let owner_clone = match &self.spill {
                Some((_, owner)) => {
                    let fd = libc::syscall(
                        libc::SYS_open_tree,
                        libc::AT_FDCWD,
                        owner.as_ptr(),
                        OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint,
                    );
                    if fd < 0 {
                        fail(b"cannot copy the owner's spill directory");
                    }
                    fd as libc::c_int
                }
                None => -1,
            };
            if !read_only(c"/", AT_RECURSIVE) {
                fail(b"cannot make the file system read-only");
            }
            for (path, options) in &self.tmpfs {
                if libc::mount(
                    c"tmpfs".as_ptr(),
                    path.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    options.as_ptr().cast(),
                ) != 0
                {
                    fail(b"cannot mount a private tmpfs");
                }
            }
            for (fd, root) in clones.iter().zip(&self.rw) {
                for dir in &root.ancestors {
                    libc::mkdir(dir.as_ptr(), 0o755);
                }
                if libc::syscall(
                    libc::SYS_move_mount,
                    *fd,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    root.path.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                ) != 0
                {
                    fail(b"cannot put a read-write root back");
                }
                libc::close(*fd);
            }
            // Read-only onto themselves, before the deny mounts: a path both
            // write-protected and hidden stays hidden.
            for path in &self.write_protected {
                if libc::mount(
                    path.as_ptr(),
                    path.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
                    || !read_only(path, AT_RECURSIVE)
                {
                    // Gone since the plan was made: nothing to protect.
                    if errno() != libc::ENOENT {
                        fail(b"cannot make a write-protected path read-only");
                    }
                }
            }
            for dir in &self.deny_dirs {
                if libc::mount(
                    c"tmpfs".as_ptr(),
                    dir.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"mode=000,size=4k,nr_inodes=1".as_ptr().cast(),
                ) != 0
                    && errno() != libc::ENOENT
                {
                    fail(b"cannot hide a deny-read directory");
                }
            }
            for file in &self.deny_files {
                if libc::mount(c"/dev/null".as_ptr(), file.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null())
                    != 0
                    && errno() != libc::ENOENT
                {
                    fail(b"cannot hide a deny-read file");
                }
            }
            if let Some((hidden, owner)) = &self.spill {
                // Every owner's spill files go; this owner's come back,
                // read-only (so `tail` of a path named in its output works).
                for dir in &hidden.ancestors {
                    libc::mkdir(dir.as_ptr(), 0o755);
                }
                if libc::mount(
                    c"tmpfs".as_ptr(),
                    hidden.path.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"mode=0755,size=64k".as_ptr().cast(),
                ) != 0
                {
                    // Below a hidden directory: out of reach already.
                    if errno() != libc::ENOENT {
                        fail(b"cannot hide the spill directory");
                    }
                } else {
                    libc::mkdir(owner.as_ptr(), 0o700);
                    if libc::syscall(
                        libc::SYS_move_mount,
                        owner_clone,
                        c"".as_ptr(),
                        libc::AT_FDCWD,
                        owner.as_ptr(),
                        MOVE_MOUNT_F_EMPTY_PATH,
                    ) != 0
                        || !read_only(owner, 0)
                        || !read_only(&hidden.path, 0)
                    {
                        fail(b"cannot show the owner's spill directory");
                    }
                }
                libc::close(owner_clone);
            }
        }
    }

    /// Lets the Landlock `ruleset` (-1: none) write below the private
    /// directories just mounted. Async-signal-safe.
    ///
    /// # Safety
    /// In the keeper, after [`Self::apply_in_keeper`].
    pub(crate) unsafe fn allow_private_dirs(&self, ruleset: libc::c_int, rights: u64) {
        if ruleset < 0 {
            return;
        }
        for (path, _) in &self.tmpfs {
            // SAFETY: forwarded.
            if !unsafe { super::lockdown::add_private_rule(ruleset, path, rights) } {
                fail(b"cannot add a Landlock rule for a private directory");
            }
        }
    }

    /// I's part: a fresh `/proc` for its PID namespace. Async-signal-safe.
    ///
    /// # Safety
    /// In the init of a new PID namespace, inside the plan's mount namespace.
    pub(crate) unsafe fn apply_in_init(&self) {
        if !self.fresh_proc {
            return;
        }
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
                if libc::mount(
                    std::ptr::null(),
                    path.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND
                        | libc::MS_REMOUNT
                        | libc::MS_RDONLY
                        | libc::MS_NOSUID
                        | libc::MS_NODEV
                        | libc::MS_NOEXEC,
                    std::ptr::null(),
                ) != 0
                {
                    fail(b"cannot make /proc/sys read-only");
                }
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
unsafe fn read_only(path: &std::ffi::CStr, flags: libc::c_uint) -> bool {
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

/// The probe's test of the keeper's mount steps (in a fresh user and mount
/// namespace): private mounts, a detached copy, a read-only tree, a `tmpfs`,
/// and a copy moved back. Async-signal-safe.
pub(crate) fn probe_mounts() -> bool {
    // SAFETY: plain syscalls on static C strings, in the probe's child.
    unsafe {
        if !make_mounts_private() {
            return false;
        }
        let fd = libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c"/tmp".as_ptr(), OPEN_TREE_CLONE | AT_RECURSIVE);
        if fd < 0 {
            return false;
        }
        let attr = MountAttr { attr_set: MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
        if libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c"/".as_ptr(),
            AT_RECURSIVE,
            &attr,
            std::mem::size_of::<MountAttr>(),
        ) != 0
        {
            return false;
        }
        if libc::mount(
            c"tmpfs".as_ptr(),
            c"/tmp".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            c"size=4k".as_ptr().cast(),
        ) != 0
        {
            return false;
        }
        libc::syscall(libc::SYS_move_mount, fd, c"".as_ptr(), libc::AT_FDCWD, c"/tmp".as_ptr(), MOVE_MOUNT_F_EMPTY_PATH)
            == 0
    }
}

/// The probe's test of a fresh `/proc` (in the init of a new PID namespace).
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
