//! The `scripted` kind: background work whose every move its driver decides.
//!
//! Tests and demos use it to reach states real work reaches only by chance:
//! output arriving in chunks, settling on demand, a cancel that fails, a task
//! that ignores cancellation, a `done` that errors. A [`ScriptedTask`] is the
//! handle to one task; a [`ScriptedProducer`] serves the kind as a tool and
//! records every task it started.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::sync::Notify;

use crate::producer::{Descriptor, PreparedRun, Producer, RunMode, runner};
use crate::tasks::{TaskControl, TaskHooks, TaskOutcome, TaskRunner};

/// What a scripted task does when asked to cancel.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum CancelMode {
    /// Accept, and settle as killed at once.
    #[default]
    Settle,
    /// Accept, but only settle when told to (`settle`).
    Accept,
    /// Refuse: the cancel call fails with this message.
    Fail(String),
}

/// One scripted task.
pub struct ScriptedTask {
    state: Mutex<ScriptedState>,
    changed: Notify,
    streams_output: bool,
}

#[derive(Default)]
struct ScriptedState {
    unread: String,
    outcome: Option<Result<TaskOutcome, String>>,
    cancel_mode: CancelMode,
    cancels: Vec<Option<String>>,
    abandoned: bool,
    /// What `task_input` sent, and whether it closed the input.
    input: String,
    input_closed: bool,
    output_signal: Option<crate::tasks::OutputSignal>,
}

impl ScriptedTask {
    /// A live task; `streams_output` chooses a stream or a final-output kind.
    pub fn new(streams_output: bool) -> Arc<Self> {
        Arc::new(Self { state: Mutex::new(ScriptedState::default()), changed: Notify::new(), streams_output })
    }

    /// Hooks for the registry; `done` settles when the script says so.
    pub fn hooks(self: &Arc<Self>) -> TaskHooks {
        let task = self.clone();
        let done = async move {
            loop {
                let changed = task.changed.notified();
                if let Some(outcome) = task.state().outcome.clone() {
                    return outcome.map_err(anyhow::Error::msg);
                }
                changed.await;
            }
        };
        TaskHooks::new(self.clone(), Box::pin(done))
    }

    /// A runner that starts this task, for [`crate::tasks::TaskStart::run`].
    pub fn runner(self: &Arc<Self>) -> TaskRunner {
        let task = self.clone();
        runner(async move { Ok(task.hooks()) })
    }

    /// Makes output available to the next read (and tells the registry).
    pub fn push_output(&self, text: &str) {
        let signal = {
            let mut state = self.state();
            state.unread.push_str(text);
            state.output_signal.clone()
        };
        self.changed.notify_waiters();
        if let Some(signal) = signal {
            signal.raise();
        }
    }

    /// Everything sent to the task's input so far, and whether it was closed.
    pub fn input(&self) -> (String, bool) {
        let state = self.state();
        (state.input.clone(), state.input_closed)
    }

    /// Settles the task with this outcome (the first settle wins).
    pub fn settle(&self, outcome: TaskOutcome) {
        self.state().outcome.get_or_insert(Ok(outcome));
        self.changed.notify_waiters();
    }

    /// Makes `done` fail, a producer contract violation.
    pub fn fail_done(&self, error: &str) {
        self.state().outcome.get_or_insert(Err(error.to_string()));
        self.changed.notify_waiters();
    }

    pub fn set_cancel_mode(&self, mode: CancelMode) {
        self.state().cancel_mode = mode;
    }

    /// The reasons of every cancel request received, in order.
    pub fn cancel_requests(&self) -> Vec<Option<String>> {
        self.state().cancels.clone()
    }

    /// True once the registry gave up on the task.
    pub fn was_abandoned(&self) -> bool {
        self.state().abandoned
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ScriptedState> {
        self.state.lock().expect("scripted task poisoned")
    }
}

#[async_trait::async_trait]
impl TaskControl for ScriptedTask {
    async fn cancel(&self, reason: Option<&str>) -> anyhow::Result<()> {
        let mode = {
            let mut state = self.state();
            state.cancels.push(reason.map(str::to_string));
            state.cancel_mode.clone()
        };
        match mode {
            CancelMode::Settle => {
                self.settle(TaskOutcome::killed(None));
                Ok(())
            }
            CancelMode::Accept => Ok(()),
            CancelMode::Fail(message) => Err(anyhow::anyhow!(message)),
        }
    }

    fn streams_output(&self) -> bool {
        self.streams_output
    }

    async fn read_output(&self) -> anyhow::Result<String> {
        Ok(std::mem::take(&mut self.state().unread))
    }

    fn abandon(&self) {
        self.state().abandoned = true;
    }

    fn watch_output(&self, signal: crate::tasks::OutputSignal) {
        self.state().output_signal = Some(signal);
    }

    async fn write_input(&self, data: &[u8], close: bool) -> anyhow::Result<()> {
        let mut state = self.state();
        if state.input_closed {
            anyhow::bail!("its input is already closed");
        }
        state.input.push_str(&String::from_utf8_lossy(data));
        state.input_closed = close;
        Ok(())
    }
}

/// Serves the scripted kind as a tool. Arguments: `{"label": "..."}`.
pub struct ScriptedProducer {
    descriptor: Arc<Descriptor>,
    started: Mutex<Vec<Arc<ScriptedTask>>>,
    runs: AtomicUsize,
    fail_runs_with: Mutex<Option<String>>,
}

impl ScriptedProducer {
    pub fn new(kind: &str, streams_output: bool) -> Arc<Self> {
        Arc::new(Self {
            descriptor: Arc::new(Descriptor {
                kind: kind.to_string(),
                description: format!("A scripted {kind} task whose behaviour the host controls."),
                parameters: json!({
                    "type": "object",
                    "properties": {"label": {"type": "string", "description": "The task's label."}},
                    "additionalProperties": false
                }),
                streams_output,
                // Stream kinds take input, so the input paths can be driven.
                takes_input: streams_output,
            }),
            started: Mutex::new(Vec::new()),
            runs: AtomicUsize::new(0),
            fail_runs_with: Mutex::new(None),
        })
    }

    /// How many times a task was actually started.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// The tasks started so far, in order.
    pub fn started(&self) -> Vec<Arc<ScriptedTask>> {
        self.started.lock().expect("scripted producer poisoned").clone()
    }

    /// Makes every later start fail with this message (`None` to stop).
    pub fn fail_runs_with(&self, message: Option<&str>) {
        *self.fail_runs_with.lock().expect("scripted producer poisoned") = message.map(str::to_string);
    }
}

#[async_trait::async_trait]
impl Producer for Arc<ScriptedProducer> {
    fn descriptor(&self) -> Arc<Descriptor> {
        self.descriptor.clone()
    }

    async fn prepare(&self, args: serde_json::Value, _mode: RunMode) -> anyhow::Result<PreparedRun> {
        let label = args.get("label").and_then(|l| l.as_str()).unwrap_or("scripted").to_string();
        let producer = self.clone();
        Ok(PreparedRun::new(
            label,
            runner(async move {
                producer.runs.fetch_add(1, Ordering::SeqCst);
                if let Some(message) = producer.fail_runs_with.lock().expect("scripted producer poisoned").clone() {
                    anyhow::bail!(message);
                }
                let task = ScriptedTask::new(producer.descriptor.streams_output);
                producer.started.lock().expect("scripted producer poisoned").push(task.clone());
                Ok(task.hooks())
            }),
        ))
    }
}
