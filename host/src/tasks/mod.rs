//! The background task registry and its vocabulary.
//!
//! [`types`] holds the producer contract and the snapshots consumers see;
//! [`registry`] holds the one concrete registry that owns every task.

mod registry;
mod types;

pub use registry::{ListenerGuard, RegistryConfig, SurfaceGuard, TaskDone, TaskDoneListener, TaskRegistry};
pub use types::*;
