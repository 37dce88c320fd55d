//! Test support (the `testing` feature): what the suites of every crate
//! need to check process trees from the outside.
//!
//! - [`procfs`]: finding a test's processes through `/proc`.
//! - [`as_user`]: running a binary as another user (`setpriv`).

pub mod as_user;
pub mod procfs;
