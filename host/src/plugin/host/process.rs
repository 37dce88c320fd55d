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

use std::os::unix::fs::DirBuilderExt as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use taskhost_process::{
    DurableSpawn, ExitStatus, FollowedTree, Refusal, SpawnError, SpawnRequest, StdinMode, Stream, TreeCursor, TreeEnd,
};
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::DynPollable;

use crate::durable_tasks::HandedOverTree;
use crate::plugin::bindings::taskhost::producer::process as wit;
use crate::plugin::clock::{CallClock, SPAWN_BOUND};
use crate::plugin::resources::{DurableTrees, ExitWatch, Held, ProcessCtx, ProcessResource, Tree};

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

/// A consuming read; a handed-over tree's output goes to the task's
/// output, so its reads return nothing.
fn chunk(tree: &Tree, stream: Stream) -> wit::OutputChunk {
    let Tree::Plain(process) = tree else {
        let closed = matches!(tree, Tree::HandedOver(t) if t.end().is_some());
        return wit::OutputChunk { data: Vec::new(), dropped: false, spill_path: None, closed };
    };
    let chunk = process.read(stream);
    wit::OutputChunk {
        data: chunk.data,
        dropped: chunk.dropped,
        spill_path: chunk.spill_path.map(|p| p.display().to_string()),
        closed: chunk.closed,
    }
}

/// Refused in a foreground run (verbatim in the WIT).
const FORWARD_IN_FOREGROUND: &str =
    "forwarding is for background runs: read a foreground process's streams when it ends";

/// How long K lets a handed-over tree run when the request sets no timeout.
pub const DURABLE_TREE_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// A unique name for a durable tree's directory.
fn tree_dir_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("tree-{nanos:x}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

fn to_request(request: wit::SpawnRequest) -> SpawnRequest {
    SpawnRequest {
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
    }
}

/// What a spawn makes: a plain tree, or a durable one under `trees`.
enum Flavor {
    Plain,
    Durable(DurableTrees),
}

impl ProcessView<'_> {
    /// Checks the grant and the process bound, spawns, and hands the
    /// process to the guest (see [`Flavor`]).
    async fn spawn_tree(
        &mut self,
        request: wit::SpawnRequest,
        flavor: Flavor,
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
        let request = to_request(request);
        let span = tracing::Span::current();
        let owner = ctx.owner.clone();
        let sink = ctx.output_sink();
        let max_grace = Duration::from_millis(capability.grant.limits.kill_grace_ms);
        let grace = request.kill_grace.map_or(max_grace, |g| g.min(max_grace));
        // The host's own work: the plugin's clock stands still, the spawn
        // has its own bound.
        let spawn = async {
            let program = request.argv.first().cloned().unwrap_or_default();
            let owner = match owner {
                Some(owner) => owner,
                None => capability.host.owner_spill("").map_err(|error| SpawnError::Failed {
                    program: program.clone(),
                    source: std::io::Error::new(error.kind(), format!("cannot create the spill directory: {error}")),
                })?,
            };
            match flavor {
                Flavor::Plain => capability
                    .host
                    .spawn_for(&owner, &capability.grant, request, &span)
                    .await
                    .map(|process| (Tree::Plain(process), None)),
                Flavor::Durable(trees) => {
                    let failed = |source: std::io::Error| SpawnError::Failed { program: program.clone(), source };
                    let dir = trees.root.join(tree_dir_name());
                    std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|error| {
                        failed(std::io::Error::new(
                            error.kind(),
                            format!("cannot create the durable tree's directory {}: {error}", dir.display()),
                        ))
                    })?;
                    let ttl = request.timeout.unwrap_or(DURABLE_TREE_TTL);
                    let durable = DurableSpawn::new(dir.clone(), dir.join("k.sock"), ttl);
                    match capability.host.spawn_durable(&owner, &capability.grant, request, durable, &span).await {
                        Ok(process) => {
                            let kept = HandedOverTree::new(process.record().clone(), grace);
                            if let Err(error) = crate::durable_tasks::record_launch(&dir, &kept) {
                                let _ = process.kill();
                                return Err(failed(std::io::Error::new(
                                    error.kind(),
                                    format!(
                                        "cannot record the launch of the durable tree in {} ({error}); \
                                         is the state directory full?",
                                        dir.display()
                                    ),
                                )));
                            }
                            tracing::info!(pid = process.pid(), dir = %dir.display(), "durable tree handed over");
                            let kept = kept.to_text();
                            let tree = FollowedTree::follow(process, sink, TreeCursor::default(), grace);
                            Ok((Tree::HandedOver(tree), Some(kept)))
                        }
                        Err(error) => {
                            let _ = std::fs::remove_dir_all(&dir);
                            Err(error)
                        }
                    }
                }
            }
        };
        let tree = match self.clock.host_step("process spawn", SPAWN_BOUND, spawn).await {
            Ok(Ok((tree, kept))) => {
                if kept.is_some() {
                    ctx.handed_over = kept;
                }
                tree
            }
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
        let watch = match &tree {
            Tree::Plain(process) => Some(process.watch()),
            Tree::HandedOver(_) => None,
        };
        let resource = table.push(ProcessResource { tree, _held: Held(ctx.held.clone()) })?;
        if let Some(watch) = watch {
            ctx.watches.push((resource.rep(), watch));
        }
        Ok(Ok(resource))
    }
}

impl wit::Host for ProcessView<'_> {
    async fn spawn(
        &mut self,
        request: wit::SpawnRequest,
    ) -> wasmtime::Result<Result<Resource<ProcessResource>, String>> {
        self.spawn_tree(request, Flavor::Plain).await
    }

    async fn spawn_handed_over(
        &mut self,
        request: wit::SpawnRequest,
    ) -> wasmtime::Result<Result<Resource<ProcessResource>, String>> {
        if self.ctx.is_foreground() {
            return Ok(Err(FORWARD_IN_FOREGROUND.into()));
        }
        let Some(trees) = self.ctx.durable.clone() else {
            // Not a stable owner: a plain tree, forwarded from the start.
            let resource = match self.spawn_tree(request, Flavor::Plain).await? {
                Ok(resource) => resource,
                Err(refused) => return Ok(Err(refused)),
            };
            let sink = self.ctx.output_sink();
            if let Tree::Plain(process) = &self.table.get(&resource)?.tree {
                // A fresh process is not forwarded yet.
                let _ = process.forward_output(sink);
            }
            return Ok(Ok(resource));
        };
        self.spawn_tree(request, Flavor::Durable(trees)).await
    }

    async fn signal_name(&mut self, signal: i32) -> wasmtime::Result<String> {
        Ok(taskhost_process::signal_name(signal))
    }
}

/// Writes to a durable tree's stdin pipe; what it cannot take at once is
/// refused (a durable tree has no host-side queue: it outlives the host).
fn write_durable_stdin(tree: &FollowedTree, data: &[u8]) -> Result<(), String> {
    let mut written = 0;
    while written < data.len() {
        match tree.process().write_stdin(&data[written..]) {
            Ok(0) => {
                return Err(format!(
                    "its stdin buffer is full ({written} of {} bytes were taken; the program has not read the rest)",
                    data.len()
                ));
            }
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                return Err("the program no longer reads its stdin (it exited or closed it)".into());
            }
            Err(e) if e.to_string() == "stdin is closed" => return Err("its stdin is already closed".into()),
            Err(e) => return Err(format!("cannot write to its stdin: {e}")),
        }
    }
    Ok(())
}

impl wit::HostProcess for ProcessView<'_> {
    async fn pid(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<u32> {
        let table = &mut *self.table;
        Ok(match &table.get(&this)?.tree {
            Tree::Plain(process) => process.pid(),
            Tree::HandedOver(tree) => tree.pid(),
        })
    }

    async fn read_stdout(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<wit::OutputChunk> {
        let table = &mut *self.table;
        Ok(chunk(&table.get(&this)?.tree, Stream::Stdout))
    }

    async fn read_stderr(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<wit::OutputChunk> {
        let table = &mut *self.table;
        Ok(chunk(&table.get(&this)?.tree, Stream::Stderr))
    }

    async fn subscribe(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Resource<DynPollable>> {
        let table = &mut *self.table;
        let borrowed = Resource::<ProcessResource>::new_borrow(this.rep());
        wasmtime_wasi::p2::subscribe(table, borrowed)
    }

    async fn subscribe_exit(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Resource<DynPollable>> {
        let table = &mut *self.table;
        let watch = match &table.get(&this)?.tree {
            Tree::Plain(process) => ExitWatch::Plain(process.watch()),
            Tree::HandedOver(tree) => ExitWatch::HandedOver(tree.end_watch()),
        };
        // Owned and a child of the process: the pollable removes it on drop.
        let watch = table.push_child(watch, &this)?;
        wasmtime_wasi::p2::subscribe(table, watch)
    }

    async fn exit_status(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Option<wit::ExitStatus>> {
        let table = &mut *self.table;
        let status = match &table.get(&this)?.tree {
            Tree::Plain(process) => process.exit_status(),
            Tree::HandedOver(tree) => tree.end().map(|end| match end {
                TreeEnd::Exited(exit) => exit.status,
                // K is gone without an end: its tree died with it (K is its
                // init's parent), by a signal nobody recorded.
                TreeEnd::Lost(_) => ExitStatus::Signal(libc::SIGKILL),
            }),
        };
        Ok(status.map(|status| match status {
            ExitStatus::Code(code) => wit::ExitStatus::Code(code),
            ExitStatus::Signal(signal) => wit::ExitStatus::Signal(signal),
        }))
    }

    async fn timed_out(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<bool> {
        let table = &mut *self.table;
        Ok(match &table.get(&this)?.tree {
            Tree::Plain(process) => process.timed_out(),
            Tree::HandedOver(tree) => matches!(tree.end(), Some(TreeEnd::Exited(exit)) if exit.deadline),
        })
    }

    async fn kill(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<()> {
        let table = &mut *self.table;
        match &table.get(&this)?.tree {
            Tree::Plain(process) => process.kill(),
            Tree::HandedOver(tree) => tree.kill(),
        }
        Ok(())
    }

    async fn write_stdin(
        &mut self,
        this: Resource<ProcessResource>,
        data: Vec<u8>,
    ) -> wasmtime::Result<Result<(), String>> {
        let table = &mut *self.table;
        Ok(match &table.get(&this)?.tree {
            Tree::Plain(process) => process.write_stdin(&data).map_err(|e| e.to_string()),
            Tree::HandedOver(tree) => write_durable_stdin(tree, &data),
        })
    }

    async fn close_stdin(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Result<(), String>> {
        let table = &mut *self.table;
        Ok(match &table.get(&this)?.tree {
            Tree::Plain(process) => process.close_stdin().map_err(|e| e.to_string()),
            Tree::HandedOver(tree) => tree.process().close_stdin().map_err(|e| format!("cannot close its stdin: {e}")),
        })
    }

    async fn forward_output(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Result<(), String>> {
        let (ctx, table) = (&mut *self.ctx, &mut *self.table);
        if ctx.is_foreground() {
            return Ok(Err(
                "forwarding is for background runs: read a foreground process's streams when it ends".into()
            ));
        }
        Ok(match &table.get(&this)?.tree {
            Tree::Plain(process) => process.forward_output(ctx.output_sink()).map_err(str::to_string),
            Tree::HandedOver(_) => Err("its output is already forwarded".into()),
        })
    }

    async fn drop(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<()> {
        let (ctx, table) = (&mut *self.ctx, &mut *self.table);
        let rep = this.rep();
        let resource = table.delete(this)?;
        ctx.watches.retain(|(r, _)| *r != rep);
        let ProcessResource { tree, _held } = resource;
        match tree {
            Tree::Plain(process) => {
                ctx.retained.extend(process.spill_files());
                // Dropping a plain process kills its tree if it is still alive.
                drop(process);
            }
            // The guest let go of it: the task is over, so is its tree
            // (its directory goes with the task's record).
            Tree::HandedOver(tree) => tree.kill(),
        }
        Ok(())
    }
}
