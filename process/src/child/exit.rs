//! How a tree's set-up code ends when it cannot go on: the exit codes shells
//! use, and a `taskhost: <what>: errno <n>` line on the tree's own stderr,
//! so the plugin and the model see why.
//!
//! Invariant: async-signal-safe (see [`super`]).

/// Exit code when confining the tree failed (the message is on stderr).
pub(crate) const EXIT_SETUP_FAILED: i32 = 126;
/// Exit code when the command could not be executed (as shells use).
pub(crate) const EXIT_EXEC_FAILED: i32 = 127;

/// Writes `taskhost: <what>: errno <n>` to stderr (the process's own stderr
/// pipe, so the plugin and the model see it) and exits with `code`.
///
/// # Safety
/// In a tree's process before `exec` (it ends the process).
pub(crate) unsafe fn fail(code: i32, what: &[u8]) -> ! {
    // SAFETY: forwarded.
    unsafe { fail_parts(code, &[what]) }
}

/// As [`fail`], with the path the step was about: `taskhost: <what>
/// <path>: errno <n>`.
///
/// # Safety
/// As [`fail`].
pub(crate) unsafe fn fail_at(code: i32, what: &[u8], path: &std::ffi::CStr) -> ! {
    // SAFETY: forwarded.
    unsafe { fail_parts(code, &[what, b" ", path.to_bytes()]) }
}

/// `n` in decimal, written into the end of `digits` without allocating
/// (async-signal-safe); returns the digits written.
pub(crate) fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &digits[at..]
}

/// Writes `taskhost: <parts…>: errno <n>` to stderr and exits with `code`.
///
/// # Safety
/// As [`fail`].
unsafe fn fail_parts(code: i32, what: &[&[u8]]) -> ! {
    // SAFETY: reads errno and writes a stack buffer to fd 2, then _exit: async-signal-safe.
    unsafe {
        let errno = *libc::__errno_location();
        let mut digits = [0u8; 20];
        let digits = decimal(errno.unsigned_abs().into(), &mut digits);
        libc::write(2, b"taskhost: ".as_ptr().cast(), 10);
        for part in what {
            libc::write(2, part.as_ptr().cast(), part.len());
        }
        for part in [b": errno ".as_slice(), digits, b"\n"] {
            libc::write(2, part.as_ptr().cast(), part.len());
        }
        libc::_exit(code)
    }
}

/// Exit code of an init whose keeper died before the init was armed.
pub(crate) const EXIT_PARENT_GONE: i32 = 125;
