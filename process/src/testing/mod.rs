//! Test support (the `testing` feature): what the suites of every crate
//! need to check process trees from the outside.
//!
//! - [`procfs`]: finding a test's processes through `/proc`.

pub mod procfs;
