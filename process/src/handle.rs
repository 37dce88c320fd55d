//! A live process tree and the tasks that supervise it.
//!
//! Model: a [`Process`] is the owner's handle; a supervisor task waits for the
//! tree's exit (through a pidfd) and enforces kill deadlines and the timeout,
//! and one reader task per stream moves output into its [`StreamBuffer`].
//! They share [`Shared`]; readiness is one `Notify` woken on every change.
//!
//! Invariants:
//! - The group is signalled only while its leader is not reaped (checked
//!   under the `life` lock the reaper holds), so a recycled pid is never hit.
//! - When the leader exits, whatever is left in its group is SIGKILLed before
//!   it is reaped (while the zombie still pins the group id).
//! - [`Process::exit_status`] is `Some` only once the leader was reaped AND
//!   both streams reached their end, so one read after it drains everything.
//! - Dropping a [`Process`] SIGKILLs its group if it is still alive: the
//!   owner's store going away is enough to end the tree.
//! - Output never blocks the process, but it is paced: a reader task that
//!   finds its buffer three quarters full while a consumer has read within
//!   the last 100 ms waits up to 5 ms for that read before reading more, so
//!   an active reader loses nothing to a fast producer; a stream nobody
//!   reads is never slowed.
//! - A forwarded process ([`Process::forward_output`]) keeps nothing for
//!   reads: its readers format each chunk into the task's
//!   [`OutputSink`] under the stream's buffer lock (so what was unread
//!   when forwarding began goes first), write no spill file (the host's
//!   log has its own), and wait while the sink is full (see
//!   [`crate::forward`]).

mod exit_status;
mod reader;

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::confine::Applied;
use super::forward::{Forwarding, OutputSink};
use super::limits::TreeCgroup;
use super::output::{SpillFile, SpillWriter, StreamBuffer, StreamChunk};
use super::stdin::{StdinError, StdinPipe};
pub use exit_status::{ExitStatus, signal_name};
use reader::{backfill, read_stream};

/// How long output may stay open after the leader exited before the readers
/// give up (a process that left the group holds the pipe; only possible
/// without PID namespaces).
const OUTPUT_LINGER: Duration = Duration::from_millis(250);

/// How long forwarded output that the host's log has no room for yet may
/// wait after the leader exited: the host takes it within milliseconds
/// normally, seconds on a saturated host (250 ms lost output there); only
/// a sink nobody takes from any more waits this long.
const FORWARD_LINGER: Duration = Duration::from_secs(30);

/// A stream read within this window counts as actively read (see `PACE_WAIT`).
const READER_ACTIVE: Duration = Duration::from_millis(100);
/// How long a reader task waits for an active consumer to drain a stream
/// that is more than three quarters full before reading more (reads are a
/// quarter of the cap, so the reader stays up to three reads ahead).
const PACE_WAIT: Duration = Duration::from_millis(5);
/// The largest single read from a pipe (its default capacity).
const MAX_READ: usize = 64 * 1024;

/// Which output stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stream {
    #[default]
    Stdout,
    Stderr,
}

#[derive(Debug, Default)]
struct Life {
    reaped: bool,
    status: Option<ExitStatus>,
    kill_requested: bool,
    timed_out: bool,
}

pub(crate) struct Shared {
    id: u64,
    /// The leader's pid, also the process group id.
    pid: i32,
    grace: Duration,
    applied: Applied,
    stdout: Mutex<StreamBuffer>,
    stderr: Mutex<StreamBuffer>,
    life: Mutex<Life>,
    notify: Notify,
    /// Woken on every consuming read (the reader tasks' pacing).
    drained: Notify,
    /// When set, the supervisor SIGKILLs the group at this instant.
    kill_deadline: watch::Sender<Option<Instant>>,
    exited: watch::Sender<bool>,
    /// The tree's cgroup(s), until the tree is reaped (then removed).
    cgroup: Mutex<Option<TreeCgroup>>,
    /// Set once the output is forwarded: where every later byte goes.
    forward: OnceLock<Forwarding>,
    /// Held by whoever reads a stream's pipe until what it read is
    /// recorded (stdout, stderr): its own reader, or the other stream's
    /// forwarding reader.
    reading: [Mutex<()>; 2],
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain data behind: keep going.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    fn buffer(&self, stream: Stream) -> &Mutex<StreamBuffer> {
        match stream {
            Stream::Stdout => &self.stdout,
            Stream::Stderr => &self.stderr,
        }
    }

    /// Signals the whole group, unless its leader was reaped already.
    fn signal_group(&self, signal: i32) -> bool {
        let life = lock(&self.life);
        if life.reaped {
            return false;
        }
        if signal == libc::SIGKILL
            && let Some(cgroup) = lock(&self.cgroup).as_ref()
        {
            // Also what left the group (without a PID namespace): the cgroup
            // holds every process of the tree.
            cgroup.kill();
        }
        // SAFETY: plain syscall; the group is pinned by the unreaped leader.
        unsafe { libc::kill(-self.pid, signal) == 0 }
    }

    /// SIGTERM now, SIGKILL after the grace. Idempotent: the first request
    /// sets the deadline, later ones change nothing.
    fn kill(&self) {
        {
            let mut life = lock(&self.life);
            if life.reaped || life.kill_requested {
                return;
            }
            life.kill_requested = true;
        }
        tracing::debug!(pid = self.pid, "SIGTERM to the process group");
        self.signal_group(libc::SIGTERM);
        self.kill_deadline.send_replace(Some(Instant::now() + self.grace));
    }

    fn finished(&self) -> Option<ExitStatus> {
        let status = lock(&self.life).status?;
        (lock(&self.stdout).is_eof() && lock(&self.stderr).is_eof()).then_some(status)
    }

    /// Appends output to a stream: into its buffer, or when forwarded to
    /// the task's sink (under the buffer's lock either way, so the order
    /// holds across the switch).
    fn append(&self, stream: Stream, data: &[u8]) -> MutexGuard<'_, StreamBuffer> {
        let mut buffer = lock(self.buffer(stream));
        match self.forward.get() {
            Some(forwarding) => {
                buffer.count(data.len());
                forwarding.push(stream == Stream::Stderr, data, false);
            }
            None => buffer.push(data),
        }
        buffer
    }

    /// A stream reached its end (a split character left over is flushed).
    fn end_stream(&self, stream: Stream) {
        let mut buffer = lock(self.buffer(stream));
        if let Some(forwarding) = self.forward.get() {
            forwarding.push(stream == Stream::Stderr, &[], true);
        }
        buffer.set_eof();
    }

    fn has_news(&self) -> bool {
        lock(&self.stdout).has_unread() || lock(&self.stderr).has_unread() || self.finished().is_some()
    }
}

/// Every live process tree of this host process, for [`kill_all`].
fn live() -> &'static Mutex<BTreeMap<u64, Weak<Shared>>> {
    static LIVE: OnceLock<Mutex<BTreeMap<u64, Weak<Shared>>>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
}

/// SIGKILLs every live task process tree of this host process. For a host's
/// shutdown path (SIGINT/SIGTERM handlers): with PID namespaces, killing a
/// keeper takes its whole tree down. Returns how many groups were signalled.
pub fn kill_all() -> usize {
    let all: Vec<_> = lock(live()).values().filter_map(Weak::upgrade).collect();
    all.iter().filter(|shared| shared.signal_group(libc::SIGKILL)).count()
}

/// Number of process trees of this host process not yet reaped.
pub fn live_count() -> usize {
    lock(live()).values().filter(|w| w.strong_count() > 0).count()
}

/// A running (or finished) process tree. Dropping it kills the tree.
pub struct Process {
    shared: Arc<Shared>,
    stdin: Option<Arc<StdinPipe>>,
    span: tracing::Span,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process").field("id", &self.shared.id).field("pid", &self.shared.pid).finish()
    }
}

/// What [`Process::start`] needs from the spawn.
pub(crate) struct Started {
    pub id: u64,
    pub pid: libc::pid_t,
    pub pidfd: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The write end of the tree's stdin pipe, if it asked for one.
    pub stdin: Option<OwnedFd>,
    pub memory_cap: usize,
    pub spill_cap: u64,
    pub spill_owner: Arc<super::output::OwnerSpill>,
    pub grace: Duration,
    pub timeout: Option<Duration>,
    pub applied: Applied,
    pub cgroup: Option<TreeCgroup>,
    pub span: tracing::Span,
}

impl Process {
    /// Wires the supervisor and readers of a freshly spawned tree. Needs a
    /// tokio runtime.
    pub(crate) fn start(s: Started) -> std::io::Result<Self> {
        let pid = s.pid;
        // SAFETY: an OwnedFd stays open for as long as the AsyncFd owns it.
        let pidfd = unsafe { AsyncFd::register(s.pidfd) }.map_err(std::io::Error::from)?;
        let stdout = pipe::Receiver::from_owned_fd(s.stdout)?;
        let stderr = pipe::Receiver::from_owned_fd(s.stderr)?;
        let (kill_deadline, kill_rx) = watch::channel(None);
        let (exited, exited_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            id: s.id,
            pid,
            grace: s.grace,
            applied: s.applied,
            stdout: Mutex::new(StreamBuffer::new(s.memory_cap)),
            stderr: Mutex::new(StreamBuffer::new(s.memory_cap)),
            life: Mutex::new(Life::default()),
            notify: Notify::new(),
            drained: Notify::new(),
            kill_deadline,
            exited,
            cgroup: Mutex::new(s.cgroup),
            forward: OnceLock::new(),
            reading: [Mutex::new(()), Mutex::new(())],
        });
        lock(live()).insert(s.id, Arc::downgrade(&shared));
        let names = [format!("process-{}-stdout", s.id), format!("process-{}-stderr", s.id)];
        let [stdout_path, stderr_path] = names;
        // Reads smaller than the cap leave room for several in memory, so a
        // reader that keeps up loses nothing to one oversized read.
        let chunk = (s.memory_cap / 4).clamp(1, MAX_READ);
        // Each reader holds both pipes: a forwarding reader reads both, in
        // order (see `forward_step`).
        let pipes = [Arc::new(stdout), Arc::new(stderr)];
        for (stream, path) in [(Stream::Stdout, stdout_path), (Stream::Stderr, stderr_path)] {
            let spill = SpillWriter::new(s.spill_owner.clone(), path, s.memory_cap, s.spill_cap);
            let fut = read_stream(shared.clone(), stream, pipes.clone(), spill, chunk, exited_rx.clone());
            tokio::spawn(tracing::Instrument::instrument(fut, s.span.clone()));
        }
        let deadline = s.timeout.map(|t| Instant::now() + t);
        let fut = supervise(shared.clone(), pidfd, deadline, kill_rx);
        tokio::spawn(tracing::Instrument::instrument(fut, s.span.clone()));
        let stdin = s.stdin.map(|fd| StdinPipe::start(fd, s.span.clone())).transpose()?;
        Ok(Self { shared, stdin, span: s.span })
    }

    /// The leader's pid in the host's PID namespace (also the group id).
    pub fn pid(&self) -> u32 {
        self.shared.pid as u32
    }

    /// The confinement this tree runs under.
    pub fn confinement(&self) -> Applied {
        self.shared.applied
    }

    /// Takes everything unread from one stream (consuming, never blocks).
    pub fn read(&self, stream: Stream) -> StreamChunk {
        let chunk = lock(self.shared.buffer(stream)).take();
        self.shared.drained.notify_waiters();
        chunk
    }

    /// Hands both streams to `sink` from now on: what is unread goes
    /// first, then every byte as it is read, formatted (see
    /// [`crate::forward`]); reads return nothing new, [`ready`](Self::ready)
    /// waits for the end only, and the memory and spill caps no longer
    /// apply (the sink is bounded, the host's log spills). Once per process.
    pub fn forward_output(&self, sink: Arc<OutputSink>) -> Result<(), &'static str> {
        let mut stdout = lock(&self.shared.stdout);
        let mut stderr = lock(&self.shared.stderr);
        if self.shared.forward.set(Forwarding::new(sink)).is_err() {
            return Err("its output is already forwarded");
        }
        let forwarding = self.shared.forward.get().expect("set just above");
        for (stream, buffer) in [(Stream::Stdout, &mut *stdout), (Stream::Stderr, &mut *stderr)] {
            let dropped = buffer.dropped_range().zip(buffer.spill());
            let unread = buffer.take();
            if unread.dropped {
                // Output that outran the memory cap before forwarding began
                // (a fast command on a loaded host) is in the spill file:
                // it is forwarded from there, so the task's log holds the
                // whole output. Only a gap beyond the bound (or past the
                // spill cap) is left as a pointer to the file.
                let backfill = dropped.and_then(|(range, spill)| backfill(&spill, range));
                match (backfill, &unread.spill_path) {
                    (Some(bytes), _) => forwarding.push(stream == Stream::Stderr, &bytes, false),
                    (None, Some(path)) => forwarding
                        .sink
                        .append(&format!("[some output was dropped from memory; full output: {}]\n", path.display())),
                    (None, None) => forwarding.sink.append("[some output was dropped from memory]\n"),
                }
            }
            forwarding.push(stream == Stream::Stderr, &unread.data, unread.closed);
        }
        drop((stdout, stderr));
        self.shared.drained.notify_waiters();
        Ok(())
    }

    /// Bytes a stream has produced so far.
    pub fn total(&self, stream: Stream) -> u64 {
        lock(self.shared.buffer(stream)).total()
    }

    /// `Some` once the tree is gone and its output ended; read once more after.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.shared.finished()
    }

    /// True when the spawn's timeout expired and the tree was killed for it.
    pub fn timed_out(&self) -> bool {
        lock(&self.shared.life).timed_out
    }

    /// True once [`kill`](Self::kill) was called or the timeout expired.
    pub fn kill_requested(&self) -> bool {
        lock(&self.shared.life).kill_requested
    }

    /// SIGTERM to the whole group now, SIGKILL after the grace. Idempotent;
    /// does nothing once the tree is gone.
    pub fn kill(&self) {
        let _enter = self.span.enter();
        self.shared.kill();
    }

    /// Completes when a read would return something or the tree finished.
    pub async fn ready(&self) {
        wait_until(&self.shared, Shared::has_news).await
    }

    /// Completes when [`exit_status`](Self::exit_status) is `Some`.
    pub async fn finished(&self) {
        wait_until(&self.shared, |s| s.finished().is_some()).await
    }

    /// The spill files created so far. Holding them keeps them on disk after
    /// the process is dropped (they are deleted when the last holder drops).
    pub fn spill_files(&self) -> Vec<Arc<SpillFile>> {
        spill_files(&self.shared)
    }

    /// Writes `data` to the tree's stdin pipe without blocking: what the
    /// pipe does not take at once waits in a bounded host-side queue (see
    /// [`crate::stdin`]). Refused whole, with the reason, when the process
    /// has no pipe, its stdin was closed, the program no longer reads it, or
    /// the queue would overflow.
    pub fn write_stdin(&self, data: &[u8]) -> Result<(), StdinError> {
        self.stdin.as_ref().ok_or(StdinError::NotPiped)?.write(data)
    }

    /// Closes the tree's stdin pipe once everything written was taken: the
    /// program then reads end-of-file. Refused when there is no pipe or it
    /// is already closed.
    pub fn close_stdin(&self) -> Result<(), StdinError> {
        self.stdin.as_ref().ok_or(StdinError::NotPiped)?.close()
    }

    /// Bytes written to stdin that the pipe has not taken yet.
    pub fn stdin_pending(&self) -> usize {
        self.stdin.as_ref().map_or(0, |stdin| stdin.pending())
    }

    /// A non-owning view of this process.
    pub fn watch(&self) -> ProcessWatch {
        ProcessWatch { shared: self.shared.clone() }
    }
}

/// A non-owning view of a process: waits for it and lists its spill files,
/// but neither keeps it alive nor kills it.
#[derive(Clone)]
pub struct ProcessWatch {
    shared: Arc<Shared>,
}

impl ProcessWatch {
    /// Completes when the process's exit status is known (see [`Process::exit_status`]).
    pub async fn finished(&self) {
        wait_until(&self.shared, |s| s.finished().is_some()).await
    }

    /// The spill files created so far.
    pub fn spill_files(&self) -> Vec<Arc<SpillFile>> {
        spill_files(&self.shared)
    }
}

fn spill_files(shared: &Shared) -> Vec<Arc<SpillFile>> {
    [Stream::Stdout, Stream::Stderr].into_iter().filter_map(|s| lock(shared.buffer(s)).spill()).collect()
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(stdin) = &self.stdin {
            stdin.shut();
        }
        if self.shared.signal_group(libc::SIGKILL) {
            let _enter = self.span.enter();
            tracing::debug!(pid = self.shared.pid, "process dropped while alive: SIGKILL to its group");
        }
    }
}

async fn wait_until(shared: &Shared, ready: impl Fn(&Shared) -> bool) {
    loop {
        let notified = shared.notify.notified();
        tokio::pin!(notified);
        // Registered before the check, so no wake-up is lost in between.
        notified.as_mut().enable();
        if ready(shared) {
            return;
        }
        notified.await;
    }
}

/// Waits for the leader's exit; enforces the timeout and the kill deadline.
async fn supervise(
    shared: Arc<Shared>,
    pidfd: AsyncFd<OwnedFd>,
    mut timeout: Option<Instant>,
    mut kill_rx: watch::Receiver<Option<Instant>>,
) {
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            guard = pidfd.readable() => {
                if let Ok(mut guard) = guard {
                    guard.clear_ready();
                }
                let mut life = lock(&shared.life);
                // The leader is a zombie now: it still pins the group id, so
                // this reaches exactly what it left behind in its group.
                // SAFETY: plain syscall on our own unreaped group.
                unsafe { libc::kill(-shared.pid, libc::SIGKILL) };
                let mut raw = 0;
                // SAFETY: reaps our own child, without blocking.
                match unsafe { libc::waitpid(shared.pid, &mut raw, libc::WNOHANG) } {
                    0 => continue,
                    pid if pid == shared.pid => {
                        let status = ExitStatus::from_wait(raw);
                        // Before the status is visible, so the one read after
                        // it carries the note.
                        report_limits(&shared);
                        life.reaped = true;
                        life.status = Some(status);
                        break status;
                    }
                    _ => {
                        let e = std::io::Error::last_os_error();
                        tracing::warn!(pid = shared.pid, error = %e, "cannot collect the exit status");
                        life.reaped = true;
                        life.status = Some(ExitStatus::Code(-1));
                        break ExitStatus::Code(-1);
                    }
                }
            }
            _ = sleep_until(timeout), if timeout.is_some() => {
                timeout = None;
                lock(&shared.life).timed_out = true;
                tracing::debug!(pid = shared.pid, "timeout expired");
                shared.kill();
            }
            changed = kill_rx.changed() => {
                if changed.is_ok() {
                    kill_at = *kill_rx.borrow_and_update();
                }
            }
            _ = sleep_until(kill_at), if kill_at.is_some() => {
                kill_at = None;
                if shared.signal_group(libc::SIGKILL) {
                    tracing::debug!(pid = shared.pid, "grace expired: SIGKILL to the process group");
                }
            }
        }
    };
    tracing::debug!(pid = shared.pid, %status, "process exited");
    lock(live()).remove(&shared.id);
    shared.exited.send_replace(true);
    shared.notify.notify_waiters();
}

/// Says on the tree's stderr which limit it ran into, then removes its
/// cgroup (killing whatever is still in it).
fn report_limits(shared: &Shared) {
    let Some(cgroup) = lock(&shared.cgroup).take() else { return };
    let notes = cgroup.limits_reached();
    drop(cgroup);
    if notes.is_empty() {
        return;
    }
    tracing::debug!(pid = shared.pid, ?notes, "the tree reached a limit");
    for note in notes {
        drop(shared.append(Stream::Stderr, format!("\n{note}\n").as_bytes()));
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
