//! The registry's guards: values whose drop undoes what they hold (a
//! listener, a control surface, a start's reservation, a pending reporter,
//! a settlement still telling of its end).
//!
//! Invariants: a guard that is dropped without having been disarmed gives
//! back what it held, so a start that fails or a caller that goes away never
//! leaks a live-task slot or suppresses a completion notice.

use super::state::{Record, Reporting, bucket_mut};
use super::*;

pub(super) struct ListenerSlot {
    pub(super) active: std::sync::atomic::AtomicBool,
    pub(super) listener: TaskDoneListener,
}

/// Keeps a listener registered; dropping it unregisters the listener, after
/// which it never fires again.
#[must_use = "dropping the guard unregisters the listener"]
pub struct ListenerGuard {
    registry: Weak<Shared>,
    slot: Arc<ListenerSlot>,
}

impl Drop for ListenerGuard {
    fn drop(&mut self) {
        self.slot.active.store(false, std::sync::atomic::Ordering::SeqCst);
        if let Some(shared) = self.registry.upgrade() {
            shared.listeners.lock().expect("listeners poisoned").retain(|s| !Arc::ptr_eq(s, &self.slot));
        }
    }
}

/// Keeps a control surface attached; see [`TaskRegistry::attach_surface`].
#[must_use = "dropping the guard detaches the surface"]
pub struct SurfaceGuard {
    registry: Weak<Shared>,
    name: String,
}

impl Drop for SurfaceGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.registry.upgrade() {
            shared.lock().surfaces -= 1;
            tracing::debug!(surface = %self.name, "control surface detached");
        }
    }
}

impl TaskRegistry {
    /// Declares that a control surface (something that can read and stop
    /// tasks) is loaded. `start` refuses while none is attached, so no work
    /// can start that nobody could collect.
    pub fn attach_surface(&self, name: impl Into<String>) -> SurfaceGuard {
        let name = name.into();
        self.shared.lock().surfaces += 1;
        tracing::debug!(surface = %name, "control surface attached");
        SurfaceGuard { registry: Arc::downgrade(&self.shared), name }
    }

    /// Registers a listener called once per settled task with its terminal
    /// snapshot. Listeners are contained: a panicking listener is logged and
    /// the others still run. Dropping the guard unregisters it for good.
    pub fn on_task_done(&self, listener: TaskDoneListener) -> ListenerGuard {
        let slot = Arc::new(ListenerSlot { active: true.into(), listener });
        self.shared.listeners.lock().expect("listeners poisoned").push(slot.clone());
        ListenerGuard { registry: Arc::downgrade(&self.shared), slot }
    }
}

/// A start that passed preflight. Dropped without commit (the runner failed
/// or the start future was dropped), it gives its reservation back.
pub(super) struct Reservation {
    pub(super) registry: Weak<Shared>,
    pub(super) bucket_key: Option<u64>,
    pub(super) armed: bool,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(shared) = self.registry.upgrade() {
            let mut state = shared.lock();
            release_start(&mut state, &shared, self.bucket_key);
        }
    }
}

/// A start in flight ended (committed or given back). Only a cleanup or a
/// disposal waits for starts to drain, and each marks its scope closing (or
/// the registry disposed) before it looks, so nobody else is woken.
pub(super) fn release_start(state: &mut State, shared: &Shared, bucket_key: Option<u64>) {
    match bucket_key {
        None => state.unowned.starting -= 1,
        Some(key) => {
            if let Some(scope) = state.owner_scopes.get_mut(&key) {
                scope.bucket.starting -= 1;
                if scope.closing && scope.bucket.starting == 0 {
                    scope.starts_drained.notify_one();
                }
            }
        }
    }
    state.starts_in_flight -= 1;
    if state.disposed && state.starts_in_flight == 0 {
        shared.starts_drained.notify_waiters();
    }
}

/// A wait or kill in progress. If its future is dropped before it delivered
/// (the caller went away), it un-counts itself and hands back an end held
/// for it.
pub(super) struct PendingReporter<'a> {
    pub(super) registry: &'a TaskRegistry,
    /// The tasks it reports on: one for a wait or a kill, several for a
    /// wait for any.
    pub(super) ids: &'a [TaskId],
    /// A wait's ticket; `None` for a kill (counted, with no entry).
    pub(super) wait: Option<u64>,
    pub(super) armed: bool,
}

impl Drop for PendingReporter<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let held = {
            let mut held = Vec::new();
            let mut state = self.registry.shared.lock();
            for id in self.ids {
                let Some(record) = state.tasks.get_mut(id) else { continue };
                match self.wait {
                    Some(ticket) => {
                        record.end_wait(ticket);
                    }
                    None => record.pending_reporters -= 1,
                }
                held.extend(release_reporter(record));
            }
            HeldEnd::count(&self.registry.shared, &mut state, held)
        };
        self.registry.tell_listeners(held);
    }
}

/// After a reporter left without delivering: if the task settled while
/// reporters were pending and none is left to deliver, the end is untold
/// again and its listeners (the completion notice) are owed it.
pub(super) fn release_reporter(record: &mut Record) -> Option<TaskDone> {
    if record.reporting == Reporting::Held && record.pending_reporters == 0 {
        record.reporting = Reporting::Untold;
        return Some(record.done_event());
    }
    None
}

/// One settlement telling of its end: counted in [`State::telling`] and in
/// its bucket's [`telling`](super::state::Bucket::telling) from the moment
/// its record turned terminal (or its held end was delivered or handed
/// back) until dropped, after its listeners, subscribers and waiters were
/// told.
pub(super) struct Telling<'a> {
    shared: &'a Shared,
    /// The bucket it counts in (`Some(None)`: the unowned one), if any.
    bucket: Option<Option<u64>>,
}

impl<'a> Telling<'a> {
    /// Counts one telling in the registry and in the bucket of `bucket_key`
    /// (`None`: no bucket; `Some(None)`: the unowned one) when it still
    /// exists; under the lock, in the same hold as the transition that made
    /// the end due, so a cleanup or disposal that saw the transition also
    /// waits for the telling.
    pub(super) fn count(shared: &'a Shared, state: &mut State, bucket_key: Option<Option<u64>>) -> Self {
        let bucket = bucket_key.filter(|&key| bucket_mut(state, key).map(|bucket| bucket.telling += 1).is_some());
        state.telling += 1;
        Self { shared, bucket }
    }
}

/// A held end ([`Reporting::Held`]) that was delivered or handed back, to
/// tell the listeners of outside the lock: counted as telling until told.
pub(super) struct HeldEnd<'a> {
    pub(super) done: TaskDone,
    _telling: Telling<'a>,
}

impl<'a> HeldEnd<'a> {
    /// Counts the held ends `done` (whose records are still in `state`) as
    /// telling; call under the lock that saw them become due.
    pub(super) fn count(shared: &'a Shared, state: &mut State, done: impl IntoIterator<Item = TaskDone>) -> Vec<Self> {
        done.into_iter()
            .map(|done| {
                let bucket_key = state.tasks.get(&done.snapshot.id).map(Record::bucket_key);
                Self { _telling: Telling::count(shared, state, bucket_key), done }
            })
            .collect()
    }
}

impl Drop for Telling<'_> {
    fn drop(&mut self) {
        // Not `Shared::lock`: this may run while a panic unwinds.
        let mut state = self.shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.telling -= 1;
        let mut awaited = state.disposed;
        // A bucket that counts it outlives the count: its cleanup waits.
        if let Some(key) = self.bucket
            && let Some(bucket) = bucket_mut(&mut state, key)
        {
            bucket.telling -= 1;
        }
        if let Some(scope) = self.bucket.flatten().and_then(|key| state.owner_scopes.get(&key)) {
            awaited |= scope.closing;
        }
        drop(state);
        // Only a closing scope or a disposal waits: a settlement that ended
        // after the waiter looked finds the flag it set first.
        if awaited {
            self.shared.settlements_told.notify_waiters();
        }
    }
}
