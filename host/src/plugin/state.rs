//! The data of one task store, and the host imports a plugin is linked against.
//!
//! Model: every store (one per task, plus throwaway stores for `describe` and
//! load-time validation) holds a [`StoreState`]: a WASI 0.2 context with no
//! ambient authority, the store's `ResourceTable`, its memory limiter, the
//! clock of the call in progress ([`super::clock`]) and the tags that name
//! it in logs.
//!
//! Invariants:
//! - The WASI context inherits nothing: no environment, no arguments, no
//!   preopened directories, no stdin, no sockets (TCP/UDP denied, no name
//!   lookup). Guest stdout/stderr become `tracing` debug events tagged with the
//!   plugin, and the tail of stderr is kept to explain a trap. Each
//!   `host-log` message is cut to `bounds::MAX_LOG_LINE_BYTES` with a notice.
//! - Every host import a plugin can see is added in
//!   [`super::host::linker`]; a capability (process, subagents, http) keeps its
//!   per-store state in [`StoreState`] and is implemented on a view of it.
//! - Memory growth beyond the cap is refused (the guest sees an allocation
//!   failure) and remembered, so the resulting fault names the limit.

use std::sync::{Arc, Mutex};

use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::clock::CallClock;
use super::engine::PluginEngine;
use super::resources::{HttpCapability, HttpCtx, ProcessCtx};
use crate::subagents::Subagents;

/// Names a store in logs and fault details.
#[derive(Clone, Debug)]
pub struct StoreTag {
    /// The plugin name (its file stem, or the built-in's name).
    pub plugin: Arc<str>,
    /// The plugin version, `<name>@<short hash>`.
    pub version: Arc<str>,
    /// What the store is for: `describe`, `validate`, or `run <n>` (the n-th
    /// task this plugin version started).
    pub purpose: Arc<str>,
}

/// The data of one store.
pub struct StoreState {
    wasi: WasiCtx,
    pub(super) table: ResourceTable,
    limiter: TaskLimiter,
    pub(super) tag: StoreTag,
    /// The clock of the call in progress: its deadline counts the guest's
    /// own time (see [`super::clock`]); checked at every epoch tick.
    pub(crate) clock: Arc<CallClock>,
    /// Set when a call was interrupted by its deadline.
    pub(crate) deadline_hit: bool,
    stderr_tail: Arc<Mutex<TailBuffer>>,
    /// The `process` capability of this store (denied unless granted).
    pub(super) process: ProcessCtx,
    /// The `subagents` grant: None refuses `subagents.start`.
    pub(super) subagents: Option<Subagents>,
    /// `wasi:http`: every request refused unless granted.
    pub(super) http: HttpCtx,
}

impl StoreState {
    /// A fresh state for a new store.
    pub fn new(engine: &PluginEngine, tag: StoreTag) -> Self {
        let stderr_tail = Arc::new(Mutex::new(TailBuffer::default()));
        let mut builder = WasiCtx::builder();
        builder
            .stdout(LogStream { tag: tag.clone(), stream: "stdout", tail: None })
            .stderr(LogStream { tag: tag.clone(), stream: "stderr", tail: Some(stderr_tail.clone()) })
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        Self {
            wasi: builder.build(),
            table: ResourceTable::new(),
            limiter: TaskLimiter {
                memory_cap: usize::try_from(engine.config().memory_limit_bytes).unwrap_or(usize::MAX),
                memory_limit_hit: false,
            },
            clock: Arc::default(),
            deadline_hit: false,
            stderr_tail,
            process: ProcessCtx::default(),
            subagents: None,
            http: HttpCtx::new(tag.plugin.clone()),
            tag,
        }
    }

    /// A new store with this state, its limiter and its deadline policy
    /// installed: each epoch tick yields to the executor (the wait to run
    /// again is not the guest's time); a tick past the guest's own budget
    /// interrupts it.
    pub fn into_store(self, engine: &PluginEngine) -> Store<StoreState> {
        let mut store = Store::new(engine.engine(), self);
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_callback(|mut ctx| {
            let state = ctx.data_mut();
            if state.clock.expired() {
                state.deadline_hit = true;
                Ok(wasmtime::UpdateDeadline::Interrupt)
            } else {
                Ok(wasmtime::UpdateDeadline::YieldCustom(1, state.clock.yield_at_tick()))
            }
        });
        store
    }

    /// The clock of the call in progress (see [`super::clock`]).
    pub fn clock(&self) -> &Arc<CallClock> {
        &self.clock
    }

    /// The tags of this store.
    pub fn tag(&self) -> &StoreTag {
        &self.tag
    }

    /// The `process` capability state of this store.
    pub fn process(&mut self) -> &mut ProcessCtx {
        &mut self.process
    }

    /// Grants this store the `subagents` capability.
    pub fn grant_subagents(&mut self, subagents: Subagents) {
        self.subagents = Some(subagents);
    }

    /// Grants this store the `http` capability (`wasi:http/outgoing-handler`).
    pub fn grant_http(&mut self, capability: HttpCapability) {
        self.http.grant(capability);
    }

    /// The store's resource table (where guest-returned pollables live).
    pub fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    /// True once a memory growth was refused for exceeding the cap.
    pub fn memory_limit_hit(&self) -> bool {
        self.limiter.memory_limit_hit
    }

    /// The memory cap of this store in bytes.
    pub fn memory_cap(&self) -> usize {
        self.limiter.memory_cap
    }

    /// The last line(s) the guest wrote to stderr (a Rust panic message).
    pub fn stderr_tail(&self) -> String {
        self.stderr_tail.lock().map(|t| t.text()).unwrap_or_default()
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// The memory cap of a store, remembering whether it was hit.
struct TaskLimiter {
    memory_cap: usize,
    memory_limit_hit: bool,
}

impl ResourceLimiter for TaskLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            self.memory_limit_hit = true;
            return Ok(false);
        }
        Ok(maximum.is_none_or(|max| desired <= max))
    }

    fn table_growing(&mut self, _current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(maximum.is_none_or(|max| desired <= max))
    }
}

/// The last bytes a guest wrote to stderr.
#[derive(Default)]
struct TailBuffer {
    bytes: Vec<u8>,
}

const TAIL_CAP: usize = 512;

impl TailBuffer {
    fn push(&mut self, data: &[u8]) {
        self.bytes.extend_from_slice(data);
        if self.bytes.len() > TAIL_CAP {
            let cut = self.bytes.len() - TAIL_CAP;
            self.bytes.drain(..cut);
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).trim().to_string()
    }
}

/// Guest stdout/stderr: every line becomes a `tracing` debug event.
struct LogStream {
    tag: StoreTag,
    stream: &'static str,
    tail: Option<Arc<Mutex<TailBuffer>>>,
}

impl IsTerminal for LogStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(LogWriter { tag: self.tag.clone(), stream: self.stream, tail: self.tail.clone(), line: Vec::new() })
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        // Only the WASIp3 bindings use this; a sink is enough for them.
        Box::new(tokio::io::sink())
    }
}

/// Longest line kept before it is logged in pieces.
const LINE_CAP: usize = 4096;

struct LogWriter {
    tag: StoreTag,
    stream: &'static str,
    tail: Option<Arc<Mutex<TailBuffer>>>,
    line: Vec<u8>,
}

impl LogWriter {
    fn emit(&mut self) {
        if self.line.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.line);
        tracing::debug!(
            target: "taskhost::plugin::guest",
            plugin = &*self.tag.plugin,
            version = &*self.tag.version,
            store = &*self.tag.purpose,
            stream = self.stream,
            "{}",
            text.trim_end()
        );
        self.line.clear();
    }
}

impl OutputStream for LogWriter {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        if let Some(tail) = &self.tail
            && let Ok(mut tail) = tail.lock()
        {
            tail.push(&bytes);
        }
        for chunk in bytes.split_inclusive(|b| *b == b'\n') {
            self.line.extend_from_slice(chunk);
            if chunk.ends_with(b"\n") || self.line.len() >= LINE_CAP {
                self.emit();
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[async_trait::async_trait]
impl Pollable for LogWriter {
    async fn ready(&mut self) {}
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        self.emit();
    }
}
