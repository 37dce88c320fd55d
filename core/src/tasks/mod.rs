//! The background task registry and its vocabulary.
//!
//! [`types`] holds the producer contract and the snapshots consumers see;
//! [`registry`] holds the one concrete registry that owns every task;
//! [`peek`] the output it keeps so viewers can watch without consuming.

mod peek;
mod registry;
mod types;

pub use peek::{HELD_LIMIT, OutputPeek, TAIL_LIMIT};

pub use registry::{
    DEFAULT_MAX_FINISHED_TASKS_PER_OWNER, DEFAULT_MAX_LIVE_TASKS_PER_OWNER, DEFAULT_TEARDOWN_TIMEOUT, ListenerGuard,
    RegistryConfig, SurfaceGuard, TASK_EVENT_BUFFER, TaskDone, TaskDoneListener, TaskRegistry, WeakTaskRegistry,
};
pub use types::*;
