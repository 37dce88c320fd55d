//! The stdin of a process tree that asked for a pipe ([`StdinMode::Pipe`]).
//!
//! Model: the host keeps the pipe's write end (non-blocking, close-on-exec);
//! the tree's command has the read end as its fd 0 (its keeper and init do
//! not hold it, so the read end closes when the command and whatever it
//! started are gone). [`StdinPipe::write`] writes what the pipe takes at once
//! and queues the rest in a bounded host-side buffer ([`STDIN_BUFFER_BYTES`]);
//! one pump task per pipe moves the queue into the pipe as the pipe becomes
//! writable. [`StdinPipe::close`] closes the write end once the queue is
//! drained, so the command reads end-of-file after the last byte.
//!
//! Invariants:
//! - Nothing here blocks a thread: every write is a non-blocking `write(2)`
//!   under a short lock, and waiting for room is the pump's `writable()`.
//! - Bytes reach the pipe in the order they were accepted: only one writer
//!   writes at a time (under the state lock), and a direct write happens only
//!   when nothing is queued.
//! - A write to a pipe whose reader is gone is an error (`EPIPE`), never a
//!   SIGPIPE: the pipe is created only after [`ignore_sigpipe`] made sure the
//!   signal is ignored in this process (the Rust runtime already ignores it;
//!   an embedder that restored the default gets it ignored again, once, with
//!   a log line). Children get the default back (see [`crate::confine`]).
//! - The queue never holds more than [`STDIN_BUFFER_BYTES`]: a write that
//!   would exceed it is refused whole, with the reason.
//! - Once closed (asked, broken, or the process dropped) the pipe stays
//!   closed; every later write or close is refused with the reason.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, Once};

use tokio::net::unix::pipe;
use tokio::sync::Notify;

/// What a tree's stdin is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StdinMode {
    /// `/dev/null`: a read gets end-of-file at once.
    #[default]
    Empty,
    /// A pipe the host writes with [`crate::Process::write_stdin`].
    Pipe,
}

/// Bytes a pipe's host-side queue holds at most (beyond what the pipe
/// itself buffers, 64 KiB on Linux).
pub const STDIN_BUFFER_BYTES: usize = 256 * 1024;

/// Why a write to (or the close of) a process's stdin was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StdinError {
    #[error("the process was started without a stdin pipe (its stdin is empty)")]
    NotPiped,
    #[error("its stdin is already closed")]
    Closed,
    #[error("the program no longer reads its stdin (it exited or closed it)")]
    Broken,
    #[error(
        "its stdin buffer is full ({pending} bytes not yet read by the program; at most {limit} may wait): \
         the program is not reading its input; wait for it to read, or close its input"
    )]
    Full { pending: usize, limit: usize },
    #[error("writing its stdin failed: {0}")]
    Failed(String),
}

#[derive(Default)]
struct State {
    /// The write end; `None` once closed for any reason.
    sender: Option<Arc<pipe::Sender>>,
    /// Accepted bytes the pipe has not taken yet.
    pending: VecDeque<u8>,
    /// A close was asked while bytes were pending: close once drained.
    close_asked: bool,
    /// Why it is closed (the answer to later writes).
    ended: Option<StdinError>,
}

/// The host's end of one process's stdin pipe.
pub(crate) struct StdinPipe {
    state: Mutex<State>,
    wake: Notify,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes sure SIGPIPE is ignored in this process, so a write to a pipe
/// whose reader is gone fails with `EPIPE` instead of killing the host.
pub(crate) fn ignore_sigpipe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: sigaction with a null new action only reads the current
        // disposition into a zeroed struct we own.
        let current = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old);
            old.sa_sigaction
        };
        if current == libc::SIG_DFL {
            tracing::debug!("SIGPIPE had its default disposition; ignoring it so stdin writes fail with EPIPE");
            // SAFETY: setting a signal to SIG_IGN is always sound.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        }
    });
}

impl StdinPipe {
    /// Takes the write end of a fresh pipe and starts its pump. Needs a
    /// tokio runtime.
    pub(crate) fn start(write_end: OwnedFd, span: tracing::Span) -> std::io::Result<Arc<Self>> {
        let sender = pipe::Sender::from_owned_fd(write_end)?;
        let this = Arc::new(Self {
            state: Mutex::new(State { sender: Some(Arc::new(sender)), ..State::default() }),
            wake: Notify::new(),
        });
        tokio::spawn(tracing::Instrument::instrument(pump(this.clone()), span));
        Ok(this)
    }

    /// Accepts all of `data` (written now, or queued) or refuses it whole.
    pub(crate) fn write(&self, data: &[u8]) -> Result<(), StdinError> {
        let mut state = lock(&self.state);
        if let Some(ended) = &state.ended {
            return Err(ended.clone());
        }
        if state.close_asked {
            return Err(StdinError::Closed);
        }
        let Some(sender) = state.sender.clone() else { return Err(StdinError::Closed) };
        if state.pending.len() + data.len() > STDIN_BUFFER_BYTES {
            return Err(StdinError::Full { pending: state.pending.len(), limit: STDIN_BUFFER_BYTES });
        }
        let mut rest = data;
        if state.pending.is_empty() {
            while !rest.is_empty() {
                match sender.try_write(rest) {
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(end(&mut state, e)),
                }
            }
        }
        if !rest.is_empty() {
            state.pending.extend(rest);
            drop(state);
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Closes the pipe once everything accepted was written.
    pub(crate) fn close(&self) -> Result<(), StdinError> {
        let mut state = lock(&self.state);
        if let Some(ended) = &state.ended {
            return Err(ended.clone());
        }
        if state.close_asked || state.sender.is_none() {
            return Err(StdinError::Closed);
        }
        if state.pending.is_empty() {
            state.sender = None;
            state.ended = Some(StdinError::Closed);
        } else {
            state.close_asked = true;
        }
        drop(state);
        self.wake.notify_one();
        Ok(())
    }

    /// Closes the pipe now, dropping anything queued (the process is going).
    pub(crate) fn shut(&self) {
        let mut state = lock(&self.state);
        state.sender = None;
        state.pending.clear();
        state.ended.get_or_insert(StdinError::Closed);
        drop(state);
        self.wake.notify_one();
    }

    /// Bytes accepted but not yet taken by the pipe.
    pub(crate) fn pending(&self) -> usize {
        lock(&self.state).pending.len()
    }
}

/// Records why the pipe ended after a failed write, closes it, and returns
/// the error for the caller.
fn end(state: &mut State, error: std::io::Error) -> StdinError {
    let why = if error.kind() == std::io::ErrorKind::BrokenPipe {
        StdinError::Broken
    } else {
        StdinError::Failed(error.to_string())
    };
    tracing::debug!(error = %error, "stdin pipe ended");
    state.sender = None;
    state.pending.clear();
    state.ended = Some(why.clone());
    why
}

/// Moves queued bytes into the pipe as it becomes writable; closes it when
/// asked once drained. Ends when the pipe is closed for any reason.
async fn pump(pipe: Arc<StdinPipe>) {
    loop {
        let woken = pipe.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let sender = {
            let mut state = lock(&pipe.state);
            let Some(sender) = state.sender.clone() else { return };
            if state.pending.is_empty() {
                if state.close_asked {
                    state.sender = None;
                    state.ended = Some(StdinError::Closed);
                    return;
                }
                None
            } else {
                Some(sender)
            }
        };
        let Some(sender) = sender else {
            woken.await;
            continue;
        };
        tokio::select! {
            ready = sender.writable() => {
                let mut state = lock(&pipe.state);
                if let Err(e) = ready {
                    end(&mut state, e);
                    return;
                }
                if state.sender.is_none() {
                    return;
                }
                while !state.pending.is_empty() {
                    let (front, _) = state.pending.as_slices();
                    match sender.try_write(front) {
                        Ok(n) => {
                            state.pending.drain(..n);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            end(&mut state, e);
                            return;
                        }
                    }
                }
            }
            () = &mut woken => {}
        }
        // `sender` (our clone) drops here, so a close is never held up by it.
    }
}
