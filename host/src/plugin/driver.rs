//! The driver of one wasm task: a single tokio task owns the store and makes every guest
//! call, one at a time, looping `subscribe` → await the pollable → `done` while it serves
//! read, input and cancel requests from a channel (a cancel asks `done` again at once).
//!
//! Invariants:
//! - Every guest call is armed with the per-call deadline; a fault in any export (trap,
//!   deadline, memory limit) settles the task `failed` naming the export and the cause, and
//!   drops the store. No fault reaches another task or the host.
//! - Every byte of output is delivered once, in the order it was produced. `pulled`, the
//!   store's [`OutputSink`], holds what the driver took from the guest and what a forwarded
//!   process (`process.forward-output`) appended as it was read; a read returns `pulled`
//!   first, then the guest's answer. When `done` returns an outcome, `read-output` is called
//!   once more into `pulled`, and the store is dropped before the task settles.
//! - While the registry watches a stream task, each readiness round short of the end pulls
//!   into `pulled` (at most [`bounds::MAX_CHUNK_BYTES`] waiting; the rest stays in the guest)
//!   and raises the output signal. Once a pull returned output, or the guest forwards a
//!   process, the registry takes `pulled` directly ([`TaskControl::take_pulled_output`]).
//! - A read in flight when the task ended (above all one whose own call faulted) answers
//!   [`ReadEndedTask`]; reads after the end take the remainder as plain output. Input sent
//!   to a task that ended is refused with the task's end, never lost silently.
//! - No guest monopolises a worker or a core: every round spends tokio budget, and a pollable
//!   always ready while `done` stays `none` is backed off as [`bounds`] says (reads and
//!   cancels still served at once; a round whose pull returned output is progress). Every
//!   string the guest returns is bounded there too. Guest pollables are dropped with
//!   `HostPollable::drop` (which frees a parent it owns), never `ResourceTable::delete`.
//! - [`TaskControl::abandon`], or dropping every handle to the control, aborts the driver and
//!   drops the store at once, even in the middle of a guest call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument as _;
use wasmtime::Store;
use wasmtime::component::{Resource, ResourceAny};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::io::poll::HostPollable as _;

use super::bounds;
use super::fault::{self, Fault};
use super::state::StoreState;
use super::versions::Guest;
use taskhost_core::tasks::{OutputSignal, ReadEndedTask, SectionLabel, TaskControl, TaskHooks, TaskOutcome};
use taskhost_process::{OutputSink, SpillFile, Stream};

enum Request {
    Read(oneshot::Sender<ReadReply>),
    Cancel(Option<String>, oneshot::Sender<()>),
    /// `task.write-input(data, close)`; the reply is the guest's answer.
    Input(Vec<u8>, bool, oneshot::Sender<anyhow::Result<()>>),
}

/// A read's answer: output, or the end the task reached.
enum ReadReply {
    Output(String),
    Ended(ReadEndedTask),
}

/// What the driver and its controls share.
struct Shared {
    /// Output no read has taken yet: what the driver took from the guest
    /// (pulled on readiness, and the remainder after the end) and what the
    /// task's forwarded processes appended. The store's sink, shared.
    pulled: Arc<OutputSink>,
    /// A pull on readiness returned output: the guest signals new output, so
    /// reads may take `pulled` without asking it.
    pulls_itself: AtomicBool,
    /// The outcome, once the driver reached it (set before `done` settles).
    outcome: Mutex<Option<TaskOutcome>>,
    /// Raised when new output may be readable (the registry's event stream).
    output_signal: std::sync::OnceLock<OutputSignal>,
    /// Spill files of the task's processes: the output it returned may name
    /// them, so they live as long as the task's record holds the control.
    _spill_files: Mutex<Vec<Arc<SpillFile>>>,
    abandoned: AtomicBool,
    /// The durable tree the guest handed over (`spawn-handed-over` for a
    /// stable owner), as the store keeps it.
    handed_over: Option<String>,
    /// Lets go of what the owner read of the handed-over tree's logs, and
    /// removes its directory once the record goes.
    tree_dir: Option<crate::durable_tasks::TreeDir>,
}

/// Everything the driver needs to run a task that `run` just returned.
pub(crate) struct TaskParts {
    pub store: Store<StoreState>,
    pub guest: Guest,
    pub task: ResourceAny,
    pub deadline: Duration,
    pub streams_output: bool,
    /// Pins the version (and so the engine whose epoch ticker bounds calls).
    pub _version: Arc<super::component::PluginVersion>,
}

/// Starts the driver and returns the hooks the registry holds.
pub(crate) fn spawn(mut parts: TaskParts, span: tracing::Span) -> TaskHooks {
    let (tx, rx) = mpsc::unbounded_channel();
    let (done_tx, done_rx) = oneshot::channel();
    let handed_over = parts.store.data_mut().process().handed_over_tree();
    let shared = Arc::new(Shared {
        pulled: parts.store.data_mut().process().output_sink(),
        pulls_itself: AtomicBool::new(false),
        outcome: Mutex::new(None),
        output_signal: std::sync::OnceLock::new(),
        _spill_files: Mutex::new(Vec::new()),
        abandoned: AtomicBool::new(false),
        handed_over: handed_over.clone(),
        tree_dir: handed_over.as_deref().and_then(crate::durable_tasks::TreeDir::of),
    });
    let streams_output = parts.streams_output;
    let plugin = parts.store.data().tag().plugin.clone();
    let driver = Driver { parts, shared: shared.clone() };
    let handle = tokio::spawn(driver.run(rx, done_tx).instrument(span));
    let control = WasmTaskControl { tx, shared: shared.clone(), streams_output, abort: handle.abort_handle() };
    let done = Box::pin(async move {
        match done_rx.await {
            Ok(outcome) => Ok(outcome),
            Err(_) if shared.abandoned.load(Ordering::Acquire) => {
                Ok(TaskOutcome::failed(format!("plugin {plugin} task abandoned: its store was dropped")))
            }
            Err(_) => Err(anyhow!("the driver of a plugin {plugin} task stopped without an outcome")),
        }
    });
    TaskHooks::new(Arc::new(control), done)
}

struct WasmTaskControl {
    tx: mpsc::UnboundedSender<Request>,
    shared: Arc<Shared>,
    streams_output: bool,
    abort: tokio::task::AbortHandle,
}

impl Shared {
    fn take_pulled(&self) -> String {
        self.pulled.take()
    }

    fn push_pulled(&self, text: &str) {
        self.pulled.append(text);
    }

    fn pulled_len(&self) -> usize {
        self.pulled.len()
    }

    /// Every new output is known to raise the output signal.
    fn signals_output(&self) -> bool {
        self.pulls_itself.load(Ordering::Acquire) || self.pulled.is_forwarding()
    }

    /// The answer to a read that was in flight when the driver ended: the
    /// remainder, with the outcome.
    fn ended_read(&self) -> ReadReply {
        let text = self.take_pulled();
        match self.outcome.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            Some(outcome) => ReadReply::Ended(ReadEndedTask::new(text, outcome)),
            None => ReadReply::Output(text),
        }
    }
}

#[async_trait::async_trait]
impl TaskControl for WasmTaskControl {
    async fn cancel(&self, reason: Option<&str>) -> anyhow::Result<()> {
        let (reply, replied) = oneshot::channel();
        if self.tx.send(Request::Cancel(reason.map(str::to_string), reply)).is_ok() {
            // An error here means the driver ended meanwhile: the task settled.
            let _ = replied.await;
        }
        Ok(())
    }

    fn streams_output(&self) -> bool {
        self.streams_output
    }

    async fn read_output(&self) -> anyhow::Result<String> {
        let (reply, replied) = oneshot::channel();
        let answer = match self.tx.send(Request::Read(reply)) {
            Ok(()) => replied.await.unwrap_or_else(|_| ReadReply::Output(self.shared.take_pulled())),
            Err(_) => ReadReply::Output(self.shared.take_pulled()),
        };
        match answer {
            ReadReply::Output(text) => Ok(text),
            ReadReply::Ended(ended) => Err(ended.into()),
        }
    }

    async fn write_input(&self, data: &[u8], close: bool) -> anyhow::Result<()> {
        let (reply, replied) = oneshot::channel();
        if self.tx.send(Request::Input(data.to_vec(), close, reply)).is_ok()
            && let Ok(answer) = replied.await
        {
            return answer;
        }
        Err(anyhow!("the task ended before its input could be delivered"))
    }

    fn take_pulled_output(&self, into: &mut dyn FnMut(&str)) -> bool {
        self.take_pulled_sections(&mut |text, _| into(text))
    }

    /// Each part with the stream it came from, as the sink recorded it: a
    /// later read that begins inside stderr starts with `[stderr]`.
    fn take_pulled_sections(&self, into: &mut dyn FnMut(&str, SectionLabel)) -> bool {
        if !self.shared.signals_output() {
            return false;
        }
        self.shared.pulled.take_sections_with(|text, sections| {
            for (part, stream) in sections.parts(text) {
                into(
                    part,
                    match stream {
                        Stream::Stderr => Some("[stderr]"),
                        Stream::Stdout => None,
                    },
                );
            }
        });
        true
    }

    fn watch_output(&self, signal: OutputSignal) {
        let _ = self.shared.output_signal.set(signal.clone());
        // Forwarded output (and the driver's own pulls) raise it from the sink.
        self.shared.pulled.set_signal(Box::new(move || signal.raise()));
    }

    fn abandon(&self) {
        self.shared.abandoned.store(true, Ordering::Release);
        self.abort.abort();
    }

    fn handed_over_tree(&self) -> Option<String> {
        self.shared.handed_over.clone()
    }

    fn tree_cursor(&self) -> Option<Arc<str>> {
        self.shared.tree_dir.as_ref().and_then(|dir| dir.unstored(self.shared.pulled.taken_mark()))
    }

    fn tree_cursor_stored(&self, cursor: &str) {
        if let Some(dir) = &self.shared.tree_dir {
            dir.cursor_stored(cursor);
        }
    }
}

struct Driver {
    parts: TaskParts,
    shared: Arc<Shared>,
}

/// How the loop ended.
enum End {
    Settled(TaskOutcome),
    /// Every control handle is gone: nobody can read or cancel any more.
    Orphaned,
}

impl Driver {
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Request>, done_tx: oneshot::Sender<TaskOutcome>) {
        let Driver { mut parts, shared } = self;
        // Requests taken but not answered because the store faulted under them.
        let mut deferred = Vec::new();
        let end = drive(&mut parts, &mut rx, &mut deferred, &shared).await;
        let spill_files = parts.store.data_mut().process().take_spill_files();
        *shared._spill_files.lock().unwrap_or_else(|e| e.into_inner()) = spill_files;
        // Dropping the store kills every process the task still holds.
        drop(parts);
        let outcome = match end {
            End::Settled(outcome) => outcome,
            End::Orphaned => {
                tracing::debug!("every handle to the task is gone; its store was dropped");
                return;
            }
        };
        tracing::debug!(status = ?outcome.status, detail = ?outcome.detail, "wasm task settled");
        rx.close();
        *shared.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome.clone());
        // Nothing more is appended: keep only what waits for the last read.
        shared.pulled.release();
        let _ = done_tx.send(outcome);
        while let Ok(request) = rx.try_recv() {
            deferred.push(request);
        }
        for request in deferred {
            match request {
                Request::Read(reply) => {
                    let _ = reply.send(shared.ended_read());
                }
                Request::Cancel(_, reply) => {
                    let _ = reply.send(());
                }
                Request::Input(_, _, reply) => {
                    let _ = reply.send(Err(anyhow!("the task ended before its input could be delivered")));
                }
            }
        }
    }
}

async fn drive(
    parts: &mut TaskParts,
    rx: &mut mpsc::UnboundedReceiver<Request>,
    deferred: &mut Vec<Request>,
    shared: &Shared,
) -> End {
    // Rounds in a row whose pollable was ready at once and after which the
    // task was still not done: a guest that would spin a core (`bounds`).
    let mut empty_rounds = 0u32;
    loop {
        // A guest whose pollable is always ready but which is never done
        // would otherwise spin on this worker without ever yielding.
        tokio::task::consume_budget().await;
        let pause = bounds::backoff(empty_rounds);
        if !pause.is_zero() {
            // Back off, still serving reads and cancels without delay.
            let sleep = tokio::time::sleep(pause);
            tokio::pin!(sleep);
            loop {
                let request = tokio::select! {
                    biased;
                    request = rx.recv() => request,
                    _ = &mut sleep => break,
                };
                match serve(parts, request, deferred, shared).await {
                    // An empty read is served but does not end the back-off:
                    // the host's own drain reads on every readiness, so only
                    // output says the guest made progress.
                    Served::Continue => {}
                    Served::Progress => empty_rounds = 0,
                    // A cancel may have finished the work: ask `done` now.
                    Served::AskDone => {
                        empty_rounds = 0;
                        break;
                    }
                    Served::End(end) => return end,
                }
            }
        }
        let pollable = match call_subscribe(parts).await {
            Ok(pollable) => pollable,
            Err(fault) => return End::Settled(TaskOutcome::failed(fault.detail)),
        };
        // When the wait began, and whether a cancel, a read or a pull with output
        // came meanwhile (progress: the round was no spin).
        let wait_began = tokio::time::Instant::now();
        let mut made_progress = false;
        // Wait for readiness, serving requests meanwhile.
        loop {
            let event = {
                let table = parts.store.data_mut().table();
                let ready = table.block(Resource::<DynPollable>::new_borrow(pollable.rep()));
                tokio::select! {
                    biased;
                    request = rx.recv() => Event::Request(request),
                    ready = ready => Event::Ready(ready),
                }
            };
            match event {
                Event::Ready(Ok(())) => break,
                Event::Ready(Err(err)) => {
                    let detail = format!(
                        "plugin {} failed in task.subscribe: the pollable it returned cannot be awaited: {err:#}",
                        parts.store.data().tag().plugin
                    );
                    return End::Settled(TaskOutcome::failed(detail));
                }
                Event::Request(request) => match serve(parts, request, deferred, shared).await {
                    Served::Continue => {}
                    Served::Progress => made_progress = true,
                    Served::AskDone => {
                        made_progress = true;
                        break;
                    }
                    Served::End(end) => return end,
                },
            }
        }
        if let Err(err) = parts.store.data_mut().table().drop(pollable) {
            let detail = format!(
                "plugin {} failed in task.subscribe: cannot drop the pollable it returned: {err:#}",
                parts.store.data().tag().plugin
            );
            return End::Settled(TaskOutcome::failed(detail));
        }
        match call_done(parts).await {
            Ok(Some(outcome)) => {
                // Drain what is left, so later reads still get it.
                return match call_read_output(parts).await {
                    Ok(text) => {
                        shared.push_pulled(&text);
                        End::Settled(outcome)
                    }
                    Err(fault) => End::Settled(TaskOutcome::failed(fault.detail)),
                };
            }
            Ok(None) => {
                // Readiness without an end: output may have changed. Pull
                // it now, while the registry drains this task (bounded: a
                // drain that lags leaves the rest in the guest).
                if let Some(signal) = shared.output_signal.get() {
                    if parts.streams_output && shared.pulled_len() < bounds::MAX_CHUNK_BYTES {
                        match call_read_output(parts).await {
                            Ok(text) if !text.is_empty() => {
                                shared.push_pulled(&text);
                                shared.pulls_itself.store(true, Ordering::Release);
                                made_progress = true;
                            }
                            Ok(_) => {}
                            Err(fault) => return End::Settled(TaskOutcome::failed(fault.detail)),
                        }
                    }
                    signal.raise();
                }
                // Readiness that came at once (a zero-length timer only
                // yields) is a spin; a long real wait is not. Between the
                // two, leave the count alone: a spinning round delayed by a
                // loaded machine must not reset it.
                let waited = wait_began.elapsed();
                if made_progress || waited >= bounds::IDLE_WAIT {
                    empty_rounds = 0;
                } else if waited < bounds::SPIN_WAIT {
                    empty_rounds = empty_rounds.saturating_add(1);
                    if empty_rounds == bounds::SPIN_ROUNDS {
                        tracing::debug!(
                            rounds = empty_rounds,
                            "the task's pollable is always ready but it is not done; backing off"
                        );
                    }
                }
            }
            Err(fault) => return End::Settled(TaskOutcome::failed(fault.detail)),
        }
    }
}

/// What serving one request means for the loop.
enum Served {
    Continue,
    /// A read returned output: the guest is making progress.
    Progress,
    /// A cancel was delivered: ask `done` at once.
    AskDone,
    End(End),
}

/// Serves one client request (a read or a cancel) with a guest call. A
/// read answers what was pulled before it, then the guest's new output.
async fn serve(
    parts: &mut TaskParts,
    request: Option<Request>,
    deferred: &mut Vec<Request>,
    shared: &Shared,
) -> Served {
    match request {
        None => Served::End(End::Orphaned),
        Some(Request::Read(reply)) => match call_read_output(parts).await {
            Ok(fresh) => {
                let progressed = !fresh.is_empty();
                let mut text = shared.take_pulled();
                text.push_str(&fresh);
                let _ = reply.send(ReadReply::Output(text));
                if progressed { Served::Progress } else { Served::Continue }
            }
            Err(fault) => {
                deferred.push(Request::Read(reply));
                Served::End(End::Settled(TaskOutcome::failed(fault.detail)))
            }
        },
        Some(Request::Cancel(reason, reply)) => match call_cancel(parts, reason.as_deref()).await {
            Ok(()) => {
                let _ = reply.send(());
                Served::AskDone
            }
            Err(fault) => {
                deferred.push(Request::Cancel(reason, reply));
                Served::End(End::Settled(TaskOutcome::failed(fault.detail)))
            }
        },
        Some(Request::Input(data, close, reply)) => match call_write_input(parts, &data, close).await {
            Ok(answer) => {
                let _ =
                    reply.send(answer.map_err(|message| {
                        anyhow!("{}", bounds::cap(message, bounds::MAX_DETAIL_BYTES, "error message"))
                    }));
                Served::Continue
            }
            Err(fault) => {
                deferred.push(Request::Input(data, close, reply));
                Served::End(End::Settled(TaskOutcome::failed(fault.detail)))
            }
        },
    }
}

enum Event {
    Ready(wasmtime::Result<()>),
    Request(Option<Request>),
}

/// Runs one armed call and classifies its error.
macro_rules! guest_call {
    ($parts:ident, $export:literal, |$store:ident, $guest:ident, $task:ident| $call:expr) => {{
        let deadline = $parts.deadline;
        let clock = fault::arm(&mut $parts.store, deadline);
        let result = {
            let $store = &mut $parts.store;
            let $guest = &$parts.guest;
            let $task = $parts.task;
            fault::bounded(&clock, $call).await
        };
        result.map_err(|err| {
            let fault = fault::classify(&$parts.store, deadline, $export, &err);
            tracing::warn!(export = $export, cause = ?fault.cause, detail = %fault.detail, "plugin fault; failing the task");
            fault
        })
    }};
}

async fn call_done(parts: &mut TaskParts) -> Result<Option<TaskOutcome>, Fault> {
    guest_call!(parts, "task.done", |store, guest, task| guest.done(store, task))
}

async fn call_subscribe(parts: &mut TaskParts) -> Result<Resource<DynPollable>, Fault> {
    guest_call!(parts, "task.subscribe", |store, guest, task| guest.subscribe(store, task))
}

/// One `read-output` call, its result bounded: more than
/// [`bounds::MAX_CHUNK_BYTES`] at once breaks the contract and is cut.
async fn call_read_output(parts: &mut TaskParts) -> Result<String, Fault> {
    let text = guest_call!(parts, "task.read-output", |store, guest, task| guest.read_output(store, task))?;
    if text.len() > bounds::MAX_CHUNK_BYTES {
        tracing::warn!(
            bytes = text.len(),
            limit = bounds::MAX_CHUNK_BYTES,
            "read-output returned more than a chunk may hold; truncated"
        );
    }
    Ok(bounds::cap(text, bounds::MAX_CHUNK_BYTES, "read-output chunk"))
}

async fn call_cancel(parts: &mut TaskParts, reason: Option<&str>) -> Result<(), Fault> {
    guest_call!(parts, "task.cancel", |store, guest, task| guest.cancel(store, task, reason))
}

async fn call_write_input(parts: &mut TaskParts, data: &[u8], close: bool) -> Result<Result<(), String>, Fault> {
    guest_call!(parts, "task.write-input", |store, guest, task| guest.write_input(store, task, data, close))
}
