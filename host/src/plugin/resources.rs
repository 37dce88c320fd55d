//! The per-store state and the guest-held resources of every capability:
//! what a task store keeps, and what the generated bindings map the WIT
//! resources to. The WIT glue that hands them out is [`super::host::process`] and
//! [`super::host::subagents`]; this module does not depend on the bindings, so the
//! bindings can name these types.
//!
//! ## http
//! Each store holds an [`HttpCtx`]: wasmtime-wasi-http's context and the
//! [`HttpHooks`] its `send_request` goes through (the grant of the plugin
//! instance, or none, and the count of requests this store sent). The
//! `wasi:http` resources themselves are wasmtime-wasi-http's, in the
//! store's table.
//!
//! ## process
//! Model: each store holds a [`ProcessCtx`]: the grant of its plugin
//! instance (or none), a count of the processes the guest holds, and the
//! spill files of processes it dropped. A guest `process` is a
//! [`ProcessResource`] in the store's `ResourceTable`; its pollables are
//! children of it (`subscribe`: ready on news; `subscribe-exit`: ready when
//! finished, through an owned [`ExitWatch`] the pollable removes on drop).
//!
//! The store also holds its task's [`OutputSink`]: where a process whose
//! output the guest forwards (`process.forward-output`) appends it, and
//! where the driver keeps what it took from the guest, so the two never
//! reorder (see [`super::driver`]).
//!
//! Invariants:
//! - Refusals are values (`result::err` with the reason), never traps.
//! - A process dies with its resource: the guest dropping it, a trap, or the
//!   store being dropped for any reason (its table goes, and with it every
//!   [`Process`], which kills its tree on drop).
//! - Spill files outlive the processes that wrote them: the store keeps
//!   them, and [`ProcessCtx::take_spill_files`] hands them to whoever keeps
//!   the task's record, so a notice never points at a missing file.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use taskhost_process::{OutputSink, OwnerSpill, Process, ProcessGrant, ProcessHost, ProcessWatch, SpillFile};

use crate::subagents::{RunGuard, SubagentRun};

/// The process capability of one plugin instance: the host side and the grant.
#[derive(Clone, Debug)]
pub struct ProcessCapability {
    pub host: Arc<ProcessHost>,
    pub grant: Arc<ProcessGrant>,
}

/// The per-store state of the process capability.
pub struct ProcessCtx {
    pub(crate) capability: Option<ProcessCapability>,
    pub(crate) held: Arc<AtomicUsize>,
    /// Processes the guest holds, by resource rep, for their spill files.
    pub(crate) watches: Vec<(u32, ProcessWatch)>,
    pub(crate) retained: Vec<Arc<SpillFile>>,
    /// The task has no record to keep spill files in (a foreground run):
    /// hand them to the host instead.
    spills_to_host: bool,
    /// The owner session's spill directory (see [`ProcessCtx::set_owner`]).
    pub(crate) owner: Option<Arc<OwnerSpill>>,
    /// The task's output on its way to the host's log.
    pub(crate) output: Arc<OutputSink>,
    /// Where handed-over trees of a stable owner go; `None`: the owner is
    /// not stable, or the host keeps no durable store.
    pub(crate) durable: Option<DurableTrees>,
    /// The durable tree the guest handed over, as the store keeps it
    /// ([`crate::durable_tasks::HandedOverTree`]).
    pub(crate) handed_over: Option<String>,
}

impl Default for ProcessCtx {
    fn default() -> Self {
        Self {
            capability: None,
            held: Arc::default(),
            watches: Vec::new(),
            retained: Vec::new(),
            spills_to_host: false,
            owner: None,
            output: OutputSink::new(super::bounds::MAX_FORWARDED_WAITING_BYTES),
            durable: None,
            handed_over: None,
        }
    }
}

impl std::fmt::Debug for ProcessCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessCtx")
            .field("granted", &self.capability.is_some())
            .field("held", &self.held.load(Ordering::Relaxed))
            .finish()
    }
}

impl ProcessCtx {
    /// Grants (or, with `None`, denies) the capability to this store.
    /// `foreground`: the task will have no record, so its spill files are
    /// handed to the host ([`ProcessHost::retain_spill_files`]) rather than
    /// returned by [`take_spill_files`](Self::take_spill_files).
    pub fn set_capability(&mut self, capability: Option<ProcessCapability>, foreground: bool) {
        self.capability = capability;
        self.spills_to_host = foreground;
    }

    /// Spill files of this store's processes go to `owner`'s private
    /// directory (an owner session's key), which only that owner's trees
    /// can read. Without it, to the host-level directory.
    pub fn set_owner(&mut self, owner: &str) {
        if let Some(capability) = &self.capability {
            match capability.host.owner_spill(owner) {
                Ok(spill) => self.owner = Some(spill),
                Err(error) => tracing::warn!(%error, "cannot create the owner's spill directory"),
            }
        }
    }

    /// The task's owner is stable: a `spawn-handed-over` tree is made
    /// durable under `trees` (see [`Tree::HandedOver`]).
    pub fn set_durable(&mut self, trees: DurableTrees) {
        self.durable = Some(trees);
    }

    /// The durable tree the guest handed over, as the store keeps it (its
    /// proof, which is as secret as a token, and where it lives).
    pub fn handed_over_tree(&self) -> Option<String> {
        self.handed_over.clone()
    }

    /// True when the task is a foreground run (its output is read at the end).
    pub(crate) fn is_foreground(&self) -> bool {
        self.spills_to_host
    }

    /// The task's output sink (see the module's model).
    pub fn output_sink(&self) -> Arc<OutputSink> {
        self.output.clone()
    }

    /// Every spill file this store's processes created. Keep them as long as
    /// the task's output may be read: they are deleted when the last holder
    /// drops them. Foreground stores hand them to the host and return none.
    pub fn take_spill_files(&mut self) -> Vec<Arc<SpillFile>> {
        let mut files = std::mem::take(&mut self.retained);
        for (_, watch) in &self.watches {
            files.extend(watch.spill_files());
        }
        match &self.capability {
            Some(capability) if self.spills_to_host => {
                capability.host.retain_spill_files(files);
                Vec::new()
            }
            _ => files,
        }
    }
}

/// A guest-held process.
pub struct ProcessResource {
    pub(crate) tree: Tree,
    pub(crate) _held: Held,
}

/// What a guest-held process is.
pub(crate) enum Tree {
    /// A tree of this server (`spawn`, or `spawn-handed-over` for an owner
    /// that is not stable): it dies with its resource.
    Plain(Process),
    /// A durable tree handed over to the host (`spawn-handed-over` for a
    /// stable owner): its output is its logs, followed into the task's
    /// sink; it outlives the server (not the guest's `drop`).
    HandedOver(taskhost_process::FollowedTree),
}

/// Where a spawn with `spawn-handed-over` for a stable owner keeps its
/// durable tree: a private directory per tree under `root` (in the state
/// directory, protected from every tree), and how long K lets it run.
#[derive(Clone, Debug)]
pub struct DurableTrees {
    pub root: std::path::PathBuf,
}

/// Counts a process against the grant's `max_live_processes` while it is held.
pub(crate) struct Held(pub(crate) Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[async_trait::async_trait]
impl wasmtime_wasi::p2::Pollable for ProcessResource {
    async fn ready(&mut self) {
        match &self.tree {
            Tree::Plain(process) => process.ready().await,
            // Its output goes to the sink: only its end is news.
            Tree::HandedOver(tree) => tree.ended().await,
        }
    }
}

/// The target of a `subscribe-exit` pollable.
pub enum ExitWatch {
    Plain(ProcessWatch),
    HandedOver(tokio::sync::watch::Receiver<Option<taskhost_process::TreeEnd>>),
}

#[async_trait::async_trait]
impl wasmtime_wasi::p2::Pollable for ExitWatch {
    async fn ready(&mut self) {
        match self {
            Self::Plain(watch) => watch.finished().await,
            Self::HandedOver(ended) => {
                let _ = ended.wait_for(Option::is_some).await;
            }
        }
    }
}

/// A child run held by a plugin task (`taskhost:producer/subagents.run`).
///
/// A run lives in exactly one store. Dropping its handle (the guest drops
/// it, or the store itself is dropped after the task settled, faulted or was
/// abandoned) drops the guard, which starts disposal: no child outlives its
/// task's store.
pub struct RunResource {
    pub(crate) run: RunGuard,
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

/// The `http` capability of one plugin instance: its checked grant and the
/// client whose resolver checks every address it connects to.
#[derive(Clone, Debug)]
pub struct HttpCapability {
    pub grant: Arc<crate::outbound::grant::CheckedHttpGrant>,
    pub client: reqwest::Client,
}

impl HttpCapability {
    /// The capability for `grant`: a client that follows no redirect (the
    /// guest's next request is checked again), uses no proxy from the
    /// environment, and resolves names through the grant's guard.
    pub fn new(grant: crate::outbound::grant::CheckedHttpGrant) -> anyhow::Result<Self> {
        let grant = Arc::new(grant);
        let client = crate::http_client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(crate::outbound::guard::GuardedResolver { grant: grant.clone() }))
            .connect_timeout(grant.request_timeout)
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the plugin's HTTP client: {e}"))?;
        Ok(Self { grant, client })
    }
}

/// The hooks of one store's `wasi:http`: who it is, what it is granted,
/// how many requests it sent.
#[derive(Debug)]
pub struct HttpHooks {
    pub(crate) capability: Option<HttpCapability>,
    pub(crate) requests: u64,
    pub(crate) plugin: Arc<str>,
}

/// The `wasi:http` state of one store.
pub struct HttpCtx {
    pub(crate) wasi: wasmtime_wasi_http::WasiHttpCtx,
    pub(crate) hooks: HttpHooks,
}

impl HttpCtx {
    /// A store's state, refusing every request until granted.
    pub fn new(plugin: Arc<str>) -> Self {
        Self {
            wasi: wasmtime_wasi_http::WasiHttpCtx::new(),
            hooks: HttpHooks { capability: None, requests: 0, plugin },
        }
    }

    /// Grants this store the capability.
    pub fn grant(&mut self, capability: HttpCapability) {
        self.hooks.capability = Some(capability);
    }
}
