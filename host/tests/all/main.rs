//! The integration tests of the `taskhost` crate that drive its binary
//! (`taskhost serve`, `dev`, the CLI) as a client would: one binary, one
//! module per suite. Everything else end to end lives in `tests/`.

mod cli;
mod cli_new;
mod cli_plugin;
mod cluster;
mod cluster_dashboard;
mod cluster_failure;
mod cluster_serving;
mod cold_start;
mod common;
mod dashboard;
mod dev_store;
mod dev_watch;
mod durable;
mod durable_output;
mod http_limits;
mod http_wait;
mod launch_fence;
mod mcp_ext_tasks;
mod mcp_http;
mod mcp_http_wire;
mod mcp_input;
mod mcp_output;
mod mcp_python;
mod mcp_stdio;
mod mcp_stdio_wire;
mod mcp_tasks;
mod mcp_ttl;
mod nats;
mod readopt;
mod readopt_options;
mod retention;
mod sandbox_attacks;
mod sandbox_everyday;
mod sandbox_limits;
mod sandbox_terminal;
mod state_full;
mod state_trust;
