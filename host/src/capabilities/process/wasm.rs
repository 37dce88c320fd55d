//! The `taskhost:producer/process` WIT interface, implemented for task stores.
//!
//! Model: each store holds a [`ProcessCtx`]: the grant of its plugin
//! instance (or none), a count of the processes the guest holds, and the
//! spill files of processes it dropped. A guest `process` is a
//! [`ProcessResource`] in the store's `ResourceTable`; its pollables are
//! children of it (`subscribe`: ready on news; `subscribe-exit`: ready when
//! finished, through an owned [`ExitWatch`] the pollable removes on drop).
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
use std::time::Duration;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::p2::DynPollable;

use super::{ExitStatus, Process, ProcessGrant, ProcessHost, Refusal, SpawnError, SpawnRequest, SpillFile, Stream};
use crate::plugin::bindings::taskhost::producer::process as wit;
use crate::plugin::state::StoreState;

/// The process capability of one plugin instance: the host side and the grant.
#[derive(Clone, Debug)]
pub struct ProcessCapability {
    pub host: Arc<ProcessHost>,
    pub grant: Arc<ProcessGrant>,
}

/// The per-store state of the process capability.
#[derive(Default)]
pub struct ProcessCtx {
    capability: Option<ProcessCapability>,
    held: Arc<AtomicUsize>,
    /// Processes the guest holds, by resource rep, for their spill files.
    watches: Vec<(u32, super::handle::ProcessWatch)>,
    retained: Vec<Arc<SpillFile>>,
    /// The task has no record to keep spill files in (a foreground run):
    /// hand them to the host instead.
    spills_to_host: bool,
    /// The owner session's spill directory (see [`ProcessCtx::set_owner`]).
    owner: Option<Arc<super::OwnerSpill>>,
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
    process: Process,
    _held: Held,
}

/// Counts a process against the grant's `max_live_processes` while it is held.
struct Held(Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[async_trait::async_trait]
impl wasmtime_wasi::p2::Pollable for ProcessResource {
    async fn ready(&mut self) {
        self.process.ready().await;
    }
}

/// The target of a `subscribe-exit` pollable.
pub struct ExitWatch(super::handle::ProcessWatch);

#[async_trait::async_trait]
impl wasmtime_wasi::p2::Pollable for ExitWatch {
    async fn ready(&mut self) {
        self.0.finished().await;
    }
}

fn chunk(process: &Process, stream: Stream) -> wit::OutputChunk {
    let chunk = process.read(stream);
    wit::OutputChunk {
        data: chunk.data,
        dropped: chunk.dropped,
        spill_path: chunk.spill_path.map(|p| p.display().to_string()),
        closed: chunk.closed,
    }
}

fn parts(state: &mut StoreState) -> (&mut ProcessCtx, &mut ResourceTable, &str) {
    state.process_parts()
}

impl wit::Host for StoreState {
    async fn spawn(
        &mut self,
        request: wit::SpawnRequest,
    ) -> wasmtime::Result<Result<Resource<ProcessResource>, String>> {
        let (ctx, table, plugin) = parts(self);
        let Some(capability) = ctx.capability.clone() else {
            return Ok(Err(format!(
                "plugin {plugin} has no process grant: the host configuration must grant this tool \
                 instance the process capability (allowed programs, working directories)"
            )));
        };
        let limit = capability.grant.limits.max_live_processes;
        if ctx.held.load(Ordering::Acquire) >= limit {
            return Ok(Err(Refusal::TooMany(limit).to_string()));
        }
        let request = SpawnRequest {
            argv: request.argv,
            cwd: request.cwd,
            env: request.env,
            memory_cap: request.memory_cap.map(|c| usize::try_from(c).unwrap_or(usize::MAX)),
            spill_cap: request.spill_cap,
            kill_grace: request.kill_grace_ms.map(Duration::from_millis),
            timeout: request.timeout_ms.map(Duration::from_millis),
        };
        let span = tracing::Span::current();
        let owner = match ctx.owner.clone() {
            Some(owner) => owner,
            None => match capability.host.owner_spill("") {
                Ok(owner) => owner,
                Err(error) => return Ok(Err(format!("cannot create the spill directory: {error}"))),
            },
        };
        let process = match capability.host.spawn_for(&owner, &capability.grant, request, &span).await {
            Ok(process) => process,
            Err(err @ SpawnError::Refused(_)) => {
                tracing::debug!(plugin, error = %err, "process spawn refused");
                return Ok(Err(err.to_string()));
            }
            Err(err) => {
                tracing::warn!(plugin, error = %err, "process spawn failed");
                return Ok(Err(err.to_string()));
            }
        };
        ctx.held.fetch_add(1, Ordering::AcqRel);
        let watch = process.watch();
        let resource = table.push(ProcessResource { process, _held: Held(ctx.held.clone()) })?;
        ctx.watches.push((resource.rep(), watch));
        Ok(Ok(resource))
    }

    async fn signal_name(&mut self, signal: i32) -> wasmtime::Result<String> {
        Ok(super::signal_name(signal))
    }
}

impl wit::HostProcess for StoreState {
    async fn pid(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<u32> {
        let (_, table, _) = parts(self);
        Ok(table.get(&this)?.process.pid())
    }

    async fn read_stdout(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<wit::OutputChunk> {
        let (_, table, _) = parts(self);
        Ok(chunk(&table.get(&this)?.process, Stream::Stdout))
    }

    async fn read_stderr(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<wit::OutputChunk> {
        let (_, table, _) = parts(self);
        Ok(chunk(&table.get(&this)?.process, Stream::Stderr))
    }

    async fn subscribe(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Resource<DynPollable>> {
        let (_, table, _) = parts(self);
        let borrowed = Resource::<ProcessResource>::new_borrow(this.rep());
        wasmtime_wasi::p2::subscribe(table, borrowed)
    }

    async fn subscribe_exit(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Resource<DynPollable>> {
        let (_, table, _) = parts(self);
        let watch = ExitWatch(table.get(&this)?.process.watch());
        // Owned and a child of the process: the pollable removes it on drop.
        let watch = table.push_child(watch, &this)?;
        wasmtime_wasi::p2::subscribe(table, watch)
    }

    async fn exit_status(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Option<wit::ExitStatus>> {
        let (_, table, _) = parts(self);
        Ok(table.get(&this)?.process.exit_status().map(|status| match status {
            ExitStatus::Code(code) => wit::ExitStatus::Code(code),
            ExitStatus::Signal(signal) => wit::ExitStatus::Signal(signal),
        }))
    }

    async fn timed_out(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<bool> {
        let (_, table, _) = parts(self);
        Ok(table.get(&this)?.process.timed_out())
    }

    async fn kill(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<()> {
        let (_, table, _) = parts(self);
        table.get(&this)?.process.kill();
        Ok(())
    }

    async fn drop(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<()> {
        let (ctx, table, _) = parts(self);
        let rep = this.rep();
        let resource = table.delete(this)?;
        ctx.retained.extend(resource.process.spill_files());
        ctx.watches.retain(|(r, _)| *r != rep);
        // Dropping the process kills its tree if it is still alive.
        drop(resource);
        Ok(())
    }
}
