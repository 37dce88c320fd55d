//! A durable tree as its task's output and outcome: the server's side of a
//! tree a plugin handed over ([`FollowedTree`]), spawned or re-adopted.
//!
//! Model: a follower task reads what K appended to `stdout.log` and
//! `stderr.log` since its last look (stdout first, and stderr only as far as
//! it was before that read, so stdout a program wrote before its stderr
//! comes first, as for a forwarded pipe), formats it as
//! forwarded output ([`crate::forward`]: `[stderr]`/`[stdout]` lines where
//! the stream changes, UTF-8 never split) into the task's [`OutputSink`],
//! and records how far it read each log ([`LogOffsets`]). It looks again at
//! once while a look found output, else when a log changes (one inotify
//! instance for the whole server, read by a thread of its own:
//! [`LogChanges`]), when K ends, or after [`LOOK_EVERY`] at the latest.
//! Once K ended it reads both logs to their end and only then publishes the
//! tree's end, so an end never overtakes output.
//!
//! Invariants:
//! - Every log byte past the starting offsets is forwarded once, in order;
//!   the offsets only grow.
//! - Bounded: one look reads at most [`LOOK_BYTES`] per stream, and the
//!   follower waits while the sink is full (K's logs hold at most the
//!   grant's spill cap of unread output, what was read for good being
//!   punched out by [`LogRelease`]: a slow reader costs disk, never memory).
//! - Dropping a [`FollowedTree`] stops the follower and leaves the tree
//!   running (the tree outlives its server); [`FollowedTree::kill`] ends it.
//!   Its directory is its owner's to remove once the end is recorded
//!   ([`remove_ended`]): the next server reads the end from it until then.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::durable::{DurableExit, DurableProcess};
use crate::forward::{Forwarding, OutputSink};
use crate::handle::Stream;

/// How long the follower waits at most between looks that found nothing
/// (when inotify is at its limits, the only wake-up besides K's end).
pub const LOOK_EVERY: Duration = Duration::from_millis(250);
/// What one look reads of one log at most.
pub const LOOK_BYTES: usize = 1 << 20;

/// How far the logs of a durable tree were forwarded, in bytes of each log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogOffsets {
    pub stdout: u64,
    pub stderr: u64,
}

/// Where a durable tree's forwarded output stands: the log bytes whose
/// text was appended (a character split at the end is not counted), and
/// the formatter's state there. The sink's mark ([`OutputSink::taken_mark`])
/// is one, as text ([`TreeCursor::to_mark`]): a later server resumes the output right after what was
/// taken, with no byte lost or repeated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct TreeCursor {
    pub stdout: u64,
    pub stderr: u64,
    pub in_stderr: bool,
    pub mid_line: bool,
}

impl TreeCursor {
    /// The mark's text: `cursor <stdout> <stderr> <in_stderr> <mid_line>`.
    pub fn to_mark(&self) -> String {
        format!("cursor {} {} {} {}", self.stdout, self.stderr, u8::from(self.in_stderr), u8::from(self.mid_line))
    }

    /// Reads a mark; `None` when it is not one.
    pub fn parse(mark: &str) -> Option<Self> {
        let mut words = mark.strip_prefix("cursor ")?.split(' ');
        let mut number = || words.next()?.parse::<u64>().ok();
        let (stdout, stderr, in_stderr, mid_line) = (number()?, number()?, number()?, number()?);
        Some(Self { stdout, stderr, in_stderr: in_stderr == 1, mid_line: mid_line == 1 })
    }
}

/// How a followed tree ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TreeEnd {
    /// K wrote its end.
    Exited(DurableExit),
    /// K is gone without an end (the reason).
    Lost(String),
}

/// A durable tree whose logs are followed into a task's output.
pub struct FollowedTree {
    process: Arc<DurableProcess>,
    end: watch::Receiver<Option<TreeEnd>>,
    offsets: Arc<[AtomicU64; 2]>,
    /// SIGTERM to SIGKILL on [`Self::kill`].
    grace: Duration,
    killing: AtomicBool,
    follower: tokio::task::AbortHandle,
}

impl std::fmt::Debug for FollowedTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowedTree").field("process", &self.process).field("offsets", &self.offsets()).finish()
    }
}

impl FollowedTree {
    /// Follows `process`'s logs from `from` into `sink` (which it marks as
    /// forwarded). Needs a tokio runtime.
    pub fn follow(process: DurableProcess, sink: Arc<OutputSink>, from: TreeCursor, grace: Duration) -> Self {
        let process = Arc::new(process);
        let offsets = Arc::new([AtomicU64::new(from.stdout), AtomicU64::new(from.stderr)]);
        let (tell, end) = watch::channel(None);
        let forwarding = Forwarding::new(sink);
        forwarding.resume(from.in_stderr, from.mid_line);
        let follower = tokio::spawn(follow(process.clone(), forwarding, offsets.clone(), tell)).abort_handle();
        Self { process, end, offsets, grace, killing: AtomicBool::new(false), follower }
    }

    /// The durable handle (its record, stdin).
    pub fn process(&self) -> &DurableProcess {
        &self.process
    }

    /// K's pid.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// How far the logs were forwarded.
    pub fn offsets(&self) -> LogOffsets {
        LogOffsets { stdout: self.offsets[0].load(Ordering::Acquire), stderr: self.offsets[1].load(Ordering::Acquire) }
    }

    /// The tree's end, once it ended and every byte of its logs was forwarded.
    pub fn end(&self) -> Option<TreeEnd> {
        self.end.borrow().clone()
    }

    /// A receiver of [`Self::end`].
    pub fn end_watch(&self) -> watch::Receiver<Option<TreeEnd>> {
        self.end.clone()
    }

    /// Waits for [`Self::end`].
    pub async fn ended(&self) {
        let mut end = self.end.clone();
        let _ = end.wait_for(Option::is_some).await;
    }

    /// SIGTERM to the tree now, SIGKILL after the grace unless it ended.
    /// Idempotent; does nothing once the tree ended.
    pub fn kill(&self) {
        if self.end().is_some() || self.killing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (process, grace, mut end) = (self.process.clone(), self.grace, self.end.clone());
        tokio::spawn(async move {
            let terminated = tokio::task::spawn_blocking({
                let process = process.clone();
                move || process.terminate()
            })
            .await;
            if !matches!(terminated, Ok(Ok(())))
                || tokio::time::timeout(grace, end.wait_for(Option::is_some)).await.is_err()
            {
                let _ = tokio::task::spawn_blocking(move || process.kill()).await;
            }
        });
    }

    /// SIGKILL to the tree now (a kill carried out after a restart).
    pub fn kill_now(&self) -> std::io::Result<()> {
        self.process.kill()
    }
}

impl Drop for FollowedTree {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

/// A tree's two logs, opened once for the follower's life (K only appends
/// to them), read with `pread` into one buffer: a look costs one system
/// call per stream, not an open, a seek and a close.
struct Logs {
    files: [Option<std::fs::File>; 2],
    buffer: Vec<u8>,
}

impl Logs {
    fn open(process: &DurableProcess) -> Self {
        let open = |stream| std::fs::File::open(process.record().dir.join(crate::durable::log_name(stream))).ok();
        Self { files: [open(Stream::Stdout), open(Stream::Stderr)], buffer: Vec::new() }
    }

    /// How long `stream`'s log is now (`None` when it is not open).
    fn len(&self, stream: Stream) -> Option<u64> {
        self.files[usize::from(stream == Stream::Stderr)].as_ref()?.metadata().ok().map(|m| m.len())
    }

    /// Up to [`LOOK_BYTES`] of `stream`'s log from `offset`, and not past
    /// `until` when given.
    fn read(
        &mut self,
        process: &DurableProcess,
        stream: Stream,
        offset: u64,
        until: Option<u64>,
    ) -> std::io::Result<&[u8]> {
        use std::os::unix::fs::FileExt as _;
        let Some(file) = &self.files[usize::from(stream == Stream::Stderr)] else {
            // Not opened (yet): the slow way, which says why it cannot.
            self.buffer = process.read_log(stream, offset, LOOK_BYTES)?;
            return Ok(&self.buffer);
        };
        let most = until.map_or(LOOK_BYTES as u64, |until| until.saturating_sub(offset).min(LOOK_BYTES as u64));
        self.buffer.resize(most as usize, 0);
        let read = loop {
            match file.read_at(&mut self.buffer, offset) {
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        Ok(&self.buffer[..read])
    }
}

/// Reads up to [`LOOK_BYTES`] of `stream`'s log past its offset (not past
/// `until`) and forwards them; true when it read anything.
fn look(
    process: &DurableProcess,
    logs: &mut Logs,
    forwarding: &Forwarding,
    offsets: &[AtomicU64; 2],
    stream: Stream,
    until: Option<u64>,
) -> bool {
    let index = usize::from(stream == Stream::Stderr);
    let offset = offsets[index].load(Ordering::Acquire);
    let data = match logs.read(process, stream, offset, until) {
        Ok(data) => data,
        Err(error) => {
            tracing::warn!(pid = process.pid(), %error, "cannot read a durable tree's log");
            return false;
        }
    };
    if data.is_empty() {
        return false;
    }
    let mut read = [offsets[0].load(Ordering::Acquire), offsets[1].load(Ordering::Acquire)];
    read[index] = offset + data.len() as u64;
    let mark = |in_stderr: bool, mid_line: bool, carry: [usize; 2]| {
        let cursor =
            TreeCursor { stdout: read[0] - carry[0] as u64, stderr: read[1] - carry[1] as u64, in_stderr, mid_line };
        cursor.to_mark()
    };
    forwarding.push_marked(stream == Stream::Stderr, data, false, Some(&mark));
    offsets[index].store(read[index], Ordering::Release);
    true
}

async fn follow(
    process: Arc<DurableProcess>,
    forwarding: Forwarding,
    offsets: Arc<[AtomicU64; 2]>,
    tell: watch::Sender<Option<TreeEnd>>,
) {
    let mut logs = Logs::open(&process);
    let mut looks = |forwarding: &Forwarding| {
        let _order = forwarding.order.lock().unwrap_or_else(|e| e.into_inner());
        // Stderr only as far as it was before stdout is read: K moves what
        // one wake-up found on stdout before its stderr, so stderr written
        // after this point may follow stdout read below, never precede it.
        let stderr_before = logs.len(Stream::Stderr);
        let out = look(&process, &mut logs, forwarding, &offsets, Stream::Stdout, None);
        let err = look(&process, &mut logs, forwarding, &offsets, Stream::Stderr, stderr_before);
        out || err
    };
    let record = process.record();
    let changes = LogChanges::watch([record.dir.join("stdout.log"), record.dir.join("stderr.log")]);
    loop {
        forwarding.sink.room().await;
        // Armed before the look: a change after it wakes the wait below.
        let changed = changes.as_ref().map(|c| c.notify.clone());
        let changed = changed.as_ref().map(|n| n.notified());
        if looks(&forwarding) {
            continue;
        }
        if process.exit().is_some() {
            break;
        }
        tokio::select! {
            _ = process.finished() => {}
            () = async { match changed { Some(changed) => changed.await, None => std::future::pending().await } } => {}
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
    drop(changes);
    // K ended: its logs are complete.
    loop {
        forwarding.sink.room().await;
        if !looks(&forwarding) {
            break;
        }
    }
    forwarding.push(false, &[], true);
    forwarding.push(true, &[], true);
    let end = match process.exit() {
        Some(Ok(exit)) => TreeEnd::Exited(exit),
        Some(Err(lost)) => TreeEnd::Lost(lost.to_string()),
        None => TreeEnd::Lost("its keeper ended without an exit status".into()),
    };
    let _ = tell.send(Some(end));
}

/// Wakes a follower when one of its logs is written to: watches on the
/// server's one inotify instance, whose thread wakes the watch's `notify`.
/// `None` when inotify refuses (its per-user limits): the follower then
/// looks every [`LOOK_EVERY`].
struct LogChanges {
    notify: Arc<tokio::sync::Notify>,
    watches: Vec<i32>,
}

/// The server's inotify instance and who waits on each watch.
struct Inotify {
    fd: std::os::fd::OwnedFd,
    waiting: std::sync::Mutex<std::collections::HashMap<i32, Arc<tokio::sync::Notify>>>,
}

fn inotify() -> Option<&'static Inotify> {
    static INOTIFY: std::sync::OnceLock<Option<&'static Inotify>> = std::sync::OnceLock::new();
    *INOTIFY.get_or_init(|| {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: inotify_init1 returns a new descriptor or -1.
        let raw = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        if raw < 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "no inotify: durable trees' logs are looked at every {LOOK_EVERY:?}");
            return None;
        }
        // SAFETY: a descriptor just returned to us.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let inotify: &'static Inotify = Box::leak(Box::new(Inotify { fd, waiting: Default::default() }));
        let spawned = std::thread::Builder::new().name("durable-logs".into()).spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                // SAFETY: a read into a local buffer from a descriptor that lives forever.
                let n = unsafe { libc::read(inotify.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return;
                }
                let mut at = 0;
                let header = std::mem::size_of::<libc::inotify_event>();
                while at + header <= n as usize {
                    // SAFETY: the kernel wrote a whole event here (unaligned: read it so).
                    let event: libc::inotify_event = unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                    if let Some(notify) = lock(&inotify.waiting).get(&event.wd) {
                        notify.notify_one();
                    }
                    at += header + event.len as usize;
                }
            }
        });
        spawned.ok().map(|_| inotify)
    })
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LogChanges {
    fn watch(logs: [std::path::PathBuf; 2]) -> Option<Self> {
        use std::os::fd::AsRawFd;
        let inotify = inotify()?;
        let notify = Arc::new(tokio::sync::Notify::new());
        let mut changes = Self { notify, watches: Vec::new() };
        for log in logs {
            let path = std::ffi::CString::new(log.into_os_string().into_encoded_bytes()).ok()?;
            let mut waiting = lock(&inotify.waiting);
            // SAFETY: a NUL-terminated path and our inotify descriptor.
            let wd = unsafe { libc::inotify_add_watch(inotify.fd.as_raw_fd(), path.as_ptr(), libc::IN_MODIFY) };
            if wd < 0 {
                return None;
            }
            waiting.insert(wd, changes.notify.clone());
            changes.watches.push(wd);
        }
        Some(changes)
    }
}

impl Drop for LogChanges {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        if let Some(inotify) = inotify() {
            let mut waiting = lock(&inotify.waiting);
            for wd in self.watches.drain(..) {
                waiting.remove(&wd);
                // SAFETY: removes our own watch.
                unsafe { libc::inotify_rm_watch(inotify.fd.as_raw_fd(), wd) };
            }
        }
    }
}

/// Lets go of the log bytes a durable tree's reader took for good: once the
/// store holds a read cursor, nothing before it is read again (a later
/// server resumes there), so those bytes' blocks are punched out
/// (`FALLOC_FL_PUNCH_HOLE`: offsets stay, the disk is freed). K caps what
/// the logs hold on disk, so this is what lets a reader that keeps up read
/// past the cap.
///
/// Invariants: only whole blocks before the cursor go, and never a log's
/// last byte (K reads it to start its drop mark on a line of its own); a
/// filesystem that cannot punch holes is told once in the log and left
/// alone (the cap then bounds the whole output, as the mark says).
#[derive(Debug)]
pub struct LogRelease {
    dir: std::path::PathBuf,
    state: std::sync::Mutex<Released>,
}

#[derive(Debug, Default)]
struct Released {
    files: [Option<std::fs::File>; 2],
    /// Each log is punched out up to here.
    through: [u64; 2],
    unsupported: bool,
}

/// The granularity of what is punched out.
const RELEASE_BLOCK: u64 = 4096;

impl LogRelease {
    /// For the tree of `record`; opens its logs at the first release.
    pub fn new(record: &crate::durable::DurableRecord) -> Self {
        Self { dir: record.dir.clone(), state: Default::default() }
    }

    /// Punches out what lies before `cursor` (a mark as stored:
    /// [`TreeCursor::to_mark`]); an unreadable mark releases nothing.
    pub fn release_before(&self, cursor: &str) {
        use std::os::fd::AsRawFd;
        let Some(cursor) = TreeCursor::parse(cursor) else { return };
        let mut state = lock(&self.state);
        if state.unsupported {
            return;
        }
        for (index, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
            let offset = if stream == Stream::Stderr { cursor.stderr } else { cursor.stdout };
            let end = offset.saturating_sub(1) / RELEASE_BLOCK * RELEASE_BLOCK;
            let start = state.through[index];
            if end <= start {
                continue;
            }
            if state.files[index].is_none() {
                use std::os::unix::fs::OpenOptionsExt as _;
                let path = self.dir.join(crate::durable::log_name(stream));
                match std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(&path) {
                    Ok(file) => state.files[index] = Some(file),
                    Err(error) => {
                        tracing::debug!(log = %path.display(), %error, "cannot open a durable tree's log to release what was read");
                        continue;
                    }
                }
            }
            let Some(file) = &state.files[index] else { continue };
            // SAFETY: fallocate on a descriptor we own; offsets in range.
            let punched = unsafe {
                libc::fallocate(
                    file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    start as libc::off_t,
                    (end - start) as libc::off_t,
                )
            };
            if punched == 0 {
                state.through[index] = end;
            } else {
                let error = std::io::Error::last_os_error();
                tracing::warn!(dir = %self.dir.display(), %error, "cannot punch read output out of a durable tree's logs: they keep it, and the log cap bounds the command's whole output");
                state.unsupported = true;
                return;
            }
        }
    }
}

/// Removes an ended durable tree's directory (logs, status, socket: K
/// cannot, its mount namespace hides them); a tree still running (no
/// status yet) keeps it. Call once its end is recorded where the next
/// server looks.
pub fn remove_ended(record: &crate::durable::DurableRecord) {
    if record.dir.join("status").exists() {
        let _ = std::fs::remove_file(&record.socket);
        let _ = std::fs::remove_dir_all(&record.dir);
    }
}
