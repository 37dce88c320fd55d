//! Every contract version the host serves, behind one type: the
//! pre-instantiated component ([`PluginPre`]) and the guest's exports
//! ([`Guest`]), each a small enum over the generated bindings of
//! [`super::bindings::v0_1`] and [`super::bindings::v0_2`].
//!
//! Model: the loader ([`super::component`]) reads a component's version from
//! its `producer` export ([`ContractVersion::of_export`]) and builds the
//! matching [`PluginPre`]; from then on the producer and the driver call the
//! guest only through [`Guest`], whose methods take and return the host's own
//! types (core's [`RunMode`], [`TaskOutcome`], [`Described`]), so nothing
//! above this module knows which version a plugin speaks.
//!
//! Invariants:
//! - A 0.1 guest is called exactly as before 0.2 existed: an interactive run
//!   is never asked of it (its descriptor cannot say `takes-input`; should a
//!   caller ask anyway, it runs as `background`), and `write_input` answers
//!   an error without calling it.
//! - Strings the guest returns in an outcome are bounded here ([`bounds`]),
//!   whatever the version.

use wasmtime::Store;
use wasmtime::component::{InstancePre, Resource, ResourceAny};
use wasmtime_wasi::p2::DynPollable;

use super::bindings::{v0_1, v0_2};
use super::bounds;
use super::contract::ContractVersion;
use super::state::StoreState;
use taskhost_core::producer::RunMode;
use taskhost_core::tasks::{TaskOutcome, TerminalStatus};

/// A component pre-instantiated for the version it speaks.
pub(crate) enum PluginPre {
    V0_1(v0_1::PluginPre<StoreState>),
    V0_2(v0_2::PluginPre<StoreState>),
}

impl PluginPre {
    /// Checks the component's exports against `contract`'s world.
    pub(crate) fn new(contract: ContractVersion, pre: InstancePre<StoreState>) -> wasmtime::Result<Self> {
        Ok(match contract {
            ContractVersion::V0_1 => Self::V0_1(v0_1::PluginPre::new(pre)?),
            ContractVersion::V0_2 => Self::V0_2(v0_2::PluginPre::new(pre)?),
        })
    }

    pub(crate) fn instance_pre(&self) -> &InstancePre<StoreState> {
        match self {
            Self::V0_1(pre) => pre.instance_pre(),
            Self::V0_2(pre) => pre.instance_pre(),
        }
    }

    /// A new instance in `store`, as its guest exports.
    pub(crate) async fn instantiate_async(&self, store: &mut Store<StoreState>) -> wasmtime::Result<Guest> {
        Ok(match self {
            Self::V0_1(pre) => Guest::V0_1(pre.instantiate_async(store).await?.taskhost_producer_producer().clone()),
            Self::V0_2(pre) => Guest::V0_2(pre.instantiate_async(store).await?.taskhost_producer_producer().clone()),
        })
    }
}

/// How many times an instantiation that failed for the kernel's passing
/// reason ([`is_transient`]) is tried again, each in a fresh store.
pub(crate) const TRANSIENT_RETRIES: u32 = 3;

/// Whether an instantiation failed for a passing reason of the kernel's, not
/// the plugin's: wasmtime seals the memfd of a module's memory image when it
/// first creates it, and Linux refuses `F_SEAL_WRITE` with `EBUSY` while the
/// fresh pages are still pinned by a per-CPU batch (seen under load, about
/// one load in thirty of an 18 MB Python component). wasmtime does not keep
/// the failure, so another try makes the image.
pub(crate) fn is_transient(error: &wasmtime::Error) -> bool {
    error.chain().any(|cause| cause.to_string().contains("cannot add seals to the memfd"))
}

/// The `producer` exports of one instance, whatever its version.
#[derive(Clone)]
pub(crate) enum Guest {
    V0_1(v0_1::exports::taskhost::producer::producer::Guest),
    V0_2(v0_2::exports::taskhost::producer::producer::Guest),
}

/// What `describe` returned, in the host's terms (unchecked).
pub(crate) struct Described {
    pub kind: String,
    pub description: String,
    pub parameters: String,
    pub streams_output: bool,
    /// Always false for 0.1 (its descriptor cannot say it).
    pub takes_input: bool,
}

/// What a 0.1 task answers to input (never sent in practice: see the module doc).
const NO_INPUT_V0_1: &str =
    "this plugin was built against taskhost:producer@0.1.0, whose tasks take no input (input needs 0.2.0)";

impl Guest {
    pub(crate) async fn describe(
        &self,
        store: &mut Store<StoreState>,
        config: &str,
    ) -> wasmtime::Result<Result<Described, String>> {
        Ok(match self {
            Self::V0_1(guest) => guest.call_describe(store, config).await?.map(|d| Described {
                kind: d.kind,
                description: d.description,
                parameters: d.parameters,
                streams_output: d.streams_output,
                takes_input: false,
            }),
            Self::V0_2(guest) => guest.call_describe(store, config).await?.map(|d| Described {
                kind: d.kind,
                description: d.description,
                parameters: d.parameters,
                streams_output: d.streams_output,
                takes_input: d.takes_input,
            }),
        })
    }

    pub(crate) async fn label(
        &self,
        store: &mut Store<StoreState>,
        config: &str,
        args: &str,
    ) -> wasmtime::Result<Result<String, String>> {
        match self {
            Self::V0_1(guest) => guest.call_label(store, config, args).await,
            Self::V0_2(guest) => guest.call_label(store, config, args).await,
        }
    }

    pub(crate) async fn run(
        &self,
        store: &mut Store<StoreState>,
        config: &str,
        args: &str,
        mode: RunMode,
    ) -> wasmtime::Result<Result<ResourceAny, String>> {
        match self {
            Self::V0_1(guest) => {
                use v0_1::exports::taskhost::producer::producer::RunMode as M;
                let mode = match mode {
                    RunMode::Foreground => M::Foreground,
                    RunMode::Background | RunMode::Interactive => M::Background,
                };
                guest.call_run(store, config, args, mode).await
            }
            Self::V0_2(guest) => {
                use v0_2::exports::taskhost::producer::producer::RunMode as M;
                let mode = match mode {
                    RunMode::Foreground => M::Foreground,
                    RunMode::Background => M::Background,
                    RunMode::Interactive => M::Interactive,
                };
                guest.call_run(store, config, args, mode).await
            }
        }
    }

    pub(crate) async fn cancel(
        &self,
        store: &mut Store<StoreState>,
        task: ResourceAny,
        reason: Option<&str>,
    ) -> wasmtime::Result<()> {
        match self {
            Self::V0_1(guest) => guest.task().call_cancel(store, task, reason).await,
            Self::V0_2(guest) => guest.task().call_cancel(store, task, reason).await,
        }
    }

    pub(crate) async fn subscribe(
        &self,
        store: &mut Store<StoreState>,
        task: ResourceAny,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        match self {
            Self::V0_1(guest) => guest.task().call_subscribe(store, task).await,
            Self::V0_2(guest) => guest.task().call_subscribe(store, task).await,
        }
    }

    /// `task.done`, its outcome converted and bounded.
    pub(crate) async fn done(
        &self,
        store: &mut Store<StoreState>,
        task: ResourceAny,
    ) -> wasmtime::Result<Option<TaskOutcome>> {
        Ok(match self {
            Self::V0_1(guest) => guest.task().call_done(store, task).await?.map(|o| {
                use v0_1::taskhost::producer::types::TerminalStatus as S;
                let status = match o.status {
                    S::Completed => TerminalStatus::Completed,
                    S::Killed => TerminalStatus::Killed,
                    S::Failed => TerminalStatus::Failed,
                };
                outcome(status, o.detail, o.output)
            }),
            Self::V0_2(guest) => guest.task().call_done(store, task).await?.map(|o| {
                use v0_2::taskhost::producer::types::TerminalStatus as S;
                let status = match o.status {
                    S::Completed => TerminalStatus::Completed,
                    S::Killed => TerminalStatus::Killed,
                    S::Failed => TerminalStatus::Failed,
                };
                outcome(status, o.detail, o.output)
            }),
        })
    }

    pub(crate) async fn read_output(
        &self,
        store: &mut Store<StoreState>,
        task: ResourceAny,
    ) -> wasmtime::Result<String> {
        match self {
            Self::V0_1(guest) => guest.task().call_read_output(store, task).await,
            Self::V0_2(guest) => guest.task().call_read_output(store, task).await,
        }
    }

    /// `task.write-input`; a 0.1 task answers an error without a call.
    pub(crate) async fn write_input(
        &self,
        store: &mut Store<StoreState>,
        task: ResourceAny,
        data: &[u8],
        close: bool,
    ) -> wasmtime::Result<Result<(), String>> {
        match self {
            Self::V0_1(_) => Ok(Err(NO_INPUT_V0_1.to_string())),
            Self::V0_2(guest) => guest.task().call_write_input(store, task, data, close).await,
        }
    }
}

fn outcome(status: TerminalStatus, detail: Option<String>, output: Option<String>) -> TaskOutcome {
    let mut outcome =
        TaskOutcome::new(status, detail.map(|d| bounds::cap(d, bounds::MAX_DETAIL_BYTES, "outcome detail")));
    outcome.output = output.map(|o| bounds::cap(o, bounds::MAX_CHUNK_BYTES, "final output"));
    outcome
}
