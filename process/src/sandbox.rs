//! What a tree may not do once it runs: its mount namespace (read-only
//! host, private `/tmp`, hidden credentials, a fresh `/proc`), no
//! capabilities, `no_new_privs` and a seccomp filter.
//!
//! ## Model
//! Everything here is *prepared* in the host (paths as C strings, the BPF
//! program) and *applied* in the forked keeper K and init I (see
//! [`super::confine`]), where only async-signal-safe syscalls may run:
//!
//! 1. K, right after `unshare(NEWUSER | NEWNS | …)` and its id maps, runs
//!    [`MountPlan::apply_in_keeper`]: every mount private (nothing propagates
//!    back to the host); a detached copy of each read-write root
//!    (`open_tree`); the whole tree read-only (`mount_setattr`,
//!    recursively); fresh `tmpfs` over `/tmp`, `/dev/shm`, `/run/user` and
//!    `$XDG_RUNTIME_DIR` (so host Unix sockets there are gone); the
//!    read-write roots moved back on top, at their own paths (a workspace
//!    below `/tmp` stays reachable); then the deny-read paths covered (an
//!    empty, mode-0 `tmpfs` over a directory, `/dev/null` over a file).
//! 2. I, PID 1 of the new PID namespace, runs [`MountPlan::apply_in_init`]:
//!    a fresh `/proc` of that namespace (the host's processes, and the
//!    server's `environ`, `mem` and `fd/`, are not there), with `/proc/sys`
//!    and `/proc/sysrq-trigger` read-only.
//! 3. I (or the command itself without a PID namespace) then runs
//!    [`lock_down`]: `no_new_privs`, Landlock, an empty capability bounding
//!    set and no capabilities, then the seccomp filter. From there on no
//!    process of the tree can undo a mount, gain a capability, or call the
//!    refused syscalls.
//!
//! Invariants: mounts made here are owned by the tree's user namespace, so
//! only a process with `CAP_SYS_ADMIN` in it could undo them, and nothing
//! past [`lock_down`] has capabilities (the seccomp filter refuses the mount
//! calls besides). A step that was planned and fails ends the set-up (exit
//! 126 with a message): a tree never runs with less than its plan says;
//! what the kernel cannot do is left out of the plan by the probe and logged.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// At most this many read-write roots per tree (their detached copies sit
/// in a fixed array, the set-up may not allocate).
pub const MAX_RW_ROOTS: usize = 32;

/// Size of the private `/tmp` (and `/dev/shm`) of a tree: they live in
/// memory, so they are bounded.
pub const PRIVATE_TMP_BYTES: u64 = 1 << 30;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A read-write root: its path and the directories to create (in order)
/// when it lives below a fresh `tmpfs`.
#[derive(Clone, Debug)]
struct RwRoot {
    path: CString,
    ancestors: Vec<CString>,
}

impl RwRoot {
    fn new(root: &Path) -> io::Result<Self> {
        let ancestors = root.ancestors().collect::<Vec<_>>();
        let ancestors = ancestors.iter().rev().skip(1).map(|p| c_path(p)).collect::<io::Result<Vec<_>>>()?;
        Ok(Self { path: c_path(root)?, ancestors })
    }
}

/// The mount namespace of one tree, prepared before the fork.
#[derive(Clone, Debug, Default)]
pub(crate) struct MountPlan {
    rw: Vec<RwRoot>,
    tmpfs: Vec<(CString, CString)>,
    deny_dirs: Vec<CString>,
    deny_files: Vec<CString>,
    /// Paths bound read-only onto themselves (files or directories).
    write_protected: Vec<CString>,
    /// The host's spill directory, covered by an empty `tmpfs`, and the
    /// owner's own directory in it, put back read-only.
    spill: Option<(RwRoot, CString)>,
    fresh_proc: bool,
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{} holds a NUL byte", path.display())))
}

impl MountPlan {
    /// Plans the mounts. `rw` are canonical read-write roots, `tmpfs` the
    /// canonical paths that get a fresh `tmpfs` (missing ones are left
    /// out), `deny` the canonical deny-read paths (missing ones are left
    /// out: there is nothing to read), `write_protected` the canonical paths
    /// bound read-only onto themselves (missing ones are left out).
    /// `spill`: the host's spill directory and the owner's directory in it.
    pub(crate) fn new(
        rw: &[PathBuf],
        tmpfs: &[PathBuf],
        deny: &[PathBuf],
        write_protected: &[PathBuf],
        spill: Option<(&Path, &Path)>,
        fresh_proc: bool,
    ) -> io::Result<Self> {
        if rw.len() > MAX_RW_ROOTS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} read-write roots; a tree may have at most {MAX_RW_ROOTS}", rw.len()),
            ));
        }
        let mut plan = Self { fresh_proc, ..Self::default() };
        for root in rw {
            plan.rw.push(RwRoot::new(root)?);
        }
        if let Some((hidden, owner)) = spill {
            plan.spill = Some((RwRoot::new(hidden)?, c_path(owner)?));
        }
        for path in tmpfs.iter().filter(|p| p.is_dir()) {
            let mode = if path == Path::new("/tmp") || path == Path::new("/dev/shm") { "1777" } else { "0755" };
            let options = format!("mode={mode},size={PRIVATE_TMP_BYTES}");
            plan.tmpfs.push((c_path(path)?, CString::new(options).expect("no NUL")));
        }
        for path in write_protected.iter().filter(|p| p.exists()) {
            plan.write_protected.push(c_path(path)?);
        }
        for path in deny {
            match std::fs::metadata(path) {
                Ok(meta) if meta.is_dir() => plan.deny_dirs.push(c_path(path)?),
                Ok(_) => plan.deny_files.push(c_path(path)?),
                Err(_) => {}
            }
        }
        Ok(plan)
    }

    /// The plan as keeper arguments (see [`super::keeper`]): one argument
    /// per entry, a kind letter then the path.
    pub(crate) fn to_args(&self) -> Vec<CString> {
        let entry = |kind: u8, path: &CString| {
            let mut bytes = vec![kind];
            bytes.extend_from_slice(path.as_bytes());
            CString::new(bytes).expect("paths hold no NUL")
        };
        let mut args = Vec::new();
        args.extend(self.rw.iter().map(|r| entry(b'W', &r.path)));
        args.extend(self.tmpfs.iter().map(|(p, _)| entry(b'T', p)));
        args.extend(self.deny_dirs.iter().map(|p| entry(b'D', p)));
        args.extend(self.deny_files.iter().map(|p| entry(b'F', p)));
        args.extend(self.write_protected.iter().map(|p| entry(b'R', p)));
        if let Some((hidden, owner)) = &self.spill {
            args.push(entry(b'H', &hidden.path));
            args.push(entry(b'O', owner));
        }
        if self.fresh_proc {
            args.push(c"P".into());
        }
        args
    }

    /// Rebuilds a plan from [`Self::to_args`] (in an exec'd keeper).
    pub(crate) fn from_args(args: &[&[u8]]) -> io::Result<Self> {
        use std::os::unix::ffi::OsStrExt as _;
        let (mut rw, mut tmpfs, mut deny, mut write_protected) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut fresh_proc = false;
        let (mut hidden, mut owner) = (None, None);
        for arg in args {
            let path = || PathBuf::from(std::ffi::OsStr::from_bytes(&arg[1..]));
            match arg.first() {
                Some(b'W') => rw.push(path()),
                Some(b'T') => tmpfs.push(path()),
                Some(b'D' | b'F') => deny.push(path()),
                Some(b'R') => write_protected.push(path()),
                Some(b'P') => fresh_proc = true,
                Some(b'H') => hidden = Some(path()),
                Some(b'O') => owner = Some(path()),
                _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad keeper argument: mount entry")),
            }
        }
        let spill = hidden.as_deref().zip(owner.as_deref());
        Self::new(&rw, &tmpfs, &deny, &write_protected, spill, fresh_proc)
    }

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
            if !unsafe { super::landlock::add_private_rule(ruleset, path, rights) } {
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

/// The seccomp filter of every tree: refuses (EPERM) the calls that reach
/// other processes' memory, the kernel's key rings, BPF, perf, modules,
/// kexec, mounts, namespaces of others, and new user namespaces; `clone3`
/// gets ENOSYS (its flags cannot be inspected) so libc falls back to
/// `clone`, whose flags can.
pub(crate) struct SeccompPrograms {
    programs: Vec<seccompiler::BpfProgram>,
}

impl std::fmt::Debug for SeccompPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeccompPrograms").field("programs", &self.programs.len()).finish()
    }
}

/// Syscalls the tree may never make.
const REFUSED_SYSCALLS: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

impl SeccompPrograms {
    /// Builds the filter for this architecture; `None` where seccompiler
    /// has no target for it (the probe reports seccomp off then).
    pub(crate) fn build() -> Option<Self> {
        use seccompiler::{
            SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
        };
        use std::collections::BTreeMap;
        let arch: seccompiler::TargetArch = std::env::consts::ARCH.try_into().ok()?;
        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = REFUSED_SYSCALLS.iter().map(|&nr| (nr, Vec::new())).collect();
        let new_user = |arg| {
            SeccompRule::new(vec![
                SeccompCondition::new(
                    arg,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(libc::CLONE_NEWUSER as u64),
                    libc::CLONE_NEWUSER as u64,
                )
                .ok()?,
            ])
            .ok()
        };
        rules.insert(libc::SYS_unshare, vec![new_user(0)?]);
        rules.insert(libc::SYS_clone, vec![new_user(0)?]);
        let refuse =
            SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch).ok()?;
        let clone3 = SeccompFilter::new(
            [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )
        .ok()?;
        let programs = vec![refuse.try_into().ok()?, clone3.try_into().ok()?];
        Some(Self { programs })
    }

    /// Installs the filters on the calling thread. Async-signal-safe;
    /// needs `no_new_privs`.
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

fn errno() -> libc::c_int {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() }
}

/// Writes `taskhost: <what>: errno <n>` to stderr and exits 126.
fn fail(what: &[u8]) -> ! {
    // SAFETY: async-signal-safe (see `child_exit`).
    unsafe { super::child_exit::fail(super::child_exit::EXIT_SETUP_FAILED, what) }
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
