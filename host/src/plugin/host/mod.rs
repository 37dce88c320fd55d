//! The host side of the WIT world: every interface a plugin may import
//! beyond WASI, one module per capability, each implemented on a *view* of
//! the task store (as wasmtime-wasi implements WASI on `WasiCtxView`).
//!
//! - [`log`]: `host-log`, into `tracing`.
//! - [`process`]: the `process` capability (the `taskhost-process` crate).
//! - [`subagents`]: the `subagents` capability ([`crate::subagents`]).
//! - [`http`]: `wasi:http` (wasmtime-wasi-http), checked by [`crate::outbound`].
//! - [`v0_1`]: the same three at the frozen contract 0.1.0, delegating to
//!   the modules above (the linker holds both versions side by side).
//!
//! The per-store state and guest-held resources they hand out live in
//! [`super::resources`], which the bindings name (so it depends on neither).
//!
//! The host's own work a guest waits on (a process spawn, a subagent start,
//! a log write) runs as a host step of the store's call clock
//! ([`super::clock`]): the guest's deadline stands still meanwhile, and the
//! step has a bound of its own.
//!
//! Adding a capability: its WIT in `wit/`, a `with:` entry in
//! [`super::bindings`] for its resources (defined in [`super::resources`]), a module here with a view type and
//! `add_to_linker`, its per-store state in [`StoreState`], one line in
//! [`linker`], and its name in [`PROVIDED_IMPORTS`].

pub mod http;
pub mod log;
pub mod process;
pub mod subagents;
pub mod v0_1;

use wasmtime::component::Linker;

use super::engine::PluginEngine;
use super::state::StoreState;

fn log_view(state: &mut StoreState) -> log::LogView<'_> {
    log::LogView { tag: &state.tag, clock: &state.clock }
}

fn process_view(state: &mut StoreState) -> process::ProcessView<'_> {
    process::ProcessView {
        ctx: &mut state.process,
        table: &mut state.table,
        plugin: &state.tag.plugin,
        clock: &state.clock,
    }
}

fn subagents_view(state: &mut StoreState) -> subagents::SubagentsView<'_> {
    subagents::SubagentsView {
        grant: state.subagents.as_ref(),
        table: &mut state.table,
        tag: &state.tag,
        clock: &state.clock,
    }
}

fn http_view(state: &mut StoreState) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
    wasmtime_wasi_http::WasiHttpCtxView {
        ctx: &mut state.http.wasi,
        table: &mut state.table,
        hooks: &mut state.http.hooks,
    }
}

/// Assembles every host import a plugin may use: WASI 0.2 (sandboxed by the
/// context in [`StoreState`]), `taskhost:producer/host-log` and the
/// `subagents` capability (refused unless the store was granted it). Capabilities
/// add their interfaces here.
pub fn linker(engine: &PluginEngine) -> anyhow::Result<Linker<StoreState>> {
    let mut linker = Linker::new(engine.engine());
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    log::add_to_linker(&mut linker, log_view)?;
    process::add_to_linker(&mut linker, process_view)?;
    subagents::add_to_linker(&mut linker, subagents_view)?;
    http::add_to_linker(&mut linker, http_view)?;
    v0_1::add_to_linker(&mut linker, log_view, process_view, subagents_view)?;
    Ok(linker)
}

/// The interfaces [`linker`] provides, for error messages.
pub const PROVIDED_IMPORTS: &str = "wasi:io, wasi:clocks, wasi:random, wasi:cli (no env, args or stdin), \
     wasi:filesystem (no preopens), wasi:sockets (all denied) at 0.2.x, wasi:http/outgoing-handler and \
     wasi:http/types at 0.2.x (only with [producer.grants.http]), taskhost:producer/host-log@0.2.2, \
     taskhost:producer/process@0.2.2 and taskhost:producer/subagents@0.2.2 (both refused unless granted), \
     and the same three at the previous contract (taskhost:producer/host-log@0.1.0, \
     taskhost:producer/process@0.1.0, taskhost:producer/subagents@0.1.0)";
