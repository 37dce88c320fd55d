//! The WIT host side of `taskhost:producer/subagents`: what plugins import.
//!
//! Model: the grant is a [`Subagents`] service in the task store's data
//! ([`crate::plugin::state::StoreState::grant_subagents`]); a store without
//! it answers `start` with an error naming the missing grant. Each `run`
//! resource is a [`RunResource`] in the store's `ResourceTable`, wrapping a
//! [`RunGuard`].
//!
//! Invariants:
//! - A run lives in exactly one store. Dropping its handle (the guest drops
//!   it, or the store itself is dropped after the task settled, faulted or
//!   was abandoned) drops the guard, which starts disposal: no child outlives
//!   its task's store.
//! - Every method returns at once; waiting is done by the host on the
//!   pollable `subscribe` returns (ready when the result is in, or — once
//!   disposal started — when the child is released).

use wasmtime::component::Resource;
use wasmtime_wasi::p2::DynPollable;

use super::{RunGuard, RunResult, StartRequest, StopReason, SubagentRun, Subagents};
use crate::plugin::bindings::taskhost::producer::subagents::{
    self as wit, Host as WitHost, HostRun, RunResult as WitRunResult, StopReason as WitStopReason,
};
use crate::plugin::state::StoreState;

/// A child run held by a plugin task.
pub struct RunResource {
    run: RunGuard,
}

impl RunResource {
    pub fn run(&self) -> &SubagentRun {
        &self.run
    }
}

#[async_trait::async_trait]
impl wasmtime_wasi::p2::Pollable for RunResource {
    async fn ready(&mut self) {
        if self.run.is_disposing() {
            self.run.released().await;
        } else {
            tokio::select! {
                _ = self.run.wait_result() => {}
                // `dispose` may be called while a pollable made before it waits.
                () = self.run.released() => {}
            }
        }
    }
}

fn to_wit(result: RunResult) -> WitRunResult {
    let stop_reason = match result.stop_reason {
        StopReason::Completed => WitStopReason::Completed,
        StopReason::Aborted => WitStopReason::Aborted,
        StopReason::Error => WitStopReason::Error,
        StopReason::MaxTokens => WitStopReason::MaxTokens,
        StopReason::Refusal => WitStopReason::Refusal,
        StopReason::Other(other) => WitStopReason::Other(other),
    };
    WitRunResult { text: result.text, stop_reason, detail: result.detail }
}

impl StoreState {
    /// Grants this store the `subagents` capability.
    pub fn grant_subagents(&mut self, subagents: Subagents) {
        self.subagents = Some(subagents);
    }
}

impl WitHost for StoreState {
    async fn start(
        &mut self,
        description: String,
        prompt: String,
        profile: Option<String>,
    ) -> wasmtime::Result<Result<Resource<RunResource>, String>> {
        let Some(subagents) = self.subagents.clone() else {
            return Ok(Err(format!(
                "plugin {} is not granted the subagents capability: only subagent producer instances \
                 (plugin = \"builtin:subagent\") may start child runs",
                self.tag().plugin
            )));
        };
        let run = match subagents.start(StartRequest { description, prompt, profile }) {
            Ok(run) => run,
            Err(error) => return Ok(Err(format!("{error:#}"))),
        };
        tracing::debug!(plugin = &*self.tag().plugin, store = &*self.tag().purpose, child = %run.child().id(), "plugin started a subagent run");
        let guard = RunGuard(run);
        Ok(Ok(self.table().push(RunResource { run: guard })?))
    }
}

impl HostRun for StoreState {
    async fn subscribe(&mut self, run: Resource<RunResource>) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(self.table(), run)
    }

    async fn result(&mut self, run: Resource<RunResource>) -> wasmtime::Result<Option<WitRunResult>> {
        Ok(self.table().get(&run)?.run.result().map(to_wit))
    }

    async fn cancel(&mut self, run: Resource<RunResource>, reason: Option<String>) -> wasmtime::Result<()> {
        self.table().get(&run)?.run.cancel(reason);
        Ok(())
    }

    async fn dispose(&mut self, run: Resource<RunResource>) -> wasmtime::Result<()> {
        self.table().get(&run)?.run.start_dispose();
        Ok(())
    }

    async fn released(&mut self, run: Resource<RunResource>) -> wasmtime::Result<bool> {
        Ok(self.table().get(&run)?.run.is_released())
    }

    async fn drop(&mut self, run: Resource<RunResource>) -> wasmtime::Result<()> {
        // Dropping the guard starts disposal.
        self.table().delete(run)?;
        Ok(())
    }
}

/// Adds the interface to a plugin linker.
pub fn add_to_linker(linker: &mut wasmtime::component::Linker<StoreState>) -> wasmtime::Result<()> {
    wit::add_to_linker::<StoreState, wasmtime::component::HasSelf<StoreState>>(linker, |state| state)
}
