//! Confinement of a process tree: what is prepared before `fork` and how the
//! tree is laid out after it (host → K keeper → I init, PID 1 → C the
//! command; see ARCHITECTURE.md, "A tree's processes", for why not bubblewrap).
//!
//! Invariants:
//! - K leads a session of its own (`setsid` first, or `POSIX_SPAWN_SETSID`):
//!   no controlling terminal, so no `TIOCSTI`/`tcsetpgrp`; the session exists
//!   when the start returns, so a group kill that lands at once cannot miss.
//! - The task's group is K's. A kill signals the group; K and I keep SIGTERM
//!   blocked and forward what is pending, so the command gets its grace even
//!   when the kill lands before it exists. SIGKILL after the grace kills K,
//!   and I's `PR_SET_PDEATHSIG` takes the namespace with it.
//! - When C exits, I reports its status to K and exits; the kernel kills
//!   what is left in the namespace (setsid, nohup, double forks); K
//!   reproduces C's status (code, or death by the same signal).
//! - K holds the host's lifeline pipe and SIGKILLs its group on hang-up: a
//!   tree never outlives the host (not `PR_SET_PDEATHSIG` on K: it follows
//!   the forking *thread*). A durable tree's K ([`crate::durable`]) holds
//!   no lifeline: it keeps the tree until its deadline.
//! - Before it unshares, K joins the tree's cgroups (or sets the fallback's
//!   rlimits right after entering its user namespace); it builds the view
//!   ([`crate::view`]) in its mount namespace; without the network grant the
//!   tree has loopback only; Landlock is applied in I, before the command.
//! - Code after the fork lives in [`crate::child`]: no allocation, only
//!   async-signal-safe calls; everything it needs is prepared here, in
//!   [`ChildPlan`]. The spawn returns right after the fork; later failures
//!   reach the process's stderr and exit code 126/127. K closes every
//!   inherited descriptor, and K and I hold no output pipe.
//! - [`support`] probes each mechanism once and logs what is active; without
//!   PID namespaces K forks C directly, and a descendant that leaves the
//!   group can outlive its task (logged).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use super::fs_policy::TreePolicy;
use super::landlock;
use super::view::MountPlan;
use crate::child;
pub(crate) use crate::plan::{Bounds, ChildPlan, ExecPlan, IdMaps};

/// What the kernel allows here, probed once per host process (a report:
/// it grows as layers are added).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfinementSupport {
    /// Trees get a user namespace of their own (also as root).
    pub user_namespace: bool,
    /// PID namespaces work.
    pub pid_namespace: bool,
    /// Network namespaces work.
    pub net_namespace: bool,
    /// IPC namespaces work (SysV IPC and POSIX message queues of its own).
    pub ipc_namespace: bool,
    /// UTS namespaces work (a host name of its own).
    pub uts_namespace: bool,
    /// Cgroup namespaces work (`/proc/self/cgroup` rooted at its own).
    pub cgroup_namespace: bool,
    /// Mount namespaces with the whole set-up of [`crate::view`] work: a
    /// new root holding only what the view names.
    pub mount_namespace: bool,
    /// A fresh `/proc` of the tree's PID namespace can be mounted.
    pub fresh_proc: bool,
    /// The seccomp filter can be installed.
    pub seccomp: bool,
    /// The Landlock ABI version, when Landlock is enabled.
    pub landlock_abi: Option<u32>,
}

impl ConfinementSupport {
    /// True when every layer is on.
    pub fn complete(&self) -> bool {
        self.user_namespace
            && self.pid_namespace
            && self.net_namespace
            && self.ipc_namespace
            && self.uts_namespace
            && self.cgroup_namespace
            && self.mount_namespace
            && self.fresh_proc
            && self.seccomp
            && self.landlock_abi.is_some()
    }

    /// A one-line summary for logs and `taskhost check`.
    pub fn describe(&self) -> String {
        let on = |yes: bool, what: &str, off: &str| {
            if yes { format!("{what}: on") } else { format!("{what}: UNAVAILABLE ({off})") }
        };
        let fs = match self.landlock_abi {
            Some(abi) => format!("Landlock: ABI {abi}"),
            None => {
                "Landlock: UNAVAILABLE (writes outside the workspace rest on the read-only mounts alone)".to_string()
            }
        };
        [
            on(self.user_namespace, "user namespaces", "a root server's trees keep root's uid without capabilities"),
            on(self.pid_namespace, "PID namespaces", "process groups only: setsid escapees can outlive their task"),
            on(self.net_namespace, "network isolation", "processes keep the host network"),
            on(
                self.ipc_namespace,
                "IPC namespaces",
                "trees share the host's SysV IPC and message queues: shared memory can outlive a task",
            ),
            on(self.uts_namespace, "UTS namespaces", "trees share the host's host name (they still cannot change it)"),
            on(self.cgroup_namespace, "cgroup namespaces", "trees see the host's cgroup paths"),
            on(
                self.mount_namespace,
                "mount namespaces",
                "NO allow-listed view: trees see the host's whole filesystem, the home and its credentials included",
            ),
            on(self.fresh_proc, "private /proc", "trees see the host's processes in /proc"),
            on(self.seccomp, "seccomp", "ptrace, mount, bpf and the like are refused only by missing capabilities"),
            fs,
        ]
        .join("; ")
    }
}

/// Probes (once) and logs what confinement the kernel allows.
pub fn support() -> &'static ConfinementSupport {
    static SUPPORT: OnceLock<ConfinementSupport> = OnceLock::new();
    SUPPORT.get_or_init(|| {
        let support = probe();
        if support.complete() {
            tracing::info!(confinement = %support.describe(), "process confinement probed");
        } else {
            tracing::warn!(confinement = %support.describe(), "process confinement is degraded");
        }
        support
    })
}

/// Starts [`support`]'s probe on a background thread, once per process:
/// probing forks a few children that try namespaces (~10 ms), which need not
/// delay start-up. The first spawn waits for it if it has to.
pub(crate) fn probe_in_background() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new().name("taskhost-confinement-probe".into()).spawn(|| {
            support();
        });
    });
}

fn probe() -> ConfinementSupport {
    let landlock_abi = landlock::abi();
    let seccomp = seccomp_programs().is_some();
    let full = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWNET | SMALL_NAMESPACES;
    let mask = probe_unshare(full, true, seccomp);
    if mask == PROBE_ALL {
        return ConfinementSupport {
            user_namespace: true,
            pid_namespace: true,
            net_namespace: true,
            ipc_namespace: true,
            uts_namespace: true,
            cgroup_namespace: true,
            mount_namespace: true,
            fresh_proc: true,
            seccomp,
            landlock_abi,
        };
    }
    // Something is missing: find out what, layer by layer.
    let user_namespace = probe_unshare(libc::CLONE_NEWUSER, true, false) & PROBE_NS != 0;
    let user = if user_namespace { libc::CLONE_NEWUSER } else { 0 };
    let pid_namespace = probe_unshare(user | libc::CLONE_NEWPID, user_namespace, false) & PROBE_NS != 0;
    let pid = if pid_namespace { libc::CLONE_NEWPID } else { 0 };
    let net_namespace = probe_unshare(user | pid | libc::CLONE_NEWNET, user_namespace, false) & PROBE_NS != 0;
    let alone = |flag| probe_unshare(user | flag, user_namespace, false) & PROBE_NS != 0;
    let (ipc_namespace, uts_namespace) = (alone(libc::CLONE_NEWIPC), alone(libc::CLONE_NEWUTS));
    let cgroup_namespace = alone(libc::CLONE_NEWCGROUP);
    let mounts = probe_unshare(user | pid | libc::CLONE_NEWNS, user_namespace, false);
    let seccomp = seccomp && probe_unshare(user, user_namespace, true) & PROBE_SECCOMP != 0;
    ConfinementSupport {
        user_namespace,
        pid_namespace,
        net_namespace,
        ipc_namespace,
        uts_namespace,
        cgroup_namespace,
        mount_namespace: mounts & PROBE_MOUNTS != 0 && mounts & PROBE_FINISH != 0,
        fresh_proc: pid_namespace && mounts & PROBE_PROC != 0,
        seccomp,
        landlock_abi,
    }
}

/// The namespaces every tree gets besides user, PID, network and mount,
/// each on its own: IPC (SysV shared memory, semaphores and message queues,
/// POSIX message queues: none of the host's or another tree's is
/// reachable, and all of the tree's go with it), UTS (the host name, copied:
/// a tree may set its own), cgroup (`/proc/self/cgroup` shows the tree's
/// own cgroups as `/`; created after K joined them).
const SMALL_NAMESPACES: libc::c_int = libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWCGROUP;

use child::probe::{PROBE_ALL, PROBE_FINISH, PROBE_MOUNTS, PROBE_NS, PROBE_PROC, PROBE_SECCOMP};

/// Forks a child that tries the unshare (and a first process in the new PID
/// namespace), the mount set-up when `flags` has a mount namespace, a fresh
/// `/proc` when it also has a PID namespace, and the seccomp filter when
/// `seccomp`; returns the `PROBE_*` bits of what worked.
fn probe_unshare(flags: libc::c_int, userns: bool, seccomp: bool) -> i32 {
    let maps = IdMaps::current();
    let mounts = flags & libc::CLONE_NEWNS != 0;
    // The probe's own set-up must not print: the child's stderr goes here.
    let Ok(devnull) = devnull() else { return 0 };
    let plan = child::probe::ProbePlan {
        flags,
        maps: userns.then_some(&maps),
        seccomp: if seccomp { seccomp_programs() } else { None },
        mounts,
        proc: mounts && flags & libc::CLONE_NEWPID != 0,
        devnull,
    };
    // SAFETY: the child runs only `child::probe::run`, async-signal-safe on
    // the plan prepared above.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return 0;
        }
        if pid == 0 {
            child::probe::run(&plan);
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return 0;
            }
        }
        if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 0 }
    }
}

/// The seccomp filter, built once per host process.
pub(crate) fn seccomp_programs() -> Option<&'static super::sandbox::SeccompPrograms> {
    static PROGRAMS: OnceLock<Option<super::sandbox::SeccompPrograms>> = OnceLock::new();
    PROGRAMS.get_or_init(super::sandbox::SeccompPrograms::build).as_ref()
}

/// The read end of the host-wide lifeline pipe. Nobody ever writes to it;
/// both ends stay open for the life of the host process, so the read end
/// hangs up exactly when the host process is gone.
pub(super) fn lifeline() -> io::Result<RawFd> {
    static LIFELINE: OnceLock<(OwnedFd, OwnedFd)> = OnceLock::new();
    if let Some((read, _)) = LIFELINE.get() {
        return Ok(read.as_raw_fd());
    }
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fresh descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned here.
    let ends = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A racing initialiser may win; ours is then dropped (closed).
    Ok(LIFELINE.get_or_init(|| ends).0.as_raw_fd())
}

/// `/dev/null`, opened once for the life of the host process.
pub(super) fn devnull() -> io::Result<RawFd> {
    static DEVNULL: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = DEVNULL.get() {
        return Ok(fd.as_raw_fd());
    }
    let fd: OwnedFd = std::fs::File::options().read(true).write(true).open("/dev/null")?.into();
    Ok(DEVNULL.get_or_init(|| fd).as_raw_fd())
}

/// A freshly forked tree: K's pid and the read ends of its output pipes.
pub(crate) struct Forked {
    pub pid: libc::pid_t,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// A durable K that listens only after it started (an exec'd one):
    /// readable (a byte, or end of file if K died first) once it does.
    pub listening: Option<OwnedFd>,
}

/// A close-on-exec pipe: (read end, write end).
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fresh descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh and owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// What confinement one spawn gets, after the grant and the probe (a
/// report: it grows as layers are added).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Applied {
    pub user_namespace: bool,
    pub pid_namespace: bool,
    pub net_namespace: bool,
    pub ipc_namespace: bool,
    pub uts_namespace: bool,
    pub cgroup_namespace: bool,
    pub mount_namespace: bool,
    pub fresh_proc: bool,
    pub seccomp: bool,
    pub landlock: bool,
}

/// What a tree's view is planned from (see [`crate::view::plan`]): the
/// tree's filesystem policy, its workspace's read-only set, the spill
/// directories, the sizes of its private `tmpfs`es, and the cache that
/// keeps plans between spawns.
pub(crate) struct ViewInputs<'a> {
    pub cache: &'a crate::spawn_cache::SpawnCache,
    pub policy: &'a std::sync::Arc<TreePolicy>,
    pub found: &'a crate::view::workspace::Found,
    pub spill: crate::view::SpillView<'a>,
    pub tmpfs: crate::view::TmpfsSizes,
}

impl ChildPlan {
    /// Plans the confinement of one spawn. `landlock` is the prepared ruleset
    /// (when the kernel supports it); `read_root`: Landlock reads everything
    /// the view shows; `view` what the tree's view is planned from;
    /// `bounds` the tree's limits.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        want_pid_ns: bool,
        want_net_ns: bool,
        landlock: Option<OwnedFd>,
        read_root: bool,
        view: ViewInputs<'_>,
        cwd: &std::path::Path,
        exec: ExecPlan,
        bounds: Bounds,
    ) -> io::Result<(Self, Applied)> {
        use std::os::unix::ffi::OsStrExt;
        let support = support();
        let userns = support.user_namespace;
        let pid_ns = want_pid_ns && support.pid_namespace;
        let net_ns = want_net_ns && support.net_namespace;
        let mount_ns = support.mount_namespace;
        let fresh_proc = pid_ns && mount_ns && support.fresh_proc;
        let mut ns_flags = 0;
        for (on, flag) in [
            (userns, libc::CLONE_NEWUSER),
            (pid_ns, libc::CLONE_NEWPID),
            (net_ns, libc::CLONE_NEWNET),
            (mount_ns, libc::CLONE_NEWNS),
            (support.ipc_namespace, libc::CLONE_NEWIPC),
            (support.uts_namespace, libc::CLONE_NEWUTS),
            (support.cgroup_namespace, libc::CLONE_NEWCGROUP),
        ] {
            if on {
                ns_flags |= flag;
            }
        }
        let mounts = if mount_ns {
            Some(view.cache.plan(view.policy, view.found, view.spill, fresh_proc, read_root, view.tmpfs)?)
        } else {
            None
        };
        let seccomp = if support.seccomp { seccomp_programs() } else { None };
        let devnull = devnull()?;
        let applied = Applied {
            user_namespace: userns,
            pid_namespace: pid_ns,
            net_namespace: net_ns,
            ipc_namespace: support.ipc_namespace,
            uts_namespace: support.uts_namespace,
            cgroup_namespace: support.cgroup_namespace,
            mount_namespace: mount_ns,
            fresh_proc,
            seccomp: seccomp.is_some(),
            landlock: landlock.is_some(),
        };
        let plan = Self {
            ns_flags,
            maps: userns.then(IdMaps::current),
            loopback_up: net_ns,
            mounts,
            landlock,
            landlock_rights: landlock::handled_bits(),
            landlock_read_rights: landlock::read_bits(),
            seccomp,
            devnull,
            lifeline: lifeline()?,
            cwd: CString::new(cwd.as_os_str().as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the working directory holds a NUL byte"))?,
            exec,
            bounds,
            durable: None,
        };
        Ok((plan, applied))
    }

    /// The plan of a keeper started by [`super::keeper::spawn`], rebuilt
    /// from its arguments in the fresh process.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn for_keeper(
        ns_flags: libc::c_int,
        loopback_up: bool,
        mounts: Option<MountPlan>,
        landlock: Option<OwnedFd>,
        seccomp: bool,
        lifeline: RawFd,
        cwd: &[u8],
        exec: ExecPlan,
        bounds: Bounds,
    ) -> io::Result<Self> {
        let seccomp = if seccomp {
            Some(seccomp_programs().ok_or_else(|| io::Error::other("the seccomp filter cannot be built here"))?)
        } else {
            None
        };
        Ok(Self {
            ns_flags,
            maps: (ns_flags & libc::CLONE_NEWUSER != 0).then(IdMaps::current),
            loopback_up,
            mounts: mounts.map(std::sync::Arc::new),
            landlock,
            landlock_rights: landlock::handled_bits(),
            landlock_read_rights: landlock::read_bits(),
            seccomp,
            devnull: devnull()?,
            lifeline,
            cwd: CString::new(cwd)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the working directory holds a NUL byte"))?,
            exec,
            bounds,
            durable: None,
        })
    }

    /// The descriptors the tree writes its stdout and stderr to: the
    /// pipes a durable K copies into its logs, else the pipes the host
    /// reads (`stdout_w`, `stderr_w`).
    pub(crate) fn tree_output(&self, stdout_w: &OwnedFd, stderr_w: &OwnedFd) -> (RawFd, RawFd) {
        let durable = self.durable.as_ref();
        let pick = |own: Option<&OwnedFd>, host: &OwnedFd| own.unwrap_or(host).as_raw_fd();
        (
            pick(durable.and_then(|d| d.stdout_w.as_ref()), stdout_w),
            pick(durable.and_then(|d| d.stderr_w.as_ref()), stderr_w),
        )
    }

    /// Forks K from this process. Not `std::process::Command`: it would
    /// block until the command's `exec`, i.e. until the whole set-up ran, on
    /// a scheduler that may be busy.
    /// `stdin`: the read end of the tree's stdin pipe, or `None` for
    /// `/dev/null`.
    pub(crate) fn fork(&self, stdin: Option<RawFd>) -> io::Result<Forked> {
        let (stdout, stdout_w) = pipe()?;
        let (stderr, stderr_w) = pipe()?;
        // K tells through this pipe that its session exists (see below).
        let (session_r, session_w) = pipe()?;
        // SAFETY: the child runs only `in_child`, which is async-signal-safe.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: a freshly forked child: its own session first, said
            // through the pipe, then the tree.
            unsafe {
                libc::setsid();
                if let Some(durable) = &self.durable {
                    // Listening before the spawn returns: a server may
                    // connect at once; the peer a client sees is K.
                    libc::listen(durable.socket.as_raw_fd(), 8);
                }
                libc::close(session_w.as_raw_fd());
                let (out, err) = self.tree_output(&stdout_w, &stderr_w);
                self.in_child(stdin.unwrap_or(self.devnull), out, err)
            }
        }
        // The group kill signals K's session (`kill(-pid)`), which exists
        // only once K called `setsid` (the parent cannot make it: a group
        // leader could not call `setsid` then). So this waits for K to close
        // its end, its first step: a kill from then on cannot miss. End of
        // file also comes when K died first; then there is nothing to kill.
        drop(session_w);
        let mut byte = 0u8;
        // SAFETY: a blocking read of one byte into a local from our pipe.
        while unsafe { libc::read(session_r.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) } < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
        Ok(Forked { pid, stdout, stderr, listening: None })
    }
}
