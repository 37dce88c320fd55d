//! The clock of a call into a guest: its deadline counts the guest's own
//! time, never the host's.
//!
//! Model: [`CallClock::arm`] gives the call its budget. Two kinds of time
//! are not the guest's, and pause the clock: a *host step* the guest waits
//! on ([`CallClock::host_step`]: a process spawn, a subagent start, a log
//! write), and the time a busy guest is parked at an epoch tick while the
//! executor runs other work ([`CallClock::yield_at_tick`]: on a loaded host
//! that wait is the scheduler's, not the guest's). When the clock resumes,
//! the deadline moves on by the pause. What the guest does itself (its code,
//! and waits it chose, such as WASI's `poll` or a sleep) is its own time.
//!
//! Invariants: a paused clock never expires; every pause ends (its guard
//! resumes the clock when the step ends, is cancelled or panics); a host
//! step has its own bound, and one that overruns it fails with an error
//! naming the step ([`HostStepOverran`]), never with a fault of the guest.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How long a process spawn by the host may take (`process.spawn`).
pub const SPAWN_BOUND: Duration = Duration::from_secs(30);

/// The clock of the call in progress on one store.
#[derive(Debug)]
pub struct CallClock {
    state: Mutex<ClockState>,
    /// Woken when a pause ends (the deadline moved).
    resumed: Notify,
}

#[derive(Debug)]
struct ClockState {
    armed_at: Instant,
    budget: Duration,
    /// The pauses of this call so far (a pause in progress not included).
    paused_total: Duration,
    deadline_at: Instant,
    /// Pauses in progress (a host step may nest in nothing else, but a
    /// tick's yield and a step never overlap; counted all the same).
    paused: u32,
    paused_since: Instant,
}

impl Default for CallClock {
    fn default() -> Self {
        let now = Instant::now();
        let state = ClockState {
            armed_at: now,
            budget: Duration::ZERO,
            paused_total: Duration::ZERO,
            deadline_at: now,
            paused: 0,
            paused_since: now,
        };
        Self { state: Mutex::new(state), resumed: Notify::new() }
    }
}

/// A host step took longer than its own bound.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the host's {step} took {} ms, over its own bound of {} ms: the host is overloaded, not the plugin at fault; \
     try again",
    took.as_millis(),
    bound.as_millis()
)]
pub struct HostStepOverran {
    pub step: &'static str,
    pub took: Duration,
    pub bound: Duration,
}

impl CallClock {
    fn state(&self) -> MutexGuard<'_, ClockState> {
        // Plain data: a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts a call with `budget` of the guest's own time.
    pub fn arm(&self, budget: Duration) {
        let now = Instant::now();
        let mut state = self.state();
        state.armed_at = now;
        state.budget = budget;
        state.paused_total = Duration::ZERO;
        state.deadline_at = now + budget;
        state.paused = 0;
        state.paused_since = now;
    }

    /// The call so far: `(wall time, the guest's own time, budget)`. The
    /// own time is the wall time less the pauses.
    pub fn times(&self) -> (Duration, Duration, Duration) {
        let state = self.state();
        let paused = state.paused_total + if state.paused > 0 { state.paused_since.elapsed() } else { Duration::ZERO };
        let wall = state.armed_at.elapsed();
        (wall, wall.saturating_sub(paused), state.budget)
    }

    /// True once the guest used its budget (never while paused).
    pub fn expired(&self) -> bool {
        let state = self.state();
        state.paused == 0 && Instant::now() >= state.deadline_at
    }

    /// True once the guest overran its budget by `slack` too (never while paused).
    pub fn overdue(&self, slack: Duration) -> bool {
        let state = self.state();
        state.paused == 0 && Instant::now() >= state.deadline_at + slack
    }

    /// When the budget runs out, unless a pause moves it; `None` while paused.
    pub fn deadline(&self) -> Option<Instant> {
        let state = self.state();
        (state.paused == 0).then_some(state.deadline_at)
    }

    /// Resolves when a pause ends. Register it (`enable`) before reading
    /// [`Self::deadline`], so an end in between is not missed.
    pub fn resumed(&self) -> tokio::sync::futures::Notified<'_> {
        self.resumed.notified()
    }

    /// Stops the clock until the returned guard drops.
    fn pause(self: &Arc<Self>) -> Pause {
        let mut state = self.state();
        if state.paused == 0 {
            state.paused_since = Instant::now();
        }
        state.paused += 1;
        Pause(self.clone())
    }

    fn resume(&self) {
        {
            let mut state = self.state();
            state.paused -= 1;
            if state.paused == 0 {
                let paused = state.paused_since.elapsed();
                state.deadline_at += paused;
                state.paused_total += paused;
            }
        }
        self.resumed.notify_waiters();
    }

    /// Runs `step`, a piece of the host's own work the guest waits on
    /// (`what` names it: `process spawn`): the guest's clock stands still
    /// meanwhile, and the step has its own `bound`. A step that overruns it
    /// fails with [`HostStepOverran`] (dropped at its bound when it waits;
    /// one that never yields is judged when it returns, its result dropped).
    pub async fn host_step<T>(
        self: &Arc<Self>,
        what: &'static str,
        bound: Duration,
        step: impl Future<Output = T>,
    ) -> Result<T, HostStepOverran> {
        let _pause = self.pause();
        let started = Instant::now();
        let done = tokio::time::timeout(bound, step).await;
        let took = started.elapsed();
        tracing::debug!(
            step = what,
            took_ms = took.as_millis() as u64,
            "host step done; the plugin's clock stood still"
        );
        match done {
            Ok(value) if took <= bound => Ok(value),
            _ => {
                tracing::warn!(
                    step = what,
                    took_ms = took.as_millis() as u64,
                    bound_ms = bound.as_millis() as u64,
                    "a host step overran its bound"
                );
                Err(HostStepOverran { step: what, took, bound })
            }
        }
    }

    /// Runs a synchronous host step with the guest's clock standing still.
    pub fn host_step_now<T>(self: &Arc<Self>, step: impl FnOnce() -> T) -> T {
        let _pause = self.pause();
        step()
    }

    /// What a busy guest does at an epoch tick: it yields to the executor,
    /// and the time until it runs again is not its own.
    pub fn yield_at_tick(self: &Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let pause = self.pause();
        Box::pin(async move {
            tokio::task::yield_now().await;
            drop(pause);
        })
    }
}

/// Ends a pause when dropped.
struct Pause(Arc<CallClock>);

impl Drop for Pause {
    fn drop(&mut self) {
        self.0.resume();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_host_step_moves_the_deadline_by_its_length() {
        let clock = Arc::new(CallClock::default());
        clock.arm(Duration::from_millis(50));
        let before = clock.deadline().unwrap();
        clock
            .host_step("test step", Duration::from_secs(5), tokio::time::sleep(Duration::from_millis(80)))
            .await
            .unwrap();
        assert!(!clock.expired(), "80 ms of host work did not use the guest's 50 ms");
        let moved = clock.deadline().unwrap() - before;
        assert!(moved >= Duration::from_millis(80), "{moved:?}");
    }

    #[tokio::test]
    async fn a_paused_clock_never_expires_and_a_step_over_its_bound_names_itself() {
        let clock = Arc::new(CallClock::default());
        clock.arm(Duration::ZERO);
        let step = clock.host_step("process spawn", Duration::from_millis(20), std::future::pending::<()>());
        let overran = step.await.unwrap_err();
        assert_eq!(overran.step, "process spawn");
        assert!(overran.to_string().starts_with("the host's process spawn took "), "{overran}");
        assert!(overran.to_string().contains("not the plugin at fault"), "{overran}");
        // A step that never yields is judged when it returns.
        let blocking = clock.host_step("process spawn", Duration::from_millis(5), async {
            std::thread::sleep(Duration::from_millis(20));
        });
        assert!(blocking.await.is_err());
        let pause = clock.pause();
        std::thread::sleep(Duration::from_millis(5));
        assert!(!clock.expired() && clock.deadline().is_none(), "paused");
        drop(pause);
        assert!(clock.expired(), "running again, its zero budget is spent");
    }
}
