//! The background task registry and its vocabulary.
//!
//! [`types`] holds the producer contract and the snapshots consumers see;
//! [`registry`] holds the one concrete registry that owns every task;
//! [`output`] the output it keeps of each stream task (reads, views and
//! peeks are served from it); [`peek`] what a viewer's peek returns;
//! [`store`] where the registry records what outlives the process;
//! [`replica`] where it copies output a cluster keeps beyond it;
//! [`stop_cause`] who asked a task to stop.

mod output;
mod peek;
mod registry;
pub mod replica;
mod stop_cause;
pub mod store;
mod types;

pub use output::{
    DEFAULT_OUTPUT_MEMORY_BYTES, DEFAULT_OUTPUT_MEMORY_TOTAL_BYTES, DEFAULT_OUTPUT_READ_BYTES,
    DEFAULT_OUTPUT_SPILL_BYTES, DEFAULT_VIEW_LINES, LINE_LIMIT, MAX_VIEW_LINES, OutputFile, OutputFiles, OutputLimits,
    SectionLabel, VIEW_LIMIT, ViewKind, ViewRequest,
};
pub use peek::{OutputPeek, TAIL_LIMIT};

pub use registry::{
    AbortedWait, DEFAULT_MAX_FINISHED_TASKS_PER_OWNER, DEFAULT_MAX_LIVE_TASKS_PER_OWNER, DEFAULT_TEARDOWN_TIMEOUT,
    ListenerGuard, NOTICE_LINE_LIMIT, RegistryConfig, SurfaceGuard, TASK_EVENT_BUFFER, TTL_MS_RANGE, TaskDone,
    TaskDoneListener, TaskRegistry, WeakTaskRegistry, seconds, warning_lead,
};
pub use types::*;
