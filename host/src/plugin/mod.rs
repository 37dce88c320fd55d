//! The WebAssembly plugin runtime: producers as sandboxed components.
//!
//! Model: one [`PluginEngine`] (wasmtime, async, epoch deadlines, pooling
//! allocator, compile cache) loads plugin files or bytes into immutable
//! [`PluginVersion`]s (validated against the `taskhost:producer/plugin`
//! world, pre-instantiated once). A [`WasmProducer`] serves one tool instance
//! (version + config) through [`taskhost_core::producer::Producer`]: one store per
//! task, driven by its own driver task that owns the store.
//!
//! Invariants: a plugin never runs outside a per-call deadline and a memory
//! cap; a fault in any export fails only the task it happened in; a task stays
//! on the version that started it across reloads.
//!
//! Submodules: [`engine`] (engine, config, epoch ticker), [`cache`] (the
//! verified compile cache), [`bounds`] (caps on plugin strings, the spin
//! back-off), [`bindings`]
//! (generated from `wit/`), [`preflight`] (the contract check before compiling), [`state`] (store data, sandboxed WASI), [`host`] (the
//! host imports, one module per capability, on views of the store),
//! [`resources`] (per-store capability state and guest-held resources), [`component`] (load, validate, cache), [`clock`]
//! (a call's deadline counts the guest's own time), [`fault`] (deadlines and
//! fault details), [`producer`] (the `Producer` impl), `driver` (the per-task
//! loop), [`check`] (`taskhost check`).

pub mod bindings;
pub mod bounds;
pub mod cache;
pub mod check;
pub mod clock;
pub mod component;
pub mod contract;
mod driver;
pub mod engine;
pub mod fault;
pub mod host;
pub mod preflight;
pub mod producer;
pub mod resources;
pub mod state;
mod versions;

pub use check::{CheckReport, check_plugin, check_plugin_with};
pub use component::{CompileSource, PluginSource, PluginVersion};
pub use contract::ContractVersion;
pub use engine::{PluginEngine, PluginRuntimeConfig};
pub use producer::{ServingVersion, WasmProducer};
