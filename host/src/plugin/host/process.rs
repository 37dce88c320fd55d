//! The `taskhost:producer/process` WIT interface: what a plugin imports to
//! start and supervise process trees.
//!
//! Model: implemented on [`ProcessView`], a borrow of one store's
//! [`ProcessCtx`] and `ResourceTable` (as wasmtime-wasi implements WASI on
//! `WasiCtxView`), so this glue knows nothing of the store type it is
//! linked into. The capability itself is the `taskhost-process` crate.
//!
//! Invariants: refusals are values (`result::err` with the reason), never
//! traps; a process dies with its resource (see [`crate::plugin::resources`]);
//! stdin writes never block (see `taskhost_process::Process::write_stdin`);
//! a forwarded process appends to its store's task output sink, which the
//! driver drains (`forward-output`, background runs only).
//! This is the current (0.2) interface; [`super::v0_1`] serves the frozen
//! 0.1 one by delegating here.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use taskhost_process::{ExitStatus, Process, Refusal, SpawnError, SpawnRequest, StdinMode, Stream};
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::DynPollable;

use crate::plugin::bindings::taskhost::producer::process as wit;
use crate::plugin::clock::{CallClock, SPAWN_BOUND};
use crate::plugin::resources::{ExitWatch, Held, ProcessCtx, ProcessResource};

/// One store's process capability, borrowed for a host call.
pub struct ProcessView<'a> {
    pub ctx: &'a mut ProcessCtx,
    pub table: &'a mut ResourceTable,
    /// The plugin's name, for refusals and logs.
    pub plugin: &'a str,
    /// The call's clock: a spawn is the host's time ([`SPAWN_BOUND`]).
    pub clock: &'a Arc<CallClock>,
}

struct ProcessData;

impl HasData for ProcessData {
    type Data<'a> = ProcessView<'a>;
}

/// Adds the interface to a linker whose store data yields a [`ProcessView`].
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> ProcessView<'_>,
) -> wasmtime::Result<()> {
    wit::add_to_linker::<T, ProcessData>(linker, view)
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

impl wit::Host for ProcessView<'_> {
    async fn spawn(
        &mut self,
        request: wit::SpawnRequest,
    ) -> wasmtime::Result<Result<Resource<ProcessResource>, String>> {
        let (ctx, table, plugin) = (&mut *self.ctx, &mut *self.table, self.plugin);
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
            stdin: match request.stdin {
                wit::StdinMode::Empty => StdinMode::Empty,
                wit::StdinMode::Pipe => StdinMode::Pipe,
            },
        };
        let span = tracing::Span::current();
        let owner = ctx.owner.clone();
        // The host's own work: the plugin's clock stands still, the spawn
        // has its own bound.
        let spawn = async {
            let owner = match owner {
                Some(owner) => owner,
                None => capability.host.owner_spill("").map_err(|error| SpawnError::Failed {
                    program: request.argv.first().cloned().unwrap_or_default(),
                    source: std::io::Error::new(error.kind(), format!("cannot create the spill directory: {error}")),
                })?,
            };
            capability.host.spawn_for(&owner, &capability.grant, request, &span).await
        };
        let process = match self.clock.host_step("process spawn", SPAWN_BOUND, spawn).await {
            Ok(Ok(process)) => process,
            Ok(Err(err @ SpawnError::Refused(_))) => {
                tracing::debug!(plugin, error = %err, "process spawn refused");
                return Ok(Err(err.to_string()));
            }
            Ok(Err(err)) => {
                tracing::warn!(plugin, error = %err, "process spawn failed");
                return Ok(Err(err.to_string()));
            }
            // The host overran its own bound: said as the host's, not the plugin's.
            Err(overran) => return Ok(Err(overran.to_string())),
        };
        ctx.held.fetch_add(1, Ordering::AcqRel);
        let watch = process.watch();
        let resource = table.push(ProcessResource { process, _held: Held(ctx.held.clone()) })?;
        ctx.watches.push((resource.rep(), watch));
        Ok(Ok(resource))
    }

    async fn signal_name(&mut self, signal: i32) -> wasmtime::Result<String> {
        Ok(taskhost_process::signal_name(signal))
    }
}

impl wit::HostProcess for ProcessView<'_> {
    async fn pid(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<u32> {
        let table = &mut *self.table;
        Ok(table.get(&this)?.process.pid())
    }

    async fn read_stdout(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<wit::OutputChunk> {
        let table = &mut *self.table;
        Ok(chunk(&table.get(&this)?.process, Stream::Stdout))
    }

    async fn read_stderr(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<wit::OutputChunk> {
        let table = &mut *self.table;
        Ok(chunk(&table.get(&this)?.process, Stream::Stderr))
    }

    async fn subscribe(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Resource<DynPollable>> {
        let table = &mut *self.table;
        let borrowed = Resource::<ProcessResource>::new_borrow(this.rep());
        wasmtime_wasi::p2::subscribe(table, borrowed)
    }

    async fn subscribe_exit(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Resource<DynPollable>> {
        let table = &mut *self.table;
        let watch = ExitWatch(table.get(&this)?.process.watch());
        // Owned and a child of the process: the pollable removes it on drop.
        let watch = table.push_child(watch, &this)?;
        wasmtime_wasi::p2::subscribe(table, watch)
    }

    async fn exit_status(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Option<wit::ExitStatus>> {
        let table = &mut *self.table;
        Ok(table.get(&this)?.process.exit_status().map(|status| match status {
            ExitStatus::Code(code) => wit::ExitStatus::Code(code),
            ExitStatus::Signal(signal) => wit::ExitStatus::Signal(signal),
        }))
    }

    async fn timed_out(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<bool> {
        let table = &mut *self.table;
        Ok(table.get(&this)?.process.timed_out())
    }

    async fn kill(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<()> {
        let table = &mut *self.table;
        table.get(&this)?.process.kill();
        Ok(())
    }

    async fn write_stdin(
        &mut self,
        this: Resource<ProcessResource>,
        data: Vec<u8>,
    ) -> wasmtime::Result<Result<(), String>> {
        let table = &mut *self.table;
        Ok(table.get(&this)?.process.write_stdin(&data).map_err(|e| e.to_string()))
    }

    async fn close_stdin(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Result<(), String>> {
        let table = &mut *self.table;
        Ok(table.get(&this)?.process.close_stdin().map_err(|e| e.to_string()))
    }

    async fn forward_output(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Result<(), String>> {
        let (ctx, table) = (&mut *self.ctx, &mut *self.table);
        if ctx.is_foreground() {
            return Ok(Err(
                "forwarding is for background runs: read a foreground process's streams when it ends".into()
            ));
        }
        let process = &table.get(&this)?.process;
        Ok(process.forward_output(ctx.output_sink()).map_err(str::to_string))
    }

    async fn drop(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<()> {
        let (ctx, table) = (&mut *self.ctx, &mut *self.table);
        let rep = this.rep();
        let resource = table.delete(this)?;
        ctx.retained.extend(resource.process.spill_files());
        ctx.watches.retain(|(r, _)| *r != rep);
        // Dropping the process kills its tree if it is still alive.
        drop(resource);
        Ok(())
    }
}
