//! The background task registry and its vocabulary.
//!
//! [`types`] holds the producer contract and the snapshots consumers see;
//! [`registry`] holds the one concrete registry that owns every task.

mod registry;
mod types;

pub use registry::{
    DEFAULT_MAX_FINISHED_TASKS_PER_OWNER, DEFAULT_MAX_LIVE_TASKS_PER_OWNER, DEFAULT_TEARDOWN_TIMEOUT, ListenerGuard,
    RegistryConfig, SurfaceGuard, TASK_EVENT_BUFFER, TaskDone, TaskDoneListener, TaskRegistry, WeakTaskRegistry,
};
pub use types::*;
