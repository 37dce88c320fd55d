//! What a tree may not do once it runs: its mount namespace (read-only
//! host, private `/tmp`, hidden credentials, a fresh `/proc`), no
//! capabilities, `no_new_privs` and a seccomp filter.
//!
//! ## Model
//! Everything here is *prepared* in the host (paths as C strings, the BPF
//! program) and *applied* in the forked keeper K and init I (see
//! [`super::confine`]) by [`crate::child`], where only async-signal-safe
//! syscalls may run:
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
//!    `lock_down`: `no_new_privs`, Landlock, an empty capability bounding
//!    set and no capabilities, then the seccomp filter. From there on no
//!    process of the tree can undo a mount, gain a capability, or call the
//!    refused syscalls.
//!
//! Invariants: mounts made here are owned by the tree's user namespace, so
//! only a process with `CAP_SYS_ADMIN` in it could undo them, and nothing
//! past `lock_down` has capabilities (the seccomp filter refuses the mount
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

/// A read-write root: its path and the directories to create (in order)
/// when it lives below a fresh `tmpfs`.
#[derive(Clone, Debug)]
pub(crate) struct RwRoot {
    pub(crate) path: CString,
    pub(crate) ancestors: Vec<CString>,
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
    pub(crate) rw: Vec<RwRoot>,
    pub(crate) tmpfs: Vec<(CString, CString)>,
    pub(crate) deny_dirs: Vec<CString>,
    pub(crate) deny_files: Vec<CString>,
    /// Paths bound read-only onto themselves (files or directories).
    pub(crate) write_protected: Vec<CString>,
    /// The host's spill directory, covered by an empty `tmpfs`, and the
    /// owner's own directory in it, put back read-only.
    pub(crate) spill: Option<(RwRoot, CString)>,
    pub(crate) fresh_proc: bool,
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
}

/// The seccomp filter of every tree: refuses (EPERM) the calls that reach
/// other processes' memory, the kernel's key rings, BPF, perf, modules,
/// kexec, mounts, namespaces of others, and new user namespaces; `clone3`
/// gets ENOSYS (its flags cannot be inspected) so libc falls back to
/// `clone`, whose flags can.
pub(crate) struct SeccompPrograms {
    pub(crate) programs: Vec<seccompiler::BpfProgram>,
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
}
