//! The task vocabulary shared by producers, the registry and its surfaces.
//!
//! The status set is generic and closed; kind-specific meaning (exit codes,
//! stop reasons) rides in `detail`, so the registry never learns process or
//! agent semantics. A producer hands the registry a [`TaskStart`]; its `run`
//! yields [`TaskHooks`] whose `done` settles at quiescence.

use std::fmt;
use std::time::SystemTime;

use futures::future::BoxFuture;

pub use super::stop_cause::StopCause;

use crate::agents::Agent;
use crate::ids::{SessionId, TaskId};
use crate::tasks::SectionLabel;

/// A task's lifecycle state. `Running` and `Stopping` are live; the other
/// four are terminal and final.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    Running,
    /// Cancellation was requested and the producer has not settled yet.
    Stopping,
    Completed,
    Killed,
    Failed,
    /// Live when its host stopped (a crash, a restart) and not carried on:
    /// its work died with the host and is never run again. Terminal.
    Lost,
}

impl TaskStatus {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Killed | Self::Failed | Self::Lost)
    }

    /// The status named `text` (as [`Self::as_str`] writes it).
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "running" => Self::Running,
            "stopping" => Self::Stopping,
            "completed" => Self::Completed,
            "killed" => Self::Killed,
            "failed" => Self::Failed,
            "lost" => Self::Lost,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Completed => "completed",
            Self::Killed => "killed",
            Self::Failed => "failed",
            Self::Lost => "lost",
        }
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a task ended, as a producer reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TerminalStatus {
    Completed,
    Killed,
    Failed,
}

impl From<TerminalStatus> for TaskStatus {
    fn from(status: TerminalStatus) -> Self {
        match status {
            TerminalStatus::Completed => Self::Completed,
            TerminalStatus::Killed => Self::Killed,
            TerminalStatus::Failed => Self::Failed,
        }
    }
}

/// The terminal report of a producer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskOutcome {
    pub status: TerminalStatus,
    /// Rendered into status lines: `exit code: 3`, `max-tokens`.
    pub detail: Option<String>,
    /// Final output of final-output-only kinds, read idempotently once settled.
    pub output: Option<String>,
}

impl TaskOutcome {
    /// An outcome of any status; [`Self::completed`], [`Self::killed`] and
    /// [`Self::failed`] say it shorter.
    pub fn new(status: TerminalStatus, detail: Option<String>) -> Self {
        Self { status, detail, output: None }
    }

    pub fn completed(detail: impl Into<Option<String>>) -> Self {
        Self { status: TerminalStatus::Completed, detail: detail.into(), output: None }
    }

    pub fn killed(detail: impl Into<Option<String>>) -> Self {
        Self { status: TerminalStatus::Killed, detail: detail.into(), output: None }
    }

    pub fn failed(detail: impl Into<String>) -> Self {
        Self { status: TerminalStatus::Failed, detail: Some(detail.into()), output: None }
    }

    pub fn with_output(mut self, output: impl Into<String>) -> Self {
        self.output = Some(output.into());
        self
    }
}

/// The live half of a running task: what the registry may ask of it.
///
/// Implementations must be cheap to call concurrently with the task's `done`
/// future; the registry never holds its own locks across these calls.
#[async_trait::async_trait]
pub trait TaskControl: Send + Sync + 'static {
    /// Requests termination. Idempotent; a successful return must lead to
    /// `done` settling. An error means the request could not even be made: it
    /// reaches the caller, and the task is left untouched.
    async fn cancel(&self, reason: Option<&str>) -> anyhow::Result<()>;

    /// True for stream kinds, whose output is read incrementally.
    fn streams_output(&self) -> bool;

    /// Stream kinds: everything produced since the previous call, formatted
    /// for the model. Consecutive calls never return the same output twice,
    /// and the remainder stays readable after `done` settled.
    /// Final-output-only kinds are never asked. A read whose own work ended
    /// the task (a fault in it) should fail with [`ReadEndedTask`], so its
    /// caller is told of the end.
    async fn read_output(&self) -> anyhow::Result<String> {
        Ok(String::new())
    }

    /// Stream kinds that pull their own output as it appears (before raising
    /// the output signal): hands what they pulled since the previous call to
    /// `into` (once, possibly empty) and returns true, without asking the
    /// task again, so the registry's drain and reads cost no round trip into
    /// it (and, lent rather than moved, no allocation per chunk). False (the
    /// default, `into` not called): the producer does not (or not yet) pull
    /// by itself, so the registry calls [`read_output`](Self::read_output).
    /// An implementation returns true only once every new output is known to
    /// raise the signal, since reads then rely on it; output it holds at the
    /// end is still taken here.
    fn take_pulled_output(&self, into: &mut dyn FnMut(&str)) -> bool {
        let _ = into;
        false
    }

    /// As [`take_pulled_output`](Self::take_pulled_output), handing over
    /// each part of the output with the label of the part it belongs to
    /// (its label line is in the text where the part begins): a read that
    /// begins inside a labelled part (`Some("[stderr]")`) starts with that
    /// label line. The registry calls this one; the default hands everything
    /// over unlabelled, through `take_pulled_output`.
    fn take_pulled_sections(&self, into: &mut dyn FnMut(&str, SectionLabel)) -> bool {
        self.take_pulled_output(&mut |text| into(text, None))
    }

    /// The registry gave up on this task (a teardown cancel failed or timed
    /// out) and has force-failed its record. Release whatever can be released
    /// without the task's cooperation. The default does nothing.
    fn abandon(&self) {}

    /// Called once, right after the task was registered: raise `signal`
    /// whenever new output may be readable, so the registry's event stream
    /// can tell a UI (see [`crate::tasks::TaskRegistry::subscribe`]). Raising
    /// it is cheap and may be spurious. The default never raises it.
    fn watch_output(&self, signal: OutputSignal) {
        let _ = signal;
    }

    /// Writes `data` to the task's input, then closes it when `close` is
    /// set. Asked only of tasks started with [`TaskInput::Open`] that are
    /// still live; an error (the input was closed, the task's program no
    /// longer reads) reaches the caller. The default takes no input.
    async fn write_input(&self, data: &[u8], close: bool) -> anyhow::Result<()> {
        let _ = (data, close);
        anyhow::bail!("this task takes no input")
    }

    /// A durable tree whose outcome is the task's (its producer handed it
    /// over), as the text a [`TreeAdopter`] of a later process re-adopts it
    /// by; asked once, at the commit, and stored with the start. The
    /// default: none (the task cannot outlive its process).
    fn handed_over_tree(&self) -> Option<String> {
        None
    }

    /// For a handed-over tree: where its output stood after the text the
    /// registry took last (see [`Self::take_pulled_sections`]); the
    /// registry stores it after each consuming read, so a later process
    /// resumes the output right after what the owner read. None: nothing
    /// to store (no tree, or the store holds this cursor already). Default:
    /// none.
    fn tree_cursor(&self) -> Option<std::sync::Arc<str>> {
        None
    }

    /// For a handed-over tree: the store now holds `cursor` (from
    /// [`Self::tree_cursor`]), so no process reads the tree's output before
    /// it again, and the tree may let go of it. Default: nothing.
    fn tree_cursor_stored(&self, _cursor: &str) {}
}

/// Re-adopts handed-over trees at start-up ([`crate::tasks::TaskRegistry::readopt`]):
/// the host side of a durable tree, which the registry (free of processes)
/// cannot prove or reach itself.
pub trait TreeAdopter: Send + Sync {
    /// Re-adopts the tree `tree` names (a [`TaskControl::handed_over_tree`]
    /// text), its output resuming at `cursor`: the task's control and the
    /// future of its outcome, as a start gives. `kill`: its stop was
    /// requested before the restart, so it is killed now. An error is why
    /// the tree cannot be carried on (the task is then `lost` with it).
    fn adopt(&self, tree: &str, cursor: Option<&str>, kill: bool) -> Result<TaskHooks, String>;
}

/// Whether a task can take input while it runs (`task_input`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TaskInput {
    /// Its kind takes no input.
    #[default]
    Unsupported,
    /// Its kind could, but the start did not ask for it (`interactive`
    /// unset): its input is empty from the start.
    NotRequested,
    /// Started with `interactive: true`: input stays open until closed.
    Open,
}

/// A milestone to tell the owner of while the task runs (`notify_on`).
#[derive(Clone, Debug, Default)]
pub struct NotifyOn {
    /// A line of output matching it injects a notice, once until the owner
    /// next reads the task.
    pub pattern: Option<regex::Regex>,
    /// Running this long with no new output injects a notice, once per stall.
    pub stalled: Option<std::time::Duration>,
}

impl NotifyOn {
    /// Notify when an output line matches `pattern`.
    pub fn with_pattern(mut self, pattern: regex::Regex) -> Self {
        self.pattern = Some(pattern);
        self
    }

    /// Notify when no output came for `after`.
    pub fn with_stalled(mut self, after: std::time::Duration) -> Self {
        self.stalled = Some(after);
        self
    }
}

/// How a background start wants its task served, beyond the producer's
/// own arguments.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct TaskOptions {
    pub input: TaskInput,
    pub notify_on: Option<NotifyOn>,
    /// Stop the task when its owner has not read it for this long (see
    /// [`crate::tasks::RegistryConfig::default_ttl`] for the default).
    pub ttl: Option<std::time::Duration>,
}

impl TaskOptions {
    pub fn with_ttl(mut self, ttl: impl Into<Option<std::time::Duration>>) -> Self {
        self.ttl = ttl.into();
        self
    }

    pub fn with_input(mut self, input: TaskInput) -> Self {
        self.input = input;
        self
    }

    pub fn with_notify_on(mut self, notify_on: impl Into<Option<NotifyOn>>) -> Self {
        self.notify_on = notify_on.into();
        self
    }
}

/// The error a [`TaskControl::read_output`] returns when the read itself
/// ended the task (a plugin that faulted in `read-output`): the registry
/// settles the task with `outcome` (unless another outcome got there first)
/// and answers the read with `text` and the terminal status, so the caller
/// that caused the end is the one told of it.
#[derive(Debug, thiserror::Error)]
#[error("the read ended the task [{}]", TaskSnapshot::status_line_of(outcome.status.into(), outcome.detail.as_deref()))]
#[non_exhaustive]
pub struct ReadEndedTask {
    /// Output read before the end (may be empty).
    pub text: String,
    pub outcome: TaskOutcome,
}

impl ReadEndedTask {
    pub fn new(text: impl Into<String>, outcome: TaskOutcome) -> Self {
        Self { text: text.into(), outcome }
    }
}

/// A producer's "new output may be readable" signal. Cheap to clone.
#[derive(Clone)]
pub struct OutputSignal(std::sync::Arc<dyn RaiseOutput>);

/// What raising an [`OutputSignal`] does: a closure ([`OutputSignal::new`]),
/// or the registry's own target, made in one allocation per task.
pub(crate) trait RaiseOutput: Send + Sync + 'static {
    fn raise(&self);
}

struct RaiseFn<F>(F);

impl<F: Fn() + Send + Sync + 'static> RaiseOutput for RaiseFn<F> {
    fn raise(&self) {
        (self.0)()
    }
}

impl OutputSignal {
    pub fn new(raise: impl Fn() + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(RaiseFn(raise)))
    }

    pub(crate) fn to(target: std::sync::Arc<dyn RaiseOutput>) -> Self {
        Self(target)
    }

    pub fn raise(&self) {
        self.0.raise()
    }
}

impl fmt::Debug for OutputSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OutputSignal")
    }
}

/// A change in the registry, for UIs and embedders
/// ([`crate::tasks::TaskRegistry::subscribe`]). Serialized with an `event`
/// tag: `{"event": "settled", "task": {...}}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TaskEvent {
    /// A task was registered.
    Started { task: TaskSnapshot },
    /// New output may be readable (no text: read it through the registry).
    Output { id: TaskId, owner_session: Option<SessionId> },
    /// A task reached its terminal state.
    Settled { task: TaskSnapshot },
    /// A record left the registry (history cap, owner or registry disposal).
    Released { id: TaskId, owner_session: Option<SessionId> },
}

/// What a producer's `run` returns.
#[non_exhaustive]
pub struct TaskHooks {
    pub control: std::sync::Arc<dyn TaskControl>,
    /// Settles with the outcome at QUIESCENCE, after the task released its
    /// resources. An `Err` is a producer contract violation, contained as a
    /// `failed` outcome whose detail carries the error.
    pub done: BoxFuture<'static, anyhow::Result<TaskOutcome>>,
}

impl TaskHooks {
    pub fn new(
        control: std::sync::Arc<dyn TaskControl>,
        done: BoxFuture<'static, anyhow::Result<TaskOutcome>>,
    ) -> Self {
        Self { control, done }
    }
}

/// Starts the work once every preflight check passed. Called exactly once.
/// An error propagates to the caller and nothing is registered; the producer
/// owns the cleanup of its own failed start.
pub type TaskRunner = Box<dyn FnOnce() -> BoxFuture<'static, anyhow::Result<TaskHooks>> + Send>;

/// A producer's request to register background work.
#[non_exhaustive]
pub struct TaskStart {
    /// Producer kind, also the id prefix. See [`crate::ids::is_valid_kind`].
    pub kind: String,
    /// One-line model-facing label.
    pub label: String,
    /// The spawning agent, or `None` for an unowned task (open to every
    /// caller, alive until the registry is disposed).
    pub owner: Option<Agent>,
    /// Free-form producer facts shown to hosts, never to the model (the
    /// plugin version a wasm task runs on).
    pub producer_info: Option<String>,
    /// Input and milestone options (the defaults: no input, no milestones).
    pub options: TaskOptions,
    pub run: TaskRunner,
}

impl TaskStart {
    /// An unowned start with no producer info and default options; add
    /// what applies with the `with_*` methods.
    pub fn new(kind: impl Into<String>, label: impl Into<String>, run: TaskRunner) -> Self {
        Self {
            kind: kind.into(),
            label: label.into(),
            owner: None,
            producer_info: None,
            options: TaskOptions::default(),
            run,
        }
    }

    /// The agent that owns the task (`None`: unowned).
    pub fn with_owner(mut self, owner: Option<Agent>) -> Self {
        self.owner = owner;
        self
    }

    pub fn with_producer_info(mut self, producer_info: Option<String>) -> Self {
        self.producer_info = producer_info;
        self
    }

    pub fn with_options(mut self, options: TaskOptions) -> Self {
        self.options = options;
        self
    }
}

/// A read-only projection of a task record, never live state. Serializes
/// with times as milliseconds since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct TaskSnapshot {
    pub id: TaskId,
    pub kind: String,
    pub label: String,
    pub owner_session: Option<SessionId>,
    pub status: TaskStatus,
    pub detail: Option<String>,
    #[serde(rename = "started_at_ms", serialize_with = "unix_ms")]
    pub started_at: SystemTime,
    #[serde(rename = "finished_at_ms", serialize_with = "unix_ms_opt")]
    pub finished_at: Option<SystemTime>,
    /// The terminal state was (or is being) reported to the owner through an
    /// explicit response: a kill, or a read or wait that returned it.
    /// Completion notices are suppressed when set.
    pub reported: bool,
    /// Free-form facts the producer attached (for wasm plugins: the plugin
    /// version the task runs on). Not part of the model-facing texts.
    pub producer_info: Option<String>,
    /// Who stopped the task, once someone asked it to stop (its owner with
    /// `task_kill`, the dashboard, a time to live, a limit, an operator);
    /// `None` while nobody did. A `killed` end whose cause is not its owner
    /// is told to the owner in a notice that names the cause.
    pub stop_cause: Option<StopCause>,
    /// When a live task with a time to live will be stopped unless its
    /// owner reads it first (each read moves it); `None` for a task without
    /// one and once the task ended.
    #[serde(rename = "expires_at_ms", serialize_with = "unix_ms_opt")]
    pub expires_at: Option<SystemTime>,
}

impl TaskSnapshot {
    /// The model-facing status line: `[status: completed, exit code: 0]`.
    pub fn status_line(&self) -> String {
        Self::status_line_of(self.status, self.detail.as_deref())
    }

    /// The status line for a status and an optional detail.
    pub fn status_line_of(status: TaskStatus, detail: Option<&str>) -> String {
        match detail {
            Some(detail) if !detail.is_empty() => format!("[status: {status}, {detail}]"),
            _ => format!("[status: {status}]"),
        }
    }
}

fn unix_ms<S: serde::Serializer>(at: &SystemTime, serializer: S) -> Result<S::Ok, S::Error> {
    let ms = at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    serializer.serialize_u64(ms)
}

fn unix_ms_opt<S: serde::Serializer>(at: &Option<SystemTime>, serializer: S) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => unix_ms(at, serializer),
        None => serializer.serialize_none(),
    }
}

/// The result of [`crate::tasks::TaskRegistry::read`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct TaskRead {
    /// Stream kinds: the consuming delta. Final kinds: empty while live, then
    /// the final output, idempotently.
    pub text: String,
    pub snapshot: TaskSnapshot,
}

/// The result of [`crate::tasks::TaskRegistry::kill`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "result", content = "task", rename_all = "snake_case")]
pub enum KillResult {
    /// Cancellation was requested; the task is `stopping` (or just settled).
    Requested(TaskSnapshot),
    /// The task had already settled; nothing was cancelled.
    AlreadyTerminal(TaskSnapshot),
}

/// Why a registry operation was refused. Every message says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    #[error("unknown task id {0}: no background task has this id (task_list shows your tasks)")]
    UnknownTask(TaskId),
    #[error("task {0} belongs to another session")]
    ForeignTask(TaskId),
    #[error(
        "background tasks unavailable: no control surface is attached \
         (attach one with TaskRegistry::attach_surface, as the control tools do)"
    )]
    NoControlSurface,
    #[error("invalid task kind {0:?}: use lowercase letters, digits, '_' or '-', starting with a letter")]
    InvalidKind(String),
    #[error("a {kind} task needs a label (a one-line description for task_list); the producer gave an empty one")]
    EmptyLabel { kind: String },
    #[error("agent {0} is not a live agent: it was disposed or replaced, so it cannot own new tasks")]
    OwnerNotLive(String),
    #[error(
        "agent {0} belongs to another agent registry than this task registry's; \
         create owners with the same host's create_agent"
    )]
    ForeignAgent(String),
    #[error(
        "too many live background tasks for {owner} ({limit} running or stopping): a slot frees when one finishes. \
         Stop one that no longer matters with task_kill, or wait for one to finish with task_output (wait: true), \
         then retry"
    )]
    TooManyTasks { owner: String, limit: usize },
    #[error("the task registry is disposed; no new tasks can start")]
    Disposed,
    #[error("task {id} is a {kind} task, and {kind} tasks take no input")]
    NoInput { id: TaskId, kind: String },
    #[error(
        "task {0} was started without interactive: true, so its input is closed (it reads end-of-file); \
         to send input, start the command again with run_in_background: true and interactive: true"
    )]
    NotInteractive(TaskId),
    #[error("task {id} has already finished {status_line}; it takes no more input")]
    InputToFinished { id: TaskId, status_line: String },
    #[error("the wait for task {0} was aborted")]
    WaitAborted(TaskId),
    /// The producer refused or failed. The message is `context: cause`,
    /// the cause with its whole chain, printed once: the cause is part of
    /// this message, not a separate `source()`, so a reader that walks the
    /// chain (`{:#}` of an `anyhow::Error`) does not print it twice.
    #[error("{context}: {cause:#}")]
    Producer { context: String, cause: anyhow::Error },
    /// The store could not record a start (write-ahead): the start is
    /// refused and its work stopped; `id` is never issued again.
    #[error(
        "the task could not be recorded in the task store ({store}): {cause}. The start is refused and its \
         work was stopped; retry once the store can write again (a full disk or a read-only state directory \
         is the usual cause)"
    )]
    NotRecorded { id: TaskId, store: String, cause: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_producer_error_prints_its_cause_once_however_it_is_shown() {
        let cause = anyhow::anyhow!("its stdin is already closed").context("the pipe");
        let error = TaskError::Producer { context: "sending input to task bash-1 failed".to_string(), cause };
        let expected = "sending input to task bash-1 failed: the pipe: its stdin is already closed";
        assert_eq!(error.to_string(), expected, "what the model reads");
        assert!(std::error::Error::source(&error).is_none());
        assert_eq!(format!("{:#}", anyhow::Error::from(error)), expected, "an anyhow chain, as logs print it");
    }
}
