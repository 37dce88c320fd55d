//! Logging into the host's `tracing` output through the `host-log` import.
//!
//! The host tags every record with the plugin and the task, so messages need
//! not repeat them. Each call is one call into the host; the host drops
//! records below its filter, but the message is still formatted in the guest,
//! so keep logging out of hot paths.
//!
//! ```ignore
//! use taskhost_plugin_sdk::log;
//! log::info!("started {} ticks", count);
//! log::debug!("cancelled: {reason:?}");
//! ```

pub use crate::host_log::Level;

/// Records `message` at `level`. The macros below are shorthands for it.
pub fn log(level: Level, message: &str) {
    crate::host_log::log(level, message);
}

#[doc(hidden)]
#[macro_export]
macro_rules! __taskhost_log {
    ($level:expr, $($arg:tt)+) => {
        $crate::log::log($level, &::std::format!($($arg)+))
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __taskhost_trace {
    ($($arg:tt)+) => { $crate::__taskhost_log!($crate::log::Level::Trace, $($arg)+) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __taskhost_debug {
    ($($arg:tt)+) => { $crate::__taskhost_log!($crate::log::Level::Debug, $($arg)+) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __taskhost_info {
    ($($arg:tt)+) => { $crate::__taskhost_log!($crate::log::Level::Info, $($arg)+) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __taskhost_warn {
    ($($arg:tt)+) => { $crate::__taskhost_log!($crate::log::Level::Warn, $($arg)+) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __taskhost_error {
    ($($arg:tt)+) => { $crate::__taskhost_log!($crate::log::Level::Error, $($arg)+) };
}

// `#[macro_export]` puts macros at the crate root; these aliases give them
// the `log::info!` paths plugin authors expect.
#[doc(inline)]
pub use crate::__taskhost_debug as debug;
#[doc(inline)]
pub use crate::__taskhost_error as error;
#[doc(inline)]
pub use crate::__taskhost_info as info;
#[doc(inline)]
pub use crate::__taskhost_trace as trace;
#[doc(inline)]
pub use crate::__taskhost_warn as warn;
