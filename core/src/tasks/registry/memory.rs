//! The host-wide bound on output kept in memory
//! ([`OutputLimits::memory_total_bytes`]): every stream task's log counts
//! its memory window in one meter; beyond the bound, logs leave memory for
//! good (their output lives in their log files: reads and views go on from
//! there), the oldest finished tasks first, then the oldest live ones.
//!
//! Invariants: a log is never made to leave memory while someone holds it
//! (a read, a view, the drain appending to it): it is passed over, and the
//! next one goes. One enforcement runs at a time; while the meter is under
//! the bound, enforcing costs one atomic load.

use std::collections::VecDeque;

use super::output_ops::StreamOutput;
use super::state::Record;
use super::*;
use crate::tasks::output::MemoryMeter;

pub(super) struct OutputMemory {
    limit: usize,
    meter: Arc<MemoryMeter>,
    /// Finished tasks' logs still in memory, oldest settlement first.
    finished: Mutex<VecDeque<Weak<StreamOutput>>>,
    /// Held by the enforcement running.
    enforcing: Mutex<()>,
}

impl OutputMemory {
    pub(super) fn new(limit: usize) -> Self {
        Self { limit, meter: Arc::default(), finished: Mutex::default(), enforcing: Mutex::default() }
    }

    pub(super) fn meter(&self) -> Arc<MemoryMeter> {
        self.meter.clone()
    }

    pub(super) fn used(&self) -> usize {
        self.meter.used()
    }

    fn over(&self) -> bool {
        self.meter.used() > self.limit
    }

    /// A task settled: its log is among the first to leave memory.
    pub(super) fn finished(&self, log: &Arc<StreamOutput>) {
        self.finished.lock().expect("output memory poisoned").push_back(Arc::downgrade(log));
    }
}

impl TaskRegistry {
    /// Brings the output kept in memory back under the bound, if it is over.
    pub(super) fn enforce_output_memory(&self) {
        let memory = &self.shared.output_memory;
        if !memory.over() {
            return;
        }
        let Ok(_enforcing) = memory.enforcing.try_lock() else { return };
        // The oldest finished tasks first.
        let mut busy = Vec::new();
        while memory.over() {
            let next = memory.finished.lock().expect("output memory poisoned").pop_front();
            let Some(next) = next else { break };
            let Some(log) = next.upgrade() else { continue };
            match log.try_lock() {
                Ok(mut output) => {
                    let freed = output.log.evict();
                    tracing::debug!(
                        freed,
                        used = memory.used(),
                        limit = memory.limit,
                        "a finished task's output left memory"
                    );
                }
                Err(_) => busy.push(next),
            }
        }
        if !busy.is_empty() {
            let mut finished = memory.finished.lock().expect("output memory poisoned");
            for log in busy.into_iter().rev() {
                finished.push_front(log);
            }
        }
        if !memory.over() {
            return;
        }
        // Then the live ones, oldest first.
        let live: Vec<Arc<StreamOutput>> = {
            let state = self.shared.lock();
            let mut live: Vec<&Record> =
                state.tasks.values().filter(|r| !r.status.is_terminal() && r.output_log.is_some()).collect();
            live.sort_by_key(|r| r.seq);
            live.into_iter().filter_map(|r| r.output_log.clone()).collect()
        };
        for log in live {
            if !memory.over() {
                break;
            }
            if let Ok(mut output) = log.try_lock()
                && !output.log.is_evicted()
            {
                let freed = output.log.evict();
                tracing::debug!(freed, used = memory.used(), limit = memory.limit, "a live task's output left memory");
            }
        }
        if memory.over() {
            tracing::debug!(
                used = memory.used(),
                limit = memory.limit,
                "output memory over its bound: every other log is busy"
            );
        }
    }
}
