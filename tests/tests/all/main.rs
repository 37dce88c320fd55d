//! taskhost end to end with its real built plugins and the misbehaving
//! fixture plugins: one binary, one module per suite (as wasmtime's
//! `crates/wasi/tests/all`), so wasmtime is linked once.

mod architecture;
mod artifacts;
mod bash;
mod bash_env;
mod busy_guest;
mod compile_cache;
mod contract_versions;
mod control_tools;
mod docs_config;
mod grant_programs;
mod http;
mod http_as_nobody;
mod plugin_bounds;
mod plugin_errors;
mod polyglot;
mod reload;
mod reload_watch;
mod subagent_plugin;
mod subagents;
mod subagents_acp;
mod subagents_openai;
mod task_input;
mod wasm_runtime;
