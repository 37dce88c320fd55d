//! The registry's output operations: the consuming read, the views, the
//! dashboard's peek, the drain that pulls output as it appears, and the
//! milestone notices (`notify_on`) that watch it.
//!
//! Model: every pull from a producer goes through the task's
//! [`TaskOutput`] (its [`OutputLog`] and milestone state) under the task's
//! own async mutex, never with the registry lock held across it, so output
//! is never reordered and every reader sees one log. A producer's output
//! signal schedules one drain at a time per task; reads and views pull
//! first too, so they never miss output the drain has not reached yet. A
//! producer that pulls its own output before it signals
//! ([`TaskControl::take_pulled_output`], the wasm driver) is drained from
//! what it pulled, with no call into it: a read then costs a lock and a
//! copy, and a reader polling in a loop does not slow the stream down.
//!
//! Invariants:
//! - Views and peeks never move the consuming cursor and never report the
//!   end (no notice is suppressed by looking).
//! - A pattern notice is injected once, then not again until the owner next
//!   reads or views the task; a stall notice once per stall (new output ends
//!   the stall). Neither goes to an unowned task, a finished one, or a gone
//!   owner. Quoted output is capped and stripped of control characters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::guards::HeldEnd;
use super::settle::prune_history;
use super::state::{Owner, fenced, fenced_mut};
use super::*;
use crate::tasks::output::{FileTarget, OutputLog, SectionLabel, ViewRequest};
use crate::tasks::peek::{OutputPeek, TAIL_LIMIT};
use crate::tasks::replica::{ReplayedOutput, ReplicaPosition, new_epoch};

/// The bytes of an output line a pattern notice quotes at most.
pub const NOTICE_LINE_LIMIT: usize = 200;

/// One task's output and the milestones watching it.
pub(super) struct TaskOutput {
    pub(super) log: OutputLog,
    pub(super) milestones: Option<Milestones>,
    /// The log's incarnation when it is copied to the registry's replica as
    /// it grows (a stable owner's task; the replica may be set after the
    /// log was made, at a server's start).
    pub(super) replica_epoch: Option<u64>,
}

/// `notify_on` state of one task.
pub(super) struct Milestones {
    pattern: Option<regex::Regex>,
    /// A match may notify (cleared by a notice, set by the owner's next read).
    pattern_armed: bool,
    stalled: Option<Duration>,
    last_output: Instant,
    stall_notified: bool,
    /// For the stall notice's wording.
    interactive: bool,
}

impl TaskOutput {
    pub(super) fn new(log: OutputLog, options: &TaskOptions) -> Self {
        let milestones = options.notify_on.as_ref().map(|notify_on| Milestones {
            pattern: notify_on.pattern.clone(),
            pattern_armed: true,
            stalled: notify_on.stalled,
            last_output: Instant::now(),
            stall_notified: false,
            interactive: options.input == TaskInput::Open,
        });
        Self { log, milestones, replica_epoch: None }
    }

    /// The owner looked at the task: a pattern may notify again.
    fn rearm(&mut self) {
        if let Some(milestones) = self.milestones.as_mut() {
            milestones.pattern_armed = true;
        }
    }
}

/// A stream task's output as its record and its readers share it: the log
/// under its own async mutex (the deref), and the `notify_on.stalled_ms`
/// watcher, stopped at settlement.
pub(super) struct StreamOutput {
    output: tokio::sync::Mutex<TaskOutput>,
    stall_watcher: std::sync::OnceLock<tokio::task::AbortHandle>,
}

impl StreamOutput {
    pub(super) fn new(output: TaskOutput) -> Self {
        Self { output: tokio::sync::Mutex::new(output), stall_watcher: std::sync::OnceLock::new() }
    }

    /// The task settled: no stall notice any more.
    pub(super) fn stop_stall_watcher(&self) {
        if let Some(watcher) = self.stall_watcher.get() {
            watcher.abort();
        }
    }
}

impl std::ops::Deref for StreamOutput {
    type Target = tokio::sync::Mutex<TaskOutput>;

    fn deref(&self) -> &Self::Target {
        &self.output
    }
}

/// Where a read finds a task's output.
pub(super) enum OutputSource {
    /// A stream kind's log.
    Log(Arc<StreamOutput>),
    /// A final-output kind's output (empty while it runs).
    Final(String),
}

/// The registry's side of one task's [`OutputSignal`] (one allocation).
struct RegistrySignal {
    /// This signal, for the drain it schedules.
    this: std::sync::Weak<RegistrySignal>,
    registry: std::sync::Weak<Shared>,
    id: TaskId,
    owner_session: Option<SessionId>,
    /// A drain is scheduled: at most one is, per task at a time.
    scheduled: AtomicBool,
}

impl RaiseOutput for RegistrySignal {
    fn raise(&self) {
        let Some(shared) = self.registry.upgrade() else { return };
        if !self.scheduled.swap(true, Ordering::AcqRel)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
            && let Some(this) = self.this.upgrade()
        {
            let registry = TaskRegistry { shared: shared.clone() };
            runtime.spawn(async move {
                // Cleared first: output signalled during this drain
                // schedules the next one.
                this.scheduled.store(false, Ordering::Release);
                registry.drain(&this.id).await;
            });
        }
        if shared.has_subscribers() {
            let _ = shared
                .events
                .send(TaskEvent::Output { id: self.id.clone(), owner_session: self.owner_session.clone() });
        }
    }
}

impl TaskRegistry {
    /// Reads a task's output: the consuming delta for stream kinds, or (for
    /// final-output kinds) nothing while live and the final output, idempotently,
    /// once settled. A read that returns the terminal state marks it reported.
    pub async fn read(&self, id: &TaskId, caller: Option<&Agent>) -> Result<TaskRead, TaskError> {
        // The status is taken BEFORE the stream is drained: if it says
        // terminal, the producer was quiescent, so the drain got everything.
        let (snapshot, control, output) = {
            let mut state = self.shared.lock();
            let record = fenced_mut(&mut state, id, caller)?;
            self.shared.renew_ttl(record);
            let newly_reported = record.status.is_terminal() && record.reporting != state::Reporting::Reported;
            let held = if record.status.is_terminal() { record.mark_reported() } else { None };
            if newly_reported {
                self.shared.store_reporting(record);
            }
            let taken = (record.snapshot(), record.control.clone(), record.output_source());
            if newly_reported {
                // This read is the report, so older finished tasks may now
                // go (if this one goes too, the control taken above still
                // serves the read below).
                let bucket = record.bucket_key();
                let held = HeldEnd::count(&self.shared, &mut state, held);
                let dropped = prune_history(&mut state, &self.shared, bucket);
                drop(state);
                self.tell_listeners(held);
                self.release_records(dropped);
            }
            taken
        };
        let output = match output {
            OutputSource::Log(log) => log,
            OutputSource::Final(text) => return Ok(TaskRead { text, snapshot }),
        };
        let mut output = output.lock().await;
        output.rearm();
        match self.pull(id, &*control, &mut output).await? {
            None => {
                let text = output.log.take_new();
                let kept = if text.is_empty() { None } else { self.replicate_read(id, &output) };
                // Everything taken is read now: a handed-over tree's output
                // resumes after it on a later process.
                if let Some(cursor) = control.tree_cursor() {
                    match self.shared.store.set_tree_cursor(id, &cursor) {
                        Ok(()) => control.tree_cursor_stored(&cursor),
                        Err(error) => {
                            tracing::error!(task = %id, store = %self.shared.store.describe(), %error, "cannot record where the task's output was read to");
                        }
                    }
                }
                drop(output);
                if let Some(kept) = kept {
                    kept.await;
                }
                Ok(TaskRead { text, snapshot })
            }
            // The read itself ended the task (a fault in it): settle with
            // that outcome, and answer with it.
            Some(outcome) => {
                let text = output.log.take_new();
                let kept = if text.is_empty() { None } else { self.replicate_read(id, &output) };
                drop(output);
                if let Some(kept) = kept {
                    kept.await;
                }
                Ok(self.settle_by_read(id, ReadEndedTask { text, outcome }, snapshot))
            }
        }
    }

    /// A view of a task's kept output (`tail`, `head`, `all`, optionally
    /// `grep`), running or finished, final-output kinds included. Never
    /// consumes and never reports the end; passes the owner fence. Returns
    /// the view's text and the task as it is after the pull.
    pub async fn view(
        &self,
        id: &TaskId,
        caller: Option<&Agent>,
        request: &ViewRequest,
    ) -> Result<(String, TaskSnapshot), TaskError> {
        let (control, output) = {
            let mut state = self.shared.lock();
            let record = fenced_mut(&mut state, id, caller)?;
            self.shared.renew_ttl(record);
            (record.control.clone(), record.output_source())
        };
        let output = match output {
            OutputSource::Log(log) => log,
            OutputSource::Final(text) => return Ok((OutputLog::of_text(&text).view(request), self.get(id, caller)?)),
        };
        let mut output = output.lock().await;
        output.rearm();
        if let Some(outcome) = self.pull(id, &*control, &mut output).await? {
            self.settle(id, outcome);
        }
        let text = output.log.view(request);
        drop(output);
        Ok((text, self.get(id, caller)?))
    }

    /// A non-consuming read for viewers (the web dashboard): the task's
    /// output after byte offset `since`, as far as the last [`TAIL_LIMIT`]
    /// bytes the log keeps in memory reach. The peek never reports the end
    /// (no notice is suppressed). Final-output kinds: their output once
    /// settled. Passes the owner fence like every read.
    pub async fn peek(&self, id: &TaskId, caller: Option<&Agent>, since: u64) -> Result<OutputPeek, TaskError> {
        let (snapshot, control, output) = {
            let state = self.shared.lock();
            let record = fenced(&state, id, caller)?;
            (record.snapshot(), record.control.clone(), record.output_source())
        };
        let output = match output {
            OutputSource::Log(log) => log,
            OutputSource::Final(text) => return Ok(OutputPeek::whole(text, snapshot)),
        };
        let mut output = output.lock().await;
        if let Some(outcome) = self.pull(id, &*control, &mut output).await? {
            // The pull ended the task: settle it unreported, so the owner
            // hears of the end.
            self.settle(id, outcome);
        }
        let end = output.log.total();
        let requested = if since > end { 0 } else { since };
        let (text, start) = output.log.since(since, TAIL_LIMIT);
        Ok(OutputPeek { text, start, end, skipped: start - requested.min(start), snapshot })
    }

    /// Pulls what the producer has new into the log. `Some(outcome)`: the
    /// pull itself ended the task (a fault in the producer's read).
    async fn pull(
        &self,
        id: &TaskId,
        control: &dyn TaskControl,
        output: &mut TaskOutput,
    ) -> Result<Option<TaskOutcome>, TaskError> {
        let before = output.log.total();
        let pulled = self.pull_into(id, control, output).await;
        if output.log.total() != before {
            self.enforce_output_memory();
        }
        pulled
    }

    async fn pull_into(
        &self,
        id: &TaskId,
        control: &dyn TaskControl,
        output: &mut TaskOutput,
    ) -> Result<Option<TaskOutcome>, TaskError> {
        if control.take_pulled_sections(&mut |text, label| self.record_output(id, output, text, label)) {
            return Ok(None);
        }
        let pulled = crate::panics::contained(control.read_output()).await;
        let (text, ended) = match pulled {
            Ok(text) => (text, None),
            Err(error) => match error.downcast::<ReadEndedTask>() {
                Ok(ReadEndedTask { text, outcome }) => (text, Some(outcome)),
                Err(source) => {
                    return Err(TaskError::Producer {
                        context: format!("reading the output of task {id} failed"),
                        cause: source,
                    });
                }
            },
        };
        self.record_output(id, output, &text, None);
        Ok(ended)
    }

    /// Appends pulled output (of the part labelled `label`) to the log and
    /// runs the milestones on it.
    fn record_output(&self, id: &TaskId, output: &mut TaskOutput, text: &str, label: SectionLabel) {
        if text.is_empty() {
            return;
        }
        self.replicate_append(id, output, text, label);
        let TaskOutput { log, milestones, .. } = output;
        let Some(milestones) = milestones.as_mut() else {
            log.append(text, label, None);
            return;
        };
        milestones.last_output = Instant::now();
        milestones.stall_notified = false;
        let mut matched: Option<String> = None;
        match milestones.pattern.as_ref().filter(|_| milestones.pattern_armed) {
            Some(pattern) => log.append(
                text,
                label,
                Some(&mut |line: &str| {
                    if matched.is_none() && pattern.is_match(line) {
                        matched = Some(line.to_string());
                    }
                }),
            ),
            None => log.append(text, label, None),
        }
        if let (Some(line), Some(pattern)) = (matched, milestones.pattern.as_ref()) {
            milestones.pattern_armed = false;
            let pattern = pattern.as_str().to_string();
            self.inject_milestone(id, |task| {
                format!(
                    "background task {} ({}: {}) printed a line matching /{pattern}/: {} — still running. \
                     Read its output with task_output.",
                    task.id,
                    task.kind,
                    task.label,
                    quoted(&line)
                )
            });
        }
    }

    /// Injects a milestone notice about a live owned task into its owner's
    /// session (tagged with the task, so its terminal report retracts it).
    pub(super) fn inject_milestone(&self, id: &TaskId, text: impl FnOnce(&TaskSnapshot) -> String) {
        let (owner, text) = {
            let state = self.shared.lock();
            let Some(record) = state.tasks.get(id) else { return };
            if record.status.is_terminal() {
                return;
            }
            let Some(owner) = record.owner.as_ref().and_then(|o| o.agent.upgrade()) else { return };
            (owner, text(&record.snapshot()))
        };
        match owner.inject_about(id, text) {
            Ok(()) => tracing::debug!(task = %id, "milestone notice injected"),
            Err(error) => tracing::debug!(task = %id, %error, "no milestone notice: the owner is gone"),
        }
    }

    /// The signal a producer raises when new output may be readable: it
    /// schedules a drain into the log (one at a time per task) and becomes a
    /// [`TaskEvent::Output`] when anyone subscribed.
    pub(super) fn output_signal(&self, id: &TaskId, owner_session: Option<SessionId>) -> OutputSignal {
        OutputSignal::to(Arc::new_cyclic(|this| RegistrySignal {
            this: this.clone(),
            registry: Arc::downgrade(&self.shared),
            id: id.clone(),
            owner_session,
            scheduled: AtomicBool::new(false),
        }))
    }

    /// Pulls a live stream task's new output into its log.
    async fn drain(&self, id: &TaskId) {
        let (control, output) = {
            let state = self.shared.lock();
            let Some(record) = state.tasks.get(id) else { return };
            let Some(output) = record.output_log.clone() else { return };
            (record.control.clone(), output)
        };
        let mut output = output.lock().await;
        match self.pull(id, &*control, &mut output).await {
            Ok(None) => {}
            Ok(Some(outcome)) => {
                drop(output);
                self.settle(id, outcome);
            }
            Err(error) => {
                tracing::debug!(task = %id, %error, "draining the task's output failed; the next read retries")
            }
        }
    }

    /// Watches a task with `notify_on.stalled_ms` for as long as it is live.
    pub(super) fn watch_stalls(&self, id: &TaskId, output: &Arc<StreamOutput>) {
        let (stalled, interactive) = {
            let Some(milestones) =
                output.try_lock().ok().and_then(|o| o.milestones.as_ref().map(|m| (m.stalled, m.interactive)))
            else {
                return;
            };
            let Some(stalled) = milestones.0 else { return };
            (stalled, milestones.1)
        };
        let registry = Arc::downgrade(&self.shared);
        let shared_output = output;
        let output = output.clone();
        let id = id.clone();
        let watcher = async move {
            loop {
                let wake_at = {
                    let output = output.lock().await;
                    let Some(milestones) = output.milestones.as_ref() else { return };
                    if milestones.stall_notified { Instant::now() + stalled } else { milestones.last_output + stalled }
                };
                tokio::time::sleep_until(wake_at).await;
                let Some(shared) = registry.upgrade() else { return };
                let registry = TaskRegistry { shared };
                let mut output = output.lock().await;
                let Some(milestones) = output.milestones.as_mut() else { return };
                if milestones.stall_notified || milestones.last_output.elapsed() < stalled {
                    continue;
                }
                milestones.stall_notified = true;
                drop(output);
                let seconds = seconds(stalled);
                registry.inject_milestone(&id, |task| {
                    let hint =
                        if interactive { " (it may be waiting for input: task_input can send it some)" } else { "" };
                    format!(
                        "background task {} ({}: {}) has printed nothing for {seconds} s — still running{hint}.",
                        task.id, task.kind, task.label
                    )
                });
            }
        };
        let _ = shared_output.stall_watcher.set(tokio::spawn(watcher).abort_handle());
    }
}

/// A duration in seconds as the notices print it: `30`, `1.5`.
pub fn seconds(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms.is_multiple_of(1000) { format!("{}", ms / 1000) } else { format!("{:.1}", ms as f64 / 1000.0) }
}

/// A line of output quoted in a notice: at most [`NOTICE_LINE_LIMIT`]
/// bytes, control characters shown escaped, so it reads as data.
fn quoted(line: &str) -> String {
    let mut text = String::new();
    for c in line.chars() {
        if text.len() >= NOTICE_LINE_LIMIT {
            text.push('…');
            break;
        }
        if c.is_control() && c != '\t' {
            text.extend(c.escape_default());
        } else {
            text.push(c);
        }
    }
    text
}

impl TaskRegistry {
    /// A new, empty log for stream task `id`, its file (when it needs one)
    /// in the directory of `session`.
    fn new_output_log(&self, id: &TaskId, session: Option<SessionId>) -> OutputLog {
        let target = self.shared.output_files.get().map(|files| FileTarget {
            files: files.clone(),
            owner: session,
            task: id.clone(),
        });
        OutputLog::new(self.shared.output_limits.clone(), self.shared.output_memory.meter(), target)
    }

    /// Hands the replica `text` (of the part `label`), about to be logged
    /// at the log's end: its part within the bound (the log file's).
    fn replicate_append(&self, id: &TaskId, output: &TaskOutput, text: &str, label: SectionLabel) {
        let (Some(epoch), Some(replica)) = (output.replica_epoch, self.shared.output_replica.get()) else { return };
        let limits = &self.shared.output_limits;
        let bound = limits.spill_bytes.max(limits.memory_bytes as u64);
        let offset = output.log.total();
        let Some(room) = bound.checked_sub(offset).filter(|room| *room > 0) else { return };
        let mut end = text.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if end > 0 {
            replica.appended(ReplicaPosition { task: id, epoch, offset }, &text[..end], label);
        }
    }

    /// Hands the replica the cursor a consuming read left; the returned
    /// future resolves once the replica kept it (answer the read after it).
    fn replicate_read(
        &self,
        id: &TaskId,
        output: &TaskOutput,
    ) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        let (Some(epoch), Some(replica)) = (output.replica_epoch, self.shared.output_replica.get()) else {
            return None;
        };
        replica.consumed(ReplicaPosition { task: id, epoch, offset: output.log.total() });
        Some(replica.flushed(id))
    }

    /// The output of a new stream task `id` owned by `owner`, served as
    /// `options` ask; copied to the replica when the owner is stable.
    pub(super) fn new_stream_output(
        &self,
        id: &TaskId,
        owner: Option<&Owner>,
        options: &TaskOptions,
    ) -> Arc<StreamOutput> {
        let mut output = TaskOutput::new(self.new_output_log(id, owner.map(|o| o.session.clone())), options);
        if owner.is_some_and(|o| o.durable) {
            output.replica_epoch = Some(new_epoch());
        }
        Arc::new(StreamOutput::new(output))
    }

    /// The output of a task taken in from another registry, rebuilt from
    /// what its replica kept: read as far as its owner's reads took it,
    /// and copied on (its later reads) under the same incarnation.
    pub(super) fn replayed_stream_output(
        &self,
        id: &TaskId,
        owner: &Owner,
        replayed: ReplayedOutput,
    ) -> Arc<StreamOutput> {
        let mut log = self.new_output_log(id, Some(owner.session.clone()));
        for (text, label) in &replayed.pieces {
            log.append(text, *label, None);
            if log.total() == replayed.read_to {
                log.mark_read();
            }
        }
        if replayed.read_to > log.total() {
            log.mark_read();
        }
        let mut output = TaskOutput::new(log, &TaskOptions::default());
        output.replica_epoch = Some(replayed.epoch);
        Arc::new(StreamOutput::new(output))
    }
}
