//! The warm keeper: a keeper K started ahead of need (`/proc/self/exe`
//! [`ZYGOTE_ARG`], by a refill thread), so a tree's start does not wait for
//! the `exec` of this large binary; it receives its plan over a socket.
//!
//! Invariants:
//! - At most one warm zygote per host process, single-use: it *becomes* the
//!   tree's K, so it is never shared between trees or owners; the next one is
//!   spawned after the hand-off (a start that finds it still spawning waits at
//!   most as long as its own spawn would take; one that finds none uses the
//!   exec'd keeper, [`super`]).
//! - A waiting zygote holds nothing of any owner: an **empty environment**
//!   and descriptors 0–2 `/dev/null`, 3 the lifeline, 4 its end of a
//!   `SOCK_SEQPACKET` pair only the host holds the other end of. It dies on
//!   the lifeline's hang-up or the socket's end of file.
//! - A start is one message (the exec'd K's arguments, [`super::plan_args`],
//!   the command's environment, and its pipes and Landlock ruleset as
//!   `SCM_RIGHTS`): whole or not at all. Z acknowledges on receipt; the start
//!   waits for it only with [`set_await_ack`] (at most [`ACK_TIMEOUT`], then
//!   the zygote's group is killed and the start falls back).
//! - A durable tree's plan (`plan.durable`) is a start like any other: its
//!   nine extra descriptors (the duties', the secret's pipe and the pipe K
//!   says it listens on, [`super::DurableHandover`]) follow in the same
//!   message; Z moves every received descriptor clear of their numbers,
//!   installs them, listens on the tree's socket itself (so the socket's peer
//!   is K) and keeps no lifeline: it outlives the host.
//! - Z runs the same [`crate::confine::ChildPlan::in_child`] as every K, whose
//!   first step closes every descriptor but the lifeline, `/dev/null` and the
//!   ruleset: the socket never reaches the command. Failures after the
//!   hand-off end the tree with 126/127 and a `taskhost: …` line on stderr.
//! - Degrading: if this binary cannot be run again, the exec'd keeper is
//!   disabled too ([`super::disable_exec_keeper`]); three failed hand-offs (or
//!   three zygotes that never got ready) in a row disable the warm keeper for
//!   the process, with one log line; a single failure costs that start one
//!   exec'd keeper, never the start.

use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::confine::{self, ChildPlan, Forked};

/// The first argument that makes a binary that called
/// [`super::run_if_keeper`] a warm keeper.
pub const ZYGOTE_ARG: &str = "--taskhost-process-zygote";

/// Z's descriptors (see the module doc).
const LIFELINE_FD: RawFd = 3;
const SOCKET_FD: RawFd = 4;

/// The largest plan (arguments and environment) sent through a zygote; a
/// larger one uses the exec'd keeper (whose limit is the kernel's `ARG_MAX`).
pub const MAX_PLAN_BYTES: usize = 64 * 1024;

/// How long a start waits for a zygote's acknowledgement (with
/// [`set_await_ack`]) or the refill thread for a new zygote to get ready.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a start waits for a replacement that is being spawned.
const REFILL_WAIT: Duration = Duration::from_millis(100);

const MAGIC: &[u8; 4] = b"TKZ1";
const ACK: u8 = b'k';
/// Sent once by a zygote that is prepared and waits for its plan.
const READY_BYTE: u8 = b'r';
/// Failed hand-offs in a row that disable the warm keeper.
const MAX_FAILURES: u32 = 3;

/// A waiting zygote: its pid and the host's end of its socket.
struct Warm {
    pid: libc::pid_t,
    socket: OwnedFd,
}

#[derive(Default)]
struct Pool {
    warm: Option<Warm>,
    /// The refill thread is (or is about to be) spawning one.
    refilling: bool,
    /// Zygotes to kill and reap (failed hand-offs).
    discarded: Vec<libc::pid_t>,
    failures: u32,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { warm: None, refilling: false, discarded: Vec::new(), failures: 0 });
/// Signals the refill thread (work) and waiting starts (a zygote is ready).
static CHANGED: Condvar = Condvar::new();
static ENABLED: AtomicBool = AtomicBool::new(true);
static AWAIT_ACK: AtomicBool = AtomicBool::new(false);
static WARM_STARTS: AtomicU64 = AtomicU64::new(0);
static SPAWNED: AtomicU64 = AtomicU64::new(0);

fn pool() -> MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether starts may use a warm keeper: this binary opted in
/// ([`super::run_if_keeper`]) and nothing disabled it.
pub fn available() -> bool {
    super::exec_keeper_available() && ENABLED.load(Ordering::Relaxed)
}

/// Turns the warm keeper on or off for this process (on by default; a
/// benchmark's "before", or an embedder that prefers the on-demand keeper).
/// Off, starts use the exec'd keeper; on again, the next start refills.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
    CHANGED.notify_all();
}

/// Whether a start waits for the zygote's acknowledgement, or returns once
/// the plan is queued on the zygote's socket (the default: the wait cost
/// 1.2 ms at the median on a loaded 2-core machine, where the zygote must
/// first be scheduled; docs/benchmarks-log.md, run I). Without the wait, a zygote
/// killed between getting ready and reading its plan ends that tree as
/// killed by the signal (as an exec'd keeper killed right after its `exec`
/// does) instead of falling back to the exec'd keeper; a zygote that died
/// before the send is detected either way (the send fails) and falls back.
pub fn set_await_ack(on: bool) {
    AWAIT_ACK.store(on, Ordering::Relaxed);
}

/// How many trees this process started through a warm keeper.
pub fn warm_starts() -> u64 {
    WARM_STARTS.load(Ordering::Relaxed)
}

/// How many warm keepers this process spawned.
pub fn spawned() -> u64 {
    SPAWNED.load(Ordering::Relaxed)
}

/// The pid of the waiting zygote, if one is ready.
pub fn ready_pid() -> Option<u32> {
    pool().warm.as_ref().map(|w| w.pid as u32)
}

/// Waits up to `timeout` for a ready zygote (asking for one when none is
/// being spawned) and returns its pid; `None` when the warm keeper is not
/// available, the spawn failed, or none came in time.
pub fn wait_ready(timeout: Duration) -> Option<u32> {
    if !available() {
        return None;
    }
    let mut pool = pool();
    request_refill(&mut pool);
    let (pool, _) = CHANGED
        .wait_timeout_while(pool, timeout, |p| p.warm.is_none() && p.refilling && available())
        .unwrap_or_else(|e| e.into_inner());
    pool.warm.as_ref().map(|w| w.pid as u32)
}

/// Starts spawning the first zygote in the background (a no-op when the
/// warm keeper is not available or one is there).
pub(crate) fn start_ahead() {
    if available() {
        request_refill(&mut pool());
    }
}

fn request_refill(pool: &mut Pool) {
    if pool.warm.is_some() || pool.refilling || !available() {
        return;
    }
    pool.refilling = true;
    refill_thread();
    CHANGED.notify_all();
}

/// The background thread that spawns replacements and reaps discarded
/// zygotes, started once.
fn refill_thread() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new().name("taskhost-warm-keeper".into()).spawn(|| {
            loop {
                let mut guard = pool();
                guard = CHANGED
                    .wait_while(guard, |p| !(p.refilling && p.warm.is_none()) && p.discarded.is_empty())
                    .unwrap_or_else(|e| e.into_inner());
                let discarded = std::mem::take(&mut guard.discarded);
                let refill = guard.refilling && guard.warm.is_none() && available();
                drop(guard);
                discarded.into_iter().for_each(reap);
                let spawned = if refill { Some(spawn_zygote()) } else { None };
                let mut guard = pool();
                match spawned {
                    Some(Ok(warm)) => {
                        SPAWNED.fetch_add(1, Ordering::Relaxed);
                        guard.warm = Some(warm);
                    }
                    Some(Err(error)) if super::cannot_exec(&error) => {
                        disable(&error);
                        super::disable_exec_keeper(&error);
                    }
                    Some(Err(error)) => {
                        // Transient (EAGAIN, ENOMEM), or a zygote that never
                        // got ready: the next start asks again, up to
                        // MAX_FAILURES in a row.
                        guard.failures += 1;
                        if guard.failures >= MAX_FAILURES {
                            disable(&error);
                        } else {
                            tracing::debug!(%error, "cannot start a warm process keeper now");
                        }
                    }
                    None => {}
                }
                guard.refilling = false;
                drop(guard);
                CHANGED.notify_all();
            }
        });
        if let Err(error) = spawned {
            disable(&error);
        }
    });
}

/// Turns the warm keeper off for the rest of this process's life.
fn disable(error: &io::Error) {
    if ENABLED.swap(false, Ordering::Relaxed) {
        tracing::warn!(
            %error,
            "the warm process keeper cannot run here; starting each tree's keeper on demand instead (slower starts)"
        );
    }
    CHANGED.notify_all();
}

/// Spawns a zygote (on the refill thread).
fn spawn_zygote() -> io::Result<Warm> {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two fresh descriptors we then own.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh and owned here.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let devnull = confine::devnull()?;
    let argv = [c"taskhost-zygote".to_owned(), CString::new(ZYGOTE_ARG).expect("no NUL")];
    // No environment at all: a waiting zygote holds no secret.
    let envp = [std::ptr::null()];
    let dups = [
        (devnull, 0),
        (devnull, 1),
        (devnull, 2),
        (confine::lifeline()?, LIFELINE_FD),
        (theirs.as_raw_fd(), SOCKET_FD),
    ];
    let pid = super::spawn_self(&argv, &envp, &dups)?;
    drop(theirs);
    let warm = Warm { pid, socket: ours };
    // Published only once prepared: "ready" means waiting in `poll`.
    if let Err(error) = await_byte(&warm.socket, READY_BYTE, "get ready") {
        reap(warm.pid);
        return Err(error);
    }
    Ok(warm)
}

/// Kills a zygote (its group, should it have started a tree) and reaps it.
fn reap(pid: libc::pid_t) {
    // SAFETY: our own unreaped child and its group.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
        while libc::waitpid(pid, std::ptr::null_mut(), 0) < 0 && *libc::__errno_location() == libc::EINTR {}
    }
}

/// Takes the waiting zygote, waiting briefly for one being spawned. The
/// caller asks for the replacement ([`refill`]) once its hand-off is over,
/// so the replacement's spawn does not compete with it for a core.
fn take() -> Option<Warm> {
    let mut pool = pool();
    if pool.warm.is_none() && pool.refilling {
        pool = CHANGED
            .wait_timeout_while(pool, REFILL_WAIT, |p| p.warm.is_none() && p.refilling && available())
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    pool.warm.take()
}

/// Asks for the next zygote.
fn refill() {
    request_refill(&mut pool());
}

/// Starts the tree of `plan` through a warm zygote. `Ok(None)`: no zygote
/// could take it (none available, the plan too large, a failed hand-off):
/// the caller starts the tree another way.
pub(crate) fn start(plan: &ChildPlan, stdin: Option<RawFd>) -> io::Result<Option<Forked>> {
    if !available() {
        return Ok(None);
    }
    // The ruleset's number is Z's to fill in (-2 until then). A durable K
    // keeps no lifeline: it outlives the host.
    let lifeline = if plan.durable.is_some() { -1 } else { LIFELINE_FD };
    let args = super::plan_args(plan, lifeline, if plan.landlock.is_some() { -2 } else { -1 });
    let Some(message) = encode(&args, &plan.exec.envp) else { return Ok(None) };
    let (stdout, stdout_w) = confine::pipe()?;
    let (stderr, stderr_w) = confine::pipe()?;
    let handover = plan.durable.as_ref().map(super::DurableHandover::new).transpose()?;
    let Some(warm) = take() else {
        refill();
        return Ok(None);
    };
    // A durable tree writes into the pipes K copies into its logs.
    let (tree_out, tree_err) = plan.tree_output(&stdout_w, &stderr_w);
    let mut fds = vec![stdin.unwrap_or(plan.devnull), tree_out, tree_err];
    fds.extend(plan.landlock.as_ref().map(|fd| fd.as_raw_fd()));
    if let Some(handover) = &handover {
        fds.extend(handover.sent_fds(plan.devnull));
    }
    match hand_off(&warm.socket, &message, &fds, AWAIT_ACK.load(Ordering::Relaxed)) {
        Ok(()) => {
            let mut pool = pool();
            pool.failures = 0;
            request_refill(&mut pool);
            drop(pool);
            WARM_STARTS.fetch_add(1, Ordering::Relaxed);
            // Our copies of the write ends close here: only the tree holds them.
            drop((stdout_w, stderr_w));
            Ok(Some(Forked { pid: warm.pid, stdout, stderr, listening: handover.map(|h| h.into_listening()) }))
        }
        Err(error) => {
            let mut pool = pool();
            pool.discarded.push(warm.pid);
            pool.failures += 1;
            let failures = pool.failures;
            request_refill(&mut pool);
            drop(pool);
            CHANGED.notify_all();
            if failures >= MAX_FAILURES {
                disable(&error);
            } else {
                tracing::warn!(%error, "a warm process keeper failed its hand-off; starting this tree's keeper on demand");
            }
            Ok(None)
        }
    }
}

/// The message: `MAGIC`, the number of arguments and of environment
/// entries (u32, native order), then each entry NUL-terminated. `None` when
/// larger than [`MAX_PLAN_BYTES`].
fn encode(args: &[CString], env: &[CString]) -> Option<Vec<u8>> {
    let size = 12 + args.iter().chain(env).map(|e| e.as_bytes_with_nul().len()).sum::<usize>();
    if size > MAX_PLAN_BYTES {
        return None;
    }
    let mut message = Vec::with_capacity(size);
    message.extend_from_slice(MAGIC);
    message.extend_from_slice(&(args.len() as u32).to_ne_bytes());
    message.extend_from_slice(&(env.len() as u32).to_ne_bytes());
    for entry in args.iter().chain(env) {
        message.extend_from_slice(entry.as_bytes_with_nul());
    }
    Some(message)
}

fn decode(message: &[u8]) -> Option<(Vec<OsString>, BTreeMap<OsString, OsString>)> {
    let count = |at: usize| Some(u32::from_ne_bytes(message.get(at..at + 4)?.try_into().ok()?) as usize);
    if message.get(..4)? != MAGIC {
        return None;
    }
    let (n_args, n_env) = (count(4)?, count(8)?);
    let body = message.get(12..)?.strip_suffix(b"\0")?;
    let mut entries = body.split(|b| *b == 0);
    let args: Vec<OsString> = entries.by_ref().take(n_args).map(|a| OsString::from_vec(a.to_vec())).collect();
    let mut env = BTreeMap::new();
    for entry in entries.by_ref().take(n_env) {
        let eq = entry.iter().position(|b| *b == b'=')?;
        env.insert(OsString::from_vec(entry[..eq].to_vec()), OsString::from_vec(entry[eq + 1..].to_vec()));
    }
    (args.len() == n_args && env.len() == n_env && entries.next().is_none()).then_some((args, env))
}

/// Sends the message with `fds`, then (with `await_ack`) waits for the
/// acknowledgement. The message stays readable by the zygote after our end
/// closes.
fn hand_off(socket: &OwnedFd, message: &[u8], fds: &[RawFd], await_ack: bool) -> io::Result<()> {
    send_with_fds(socket.as_raw_fd(), message, fds)?;
    if await_ack { await_byte(socket, ACK, "acknowledge its plan") } else { Ok(()) }
}

/// Waits up to [`ACK_TIMEOUT`] for the zygote to send `want`.
fn await_byte(socket: &OwnedFd, want: u8, what: &str) -> io::Result<()> {
    let mut poll = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let deadline = std::time::Instant::now() + ACK_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // SAFETY: poll on one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if ready == 0 {
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("the warm keeper did not {what} in time")));
        }
        let mut byte = 0u8;
        // SAFETY: reads one byte into a local.
        let n = unsafe { libc::recv(socket.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_DONTWAIT) };
        return match n {
            1 if byte == want => Ok(()),
            n if n < 0 => Err(io::Error::last_os_error()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the warm keeper exited before it could {what}"),
            )),
        };
    }
}

fn send_with_fds(socket: RawFd, message: &[u8], fds: &[RawFd]) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    // SAFETY: every descriptor is open for the length of this call (the caller owns them).
    let fds: Vec<BorrowedFd<'_>> = fds.iter().map(|&fd| unsafe { BorrowedFd::borrow_raw(fd) }).collect();
    let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("the descriptors do not fit the control buffer"));
    }
    // SAFETY: the host's end of the socket pair, open for the life of `Warm`.
    let socket = unsafe { BorrowedFd::borrow_raw(socket) };
    loop {
        match sendmsg(socket, &[io::IoSlice::new(message)], &mut control, SendFlags::NOSIGNAL) {
            Ok(n) if n == message.len() => return Ok(()),
            Ok(_) => return Err(io::Error::other("the plan was cut short")),
            Err(rustix::io::Errno::INTR) => continue,
            Err(errno) => return Err(errno.into()),
        }
    }
}

/// Z: prepares, waits for its plan, acknowledges it and becomes the tree's
/// K. Never returns.
pub(crate) fn zygote_main() -> ! {
    // Only the five descriptors it was given: whatever the host itself
    // inherited without close-on-exec is not ours to hold.
    // SAFETY: closes descriptor numbers only, in a fresh single-threaded process.
    unsafe { libc::syscall(libc::SYS_close_range, SOCKET_FD as u32 + 1, u32::MAX, 0) };
    // What every K needs, computed before the plan arrives. Not /dev/null:
    // opened now it would take descriptor 5, where a durable K's duties go.
    let _ = confine::seccomp_programs();
    let _ = crate::landlock::handled_bits();
    let mut buffer = vec![0u8; MAX_PLAN_BYTES + 1];
    // SAFETY: one byte to our socket; the host's refill thread waits for it.
    unsafe { libc::send(SOCKET_FD, [READY_BYTE].as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    let (length, fds) = match wait_for_plan(&mut buffer) {
        Some(received) => received,
        // The host is gone (or sent nothing usable): so are we.
        None => std::process::exit(0),
    };
    // Clear of every number a durable K's duties are installed at.
    let fds = match super::above_all_targets(&fds) {
        Ok(fds) => fds,
        Err(_) => std::process::exit(126),
    };
    // SAFETY: one byte to our socket; the host waits for it.
    unsafe { libc::send(SOCKET_FD, [ACK].as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    let [stdin, stdout, stderr] = [fds[0], fds[1], fds[2]];
    // SAFETY: dup2 onto our own stdio (sources are received descriptors, above 4).
    unsafe {
        libc::dup2(stdin, 0);
        libc::dup2(stdout, 1);
        libc::dup2(stderr, 2);
    }
    let plan = decode(&buffer[..length])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "the warm keeper's plan is malformed"))
        .and_then(|(mut args, env)| {
            // The ruleset is wherever it landed here: a plan that has one
            // (-2) and no descriptor for it is refused, never run without.
            let duties_from = match (args.get_mut(3), fds.get(3)) {
                (Some(slot), Some(landlock)) if slot == "-2" => {
                    *slot = OsString::from(landlock.to_string());
                    4
                }
                (Some(slot), _) if slot == "-1" => 3,
                _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "the warm keeper's ruleset is missing")),
            };
            let (mut plan, durable) = super::plan_from_args(&args, env)?;
            match (durable, fds.get(duties_from..)) {
                (None, Some([])) => {}
                // A durable tree's K: its duties' descriptors follow.
                (Some(durable), Some(duties)) if duties.len() == 9 => {
                    super::install_received(duties)?;
                    plan.durable = Some(super::take_up_durable(durable)?);
                }
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "the warm keeper's descriptors do not match its plan",
                    ));
                }
            }
            Ok(plan)
        });
    match plan {
        // The host is gone and the tree would die with it: never started.
        Ok(plan) if plan.durable.is_none() && host_gone() => std::process::exit(0),
        // SAFETY: a single-threaded process whose stdio is the tree's and
        // that leads a session of its own; `in_child` only execs or exits,
        // and closes every descriptor but the lifeline, /dev/null and the ruleset.
        Ok(plan) => unsafe { plan.in_child(0, 1, 2) },
        Err(error) => {
            eprintln!("taskhost: the process keeper cannot start: {error}");
            std::process::exit(126)
        }
    }
}

/// Whether the host hung up its end of the lifeline.
fn host_gone() -> bool {
    let mut lifeline = libc::pollfd { fd: LIFELINE_FD, events: libc::POLLIN, revents: 0 };
    // SAFETY: poll on one valid pollfd, without waiting.
    let ready = unsafe { libc::poll(&mut lifeline, 1, 0) };
    ready != 0
}

/// Waits for the plan on [`SOCKET_FD`] while watching the lifeline; returns
/// the message's length and the descriptors (3 or 4; close-on-exec, and
/// never closed here: the tree's first step closes them), or `None` when
/// the host is gone or the message is unusable.
fn wait_for_plan(buffer: &mut [u8]) -> Option<(usize, Vec<RawFd>)> {
    loop {
        let mut fds = [
            libc::pollfd { fd: SOCKET_FD, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: LIFELINE_FD, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: poll on two valid pollfds.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return None;
        }
        // A plan sent before the host went away is still read: a durable
        // tree's start was answered, and its K outlives the host. (A plain
        // one is dropped once read: see `zygote_main`.)
        if fds[0].revents != 0 {
            break;
        }
        if fds[1].revents != 0 {
            return None;
        }
    }
    // stdin, stdout, stderr, the ruleset, a durable K's nine.
    const MAX_FDS: usize = 13;
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, recvmsg};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    // SAFETY: the socket this zygote was started with, open for its life.
    let socket = unsafe { BorrowedFd::borrow_raw(SOCKET_FD) };
    let received = loop {
        match recvmsg(socket, &mut [io::IoSliceMut::new(buffer)], &mut control, RecvFlags::CMSG_CLOEXEC) {
            Err(rustix::io::Errno::INTR) => continue,
            other => break other,
        }
    };
    // Kept open as plain numbers: the tree's first step closes them.
    let fds: Vec<RawFd> = control
        .drain()
        .filter_map(|message| match message {
            RecvAncillaryMessage::ScmRights(fds) => Some(fds),
            _ => None,
        })
        .flatten()
        .map(std::os::fd::IntoRawFd::into_raw_fd)
        .collect();
    let received = received.ok()?;
    let truncated = received.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC);
    if received.bytes == 0 || truncated || !(3..=MAX_FDS).contains(&fds.len()) {
        return None;
    }
    Some((received.bytes, fds))
}

#[cfg(test)]
mod tests;
