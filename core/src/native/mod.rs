//! Native producers: kinds of background work written in Rust and run in
//! process, through the same [`crate::producer::Producer`] contract as
//! WebAssembly plugins, so embedders can mix the two and benchmarks can
//! compare them.
//!
//! - [`ticker`]: the twin of the `ticker` plugin in `plugins/ticker` (same semantics).
//! - [`scripted`]: a kind whose every move a test or a demo controls.

#[cfg(any(test, feature = "testing"))]
pub mod scripted;
pub mod ticker;
