//! How a process tree ended ([`ExitStatus`], from a `waitpid` status) and
//! the names of signals as the model reads them ([`signal_name`]).

/// How a process tree ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code. `-1` means the status could not be collected.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
}

impl ExitStatus {
    /// Decodes a `waitpid` status.
    pub(crate) fn from_wait(status: libc::c_int) -> Self {
        if libc::WIFEXITED(status) {
            Self::Code(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Self::Signal(libc::WTERMSIG(status))
        } else {
            Self::Code(-1)
        }
    }
}

impl std::fmt::Display for ExitStatus {
    /// The model-facing detail: `exit code: 3`, `signal: SIGTERM`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Code(code) => write!(f, "exit code: {code}"),
            Self::Signal(signal) => write!(f, "signal: {}", signal_name(*signal)),
        }
    }
}

/// `SIGTERM` for 15, `signal 99` for unknown numbers.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => return format!("signal {signal}"),
    };
    name.to_string()
}
