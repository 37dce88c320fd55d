//! The lock each server holds on its own file in `tasks.servers/` while it
//! runs: how a starting server tells a dead server's records (its to claim)
//! from a live one's.
//!
//! Invariants: a server writes its pid and start time into its lock file
//! once it holds it; a lock nobody holds is a dead server's; a held lock
//! whose named process is gone is a dead server's too once its leftover
//! holder (a child it was spawning) lets go, waited for at most
//! [`DEAD_HOLDER_WAIT`]; a held lock naming a live process is never waited for.

use std::os::unix::io::AsRawFd as _;
use std::path::Path;
use std::time::Duration;

/// Whether `file` could be locked exclusively without waiting (and locks it).
pub(super) fn try_lock(file: &std::fs::File) -> bool {
    // SAFETY: flock on a file descriptor this function borrows.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// How long a lock whose server is dead may stay held: a process the server
/// was starting when it died (`posix_spawn` between its clone and its exec,
/// a fork about to close what it inherited) holds a copy of the lock's open
/// file until then.
pub(super) const DEAD_HOLDER_WAIT: Duration = Duration::from_secs(2);

/// What a server writes into its lock file: its pid and start time.
pub(super) fn owner_line() -> String {
    let pid = std::process::id();
    format!("{pid} {}\n", taskhost_process::durable::start_time(pid).unwrap_or(0))
}

/// Whether the process a lock file names (see [`owner_line`]) is gone.
fn lock_owner_is_dead(lock: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(lock) else { return false };
    let mut words = text.split_whitespace().map(str::parse::<u64>);
    match (words.next(), words.next()) {
        (Some(Ok(pid)), Some(Ok(start))) => {
            u32::try_from(pid).map_or(true, |pid| taskhost_process::durable::start_time(pid) != Some(start))
        }
        // Not written yet, or an older server's empty file: assume alive.
        _ => false,
    }
}

/// Locks `file` (the lock file at `path`) unless a live server holds it.
/// A lock still held although the server it names is dead is waited for
/// (at most [`DEAD_HOLDER_WAIT`]): its holder is a child of that server on
/// its way to `exec` or exit.
pub(super) fn take_if_dead(file: &std::fs::File, path: &Path) -> bool {
    if try_lock(file) {
        return true;
    }
    if !lock_owner_is_dead(path) {
        return false;
    }
    let deadline = std::time::Instant::now() + DEAD_HOLDER_WAIT;
    while std::time::Instant::now() < deadline {
        // Paced: a lock gives no event when its last holder lets go.
        std::thread::sleep(Duration::from_millis(5));
        if try_lock(file) {
            return true;
        }
    }
    tracing::warn!(lock = %path.display(), "a dead server's lock is still held after {DEAD_HOLDER_WAIT:?}; its records stay");
    false
}
