//! Pollables of the standard WASI bindings (the `wasip2` crate) as the SDK's
//! [`Pollable`], so a task waiting on a `wasi:http` response or body stream
//! hands the host that readiness from `subscribe` (feature `wasip2`).
//!
//! Invariants: both types are bindings of the one `wasi:io/poll` import of
//! the component (the `wasip2` crate and the SDK's `wit/deps` name the same
//! WASI 0.2 version, and the component linker merges semver-compatible
//! imports into one), so a handle of one is a handle of the other. The
//! conversion moves ownership: the handle is taken out of the `wasip2` value
//! and never dropped twice.

use crate::Pollable;

impl From<wasip2::io::poll::Pollable> for Pollable {
    fn from(pollable: wasip2::io::poll::Pollable) -> Self {
        // SAFETY: the handle is an owned `wasi:io/poll.pollable` of this
        // component's single `wasi:io/poll` import (module docs), taken out
        // of `pollable`, which therefore no longer drops it.
        unsafe { Pollable::from_handle(pollable.take_handle()) }
    }
}
