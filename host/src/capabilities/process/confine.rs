//! Confinement of a process tree: what runs between `fork` and `exec`.
//!
//! ## Decision
//! We confine with namespaces of our own, set up in the forked child before
//! `exec` (no external helper), and Landlock through raw syscalls:
//!
//! ```text
//! host ──fork──▶ K "keeper" (host PID namespace, process-group leader)
//!                 │ unshare(NEWPID [| NEWNET] [| NEWUSER]), Landlock
//!                 └─fork─▶ I "init" (PID 1 of the new namespace)
//!                           └─fork─▶ C the command (PID 2) ──exec──▶ argv
//! ```
//! - The task's process group is K's. `kill` signals the group: C and every
//!   descendant that stayed in it get SIGTERM; K ignores it and I, as a
//!   namespace init without handlers, is immune to it. So a command can still
//!   clean up during the grace period.
//! - When C exits, I reports C's wait status to K through a pipe and exits;
//!   the kernel then kills everything left in the namespace, including
//!   descendants that called `setsid`, `nohup` or double-forked, and K
//!   reproduces C's status (same exit code, or death by the same signal), so
//!   the host sees the command's own status.
//! - SIGKILL to the group after the grace kills K; I has `PR_SET_PDEATHSIG`
//!   = SIGKILL on K, so the namespace dies with it. K has the same on the
//!   host's spawner thread, which lives as long as the host process: if the
//!   host dies (even by SIGKILL), every task process dies.
//! - Network: without a grant, the tree gets its own network namespace with
//!   only loopback (brought up, so local servers work).
//! - Landlock: the grant's read-only / read-write paths, applied in K before
//!   it forks, so the whole tree is bound by them.
//!
//! Why not bubblewrap: `bwrap --unshare-pid --die-with-parent` works, but a
//! SIGTERM to the process group kills the outer `bwrap`, whose death SIGKILLs
//! the sandbox at once: the command gets no grace. It also reports signals as
//! `128 + n` exit codes, and adds a package dependency. Our keeper avoids all
//! three for ~150 lines of async-signal-safe code.
//!
//! Degrading: [`probe`] tries these at start-up (as root without a user
//! namespace first, then with one) and logs what is active. Without PID
//! namespaces each process still gets its own process group, which is killed
//! as a whole when the command exits or is killed, and `PR_SET_PDEATHSIG`;
//! a descendant that leaves the group (`setsid`) can then outlive its task,
//! and the log says so.
//!
//! Invariants: code that runs in the forked children allocates nothing and
//! calls only async-signal-safe functions (everything it needs is prepared in
//! [`ChildPlan`] before the fork); K and I close every descriptor they do not
//! need, so `spawn` returns as soon as C executed and the output pipes close
//! when the tree is gone.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use super::landlock;

/// Exit code of a keeper whose host died before the keeper was armed.
const EXIT_PARENT_GONE: i32 = 125;
/// Exit code of an init that could not start the command.
const EXIT_INIT_FAILED: i32 = 126;

/// What the kernel allows here, probed once per host process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfinementSupport {
    /// PID namespaces work; `Some(true)` when they need a user namespace.
    pub pid_namespace: Option<bool>,
    /// Network namespaces work (with the same user-namespace need).
    pub net_namespace: bool,
    /// The Landlock ABI version, when Landlock is enabled.
    pub landlock_abi: Option<u32>,
}

impl ConfinementSupport {
    /// A one-line summary for logs and `taskhost check`.
    pub fn describe(&self) -> String {
        let pid = match self.pid_namespace {
            Some(false) => "PID namespaces: on",
            Some(true) => "PID namespaces: on (in a user namespace)",
            None => {
                "PID namespaces: UNAVAILABLE (process groups only: setsid escapees can outlive their task)"
            }
        };
        let net = if self.net_namespace {
            "network isolation: on"
        } else {
            "network isolation: UNAVAILABLE (processes keep the host network)"
        };
        let fs = match self.landlock_abi {
            Some(abi) => format!("Landlock: ABI {abi}"),
            None => "Landlock: UNAVAILABLE (filesystem rules not enforced)".to_string(),
        };
        format!("{pid}; {net}; {fs}")
    }
}

/// Probes (once) and logs what confinement the kernel allows.
pub fn support() -> &'static ConfinementSupport {
    static SUPPORT: OnceLock<ConfinementSupport> = OnceLock::new();
    SUPPORT.get_or_init(|| {
        let support = probe();
        if support.pid_namespace.is_some()
            && support.net_namespace
            && support.landlock_abi.is_some()
        {
            tracing::info!(confinement = %support.describe(), "process confinement probed");
        } else {
            tracing::warn!(confinement = %support.describe(), "process confinement is degraded");
        }
        support
    })
}

fn probe() -> ConfinementSupport {
    // As root a PID namespace needs no user namespace; otherwise it does.
    let pid_namespace = if probe_unshare(libc::CLONE_NEWPID, false) {
        Some(false)
    } else if probe_unshare(libc::CLONE_NEWPID, true) {
        Some(true)
    } else {
        None
    };
    let net_namespace = match pid_namespace {
        Some(userns) => probe_unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNET, userns),
        None => false,
    };
    ConfinementSupport {
        pid_namespace,
        net_namespace,
        landlock_abi: landlock::abi(),
    }
}

/// Forks a child that tries the unshare (and a first process in the new PID
/// namespace); true when it all worked.
fn probe_unshare(flags: libc::c_int, userns: bool) -> bool {
    let maps = IdMaps::current();
    // SAFETY: the child calls only async-signal-safe functions on data
    // prepared before the fork, then `_exit`s.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return false;
        }
        if pid == 0 {
            let flags = if userns {
                flags | libc::CLONE_NEWUSER
            } else {
                flags
            };
            if libc::unshare(flags) != 0 {
                libc::_exit(1);
            }
            if userns && maps.write().is_err() {
                libc::_exit(2);
            }
            let child = libc::fork();
            if child < 0 {
                libc::_exit(3);
            }
            if child == 0 {
                libc::_exit(0);
            }
            let mut status = 0;
            if libc::waitpid(child, &mut status, 0) != child {
                libc::_exit(4);
            }
            libc::_exit(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                5
            });
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return false;
            }
        }
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }
}

/// The uid/gid maps of a user namespace: the host's ids mapped to themselves,
/// so files keep their owners and the command has no capabilities after exec.
#[derive(Clone, Debug)]
struct IdMaps {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

impl IdMaps {
    fn current() -> Self {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Self {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
        }
    }

    /// Async-signal-safe: writes this process's maps.
    fn write(&self) -> io::Result<()> {
        write_file(c"/proc/self/setgroups", b"deny")?;
        write_file(c"/proc/self/uid_map", &self.uid_map)?;
        write_file(c"/proc/self/gid_map", &self.gid_map)
    }
}

fn write_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: plain syscalls on a valid C string and buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let err = io::Error::last_os_error();
        libc::close(fd);
        if n != data.len() as isize {
            return Err(err);
        }
    }
    Ok(())
}

/// Everything the forked child needs, prepared before the fork.
pub(crate) struct ChildPlan {
    host_pid: libc::pid_t,
    /// `unshare` flags; 0 runs the command directly (process group only).
    ns_flags: libc::c_int,
    maps: Option<IdMaps>,
    loopback_up: bool,
    landlock: Option<OwnedFd>,
    devnull: OwnedFd,
}

/// What confinement one spawn gets, after the grant and the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub pid_namespace: bool,
    pub net_namespace: bool,
    pub landlock: bool,
}

impl ChildPlan {
    /// Plans the confinement of one spawn. `landlock` is the prepared ruleset
    /// (when the grant has filesystem rules and the kernel supports them).
    pub(crate) fn new(
        want_pid_ns: bool,
        want_net_ns: bool,
        landlock: Option<OwnedFd>,
    ) -> io::Result<(Self, Applied)> {
        let support = support();
        let userns = support.pid_namespace;
        let pid_ns = want_pid_ns && userns.is_some();
        let net_ns = pid_ns && want_net_ns && support.net_namespace;
        let mut ns_flags = 0;
        if pid_ns {
            ns_flags |= libc::CLONE_NEWPID;
            if net_ns {
                ns_flags |= libc::CLONE_NEWNET;
            }
            if userns == Some(true) {
                ns_flags |= libc::CLONE_NEWUSER;
            }
        }
        let devnull = std::fs::File::open("/dev/null")?.into();
        let applied = Applied {
            pid_namespace: pid_ns,
            net_namespace: net_ns,
            landlock: landlock.is_some(),
        };
        let plan = Self {
            // SAFETY: getpid cannot fail.
            host_pid: unsafe { libc::getpid() },
            ns_flags,
            maps: (userns == Some(true) && pid_ns).then(IdMaps::current),
            loopback_up: net_ns,
            landlock,
            devnull,
        };
        Ok((plan, applied))
    }

    /// Runs in the forked child between `fork` and `exec`. Returns only in
    /// the process that goes on to exec the command.
    ///
    /// # Safety
    /// Must be called only in a freshly forked child (a `pre_exec` hook).
    pub(crate) unsafe fn in_child(&self) -> io::Result<()> {
        // SAFETY (whole body): async-signal-safe syscalls on data prepared
        // before the fork; see the module invariants.
        unsafe {
            libc::setpgid(0, 0);
            // K and I never exec: they must not run the host's SIGCHLD
            // handler (tokio's), and waitpid needs the default disposition.
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The host may have died between fork and prctl: then our parent
            // is already someone else and no death signal will come.
            if libc::getppid() != self.host_pid {
                libc::_exit(EXIT_PARENT_GONE);
            }
            if self.ns_flags == 0 {
                return self.restrict_fs();
            }
            if libc::unshare(self.ns_flags) != 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(maps) = &self.maps {
                maps.write()?;
            }
            if self.loopback_up {
                loopback_up()?;
            }
            self.restrict_fs()?;
            let mut status_pipe = [0; 2];
            if libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return Err(io::Error::last_os_error());
            }
            let [status_read, status_write] = status_pipe;
            match libc::fork() {
                -1 => Err(io::Error::last_os_error()),
                0 => self.init(status_read, status_write),
                init => self.keeper(init, status_read, status_write),
            }
        }
    }

    unsafe fn restrict_fs(&self) -> io::Result<()> {
        match &self.landlock {
            // SAFETY: forwarded from in_child.
            Some(ruleset) => unsafe { landlock::restrict_self(ruleset.as_raw_fd()) },
            None => Ok(()),
        }
    }

    /// K: waits for I, then dies the way the command died.
    unsafe fn keeper(&self, init: libc::pid_t, status_read: RawFd, status_write: RawFd) -> ! {
        unsafe {
            libc::close(status_write);
            self.release_fds(status_read);
            // The group's SIGTERM is for the command; K leaves only when the
            // tree is gone (or by the group's SIGKILL).
            for signal in [
                libc::SIGTERM,
                libc::SIGINT,
                libc::SIGHUP,
                libc::SIGQUIT,
                libc::SIGPIPE,
            ] {
                libc::signal(signal, libc::SIG_IGN);
            }
            let mut init_status = 0;
            while libc::waitpid(init, &mut init_status, 0) < 0 {
                if *libc::__errno_location() != libc::EINTR {
                    libc::_exit(EXIT_INIT_FAILED);
                }
            }
            let mut bytes = [0u8; 4];
            let n = libc::read(status_read, bytes.as_mut_ptr().cast(), 4);
            let status = if n == 4 {
                i32::from_ne_bytes(bytes)
            } else {
                init_status
            };
            reproduce(status)
        }
    }

    /// I: PID 1 of the namespace: starts the command, reaps orphans, and
    /// reports the command's status. Returns only in the command (C).
    unsafe fn init(&self, status_read: RawFd, status_write: RawFd) -> io::Result<()> {
        unsafe {
            libc::close(status_read);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            // K may have died before the death signal was armed: K holds the
            // pipe's read end, so a broken pipe tells.
            let mut poll = libc::pollfd {
                fd: status_write,
                events: libc::POLLOUT,
                revents: 0,
            };
            if libc::poll(&mut poll, 1, 0) < 0 || poll.revents & libc::POLLERR != 0 {
                libc::_exit(EXIT_PARENT_GONE);
            }
            let command = libc::fork();
            if command == 0 {
                libc::close(status_write);
                return Ok(());
            }
            if command < 0 {
                libc::_exit(EXIT_INIT_FAILED);
            }
            self.release_fds(status_write);
            loop {
                let mut status = 0;
                let pid = libc::waitpid(-1, &mut status, 0);
                if pid == command {
                    let bytes = status.to_ne_bytes();
                    libc::write(status_write, bytes.as_ptr().cast(), 4);
                    // Exiting kills whatever the command left behind.
                    libc::_exit(0);
                }
                if pid < 0 && *libc::__errno_location() != libc::EINTR {
                    libc::_exit(EXIT_INIT_FAILED);
                }
            }
        }
    }

    /// Points stdio at /dev/null and closes every other descriptor but `keep`,
    /// so K and I hold neither the output pipes nor `spawn`'s exec-error pipe.
    unsafe fn release_fds(&self, keep: RawFd) {
        unsafe {
            let devnull = self.devnull.as_raw_fd();
            for fd in 0..3 {
                libc::dup2(devnull, fd);
            }
            close_from(3, keep);
        }
    }
}

/// Closes every descriptor `>= low` except `keep`.
unsafe fn close_from(low: RawFd, keep: RawFd) {
    unsafe {
        let ranges = [(low as u32, keep as u32 - 1), (keep as u32 + 1, u32::MAX)];
        for (first, last) in ranges {
            if first > last {
                continue;
            }
            if libc::syscall(libc::SYS_close_range, first, last, 0) != 0 {
                // Kernels before 5.9: close what could be open.
                let max = libc::sysconf(libc::_SC_OPEN_MAX).clamp(0, 65_536) as u32;
                for fd in first..=last.min(max) {
                    libc::close(fd as RawFd);
                }
            }
        }
    }
}

/// Exits with `status` (a `waitpid` status): the same code, or death by the
/// same signal (without a core dump).
unsafe fn reproduce(status: libc::c_int) -> ! {
    unsafe {
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            EXIT_INIT_FAILED
        })
    }
}

/// Brings `lo` up in a fresh network namespace (it starts down).
unsafe fn loopback_up() -> io::Result<()> {
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if sock < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        let mut result = Ok(());
        if libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req) < 0 {
            result = Err(io::Error::last_os_error());
        } else {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(sock, libc::SIOCSIFFLAGS, &req) < 0 {
                result = Err(io::Error::last_os_error());
            }
        }
        libc::close(sock);
        result
    }
}
