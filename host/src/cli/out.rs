//! The answer of `check` and `call` on stdout, when the reader may leave
//! early (`taskhost check x.wasm | head -1`).
//!
//! Model: every line of an answer goes through [`write`] (or [`outln!`]),
//! which returns an error instead of panicking as `println!` does. A reader
//! that closed the pipe (`EPIPE`; Rust ignores `SIGPIPE`, so it is an error
//! and not a signal) becomes [`StdoutClosed`], which the command returns
//! like any error: the command stops at once, disposes what it started (a
//! background task of `call` is killed with the host), and
//! [`crate::cli::main`] exits with [`EXIT_STDOUT_CLOSED`] and says nothing
//! (there is no one left to tell, and stderr is not the answer). Any other
//! write error is a plain error (exit 1, on stderr).

use std::io::Write as _;

/// The exit status when stdout was closed by its reader: 141, what a shell
/// reports for a program that `SIGPIPE` killed (128 + 13), so `pipefail`
/// scripts see the same status as for any other such program.
pub const EXIT_STDOUT_CLOSED: u8 = 141;

/// The reader of stdout left (a broken pipe): stop quietly.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed by its reader")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `text` to stdout and flushes it.
pub fn write(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Err(anyhow::Error::new(StdoutClosed)),
        Err(error) => Err(anyhow::Error::new(error).context("cannot write to stdout")),
    }
}

/// `println!` that returns [`StdoutClosed`] instead of panicking:
/// `outln!("{x}")?`.
macro_rules! outln {
    () => { $crate::cli::out::write("\n") };
    ($($arg:tt)*) => { $crate::cli::out::write(&format!("{}\n", format_args!($($arg)*))) };
}
pub(crate) use outln;
