//! Host capabilities: the only ways a plugin reaches the outside world.
//!
//! A plugin has no ambient authority. Each capability is granted per plugin
//! instance in the host configuration, enforced here on every call, and every
//! object it hands out is owned by the calling task's store, so dropping the
//! store releases it (for processes: kills them).
//!
//! - [`process`]: start and supervise confined process trees.

pub mod process;
