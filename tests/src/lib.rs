//! Shared support for taskhost's end-to-end tests: where the real plugins and
//! the misbehaving fixture plugins are.
//!
//! `build.rs` builds the fixture workspace `fixtures/` from source for
//! `wasm32-wasip2` (nothing built is committed); the host crate does the
//! same for the real plugins and embeds them. Every path here is absolute
//! and exists once the crate has built.
//!
//! - Real plugins: [`TICKER_PATH`] / [`TICKER_WASM`] (re-exported from
//!   [`taskhost::builtin`]).
//! - Fixtures: [`fixtures::MISBEHAVE_PATH`] (a fault chosen per export by its
//!   config and arguments), [`fixtures::WRONG_WORLD_PATH`] (a valid
//!   component of another world), [`fixtures::NOT_A_COMPONENT_WAT_PATH`] (a
//!   core module as WAT text: compile it with `wat::parse_file`). A truncated
//!   component is made at run time with [`truncated`].

pub use taskhost::builtin::{TICKER_PATH, TICKER_WASM};

/// Paths of the fixture plugins.
pub mod fixtures {
    include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

    /// A core WebAssembly module (not a component), as WAT text.
    pub const NOT_A_COMPONENT_WAT_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/not-a-component.wat");
}

/// The first half of `component`: a file a host must refuse to load, not
/// crash on.
pub fn truncated(component: &[u8]) -> Vec<u8> {
    component[..component.len() / 2].to_vec()
}
