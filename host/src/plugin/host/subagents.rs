//! The WIT host side of `taskhost:producer/subagents`: what plugins import.
//!
//! Model: implemented on [`SubagentsView`], a borrow of one store's grant
//! (a [`Subagents`] service, or none) and `ResourceTable`; a store without
//! the grant answers `start` with an error naming it. Each `run` resource is
//! a [`RunResource`] in the table, wrapping a [`RunGuard`].
//!
//! Invariants:
//! - A run lives in exactly one store (see [`crate::plugin::resources`]).
//! - Every method returns at once; waiting is done by the host on the
//!   pollable `subscribe` returns (ready when the result is in, or — once
//!   disposal started — when the child is released).

use std::sync::Arc;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::DynPollable;

use crate::plugin::bindings::taskhost::producer::subagents::{
    self as wit, Host as WitHost, HostRun, RunResult as WitRunResult, StopReason as WitStopReason,
};
use crate::plugin::clock::CallClock;
use crate::plugin::resources::RunResource;
use crate::plugin::state::StoreTag;
use crate::subagents::{RunGuard, RunResult, StartRequest, StopReason, Subagents};

/// One store's subagents grant, borrowed for a host call.
pub struct SubagentsView<'a> {
    /// None refuses `start`.
    pub grant: Option<&'a Subagents>,
    pub table: &'a mut ResourceTable,
    pub tag: &'a StoreTag,
    /// The call's clock: starting a child run is the host's time.
    pub clock: &'a Arc<CallClock>,
}

struct SubagentsData;

impl HasData for SubagentsData {
    type Data<'a> = SubagentsView<'a>;
}

/// Adds the interface to a linker whose store data yields a [`SubagentsView`].
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> SubagentsView<'_>,
) -> wasmtime::Result<()> {
    wit::add_to_linker::<T, SubagentsData>(linker, view)
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

impl WitHost for SubagentsView<'_> {
    async fn start(
        &mut self,
        description: String,
        prompt: String,
        profile: Option<String>,
    ) -> wasmtime::Result<Result<Resource<RunResource>, String>> {
        let Some(subagents) = self.grant.cloned() else {
            return Ok(Err(format!(
                "plugin {} is not granted the subagents capability: its [[producer]] entry needs \
                 [producer.grants.subagents] to start child runs",
                self.tag.plugin
            )));
        };
        let started = self.clock.host_step_now(|| subagents.start(StartRequest { description, prompt, profile }));
        let run = match started {
            Ok(run) => run,
            Err(error) => return Ok(Err(format!("{error:#}"))),
        };
        tracing::debug!(plugin = &*self.tag.plugin, store = &*self.tag.purpose, child = %run.child().id(), "plugin started a subagent run");
        let guard = RunGuard(run);
        Ok(Ok(self.table.push(RunResource { run: guard })?))
    }
}

impl HostRun for SubagentsView<'_> {
    async fn subscribe(&mut self, run: Resource<RunResource>) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut *self.table, run)
    }

    async fn result(&mut self, run: Resource<RunResource>) -> wasmtime::Result<Option<WitRunResult>> {
        Ok(self.table.get(&run)?.run.result().map(to_wit))
    }

    async fn cancel(&mut self, run: Resource<RunResource>, reason: Option<String>) -> wasmtime::Result<()> {
        self.table.get(&run)?.run.cancel(reason);
        Ok(())
    }

    async fn dispose(&mut self, run: Resource<RunResource>) -> wasmtime::Result<()> {
        self.table.get(&run)?.run.start_dispose();
        Ok(())
    }

    async fn released(&mut self, run: Resource<RunResource>) -> wasmtime::Result<bool> {
        Ok(self.table.get(&run)?.run.is_released())
    }

    async fn drop(&mut self, run: Resource<RunResource>) -> wasmtime::Result<()> {
        // Dropping the guard starts disposal.
        self.table.delete(run)?;
        Ok(())
    }
}
