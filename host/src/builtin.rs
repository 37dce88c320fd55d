//! The plugins built into the `taskhost` binary.
//!
//! `build.rs` compiles the guest workspace `plugins/` for `wasm32-wasip2`
//! and embeds each built-in plugin's component with `include_bytes!`, so the
//! binary runs its built-in kinds with no files beside it. The path of each
//! built component is kept too, for tests and `taskhost check`, but it points
//! into the build's target directory and is only meaningful on the machine
//! that built the binary; use the bytes at run time.
//!
//! The generated constants are, per plugin `<name>` (upper-cased):
//! `<NAME>_WASM: &[u8]`, `<NAME>_PATH: &str` and `<NAME>_SHA256: &str`,
//! e.g. [`TICKER_WASM`], [`TICKER_PATH`] and [`TICKER_SHA256`];
//! [`BUILTIN_PLUGINS`] lists them all.
//!
//! Invariant: a plugin's `sha256` is the SHA-256 of its `wasm`, computed by
//! `build.rs` from the very bytes it embeds (a copy in `OUT_DIR`), so a start
//! keys the descriptor cache by it without hashing the bytes again (checked
//! by `host/tests/all/cold_start.rs`).

/// One plugin built into the binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuiltinPlugin {
    /// The guest crate's name (`ticker`), which is how a configuration names it.
    pub name: &'static str,
    /// Where the build wrote the component (valid on the build machine only).
    pub path: &'static str,
    /// The component itself.
    pub wasm: &'static [u8],
    /// The SHA-256 of `wasm`, lower-case hex (what
    /// [`crate::plugin::component::content_hash`] returns for it).
    pub sha256: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/builtin_plugins.rs"));

/// The grants a built-in plugin runs with when its `[[producer]]` entry
/// grants nothing, written as a `[producer.grants]` table's body: data, so the
/// host's generic code never asks which plugin it serves.
const DEFAULT_GRANTS: &[(&str, &str)] = &[("subagent", "[subagents]\n")];

impl BuiltinPlugin {
    /// The grants this plugin gets from its default configuration, as the
    /// body of a `[producer.grants]` table (`None` for most; the
    /// configuration parses it: `crate::config::ProducerConfig::effective_grants`).
    pub fn default_grants(&self) -> Option<&'static str> {
        DEFAULT_GRANTS.iter().find(|(name, _)| *name == self.name).map(|(_, text)| *text)
    }
}

/// The built-in plugin called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static BuiltinPlugin> {
    BUILTIN_PLUGINS.iter().find(|plugin| plugin.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The WebAssembly preamble of a component: magic, then version 0x0d
    /// and layout 1 (a core module has version 1, layout 0).
    const COMPONENT_PREAMBLE: [u8; 8] = *b"\0asm\x0d\x00\x01\x00";

    #[test]
    fn every_builtin_plugin_is_an_embedded_component() {
        assert!(!BUILTIN_PLUGINS.is_empty());
        for plugin in BUILTIN_PLUGINS {
            assert!(plugin.wasm.starts_with(&COMPONENT_PREAMBLE), "{} is not a component", plugin.name);
            assert!(find(plugin.name).is_some());
        }
        assert_eq!(find("ticker").map(|plugin| plugin.wasm), Some(TICKER_WASM));
        assert!(find("no-such-plugin").is_none());
    }
}
