//! The integration tests of `taskhost-core`: one binary, one module per
//! suite (as wasmtime's `tests/all`). They link no plugin runtime, so they
//! build in seconds.

mod model_surface;
mod output_memory;
mod registry;
mod registry_peek;
mod store;
mod stress;
mod ttl;
