//! Durable trees: process trees that outlive the server that started them,
//! and are re-adopted by the next one ([`crate::ProcessHost::spawn_durable`],
//! [`DurableProcess::adopt`]).
//!
//! Model: K of a durable tree ignores the host's lifeline. It copies the
//! tree's stdout and stderr into `stdout.log` and `stderr.log` in the
//! directory the caller names (the logs are the truth; a server's memory is
//! a cache of them), writes `status` there when the tree ends, SIGKILLs the
//! tree at its deadline, and listens on a Unix socket. A server proves
//! itself to K with the secret of the [`DurableRecord`]; K proves itself to
//! the server by being the recorded process: the socket's peer pid must be
//! the recorded pid, and that pid's start time (`/proc/<pid>/stat` field
//! 22) the recorded one, so a recycled pid is refused.
//!
//! Invariants:
//! - The log directory and the socket lie under a protected path
//!   ([`crate::ProcessHostConfig::protected_paths`]): no tree sees them.
//!   The secret is in no tree's environment, argv or view.
//! - The logs hold at most the grant's spill cap together; `truncated`
//!   in the directory says K dropped output past it.
//! - A tree never outlives its deadline, server or not.
//! - Dropping a [`DurableProcess`] leaves the tree running (that is the
//!   point); [`DurableProcess::kill`] ends it.

use std::io::{Read, Seek};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::handle::ExitStatus;
use crate::handle::Stream;

use crate::plan::Command;
pub use crate::plan::SECRET_BYTES;

/// How to make a tree durable.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DurableSpawn {
    /// An existing private directory for the logs and the status file,
    /// under a protected path.
    pub dir: PathBuf,
    /// Where K's socket is bound (must not exist), under a protected path;
    /// at most 107 bytes. K cannot remove it (its mount namespace hides the
    /// path): the caller removes it once the tree ended, with `dir`.
    pub socket: PathBuf,
    /// K SIGKILLs the tree this long after the start.
    pub ttl: Duration,
}

impl DurableSpawn {
    pub fn new(dir: PathBuf, socket: PathBuf, ttl: Duration) -> Self {
        Self { dir, socket, ttl }
    }
}

/// What a later server needs to re-adopt a durable tree.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct DurableRecord {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub secret: [u8; SECRET_BYTES],
    pub keeper_pid: u32,
    /// `/proc/<pid>/stat` field 22 of K (clock ticks after boot).
    pub keeper_start_time: u64,
}

/// Why a durable tree cannot be adopted.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// K is gone without a status: the tree's end is unknown.
    #[error("the tree is lost: {0}")]
    Lost(String),
    /// A process answered that is not the recorded K, or K refused.
    #[error("re-adoption refused: {0}")]
    Refused(String),
}

/// How a durable tree ended, from its status file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurableExit {
    pub status: ExitStatus,
    /// K killed it at its deadline.
    pub deadline: bool,
}

/// A server's handle on a durable tree (spawned or adopted).
pub struct DurableProcess {
    record: DurableRecord,
    /// K's pidfd (readable once K exited); `None`: K had ended already.
    pidfd: Option<AsyncFd<OwnedFd>>,
    /// Our stdin write end.
    stdin: std::sync::Mutex<Option<OwnedFd>>,
    /// K is this process's child: reap it (in a thread, as it may outlive
    /// the handle).
    reap: bool,
    /// An exec'd K that may not listen yet (see `confine::Forked::listening`):
    /// waited for before the first request, then dropped.
    listening: std::sync::Mutex<Option<OwnedFd>>,
}

/// How long a request waits for a fresh K to listen on its socket.
const LISTEN_WAIT: Duration = Duration::from_secs(5);

impl std::fmt::Debug for DurableProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableProcess").field("pid", &self.record.keeper_pid).field("dir", &self.record.dir).finish()
    }
}

/// A fresh random secret.
pub(crate) fn new_secret() -> std::io::Result<[u8; SECRET_BYTES]> {
    let mut secret = [0u8; SECRET_BYTES];
    let mut filled = 0;
    while filled < SECRET_BYTES {
        // SAFETY: getrandom into the rest of a local buffer.
        let n = unsafe { libc::getrandom(secret[filled..].as_mut_ptr().cast(), SECRET_BYTES - filled, 0) };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::Interrupted {
                return Err(error);
            }
            continue;
        }
        filled += n as usize;
    }
    Ok(secret)
}

/// `/proc/<pid>/stat` field 22 (the start time), `None` when there is no
/// such process.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold spaces and parentheses: fields 3.. follow the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

pub(crate) fn log_name(stream: Stream) -> &'static str {
    match stream {
        Stream::Stdout => "stdout.log",
        Stream::Stderr => "stderr.log",
    }
}

impl DurableProcess {
    pub(crate) fn spawned(
        record: DurableRecord,
        pidfd: OwnedFd,
        stdin: Option<OwnedFd>,
        listening: Option<OwnedFd>,
    ) -> std::io::Result<Self> {
        Ok(Self {
            record,
            // SAFETY: an OwnedFd stays open for as long as the AsyncFd owns it.
            pidfd: Some(unsafe { AsyncFd::register(pidfd) }.map_err(std::io::Error::from)?),
            stdin: std::sync::Mutex::new(stdin),
            reap: true,
            listening: std::sync::Mutex::new(listening),
        })
    }

    /// Waits (at most [`LISTEN_WAIT`]) until a fresh K listens, or died.
    fn await_listening(&self) {
        let Some(listening) = self.listening.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
        let mut fd = libc::pollfd { fd: listening.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: poll on one descriptor we own; readable or hung up once K
        // listened or ended. EINTR and a timeout alike end the wait.
        unsafe { libc::poll(&mut fd, 1, LISTEN_WAIT.as_millis() as libc::c_int) };
    }

    /// Re-adopts the tree `record` names: checks K is the recorded process
    /// (pid and start time, and the socket's peer), proves this server with
    /// the secret and takes K's stdin write end. A tree that ended while no
    /// server watched is adopted ended (its status is in the directory).
    /// Needs a tokio runtime.
    pub fn adopt(record: &DurableRecord) -> Result<Self, AdoptError> {
        let ended = |record: &DurableRecord| {
            if record.dir.join("status").exists() {
                Ok(Self {
                    record: record.clone(),
                    pidfd: None,
                    stdin: std::sync::Mutex::new(None),
                    reap: false,
                    listening: std::sync::Mutex::new(None),
                })
            } else {
                Err(AdoptError::Lost("its keeper is gone and left no exit status".into()))
            }
        };
        if start_time(record.keeper_pid) != Some(record.keeper_start_time) {
            // Gone, or the pid now names another process.
            return ended(record);
        }
        let Ok(pidfd) = crate::spawn::pidfd_open(record.keeper_pid) else {
            // It ended (and was reaped) since the look above.
            return ended(record);
        };
        // The pidfd names the process that had the recorded start time.
        if start_time(record.keeper_pid) != Some(record.keeper_start_time) {
            return ended(record);
        }
        let conn = match Self::request(record, Command::Adopt) {
            Ok(conn) => conn,
            Err(AdoptError::Lost(_)) if record.dir.join("status").exists() => return ended(record),
            Err(e) => return Err(e),
        };
        let (byte, fd) = recv_with_fd(&conn).map_err(|e| AdoptError::Refused(format!("no answer: {e}")))?;
        let stdin = match byte {
            Some(b's') => fd,
            Some(b'n') => None,
            // K closes the connection on a wrong secret.
            _ => return Err(AdoptError::Refused("the keeper refused the secret".into())),
        };
        Ok(Self {
            record: record.clone(),
            // SAFETY: an OwnedFd stays open for as long as the AsyncFd owns it.
            pidfd: Some(unsafe { AsyncFd::register(pidfd) }.map_err(|e| AdoptError::Lost(e.to_string()))?),
            stdin: std::sync::Mutex::new(stdin),
            reap: false,
            listening: std::sync::Mutex::new(None),
        })
    }

    /// Connects to K, checks the peer is the recorded K, sends the secret
    /// and `command`.
    fn request(record: &DurableRecord, command: Command) -> Result<std::os::unix::net::UnixStream, AdoptError> {
        use std::io::Write;
        let conn = through_its_directory(&record.socket)
            .and_then(|(_parent, path)| std::os::unix::net::UnixStream::connect(path))
            .map_err(|e| AdoptError::Lost(format!("cannot reach its keeper: {e}")))?;
        let peer = rustix::net::sockopt::socket_peercred(&conn)
            .map_err(|e| AdoptError::Refused(format!("no peer credentials: {e}")))?;
        let peer_pid = peer.pid.as_raw_nonzero().get() as u32;
        if peer_pid != record.keeper_pid || start_time(peer_pid) != Some(record.keeper_start_time) {
            return Err(AdoptError::Refused(format!(
                "the socket's peer is process {peer_pid}, not the recorded keeper {}",
                record.keeper_pid
            )));
        }
        let mut request = [0u8; SECRET_BYTES + 1];
        request[..SECRET_BYTES].copy_from_slice(&record.secret);
        request[SECRET_BYTES] = command.byte();
        conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
        (&conn).write_all(&request).map_err(|e| AdoptError::Refused(format!("cannot send the request: {e}")))?;
        Ok(conn)
    }

    /// Sends `command` and waits for K's one-byte acknowledgement.
    fn command(&self, command: Command) -> std::io::Result<()> {
        self.await_listening();
        let mut conn = Self::request(&self.record, command).map_err(std::io::Error::other)?;
        let mut byte = [0u8; 1];
        match conn.read(&mut byte)? {
            1 if byte[0] == b'k' => Ok(()),
            _ => Err(std::io::Error::other("the keeper did not acknowledge")),
        }
    }

    /// What a later server needs to adopt this tree.
    pub fn record(&self) -> &DurableRecord {
        &self.record
    }

    /// K's pid.
    pub fn pid(&self) -> u32 {
        self.record.keeper_pid
    }

    /// Up to `max` bytes of `stream`'s log from `offset` (what the tree
    /// wrote there, in order).
    pub fn read_log(&self, stream: Stream, offset: u64, max: usize) -> std::io::Result<Vec<u8>> {
        let mut file = std::fs::File::open(self.record.dir.join(log_name(stream)))?;
        file.seek(std::io::SeekFrom::Start(offset))?;
        let mut out = Vec::new();
        file.take(max as u64).read_to_end(&mut out)?;
        Ok(out)
    }

    /// Whether K dropped output past the cap.
    pub fn truncated(&self) -> bool {
        self.record.dir.join("truncated").exists()
    }

    /// Writes to the tree's stdin without blocking; returns how much went
    /// in (0 when the pipe is full).
    pub fn write_stdin(&self, data: &[u8]) -> std::io::Result<usize> {
        let guard = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
        let fd = guard.as_ref().ok_or_else(|| std::io::Error::other("stdin is closed"))?;
        crate::stdin::ignore_sigpipe();
        // SAFETY: fcntl and a write from a live slice on a descriptor we own.
        let n = unsafe {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
            libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len())
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        match std::io::Error::last_os_error() {
            e if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
            e => Err(e),
        }
    }

    /// Closes stdin: ours and K's copy, so the tree sees end of file.
    pub fn close_stdin(&self) -> std::io::Result<()> {
        self.stdin.lock().unwrap_or_else(|e| e.into_inner()).take();
        if self.pidfd.is_some() { self.command(Command::CloseStdin) } else { Ok(()) }
    }

    /// SIGTERM to the tree's group (K forwards it).
    pub fn terminate(&self) -> std::io::Result<()> {
        self.command(Command::Terminate)
    }

    /// SIGKILL to the tree.
    pub fn kill(&self) -> std::io::Result<()> {
        self.command(Command::Kill)
    }

    /// The tree's end, once K wrote it; `Err` when K is gone without one.
    pub fn exit(&self) -> Option<Result<DurableExit, AdoptError>> {
        match std::fs::read_to_string(self.record.dir.join("status")) {
            Ok(text) => Some(parse_status(&text)),
            Err(_) if self.keeper_gone() => {
                // K may have written it between the two looks.
                Some(std::fs::read_to_string(self.record.dir.join("status")).map_or_else(
                    |_| Err(AdoptError::Lost("its keeper died without an exit status".into())),
                    |text| parse_status(&text),
                ))
            }
            Err(_) => None,
        }
    }

    fn keeper_gone(&self) -> bool {
        self.pidfd.as_ref().is_none_or(|fd| {
            let mut poll = libc::pollfd { fd: fd.get_ref().as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: poll of one local pollfd, no wait.
            unsafe { libc::poll(&mut poll, 1, 0) == 1 }
        })
    }

    /// Waits until K has ended, then returns the tree's end.
    pub async fn finished(&self) -> Result<DurableExit, AdoptError> {
        if let Some(fd) = &self.pidfd {
            loop {
                let Ok(mut guard) = fd.readable().await else { break };
                if self.keeper_gone() {
                    break;
                }
                guard.clear_ready();
            }
        }
        self.exit().unwrap_or_else(|| Err(AdoptError::Lost("no exit status".into())))
    }
}

impl Drop for DurableProcess {
    fn drop(&mut self) {
        if self.reap {
            let pid = self.record.keeper_pid as libc::pid_t;
            // The tree runs on; its keeper is our child until we exit.
            let _ = std::thread::Builder::new().name("durable-reaper".into()).spawn(move || {
                // SAFETY: waits for our own child.
                while unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) } < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {}
            });
        }
    }
}

fn parse_status(text: &str) -> Result<DurableExit, AdoptError> {
    let bad = || AdoptError::Lost(format!("unreadable exit status {text:?}"));
    let mut lines = text.lines();
    let (word, number) = lines.next().and_then(|l| l.split_once(' ')).ok_or_else(bad)?;
    let number: i32 = number.parse().map_err(|_| bad())?;
    let status = match word {
        "code" => ExitStatus::Code(number),
        "signal" => ExitStatus::Signal(number),
        _ => return Err(bad()),
    };
    Ok(DurableExit { status, deadline: lines.any(|l| l == "deadline") })
}

/// Receives one byte and at most one descriptor.
fn recv_with_fd(conn: &std::os::unix::net::UnixStream) -> std::io::Result<(Option<u8>, Option<OwnedFd>)> {
    let mut byte = [0u8; 1];
    let mut control = [0u64; 4];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: recvmsg into local buffers; a received descriptor is taken
    // into an OwnedFd at once.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        let n = libc::recvmsg(conn.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut fd = None;
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let mut raw: RawFd = -1;
                std::ptr::copy_nonoverlapping(libc::CMSG_DATA(cmsg), (&mut raw as *mut RawFd).cast::<u8>(), 4);
                if raw >= 0 {
                    fd = Some(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        Ok(((n == 1).then_some(byte[0]), fd))
    }
}

/// Opens what K holds for `spawn` (before the fork): the directory, the
/// logs (new files) and the bound socket.
pub(crate) struct Opened {
    pub(crate) dir: OwnedFd,
    pub(crate) stdout_log: OwnedFd,
    pub(crate) stderr_log: OwnedFd,
    pub(crate) socket: OwnedFd,
}

pub(crate) fn open(spawn: &DurableSpawn) -> std::io::Result<Opened> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&spawn.dir)?
        .into();
    // Written by K alone, from offset 0 on (not O_APPEND: a splice into an
    // append-only descriptor is refused); read by K only for a log's last
    // byte (a drop mark starts on a line of its own).
    let log = |name: &str| -> std::io::Result<OwnedFd> {
        Ok(std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(spawn.dir.join(name))?
            .into())
    };
    let (stdout_log, stderr_log) = (log("stdout.log")?, log("stderr.log")?);
    // The exit status's room, taken now: K writes the end over it, so a
    // state directory that fills up later still learns how the tree ended,
    // and one that is full already refuses the spawn here, saying so.
    let reserved = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(spawn.dir.join("status.tmp"))
        .and_then(|mut file| std::io::Write::write_all(&mut file, &[b' '; crate::plan::STATUS_BYTES]));
    if let Err(error) = reserved {
        return Err(std::io::Error::new(
            error.kind(),
            format!("cannot keep the exit status in {} ({error}); is the state directory full?", spawn.dir.display()),
        ));
    }
    // Bound here (so a bad path fails the spawn), listened on by K: the
    // peer credentials a client sees are the listener's at `listen`.
    let socket: OwnedFd = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    let (_parent, path) = through_its_directory(&spawn.socket)?;
    rustix::net::bind(&socket, &rustix::net::SocketAddrUnix::new(&path)?)?;
    Ok(Opened { dir, stdout_log, stderr_log, socket })
}

/// A path to `socket` that fits a Unix socket address (108 bytes) however
/// deep the state directory lies (a long `$HOME` or `XDG_STATE_HOME`):
/// `/proc/self/fd/<N>/<name>`, through this process's descriptor of its
/// directory, which the returned descriptor holds open while the path is used.
fn through_its_directory(socket: &Path) -> std::io::Result<(OwnedFd, PathBuf)> {
    let invalid =
        || std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no socket path: {}", socket.display()));
    let (parent, name) = (socket.parent().ok_or_else(invalid)?, socket.file_name().ok_or_else(invalid)?);
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    let dir = rustix::fs::open(
        parent,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let path = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    Ok((dir, path))
}

/// Whether `path` (resolved) lies under one of `protected` (each resolved
/// where it exists).
pub(crate) fn is_protected(path: &Path, protected: &[PathBuf]) -> bool {
    protected.iter().any(|p| path.starts_with(p.canonicalize().as_deref().unwrap_or(p)))
}
