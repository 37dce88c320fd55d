//! What a tree's processes are handed: everything the code after the fork
//! ([`crate::child`]) needs, prepared in the host before it ([`crate::confine`]
//! builds it; [`crate::keeper`] rebuilds it in an exec'd keeper).
//!
//! Invariant: plain data, owned (C strings, descriptors, a `'static` BPF
//! program); nothing here runs after the fork but reads of these fields.

use std::ffi::CString;
use std::io;
use std::os::fd::{OwnedFd, RawFd};

use crate::sandbox::SeccompPrograms;
use crate::view::MountPlan;

/// The uid/gid maps of a user namespace: the host's ids mapped to themselves,
/// so files keep their owners and the command has no capabilities after exec.
#[derive(Clone, Debug)]
pub(crate) struct IdMaps {
    pub(crate) uid_map: Vec<u8>,
    pub(crate) gid_map: Vec<u8>,
}

impl IdMaps {
    pub(crate) fn current() -> Self {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Self { uid_map: format!("{uid} {uid} 1\n").into_bytes(), gid_map: format!("{gid} {gid} 1\n").into_bytes() }
    }
}

/// The `execve` of the command, prepared before the fork (no allocation after).
pub(crate) struct ExecPlan {
    pub(crate) path: CString,
    pub(crate) argv: Vec<CString>,
    pub(crate) envp: Vec<CString>,
    pub(crate) argv_ptrs: Vec<*const libc::c_char>,
    pub(crate) envp_ptrs: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into the CStrings owned by the same struct,
// which are never mutated; the struct is only read (in the forked child).
unsafe impl Send for ExecPlan {}
// SAFETY: as for `Send` above: the pointed-to CStrings are owned and never mutated.
unsafe impl Sync for ExecPlan {}

impl ExecPlan {
    pub(crate) fn new(
        path: &std::path::Path,
        argv: &[String],
        env: &std::collections::BTreeMap<std::ffi::OsString, std::ffi::OsString>,
    ) -> io::Result<Self> {
        use std::os::unix::ffi::OsStrExt;
        let nul = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{what} holds a NUL byte"));
        let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| nul("the program path"))?;
        let argv = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()).map_err(|_| nul("an argument")))
            .collect::<Result<Vec<_>, _>>()?;
        let envp = env
            .iter()
            .map(|(k, v)| {
                let mut entry = k.as_bytes().to_vec();
                entry.push(b'=');
                entry.extend_from_slice(v.as_bytes());
                CString::new(entry).map_err(|_| nul("an environment value"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let argv_ptrs = argv.iter().map(|a| a.as_ptr()).chain([std::ptr::null()]).collect();
        let envp_ptrs = envp.iter().map(|e| e.as_ptr()).chain([std::ptr::null()]).collect();
        Ok(Self { path, argv, envp, argv_ptrs, envp_ptrs })
    }
}

/// Everything the forked child needs, prepared before the fork.
/// (Fields are visible to [`super::keeper`], which hands them to an exec'd K.)
pub(crate) struct ChildPlan {
    /// `unshare` flags; 0: no namespaces (K forks the command directly).
    pub(crate) ns_flags: libc::c_int,
    pub(crate) maps: Option<IdMaps>,
    pub(crate) loopback_up: bool,
    /// The mount namespace's set-up (with `CLONE_NEWNS` in `ns_flags`).
    pub(crate) mounts: Option<std::sync::Arc<MountPlan>>,
    pub(crate) landlock: Option<OwnedFd>,
    /// The rights of a read-write Landlock rule on this kernel.
    pub(crate) landlock_rights: u64,
    /// The rights of a read-only Landlock rule on this kernel.
    pub(crate) landlock_read_rights: u64,
    pub(crate) seccomp: Option<&'static SeccompPrograms>,
    pub(crate) devnull: RawFd,
    pub(crate) lifeline: RawFd,
    pub(crate) cwd: CString,
    pub(crate) exec: ExecPlan,
    /// The tree's limits (see [`super::limits`]).
    pub(crate) bounds: Bounds,
    /// A durable tree's keeper duties ([`crate::durable`]); `None`: K
    /// kills the tree when the host's lifeline hangs up.
    pub(crate) durable: Option<DurablePlan>,
}

/// What K of a durable tree holds and does instead of following the host:
/// descriptors it keeps (the host closes its copies of the output pipes'
/// read ends; it keeps its own stdin write end), the secret a server proves
/// itself with, the deadline and the log cap.
pub(crate) struct DurablePlan {
    /// Read ends of the tree's stdout and stderr pipes.
    pub(crate) stdout: OwnedFd,
    pub(crate) stderr: OwnedFd,
    /// Their write ends: the tree's stdout and stderr (K closes its copies).
    /// `None` in an exec'd K, where they are its descriptors 1 and 2.
    pub(crate) stdout_w: Option<OwnedFd>,
    pub(crate) stderr_w: Option<OwnedFd>,
    /// K's copy of the write end of the tree's stdin pipe, if it has one.
    pub(crate) stdin: Option<OwnedFd>,
    /// The log directory (`O_PATH`): logs, status file and marks are made
    /// relative to it (K's mount namespace hides its path).
    pub(crate) dir: OwnedFd,
    /// The open logs (append-only) of stdout and stderr.
    pub(crate) stdout_log: OwnedFd,
    pub(crate) stderr_log: OwnedFd,
    /// The bound (not yet listening) Unix socket K listens on.
    pub(crate) socket: OwnedFd,
    pub(crate) secret: [u8; SECRET_BYTES],
    /// `CLOCK_MONOTONIC` seconds at which K SIGKILLs the tree.
    pub(crate) deadline: libc::time_t,
    /// Bytes K writes into both logs together, at most.
    pub(crate) log_cap: u64,
}

/// The limits a tree's keeper applies to itself before anything else runs:
/// the cgroups it joins, the rlimits of the fallback and the open-file and
/// file-size rlimits (0: none).
#[derive(Clone, Debug, Default)]
pub(crate) struct Bounds {
    /// `cgroup.procs` files K writes itself into, first thing.
    pub cgroup_procs: Vec<CString>,
    /// `RLIMIT_NPROC`, set right after K entered its user namespace.
    pub nproc: u64,
    /// `RLIMIT_DATA`.
    pub data: u64,
    /// `RLIMIT_NOFILE`, always (0: as inherited).
    pub nofile: u64,
    /// `RLIMIT_FSIZE`, always (0: as inherited).
    pub fsize: u64,
}

impl DurablePlan {
    /// The descriptors K keeps for these duties (-1: none).
    pub(crate) fn fds(&self) -> [RawFd; 7] {
        use std::os::fd::AsRawFd;
        [
            self.stdout.as_raw_fd(),
            self.stderr.as_raw_fd(),
            self.stdin.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
            self.dir.as_raw_fd(),
            self.stdout_log.as_raw_fd(),
            self.stderr_log.as_raw_fd(),
            self.socket.as_raw_fd(),
        ]
    }
}

/// Bytes reserved for a durable tree's exit status (`status.tmp`): a status
/// line and `deadline`.
pub(crate) const STATUS_BYTES: usize = 64;

/// Bytes of the secret a server proves itself to K with.
pub const SECRET_BYTES: usize = 32;

/// A request to a durable tree's K (one byte after the secret; see
/// [`crate::durable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    /// Reply with K's stdin write end (if it still has one).
    Adopt,
    /// K closes its stdin write end (the tree sees end of file once the
    /// server closed its own).
    CloseStdin,
    /// SIGTERM to the tree's group.
    Terminate,
    /// SIGKILL to the tree.
    Kill,
}

impl Command {
    pub(crate) fn byte(self) -> u8 {
        match self {
            Self::Adopt => b'A',
            Self::CloseStdin => b'C',
            Self::Terminate => b'T',
            Self::Kill => b'K',
        }
    }

    pub(crate) fn from_byte(byte: u8) -> Option<Self> {
        [Self::Adopt, Self::CloseStdin, Self::Terminate, Self::Kill].into_iter().find(|c| c.byte() == byte)
    }
}
