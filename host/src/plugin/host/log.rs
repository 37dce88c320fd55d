//! The `taskhost:producer/host-log` WIT interface: a plugin's log lines
//! become `tracing` events tagged with the plugin, its version and the store.
//!
//! Invariant: each message is cut to `bounds::MAX_LOG_LINE_BYTES` with a
//! visible notice, so a plugin cannot flood the host's log with one line;
//! writing it is the host's time, not the plugin's ([`CallClock`]).

use std::sync::Arc;

use wasmtime::component::{HasData, Linker};

use crate::plugin::bindings::taskhost::producer::host_log;
use crate::plugin::clock::CallClock;
use crate::plugin::state::StoreTag;

/// What a log call sees of its store.
pub struct LogView<'a> {
    pub tag: &'a StoreTag,
    /// The call's clock: writing the line is the host's time.
    pub clock: &'a Arc<CallClock>,
}

struct LogData;

impl HasData for LogData {
    type Data<'a> = LogView<'a>;
}

/// Adds the interface to a linker whose store data yields a [`LogView`].
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> LogView<'_>,
) -> wasmtime::Result<()> {
    host_log::add_to_linker::<T, LogData>(linker, view)
}

impl host_log::Host for LogView<'_> {
    async fn log(&mut self, level: host_log::Level, message: String) -> wasmtime::Result<()> {
        let message = crate::plugin::bounds::cap(message, crate::plugin::bounds::MAX_LOG_LINE_BYTES, "log line");
        self.clock.host_step_now(|| emit(self.tag, level, &message));
        Ok(())
    }
}

/// Writes one guest log line as a `tracing` event.
fn emit(tag: &StoreTag, level: host_log::Level, message: &str) {
    let (plugin, version, purpose) = (&*tag.plugin, &*tag.version, &*tag.purpose);
    match level {
        host_log::Level::Trace => {
            tracing::trace!(target: "taskhost::plugin::guest", plugin, version, store = purpose, "{message}")
        }
        host_log::Level::Debug => {
            tracing::debug!(target: "taskhost::plugin::guest", plugin, version, store = purpose, "{message}")
        }
        host_log::Level::Info => {
            tracing::info!(target: "taskhost::plugin::guest", plugin, version, store = purpose, "{message}")
        }
        host_log::Level::Warn => {
            tracing::warn!(target: "taskhost::plugin::guest", plugin, version, store = purpose, "{message}")
        }
        host_log::Level::Error => {
            tracing::error!(target: "taskhost::plugin::guest", plugin, version, store = purpose, "{message}")
        }
    }
}
