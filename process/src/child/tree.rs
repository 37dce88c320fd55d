//! The tree's own processes: K (the keeper) enters the namespaces and
//! limits and relays the command's status, I (PID 1 of the tree's PID
//! namespace) reaps and reports, and the command's process runs the last
//! steps before `execve` (see [`crate::confine`] for the model).
//!
//! Invariant: async-signal-safe, no allocation (see [`super`]).

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use super::exit::{EXIT_EXEC_FAILED, EXIT_PARENT_GONE, EXIT_SETUP_FAILED, fail};
use super::sys::close_from;
use crate::plan::{Bounds, ChildPlan, ExecPlan, IdMaps};

impl ChildPlan {
    /// Runs in the forked child K and never returns: every path ends in the
    /// command's `execve` or in `_exit`.
    ///
    /// # Safety
    /// Must be called only in a freshly forked (or exec'd) child that is
    /// already the leader of a session of its own (so the host's group kill,
    /// `kill(-pid)`, reaches it, and the tree has no controlling terminal).
    /// `stdin` is `/dev/null` or the read end of the tree's stdin pipe; K
    /// and I point their own fd 0 back at `/dev/null` ([`Self::drop_stdio`])
    /// before they let their child go on, so once the command runs it alone
    /// holds the pipe.
    pub(crate) unsafe fn in_child(&self, stdin: RawFd, stdout: RawFd, stderr: RawFd) -> ! {
        // SAFETY: only in a freshly forked child (the caller's contract); async-signal-safe syscalls
        // on data prepared before the fork (see the module invariants).
        unsafe {
            // dup2 clears close-on-exec on 0, 1 and 2 (a no-op when the
            // descriptor already is the target, as in an exec'd keeper).
            libc::dup2(stdin, 0);
            libc::dup2(stdout, 1);
            libc::dup2(stderr, 2);
            // A clean signal state for the command: the host's thread may
            // block signals, or have handlers (an inherited handler survives
            // until exec), and Rust programs ignore SIGPIPE (an ignored
            // disposition survives exec; `yes | head` needs the default).
            // The signals of a group kill stay blocked in K and I (see
            // `KEEPER_SIGNALS`): never lost, never ending K early.
            set_keeper_signals(libc::SIG_DFL);
            block_keeper_signals(libc::SIG_SETMASK);
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            // K and I never exec: they must not run the host's SIGCHLD
            // handler (tokio's), and waitpid needs the default disposition.
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
            let landlock = self.landlock.as_ref().map_or(-1, |fd| fd.as_raw_fd());
            let durable = self.durable_fds();
            let mut keep = [self.devnull, landlock, self.lifeline, -1, -1, -1, -1, -1, -1, -1];
            keep[3..].copy_from_slice(&durable);
            close_from(3, &keep);
            // Before anything forks: every process of the tree starts in
            // its cgroups.
            self.bounds.join_cgroups();
            let namespaces = self.ns_flags & libc::CLONE_NEWPID != 0;
            if self.ns_flags != 0 {
                if libc::unshare(self.ns_flags) != 0 {
                    fail(EXIT_SETUP_FAILED, b"cannot create the namespaces");
                }
                if let Some(maps) = &self.maps
                    && maps.write().is_err()
                {
                    fail(EXIT_SETUP_FAILED, b"cannot map user ids in the user namespace");
                }
                if self.loopback_up && loopback_up().is_err() {
                    fail(EXIT_SETUP_FAILED, b"cannot bring up loopback in the network namespace");
                }
                if let Some(mounts) = &self.mounts {
                    mounts.build_in_keeper();
                    mounts.add_landlock_rules(landlock, self.landlock_rights, self.landlock_read_rights);
                }
            }
            // After the user namespace: RLIMIT_NPROC then counts this
            // tree's processes alone (it counts per user namespace).
            self.bounds.set_rlimits();
            // K and I hold what the command must not read: a forked K is a
            // copy of the host's memory, a durable K holds its secret. Not
            // dumpable, their memory, descriptors and maps are closed to a
            // same-uid process without CAP_SYS_PTRACE (the command: its
            // `execve` makes it dumpable again). After the id maps: a
            // process that is not dumpable cannot write its own.
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            // After the mounts: the working directory may be a read-write
            // root that was just mounted again on top of itself.
            if libc::chdir(self.cwd.as_ptr()) != 0 {
                fail(EXIT_SETUP_FAILED, b"cannot enter the working directory");
            }
            let mut status_pipe = [-1; 2];
            if namespaces && libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                fail(EXIT_SETUP_FAILED, b"cannot create the status pipe");
            }
            let [status_read, status_write] = status_pipe;
            // K -> its child: "the signals that reached K before you existed
            // are forwarded" (see `forward_pending`), and "K holds none of
            // the tree's stdio any more".
            let mut go_pipe = [-1; 2];
            if libc::pipe2(go_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                fail(EXIT_SETUP_FAILED, b"cannot create the start pipe");
            }
            let [go_read, go_write] = go_pipe;
            match super::sys::fork_raw() {
                -1 => fail(EXIT_SETUP_FAILED, b"cannot fork"),
                0 if namespaces => {
                    libc::close(go_write);
                    self.init(status_read, status_write, go_read)
                }
                0 => {
                    libc::close(go_write);
                    wait_for_go(go_read);
                    self.lock_down();
                    self.exec_command()
                }
                child => {
                    // Whatever kill reached K alone is its child's too.
                    forward_pending(child);
                    self.drop_stdio();
                    libc::close(go_read);
                    libc::write(go_write, b"g".as_ptr().cast(), 1);
                    libc::close(go_write);
                    if let Some(durable) = &self.durable {
                        if status_write >= 0 {
                            libc::close(status_write);
                        }
                        let mut keep = [status_read, -1, -1, -1, -1, -1, -1, -1];
                        keep[1..].copy_from_slice(&durable.fds());
                        self.release_fds(&keep);
                        let status = durable.keep(child, status_read);
                        reproduce(status)
                    }
                    self.keeper(child, status_read, status_write)
                }
            }
        }
    }

    /// The tree's last set-up step, in I or (without a PID namespace) in
    /// the command's process: see [`super::lockdown::lock_down`].
    ///
    /// # Safety
    /// In I or the command's process, after the mounts and before `exec`.
    unsafe fn lock_down(&self) {
        let landlock = self.landlock.as_ref().map_or(-1, |fd| fd.as_raw_fd());
        // SAFETY: forwarded from in_child.
        unsafe { super::lockdown::lock_down(landlock, self.seccomp) }
    }

    /// Closes every descriptor but stdio (the keeper's lifeline, the
    /// Landlock ruleset and the like are the host's, not the command's),
    /// then execs the command.
    ///
    /// # Safety
    /// In the command's own process (forked by I or K), after
    /// [`Self::lock_down`].
    unsafe fn exec_command(&self) -> ! {
        // SAFETY: forwarded from in_child.
        unsafe {
            close_from(3, &[]);
            // A kill already pending is delivered here, at its default.
            block_keeper_signals(libc::SIG_UNBLOCK);
            self.exec.exec()
        }
    }

    /// K: waits for its child (I, or C without namespaces) while watching the
    /// lifeline, then dies the way the command died.
    ///
    /// # Safety
    /// In K, right after it forked `child`; `status_read`/`status_write` are
    /// the status pipe's ends (-1 without a PID namespace).
    unsafe fn keeper(&self, child: libc::pid_t, status_read: RawFd, status_write: RawFd) -> ! {
        // SAFETY: in K after the fork; async-signal-safe syscalls on descriptors and pids this plan prepared.
        unsafe {
            if status_write >= 0 {
                libc::close(status_write);
            }
            self.release_fds(&[status_read, self.lifeline]);
            // The group's SIGTERM is for the command; K leaves only when the
            // tree is gone (or by the group's SIGKILL): `in_child` blocked
            // the signals a group kill sends.
            let pidfd = libc::syscall(libc::SYS_pidfd_open, child, 0) as RawFd;
            if pidfd >= 0 {
                loop {
                    let mut fds = [
                        libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 },
                        libc::pollfd { fd: self.lifeline, events: libc::POLLIN, revents: 0 },
                    ];
                    if libc::poll(fds.as_mut_ptr(), 2, -1) < 0 {
                        if *libc::__errno_location() == libc::EINTR {
                            continue;
                        }
                        break;
                    }
                    if fds[1].revents != 0 {
                        // The host is gone: so is everything it started.
                        libc::kill(0, libc::SIGKILL);
                    }
                    if fds[0].revents != 0 {
                        break;
                    }
                }
            }
            let mut child_status = 0;
            while libc::waitpid(child, &mut child_status, 0) < 0 {
                if *libc::__errno_location() != libc::EINTR {
                    libc::_exit(EXIT_SETUP_FAILED);
                }
            }
            let mut bytes = [0u8; 4];
            let status = if status_read >= 0 && libc::read(status_read, bytes.as_mut_ptr().cast(), 4) == 4 {
                i32::from_ne_bytes(bytes)
            } else {
                child_status
            };
            reproduce(status)
        }
    }

    /// I: PID 1 of the namespace: starts the command, reaps orphans, and
    /// reports the command's status.
    ///
    /// # Safety
    /// In I, the first process of the tree's PID namespace, forked by K;
    /// `go_read` is the read end of K's start pipe.
    unsafe fn init(&self, status_read: RawFd, status_write: RawFd, go_read: RawFd) -> ! {
        // SAFETY: in I after the fork; async-signal-safe syscalls on data prepared before the fork.
        unsafe {
            libc::close(status_read);
            // A durable tree's logs, socket and pipe ends are K's alone.
            for fd in self.durable_fds() {
                if fd >= 0 {
                    libc::close(fd);
                }
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            // K may have died before the death signal was armed: K holds the
            // pipe's read end, so a broken pipe tells.
            let mut poll = libc::pollfd { fd: status_write, events: libc::POLLOUT, revents: 0 };
            if libc::poll(&mut poll, 1, 0) < 0 || poll.revents & libc::POLLERR != 0 {
                libc::_exit(EXIT_PARENT_GONE);
            }
            if let Some(mounts) = &self.mounts {
                mounts.finish_in_init();
            }
            self.lock_down();
            // K has forwarded what reached it before this process existed
            // (end of file: K is gone, and the death signal ends this too).
            wait_for_go(go_read);
            // I -> the command: "I holds none of your stdio any more".
            let mut released = [-1; 2];
            if libc::pipe2(released.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                fail(EXIT_SETUP_FAILED, b"cannot create the release pipe");
            }
            let [released_read, released_write] = released;
            let command = super::sys::fork_raw();
            if command == 0 {
                libc::close(released_write);
                wait_for_go(released_read);
                self.exec_command();
            }
            if command < 0 {
                fail(EXIT_SETUP_FAILED, b"cannot fork the command");
            }
            // Whatever kill reached this process before the command existed
            // is the command's.
            forward_pending(command);
            self.release_fds(&[status_write, released_write]);
            libc::write(released_write, b"g".as_ptr().cast(), 1);
            libc::close(released_write);
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
                    libc::_exit(EXIT_SETUP_FAILED);
                }
            }
        }
    }

    /// The descriptors of a durable tree's keeper duties (-1 where none).
    fn durable_fds(&self) -> [RawFd; 7] {
        self.durable.as_ref().map_or([-1; 7], |d| d.fds())
    }

    /// Points stdio at /dev/null and closes every other descriptor but
    /// `keep`, so K and I do not hold the output pipes.
    ///
    /// # Safety
    /// In K or I (never the command: its stdio is the tree's).
    unsafe fn release_fds(&self, keep: &[RawFd]) {
        // SAFETY: in K or I after the fork; dup2/close on descriptor numbers only.
        unsafe {
            self.drop_stdio();
            close_from(3, keep);
        }
    }

    /// Points K's or I's fds 0–2 at `/dev/null`, before it lets its child
    /// go on: once the command runs, it alone holds the tree's stdin pipe
    /// (a program that closes its stdin leaves no reader, and a write to it
    /// fails at once) and the output pipes end with the command's tree.
    ///
    /// # Safety
    /// In K or I after the fork.
    unsafe fn drop_stdio(&self) {
        // SAFETY: dup2 on descriptor numbers only.
        unsafe {
            for fd in 0..3 {
                libc::dup2(self.devnull, fd);
            }
        }
    }
}

/// Blocks until the parent's one byte (or end of file: the parent is gone,
/// and the death signal ends this process too), then closes the pipe.
///
/// # Safety
/// In a child after the fork; `read_end` is the read end of its start pipe.
unsafe fn wait_for_go(read_end: RawFd) {
    // SAFETY: read/close on a descriptor the caller owns.
    unsafe {
        let mut go = 0u8;
        while libc::read(read_end, (&mut go as *mut u8).cast(), 1) < 0 && *libc::__errno_location() == libc::EINTR {}
        libc::close(read_end);
    }
}

impl ExecPlan {
    /// Replaces the calling process with the command; never returns.
    ///
    /// # Safety
    /// In the command's own process, its set-up done.
    unsafe fn exec(&self) -> ! {
        // SAFETY: the caller is a child about to become the command; every pointer comes from CStrings
        // this plan owns, NUL-terminated arrays built in `new`.
        unsafe {
            libc::execve(self.path.as_ptr(), self.argv_ptrs.as_ptr(), self.envp_ptrs.as_ptr());
            fail(EXIT_EXEC_FAILED, b"cannot execute the program")
        }
    }
}

impl Bounds {
    /// Async-signal-safe: K joins its cgroups.
    ///
    /// # Safety
    /// In K, before it forks anything (so every process of the tree starts
    /// in them).
    unsafe fn join_cgroups(&self) {
        for file in &self.cgroup_procs {
            // SAFETY: plain syscalls on a prepared C string.
            unsafe {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                // "0" is the writing process itself.
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    fail(EXIT_SETUP_FAILED, b"cannot join the tree's cgroup");
                }
                libc::close(fd);
            }
        }
    }

    /// Async-signal-safe: the rlimits (the fallback's, the open files and
    /// the file size), soft and hard, so no process of the tree can raise
    /// them (raising a hard limit takes `CAP_SYS_RESOURCE` in the initial
    /// user namespace).
    ///
    /// # Safety
    /// In K, after it entered its user namespace and before it forks.
    unsafe fn set_rlimits(&self) {
        for (resource, value) in [
            (libc::RLIMIT_NPROC, self.nproc),
            (libc::RLIMIT_DATA, self.data),
            (libc::RLIMIT_NOFILE, self.nofile),
            (libc::RLIMIT_FSIZE, self.fsize),
        ] {
            if value == 0 {
                continue;
            }
            let limit = libc::rlimit { rlim_cur: value as libc::rlim_t, rlim_max: value as libc::rlim_t };
            // SAFETY: plain syscall.
            if unsafe { libc::setrlimit(resource, &limit) } != 0 {
                // SAFETY: forwarded.
                unsafe { fail(EXIT_SETUP_FAILED, b"cannot set the tree's rlimits") };
            }
        }
    }
}

impl IdMaps {
    /// Async-signal-safe: writes this process's maps.
    pub(super) fn write(&self) -> io::Result<()> {
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

/// The signals of a group kill and of a terminal: K and I keep them
/// blocked (a namespace init without a handler would discard them, and K
/// must outlive the command), the command gets them at their defaults.
const KEEPER_SIGNALS: [libc::c_int; 5] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGPIPE];

/// Sets [`KEEPER_SIGNALS`] to `disposition` in this process.
///
/// # Safety
/// `signal` only: async-signal-safe, for a forked child.
unsafe fn set_keeper_signals(disposition: libc::sighandler_t) {
    for signal in KEEPER_SIGNALS {
        // SAFETY: signal() on this process only, with SIG_IGN or SIG_DFL.
        unsafe { libc::signal(signal, disposition) };
    }
}

/// `sigprocmask(how, KEEPER_SIGNALS)`: `SIG_SETMASK` blocks exactly them,
/// `SIG_UNBLOCK` lets them through.
///
/// # Safety
/// In a tree's process before `exec`.
unsafe fn block_keeper_signals(how: libc::c_int) {
    // SAFETY: a stack sigset and sigprocmask on this thread: async-signal-safe.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in KEEPER_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        libc::sigprocmask(how, &set, std::ptr::null_mut());
    }
}

/// Sends `child` each of [`KEEPER_SIGNALS`] pending here. A group kill
/// reaches the processes of the group at that moment: one that lands after
/// this process blocked it and before `child` existed would otherwise never
/// reach the command. (Called after the fork: a signal that lands between
/// the fork and this check reaches `child` twice; standard signals pending
/// at once coalesce, so at most once more.)
///
/// # Safety
/// In K or I, right after forking `child`.
unsafe fn forward_pending(child: libc::pid_t) {
    // SAFETY: sigpending on a stack set and kill of our own child: async-signal-safe.
    unsafe {
        let mut pending: libc::sigset_t = std::mem::zeroed();
        if libc::sigpending(&mut pending) != 0 {
            return;
        }
        for signal in KEEPER_SIGNALS {
            if libc::sigismember(&pending, signal) == 1 {
                libc::kill(child, signal);
            }
        }
    }
}

/// Exits with `status` (a `waitpid` status): the same code, or death by the
/// same signal (without a core dump).
///
/// # Safety
/// In K, once its child is reaped (it ends the process).
pub(super) unsafe fn reproduce(status: libc::c_int) -> ! {
    // SAFETY: signal, sigaction and _exit on this process only: async-signal-safe.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { EXIT_SETUP_FAILED })
    }
}

/// Brings `lo` up in a fresh network namespace (it starts down).
///
/// # Safety
/// In K, right after it entered the tree's network namespace.
unsafe fn loopback_up() -> io::Result<()> {
    // SAFETY: a socket and an ioctl on stack-allocated `ifreq` in this (forked) process; the socket is
    // closed on every path.
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
