//! K of a durable tree ([`crate::durable`]): instead of following the host
//! it copies the tree's output into the logs, answers servers on its
//! socket, enforces the deadline and writes the tree's end next to the logs.
//!
//! Invariants (besides [`super`]'s: no allocation, async-signal-safe):
//! - K alone writes the logs, each at its end. What they hold on disk stays
//!   within the cap: the server punches out what its reader took for good
//!   ([`crate::durable_follow::LogRelease`]), so the cap bounds the
//!   *unread* output, and a reader that keeps up gets all of it.
//! - Output that finds the logs at their cap is dropped, never held (the
//!   tree is not slowed), and a mark line in that stream's log says where
//!   (the `truncated` file says that it happened); the stream is written
//!   again once the reader freed a quarter of the cap (at most a pipe).
//! - The `status` file appears whole (written as `status.tmp`, then
//!   renamed) once the tree is reaped: `code N` or `signal N`, then
//!   `deadline` when K killed the tree at its deadline.
//! - A tree whose logs were removed (its state directory deleted: no
//!   server can ever adopt it, read it or end it) is SIGKILLed within
//!   [`ORPHAN_CHECK_MS`]: K checks the logs' link counts that often.
//! - A connection is served only after the secret it sends matches (in
//!   constant time), within [`CLIENT_WAIT_MS`]; K never blocks on a client
//!   longer than that.

use std::os::fd::{AsRawFd, RawFd};

use crate::plan::{Command, DurablePlan, SECRET_BYTES, STATUS_BYTES};

/// How long K waits for a connected client's request.
const CLIENT_WAIT_MS: libc::c_int = 1_000;
/// How often K checks that its logs are still linked (the state directory
/// was not deleted under a running tree).
pub(crate) const ORPHAN_CHECK_MS: libc::c_int = 5_000;
/// K's copy buffer (on its stack), for what is not spliced.
const COPY_BYTES: usize = 64 * 1024;
/// The tree's output pipes are made this large (within the system's
/// `pipe-max-size`), and one splice moves at most this much: a chatty
/// command wakes K 16 times less often than with a 64 KiB pipe.
const PIPE_BYTES: usize = 1 << 20;
/// Room kept in the logs for drop marks: output stops this short of the
/// cap, so the line saying where output was dropped always fits.
const MARK_ROOM: u64 = 1024;
/// A drop mark at most.
const MARK_BYTES: usize = 256;

/// The streams, as indices of [`Keeping`]'s arrays.
const STDOUT: usize = 0;
const STDERR: usize = 1;

/// K's loop state: what is still open.
struct Keeping {
    stdin: RawFd,
    /// Each log's length (stdout, stderr): where K's next write lands.
    lengths: [u64; 2],
    /// What the logs hold on disk, at most: their lengths less what the
    /// server punched out, measured again near the cap ([`DurablePlan::output_room`]).
    held: u64,
    /// The stream's output is dropped (since the logs were at their cap)
    /// until the reader freed [`DurablePlan::resume_room`].
    dropping: [bool; 2],
    truncated: bool,
    deadline_hit: bool,
    /// The logs' link counts are checked: from the start, unless the file
    /// system reports none (then it cannot tell), until they were found
    /// unlinked and the tree was killed.
    orphan_check: bool,
    /// When the logs' links are checked next (`CLOCK_MONOTONIC` ms).
    next_orphan_check: i64,
    /// Output still moves pipe → log by `splice` (no copy through K): false
    /// once a splice was refused (then K reads and writes).
    splice: bool,
    /// `status.tmp`, with room for the status taken when the tree was
    /// spawned (`durable::open`), so the end is written even once the state
    /// directory is full (-1: none).
    status: RawFd,
}

impl DurablePlan {
    /// Runs K's duties until the tree ended; returns the command's `waitpid`
    /// status (after writing it into the status file).
    ///
    /// # Safety
    /// In K, right after it forked `child` and released every other
    /// descriptor; `status_read` is I's status pipe (-1 without a PID
    /// namespace).
    pub(crate) unsafe fn keep(&self, child: libc::pid_t, status_read: RawFd) -> libc::c_int {
        // SAFETY: async-signal-safe syscalls on descriptors this plan holds.
        unsafe {
            // K writes the logs: past RLIMIT_FSIZE a write fails, it does not kill K.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            // Listening since the fork (see `ChildPlan::fork`).
            let socket = self.socket.as_raw_fd();
            let pidfd = libc::syscall(libc::SYS_pidfd_open, child, 0) as RawFd;
            let mut state = Keeping {
                stdin: self.stdin.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
                lengths: [0; 2],
                held: 0,
                dropping: [false; 2],
                truncated: false,
                deadline_hit: false,
                orphan_check: !self.logs_unlinked(),
                next_orphan_check: monotonic_millis() + i64::from(ORPHAN_CHECK_MS),
                splice: true,
                status: self.reserve_status(),
            };
            if pidfd < 0 {
                // K could not watch the tree end: it must not run unwatched.
                self.end_tree(child);
            }
            let mut out = self.stdout.as_raw_fd();
            let mut err = self.stderr.as_raw_fd();
            for fd in [out, err] {
                // Failure (a lower pipe-max-size) only costs throughput.
                libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_int);
            }
            let mut buf = [0u8; COPY_BYTES];
            loop {
                let until_deadline = if state.deadline_hit { -1 } else { millis_until(self.deadline) };
                let timeout = if !state.orphan_check {
                    until_deadline
                } else {
                    let until_check = (state.next_orphan_check - monotonic_millis()).clamp(0, ORPHAN_CHECK_MS.into());
                    if until_deadline < 0 {
                        until_check as libc::c_int
                    } else {
                        until_deadline.min(until_check as libc::c_int)
                    }
                };
                let mut fds = [
                    libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 },
                    libc::pollfd { fd: out, events: libc::POLLIN, revents: 0 },
                    libc::pollfd { fd: err, events: libc::POLLIN, revents: 0 },
                    libc::pollfd { fd: socket, events: libc::POLLIN, revents: 0 },
                ];
                if libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) < 0 {
                    if super::sys::errno() == libc::EINTR {
                        continue;
                    }
                    break;
                }
                if !state.deadline_hit && millis_until(self.deadline) == 0 {
                    state.deadline_hit = true;
                    self.end_tree(child);
                }
                let now = monotonic_millis();
                if state.orphan_check && now >= state.next_orphan_check {
                    state.next_orphan_check = now + i64::from(ORPHAN_CHECK_MS);
                    if self.logs_unlinked() {
                        state.orphan_check = false;
                        self.end_tree(child);
                    }
                }
                if fds[1].revents != 0 && !self.copy(out, STDOUT, &mut buf, &mut state, false) {
                    out = -1;
                }
                if fds[2].revents != 0 && !self.copy(err, STDERR, &mut buf, &mut state, false) {
                    err = -1;
                }
                if fds[3].revents != 0 {
                    self.serve(socket, child, &mut state);
                }
                if fds[0].revents != 0 || pidfd < 0 {
                    break;
                }
            }
            let mut child_status = 0;
            while libc::waitpid(child, &mut child_status, 0) < 0 {
                if super::sys::errno() != libc::EINTR {
                    break;
                }
            }
            let mut bytes = [0u8; 4];
            let status = if status_read >= 0 && libc::read(status_read, bytes.as_mut_ptr().cast(), 4) == 4 {
                i32::from_ne_bytes(bytes)
            } else {
                child_status
            };
            // What the tree wrote before it ended is in the pipes (with a
            // PID namespace nothing holds their write ends any more; without,
            // a descendant that left may: then only what is there now).
            for (fd, stream) in [(out, STDOUT), (err, STDERR)] {
                if fd < 0 {
                    continue;
                }
                libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK);
                while self.copy(fd, stream, &mut buf, &mut state, true) {}
            }
            self.write_status(status, &state);
            // Without a PID namespace, what the command left in the group
            // dies with it (K too: its status is written).
            if status_read < 0 {
                libc::kill(0, libc::SIGKILL);
            }
            status
        }
    }

    /// Moves what `from` holds now into `stream`'s log, within the cap:
    /// spliced (the kernel moves the pages; no copy through K) while the
    /// cap has room, else read, and dropped past the cap with a mark. False
    /// at end of file (or error, or nothing to read when `draining` a
    /// non-blocking end).
    ///
    /// # Safety
    /// In K.
    unsafe fn copy(
        &self,
        from: RawFd,
        stream: usize,
        buf: &mut [u8; COPY_BYTES],
        state: &mut Keeping,
        draining: bool,
    ) -> bool {
        let log = self.log(stream);
        // SAFETY: splice/read/write on K's descriptors and its stack buffer.
        unsafe {
            let mut room = self.output_room(state);
            if state.dropping[stream] {
                if room < self.resume_room() {
                    room = 0;
                } else {
                    state.dropping[stream] = false;
                }
            }
            if state.splice && room > 0 {
                let flags = libc::SPLICE_F_MOVE | if draining { libc::SPLICE_F_NONBLOCK } else { 0 };
                let len = (room as usize).min(PIPE_BYTES);
                let n = libc::splice(from, std::ptr::null_mut(), log, std::ptr::null_mut(), len, flags);
                if n >= 0 {
                    state.lengths[stream] += n as u64;
                    state.held += n as u64;
                    return n > 0;
                }
                match super::sys::errno() {
                    libc::EINTR => return true,
                    libc::EAGAIN => return false,
                    // Refused (a log that cannot take a splice, a full disk,
                    // the file size limit): the bytes are still in the pipe;
                    // the read below takes them and the write says what fails.
                    _ => state.splice = false,
                }
            }
            let n = libc::read(from, buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                return n < 0 && super::sys::errno() == libc::EINTR;
            }
            let n = n as u64;
            let keep = n.min(room) as usize;
            let at = write_all(log, &buf[..keep]);
            state.lengths[stream] += at as u64;
            state.held += at as u64;
            if (at as u64) < n && !state.dropping[stream] {
                state.dropping[stream] = true;
                self.mark_drop(stream, state);
            }
            true
        }
    }

    /// `stream`'s log.
    fn log(&self, stream: usize) -> RawFd {
        if stream == STDERR { self.stderr_log.as_raw_fd() } else { self.stdout_log.as_raw_fd() }
    }

    /// How much more output the logs take: the cap (less the marks' room)
    /// less what they hold. Near the cap, what they hold is measured (the
    /// blocks they take, no more than their lengths), so what the server
    /// punched out is room again.
    fn output_room(&self, state: &mut Keeping) -> u64 {
        let cap = self.log_cap.saturating_sub(MARK_ROOM);
        if cap.saturating_sub(state.held) < PIPE_BYTES as u64 {
            let mut blocks = 0u64;
            for stream in [STDOUT, STDERR] {
                // SAFETY: a plain C struct, all zeroes valid.
                let mut stat: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: fstat of K's own descriptor into a local.
                if unsafe { libc::fstat(self.log(stream), &mut stat) } != 0 {
                    return cap.saturating_sub(state.held);
                }
                blocks += stat.st_blocks as u64 * 512;
            }
            state.held = blocks.min(state.lengths[STDOUT] + state.lengths[STDERR]);
        }
        cap.saturating_sub(state.held)
    }

    /// True when a log has no name left (its directory was deleted): no
    /// server can find this tree again.
    fn logs_unlinked(&self) -> bool {
        [STDOUT, STDERR].into_iter().any(|stream| {
            // SAFETY: a plain C struct, all zeroes valid.
            let mut stat: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat of K's own descriptor into a local.
            unsafe { libc::fstat(self.log(stream), &mut stat) == 0 && stat.st_nlink == 0 }
        })
    }

    /// The room a dropping stream waits for before it is written again: a
    /// quarter of the cap, at most a pipe (not a mark for every line).
    fn resume_room(&self) -> u64 {
        (self.log_cap.saturating_sub(MARK_ROOM) / 4).clamp(1, PIPE_BYTES as u64)
    }

    /// Writes the line that says output was dropped here into `stream`'s
    /// log (on a line of its own), and the `truncated` mark once.
    ///
    /// # Safety
    /// In K.
    unsafe fn mark_drop(&self, stream: usize, state: &mut Keeping) {
        // SAFETY: pread/write/openat on K's descriptors and stack buffers.
        unsafe {
            let log = self.log(stream);
            let mut mark = [0u8; MARK_BYTES];
            let mut len = 0;
            let mut last = [b'\n'];
            let length = state.lengths[stream];
            if length > 0
                && libc::pread(log, last.as_mut_ptr().cast(), 1, (length - 1) as libc::off_t) == 1
                && last[0] != b'\n'
            {
                push(&mut mark, &mut len, b"\n");
            }
            push(
                &mut mark,
                &mut len,
                b"[taskhost: output dropped here: the command's unread output filled its log cap of ",
            );
            let mut digits = [0u8; 20];
            push(&mut mark, &mut len, super::exit::decimal(self.log_cap, &mut digits));
            push(&mut mark, &mut len, b" bytes (spill_cap_bytes); what it wrote until the reader caught up is lost]\n");
            let at = write_all(log, &mark[..len]);
            state.lengths[stream] += at as u64;
            state.held += at as u64;
            if !state.truncated {
                state.truncated = true;
                let fd = libc::openat(
                    self.dir.as_raw_fd(),
                    c"truncated".as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                    0o600,
                );
                if fd >= 0 {
                    libc::close(fd);
                }
            }
        }
    }

    /// Answers one client of the socket: a request is the secret and one
    /// [`Command`] byte; the reply is one byte, with K's stdin write end
    /// attached to the reply of [`Command::Adopt`] while K holds one.
    ///
    /// # Safety
    /// In K.
    unsafe fn serve(&self, socket: RawFd, child: libc::pid_t, state: &mut Keeping) {
        // SAFETY: accept/poll/recv/sendmsg/close on K's descriptors, stack buffers only.
        unsafe {
            let conn = libc::accept4(
                socket,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            );
            if conn < 0 {
                return;
            }
            let mut request = [0u8; SECRET_BYTES + 1];
            let mut got = 0;
            while got < request.len() {
                let mut poll = libc::pollfd { fd: conn, events: libc::POLLIN, revents: 0 };
                if libc::poll(&mut poll, 1, CLIENT_WAIT_MS) <= 0 {
                    break;
                }
                let n = libc::recv(conn, request[got..].as_mut_ptr().cast(), request.len() - got, libc::MSG_DONTWAIT);
                if n <= 0 {
                    break;
                }
                got += n as usize;
            }
            let mut differ = 0u8;
            for (a, b) in request[..SECRET_BYTES].iter().zip(self.secret.iter()) {
                differ |= a ^ b;
            }
            if got == request.len() && differ == 0 {
                match Command::from_byte(request[SECRET_BYTES]) {
                    Some(Command::Adopt) => send_with_fd(conn, state.stdin),
                    Some(Command::CloseStdin) => {
                        if state.stdin >= 0 {
                            libc::close(state.stdin);
                            state.stdin = -1;
                        }
                        reply(conn, b'k');
                    }
                    Some(Command::Terminate) => {
                        // The group's SIGTERM; K and I keep it blocked.
                        libc::kill(0, libc::SIGTERM);
                        reply(conn, b'k');
                    }
                    Some(Command::Kill) => {
                        self.end_tree(child);
                        reply(conn, b'k');
                    }
                    None => {}
                }
            }
            libc::close(conn);
        }
    }

    /// SIGKILLs the tree but K: I (its death empties the PID namespace) or,
    /// without one, the command and what stayed in the group.
    ///
    /// # Safety
    /// In K.
    unsafe fn end_tree(&self, child: libc::pid_t) {
        // SAFETY: kill and signal masks of this process: async-signal-safe.
        unsafe {
            // With a PID namespace, I's death ends everything in it; without
            // one, the group's stragglers die once K wrote the status.
            libc::kill(child, libc::SIGKILL);
        }
    }

    /// `status.tmp`, whose [`STATUS_BYTES`] the spawn reserved (made now,
    /// if it is gone), or -1.
    ///
    /// # Safety
    /// In K.
    unsafe fn reserve_status(&self) -> RawFd {
        // SAFETY: openat/write relative to K's directory descriptor, a stack buffer.
        unsafe {
            let fd = libc::openat(
                self.dir.as_raw_fd(),
                c"status.tmp".as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600,
            );
            // Over the reserved bytes (no new block), or taking them now.
            if fd >= 0
                && libc::pwrite(fd, [b' '; STATUS_BYTES].as_ptr().cast(), STATUS_BYTES, 0) != STATUS_BYTES as isize
            {
                libc::close(fd);
                return -1;
            }
            fd
        }
    }

    /// Writes the status into `status.tmp` (over its reserved bytes, so a
    /// full disk does not stop it), then renames it to `status`.
    ///
    /// # Safety
    /// In K, once the tree is reaped.
    unsafe fn write_status(&self, status: libc::c_int, state: &Keeping) {
        // SAFETY: openat/write/fsync/renameat relative to K's directory descriptor, stack buffers.
        unsafe {
            let mut text = [0u8; STATUS_BYTES];
            let mut len = 0;
            let (word, number): (&[u8], i32) = if libc::WIFSIGNALED(status) {
                (b"signal ", libc::WTERMSIG(status))
            } else if libc::WIFEXITED(status) {
                (b"code ", libc::WEXITSTATUS(status))
            } else {
                (b"code ", -1)
            };
            push(&mut text, &mut len, word);
            push_number(&mut text, &mut len, number);
            push(&mut text, &mut len, b"\n");
            if state.deadline_hit {
                push(&mut text, &mut len, b"deadline\n");
            }
            let dir = self.dir.as_raw_fd();
            let fd = if state.status >= 0 { state.status } else { self.reserve_status() };
            if fd < 0 {
                return;
            }
            // Over the reserved bytes, then cut to the status: neither needs
            // a new block.
            let ok = libc::pwrite(fd, text.as_ptr().cast(), len, 0) == len as isize
                && libc::ftruncate(fd, len as libc::off_t) == 0
                && libc::fsync(fd) == 0;
            libc::close(fd);
            if ok {
                libc::renameat(dir, c"status.tmp".as_ptr(), dir, c"status".as_ptr());
            }
        }
    }
}

/// Writes `bytes` at `fd`'s position, through interruptions; returns how
/// many were written (fewer on an error: a full disk, the size limit).
///
/// # Safety
/// In K.
unsafe fn write_all(fd: RawFd, bytes: &[u8]) -> usize {
    let mut at = 0;
    while at < bytes.len() {
        // SAFETY: a write from a live slice.
        let w = unsafe { libc::write(fd, bytes[at..].as_ptr().cast(), bytes.len() - at) };
        if w < 0 && super::sys::errno() == libc::EINTR {
            continue;
        }
        if w <= 0 {
            break;
        }
        at += w as usize;
    }
    at
}

fn push<const N: usize>(buf: &mut [u8; N], len: &mut usize, bytes: &[u8]) {
    let n = bytes.len().min(buf.len() - *len);
    buf[*len..*len + n].copy_from_slice(&bytes[..n]);
    *len += n;
}

fn push_number(buf: &mut [u8; STATUS_BYTES], len: &mut usize, number: i32) {
    if number < 0 {
        push(buf, len, b"-");
    }
    let mut digits = [0u8; 20];
    push(buf, len, super::exit::decimal(number.unsigned_abs().into(), &mut digits));
}

/// Milliseconds from now until `deadline` (`CLOCK_MONOTONIC` seconds), at
/// most a day (poll's timeout is an int); 0 once it passed.
fn millis_until(deadline: libc::time_t) -> libc::c_int {
    #[allow(clippy::unnecessary_cast, reason = "time_t is not i64 on every target")]
    let left = deadline as i64 * 1000 - monotonic_millis();
    left.clamp(0, 86_400_000) as libc::c_int
}

/// `CLOCK_MONOTONIC` now, in milliseconds.
fn monotonic_millis() -> i64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime into a local: async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    #[allow(clippy::unnecessary_cast, reason = "time_t and c_long are not i64 on every target")]
    let millis = now.tv_sec as i64 * 1000 + now.tv_nsec as i64 / 1_000_000;
    millis
}

/// One reply byte.
///
/// # Safety
/// In K, on a connected socket.
unsafe fn reply(conn: RawFd, byte: u8) {
    // SAFETY: send of one stack byte.
    unsafe { libc::send(conn, (&byte as *const u8).cast(), 1, libc::MSG_NOSIGNAL) };
}

/// The reply to an adoption: `s` with `fd` attached, or `n` without
/// (`fd` < 0).
///
/// # Safety
/// In K, on a connected socket.
unsafe fn send_with_fd(conn: RawFd, fd: RawFd) {
    // SAFETY: sendmsg with a stack message and a stack control buffer sized by CMSG_SPACE.
    unsafe {
        if fd < 0 {
            reply(conn, b'n');
            return;
        }
        let mut byte = b's';
        let mut iov = libc::iovec { iov_base: (&mut byte as *mut u8).cast(), iov_len: 1 };
        // u64s: aligned for `cmsghdr`.
        let mut control = [0u64; 4];
        let space = libc::CMSG_SPACE(size_of::<RawFd>() as u32) as usize;
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        std::ptr::copy_nonoverlapping((&fd as *const RawFd).cast::<u8>(), libc::CMSG_DATA(cmsg), size_of::<RawFd>());
        libc::sendmsg(conn, &msg, libc::MSG_NOSIGNAL);
    }
}
