//! Surfaces: the ways in to a running [`crate::Host`] besides the Rust API.
//!
//! - [`mcp`]: every tool over the Model Context Protocol (`taskhost serve`).

pub mod mcp;
