//! The background task registry and its vocabulary.

mod types;

pub use types::*;
