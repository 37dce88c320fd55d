//! Calls into a guest under a deadline, and what to say when one goes wrong.
//!
//! Model: every call into a guest goes through [`arm`] first (a store's
//! epoch deadline starts at 0, so an unarmed call would be interrupted at
//! once); its deadline counts the guest's own time, not the host steps it
//! waits on ([`super::clock`]). Every error a call returns is turned into a
//! [`Fault`] by
//! [`classify`], which names the plugin, the export and the cause: the call
//! deadline, the memory limit, a wasm trap (with the guest's last stderr
//! line, usually a Rust panic message) or a host-side error.
//!
//! Invariant: after any fault the store must be dropped, never re-entered
//! (a trapped component instance is poisoned).

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Store, Trap};

use super::clock::CallClock;
use super::state::StoreState;

/// Sets the deadline for the next call into the guest: `deadline` of its
/// own time ([`super::clock`]). Returns the call's clock, for [`bounded`].
pub fn arm(store: &mut Store<StoreState>, deadline: Duration) -> Arc<CallClock> {
    let state = store.data_mut();
    state.clock.arm(deadline);
    state.deadline_hit = false;
    let clock = state.clock.clone();
    // The callback runs at the first tick and then every tick: it yields, or
    // interrupts once the deadline has passed.
    store.set_epoch_deadline(1);
    clock
}

/// Extra time a call may spend awaiting host futures (a guest blocking on a
/// pollable inside an export) beyond its deadline before it is dropped. Pure
/// wasm execution is stopped by the epoch deadline before this fires.
const HOST_WAIT_SLACK: Duration = Duration::from_millis(100);

/// The error of a call dropped by [`bounded`].
#[derive(Debug)]
struct CallTimedOut;

impl std::fmt::Display for CallTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the call was still blocked in a host function at its deadline")
    }
}

impl std::error::Error for CallTimedOut {}

/// Runs an armed call (`clock` is what [`arm`] returned), also bounding the
/// time it spends awaiting futures no epoch deadline can interrupt (a guest
/// blocked in WASI's `poll`): past its deadline (which host steps move on,
/// see [`super::clock`]) plus a slack, the call is dropped (wasmtime unwinds
/// the guest) and fails with a deadline fault.
pub async fn bounded<R>(
    clock: &CallClock,
    call: impl std::future::Future<Output = wasmtime::Result<R>>,
) -> wasmtime::Result<R> {
    let mut call = std::pin::pin!(call);
    let result = bounded_loop(clock, &mut call).await;
    let (wall, own, budget) = clock.times();
    if wall >= budget {
        // Worth a line: by the wall clock alone the plugin would have been blamed.
        tracing::debug!(
            wall_ms = wall.as_millis() as u64,
            own_ms = own.as_millis() as u64,
            deadline_ms = budget.as_millis() as u64,
            "guest call outlasted its deadline by the wall clock; the plugin's own time is what counts"
        );
    }
    result
}

async fn bounded_loop<R>(
    clock: &CallClock,
    call: &mut std::pin::Pin<&mut impl std::future::Future<Output = wasmtime::Result<R>>>,
) -> wasmtime::Result<R> {
    loop {
        let resumed = clock.resumed();
        tokio::pin!(resumed);
        resumed.as_mut().enable();
        let wake = clock.deadline().map(|at| tokio::time::Instant::from_std(at + HOST_WAIT_SLACK));
        tokio::select! {
            result = call.as_mut() => return result,
            () = async { if let Some(at) = wake { tokio::time::sleep_until(at).await } else { std::future::pending().await } } => {
                if clock.overdue(HOST_WAIT_SLACK) {
                    return Err(wasmtime::Error::new(CallTimedOut));
                }
            }
            () = &mut resumed => {}
        }
    }
}

/// How to fix a deadline fault, in the words the plugin author needs.
pub const DEADLINE_FIX: &str = "every export must return at once; to wait, return a pollable from \
     `subscribe` (a clock deadline, a process or a subagent run) and the host waits on it, then calls `done`";

/// What went wrong in a call into a guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub cause: FaultCause,
    /// The full model-facing detail, e.g.
    /// `plugin misbehave trapped in task.done: wasm trap: wasm \`unreachable\` instruction executed
    /// (guest stderr: panicked at src/lib.rs:170:24: boom)`.
    pub detail: String,
}

/// The cause of a [`Fault`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultCause {
    Deadline,
    MemoryLimit,
    Trap,
    Host,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for Fault {}

/// Turns the error of a call to `export` into a [`Fault`].
pub fn classify(store: &Store<StoreState>, deadline: Duration, export: &str, err: &wasmtime::Error) -> Fault {
    let state = store.data();
    let plugin = &*state.tag().plugin;
    let trap = err.downcast_ref::<Trap>().copied();
    let blocked = err.downcast_ref::<CallTimedOut>().is_some();
    if state.deadline_hit || trap == Some(Trap::Interrupt) || blocked {
        let how = if blocked {
            " while blocked in a host function (a sleep or a blocking wait, such as Python's `time.sleep` \
             or a `block` on a pollable)"
        } else {
            ""
        };
        return Fault {
            cause: FaultCause::Deadline,
            detail: format!(
                "plugin {plugin} exceeded its {} ms call deadline in {export}{how}: {DEADLINE_FIX}",
                deadline.as_millis()
            ),
        };
    }
    if state.memory_limit_hit() {
        return Fault {
            cause: FaultCause::MemoryLimit,
            detail: format!(
                "plugin {plugin} hit its {} memory limit in {export}",
                human_bytes(state.memory_cap() as u64)
            ),
        };
    }
    if let Some(trap) = trap {
        let tail = last_line(&state.stderr_tail());
        let detail = match tail {
            Some(line) => format!("plugin {plugin} trapped in {export}: {trap} (guest stderr: {line})"),
            None => format!("plugin {plugin} trapped in {export}: {trap}"),
        };
        return Fault { cause: FaultCause::Trap, detail };
    }
    Fault { cause: FaultCause::Host, detail: format!("plugin {plugin} failed in {export}: {err:#}") }
}

/// What the guest last said on stderr, in one line: the message of a Rust
/// panic (`panicked at <place>: <message>`), else the last line that is not
/// a `note:`. Capped at 200 characters.
fn last_line(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let summary = match lines.iter().rposition(|l| l.contains(" panicked at ")) {
        Some(at) => {
            let place = lines[at].split(" panicked at ").nth(1).unwrap_or("").trim_end_matches(':');
            let message: Vec<&str> = lines[at + 1..].iter().copied().take_while(|l| !l.starts_with("note: ")).collect();
            if message.is_empty() {
                format!("panicked at {place}")
            } else {
                format!("panicked at {place}: {}", message.join(" "))
            }
        }
        None => lines.iter().rev().find(|l| !l.starts_with("note: "))?.to_string(),
    };
    let mut out: String = summary.chars().take(200).collect();
    if out.len() < summary.len() {
        out.push('…');
    }
    Some(out)
}

/// `64 MiB`, `512 KiB`, `100 bytes`.
pub fn human_bytes(n: u64) -> String {
    if n >= 1 << 30 && n.is_multiple_of(1 << 30) {
        format!("{} GiB", n >> 30)
    } else if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_picks_the_exact_unit() {
        assert_eq!(human_bytes(64 << 20), "64 MiB");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
        assert_eq!(human_bytes(1536), "1536 bytes");
        assert_eq!(human_bytes(2048), "2 KiB");
        assert_eq!(human_bytes(100), "100 bytes");
    }

    #[test]
    fn last_line_skips_blank_lines_and_truncates() {
        assert_eq!(last_line("a\nsomething broke\n\n"), Some("something broke".to_string()));
        let panic = "thread '<unnamed>' panicked at src/lib.rs:170:24:\nmisbehave: trap in done\n\
                     note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(last_line(panic), Some("panicked at src/lib.rs:170:24: misbehave: trap in done".to_string()));
        assert_eq!(last_line("  \n"), None);
        let long = "x".repeat(300);
        assert_eq!(last_line(&long).unwrap().chars().count(), 201);
    }
}
