//! The cluster's output stream: every stable owner's stream output, copied
//! into JetStream as it is logged, so that a node that settles a gone
//! node's task takes it in with its output and its owner's read cursor.
//!
//! Model: one stream per cluster (`OUTPUT_taskhost-<cluster>`, subjects
//! `taskhost.<cluster>.output.<task>`, replicated like the bucket). A
//! message is a piece of a task's log (headers: the log's incarnation, its
//! byte offset, its section label) or a read mark (the cursor a consuming
//! read left). The node that runs the task publishes; a node that takes the
//! task in replays the subject ([`replay`]) and publishes its reads' marks.
//!
//! Invariants:
//! - Publishing never blocks the registry: pieces queue (at most
//!   [`MAX_QUEUED_BYTES`]; beyond, pieces are dropped and the copy ends at
//!   the gap) and one task on the client's runtime publishes them in order,
//!   [`MAX_IN_FLIGHT`] at a time, each tried again with its message id for
//!   up to [`PUBLISH_PATIENCE`] (the stream drops a repeat).
//! - A consuming read is answered once its mark (and its task's pieces
//!   before it) is kept, or after
//!   [`FLUSH_WITHIN`] (then the node's death within that time could give the
//!   same lines again on another node: logged).
//! - A replay uses the latest incarnation only, from byte 0 up to its first
//!   gap; offsets, not arrival order, place each piece.
//! - Bounds: per task the log file's ([`taskhost_core::tasks::OutputLimits::spill_bytes`]);
//!   per cluster `[cluster] output_stream_bytes` (1 GiB by default), the
//!   oldest output dropped first; a
//!   task's output is deleted with its record ([`forget`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use futures::StreamExt;
use taskhost_core::ids::TaskId;
use taskhost_core::tasks::SectionLabel;
use taskhost_core::tasks::replica::{OutputReplica, ReplayedOutput, ReplicaPosition, section_label};
use tokio::sync::{mpsc, oneshot};

/// The most output waiting to be published (across tasks).
pub const MAX_QUEUED_BYTES: usize = 64 << 20;
/// Publishes awaiting their acknowledgement at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// The longest one piece is tried again while NATS recovers (a stream
/// leader's election: [`super::bucket::RETRY_WITHIN`]).
pub const PUBLISH_PATIENCE: Duration = super::bucket::RETRY_WITHIN;
/// The longest a consuming read waits for its mark to be kept.
pub const FLUSH_WITHIN: Duration = Duration::from_secs(2);
/// The largest piece in one message.
const PIECE_BYTES: usize = 256 * 1024;
/// The longest a replay reads a task's subject.
const REPLAY_WITHIN: Duration = Duration::from_secs(20);

const EPOCH: &str = "Taskhost-Epoch";
const OFFSET: &str = "Taskhost-Offset";
const LABEL: &str = "Taskhost-Label";
const READ_TO: &str = "Taskhost-Read-To";

/// The stream's name for the bucket `bucket`.
pub fn stream_name(bucket: &str) -> String {
    format!("OUTPUT_{bucket}")
}

/// The subject of `task`'s output in `cluster`.
pub fn subject(cluster: &str, task: &TaskId) -> String {
    format!("taskhost.{cluster}.output.{task}")
}

/// Creates the cluster's output stream when it is missing, with as many
/// replicas as the bucket's stream has and `max_bytes` (`[cluster]
/// output_stream_bytes`); an existing stream of another size is resized
/// (the latest node to join sets it: nodes should agree).
pub async fn open_stream(js: &jetstream::Context, cluster: &str, bucket: &str, max_bytes: i64) -> anyhow::Result<()> {
    let name = stream_name(bucket);
    if let Ok(stream) = js.get_stream(&name).await {
        let mut config = stream.cached_info().config.clone();
        if config.max_bytes != max_bytes {
            tracing::info!(stream = %name, from = config.max_bytes, to = max_bytes, "the output stream is resized ([cluster] output_stream_bytes)");
            config.max_bytes = max_bytes;
            js.update_stream(config).await.map_err(|error| anyhow::anyhow!("resizing the stream {name}: {error}"))?;
        }
        return Ok(());
    }
    let replicas = js.get_stream(format!("KV_{bucket}")).await?.cached_info().config.num_replicas;
    let created = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            description: Some("taskhost: stable owners' task output, kept beyond its node".into()),
            subjects: vec![format!("taskhost.{cluster}.output.>")],
            max_bytes,
            max_message_size: (PIECE_BYTES + 4096) as i32,
            storage: jetstream::stream::StorageType::File,
            num_replicas: replicas,
            discard: jetstream::stream::DiscardPolicy::Old,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await;
    match created {
        Ok(_) => Ok(()),
        // Another node created it meanwhile.
        Err(error) => {
            js.get_stream(&name).await.map(drop).map_err(|_| anyhow::anyhow!("creating the stream {name}: {error}"))
        }
    }
}

/// One thing to publish.
enum Queued {
    Piece {
        task: TaskId,
        epoch: u64,
        offset: u64,
        text: String,
        label: SectionLabel,
    },
    ReadTo {
        task: TaskId,
        epoch: u64,
        offset: u64,
    },
    /// Resolves once everything queued for `task` before it is kept.
    Flush {
        task: TaskId,
        done: oneshot::Sender<()>,
    },
}

/// The registry's [`OutputReplica`] on the output stream.
pub struct StreamReplica {
    queue: mpsc::UnboundedSender<Queued>,
    queued_bytes: Arc<AtomicUsize>,
}

impl StreamReplica {
    /// Starts the publisher on `runtime` (the cluster client's).
    pub fn start(js: jetstream::Context, cluster: &str, runtime: &tokio::runtime::Handle) -> Arc<Self> {
        let (queue, queued) = mpsc::unbounded_channel();
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let publisher = Publisher {
            js,
            cluster: cluster.to_string(),
            in_flight: VecDeque::new(),
            queued_bytes: queued_bytes.clone(),
        };
        runtime.spawn(publisher.run(queued));
        Arc::new(Self { queue, queued_bytes })
    }
}

impl OutputReplica for StreamReplica {
    fn appended(&self, at: ReplicaPosition<'_>, text: &str, label: SectionLabel) {
        let queued = self.queued_bytes.fetch_add(text.len(), Ordering::AcqRel) + text.len();
        if queued > MAX_QUEUED_BYTES {
            self.queued_bytes.fetch_sub(text.len(), Ordering::AcqRel);
            tracing::warn!(task = %at.task, offset = at.offset, "the output stream is behind: a piece is not copied (the copy ends before it)");
            return;
        }
        let piece =
            Queued::Piece { task: at.task.clone(), epoch: at.epoch, offset: at.offset, text: text.to_string(), label };
        if self.queue.send(piece).is_err() {
            self.queued_bytes.fetch_sub(text.len(), Ordering::AcqRel);
        }
    }

    fn consumed(&self, at: ReplicaPosition<'_>) {
        let _ = self.queue.send(Queued::ReadTo { task: at.task.clone(), epoch: at.epoch, offset: at.offset });
    }

    fn flushed(&self, task: &TaskId) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let (done, kept) = oneshot::channel();
        let sent = self.queue.send(Queued::Flush { task: task.clone(), done }).is_ok();
        Box::pin(async move {
            if sent && tokio::time::timeout(FLUSH_WITHIN, kept).await.is_err() {
                tracing::warn!(
                    "a read's mark was not kept in the output stream within {} s: answered anyway",
                    FLUSH_WITHIN.as_secs()
                );
            }
        })
    }
}

/// One message, kept to be published again while its ack fails.
struct Sent {
    task: TaskId,
    subject: String,
    message: PublishMessage,
    bytes: usize,
    ack: PublishAckFuture,
}

struct Publisher {
    js: jetstream::Context,
    cluster: String,
    in_flight: VecDeque<Sent>,
    queued_bytes: Arc<AtomicUsize>,
}

impl Publisher {
    async fn run(mut self, mut queued: mpsc::UnboundedReceiver<Queued>) {
        while let Some(next) = queued.recv().await {
            match next {
                Queued::Piece { task, epoch, offset, text, label } => {
                    let mut at = 0;
                    while at < text.len() {
                        let mut end = (at + PIECE_BYTES).min(text.len());
                        while !text.is_char_boundary(end) {
                            end -= 1;
                        }
                        let mut message = PublishMessage::build()
                            .payload(bytes::Bytes::copy_from_slice(&text.as_bytes()[at..end]))
                            .header(EPOCH, epoch.to_string().as_str())
                            .header(OFFSET, (offset + at as u64).to_string().as_str())
                            .message_id(format!("{task}.{epoch}.{}", offset + at as u64));
                        if let Some(label) = label {
                            message = message.header(LABEL, label);
                        }
                        self.send(&task, message, end - at).await;
                        at = end;
                    }
                }
                Queued::ReadTo { task, epoch, offset } => {
                    let message = PublishMessage::build()
                        .header(EPOCH, epoch.to_string().as_str())
                        .header(READ_TO, offset.to_string().as_str())
                        .message_id(format!("{task}.{epoch}.read.{offset}"));
                    self.send(&task, message, 0).await;
                }
                Queued::Flush { task, done } => {
                    // Only this task's publishes: a read is not held up by
                    // another task's output (each publish is acknowledged
                    // on its own; a later one may be acknowledged first).
                    while let Some(at) = self.in_flight.iter().position(|sent| sent.task == task) {
                        let sent = self.in_flight.remove(at).expect("a position in the queue");
                        self.settle(sent).await;
                    }
                    let _ = done.send(());
                }
            }
        }
    }

    async fn send(&mut self, task: &TaskId, message: PublishMessage, bytes: usize) {
        if self.in_flight.len() >= MAX_IN_FLIGHT
            && let Some(oldest) = self.in_flight.pop_front()
        {
            self.settle(oldest).await;
        }
        let subject = subject(&self.cluster, task);
        let started = Instant::now();
        loop {
            match self.js.send_publish(subject.clone(), message.clone()).await {
                Ok(ack) => {
                    self.in_flight.push_back(Sent { task: task.clone(), subject, message, bytes, ack });
                    return;
                }
                Err(error) if started.elapsed() < PUBLISH_PATIENCE => {
                    tracing::debug!(%subject, %error, "publishing output failed; trying again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => {
                    tracing::warn!(%subject, %error, "output not copied to the stream (NATS did not take it)");
                    self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
                    return;
                }
            }
        }
    }

    /// Waits for one publish's ack, publishing it again (same message id)
    /// while that fails, for up to [`PUBLISH_PATIENCE`].
    async fn settle(&mut self, sent: Sent) {
        let Sent { subject, message, bytes, mut ack, .. } = sent;
        let started = Instant::now();
        'acked: loop {
            let error = match ack.await {
                Ok(_) => break,
                Err(error) => error,
            };
            tracing::debug!(%subject, %error, "output publish unacknowledged; publishing it again");
            loop {
                if started.elapsed() >= PUBLISH_PATIENCE {
                    tracing::warn!(%subject, %error, "output not copied to the stream (no acknowledgement)");
                    break 'acked;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                match self.js.send_publish(subject.clone(), message.clone()).await {
                    Ok(again) => {
                        ack = again;
                        continue 'acked;
                    }
                    Err(error) => tracing::debug!(%subject, %error, "publishing output again failed"),
                }
            }
        }
        self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Deletes the output the stream holds of `tasks` (their records were
/// deleted). A failure is logged: the stream's bound drops it in time.
pub async fn forget(js: &jetstream::Context, bucket: &str, tasks: &[TaskId]) {
    let stream = match js.get_stream(stream_name(bucket)).await {
        Ok(stream) => stream,
        Err(error) => {
            tracing::debug!(%error, "the output stream is not there to delete output from");
            return;
        }
    };
    for task in tasks {
        // The stream holds one cluster's subjects: the cluster token may be a wildcard.
        if let Err(error) = stream.purge().filter(format!("taskhost.*.output.{task}")).await {
            tracing::debug!(%task, %error, "a deleted task's output stays in the stream until its bound drops it");
        }
    }
}

/// What the stream kept of `task`'s output: its latest incarnation's pieces
/// from byte 0 to the first gap, and where its owner's reads reached.
/// `Ok(None)`: nothing kept.
pub async fn replay(
    js: &jetstream::Context,
    cluster: &str,
    bucket: &str,
    task: &TaskId,
) -> anyhow::Result<Option<ReplayedOutput>> {
    let stream = js.get_stream(stream_name(bucket)).await?;
    let subject = subject(cluster, task);
    if stream.get_last_raw_message_by_subject(&subject).await.is_err() {
        return Ok(None);
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: subject.clone(),
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    // (epoch, offset, text, label) of pieces, (epoch, offset) of read marks.
    let mut pieces: Vec<(u64, u64, String, SectionLabel)> = Vec::new();
    let mut reads: Vec<(u64, u64)> = Vec::new();
    let mut last_epoch = None;
    let deadline = tokio::time::Instant::now() + REPLAY_WITHIN;
    loop {
        let Ok(next) = tokio::time::timeout_at(deadline, messages.next()).await else {
            anyhow::bail!("replaying {subject} took over {} s", REPLAY_WITHIN.as_secs());
        };
        let Some(message) = next else { break };
        let message = message.map_err(|error| anyhow::anyhow!("replaying {subject}: {error}"))?;
        let header = |name: &str| message.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().to_string());
        let number = |name: &str| header(name).and_then(|value| value.parse::<u64>().ok());
        if let Some(epoch) = number(EPOCH) {
            last_epoch = Some(epoch);
            if let Some(offset) = number(READ_TO) {
                reads.push((epoch, offset));
            } else if let Some(offset) = number(OFFSET) {
                let text = String::from_utf8_lossy(&message.payload).into_owned();
                pieces.push((epoch, offset, text, header(LABEL).as_deref().and_then(section_label)));
            }
        }
        let pending = message.info().map_err(|error| anyhow::anyhow!("replaying {subject}: {error}"))?.pending;
        if pending == 0 {
            break;
        }
    }
    let Some(epoch) = last_epoch else { return Ok(None) };
    pieces.retain(|piece| piece.0 == epoch);
    pieces.sort_by_key(|piece| piece.1);
    let mut kept = Vec::new();
    let mut total = 0u64;
    for (_, offset, text, label) in pieces {
        if offset + text.len() as u64 <= total {
            continue; // a repeat
        }
        if offset != total {
            break; // a gap: the copy ends here
        }
        total += text.len() as u64;
        kept.push((text, label));
    }
    let read_to = reads.iter().filter(|read| read.0 == epoch).map(|read| read.1).max().unwrap_or(0);
    Ok(Some(ReplayedOutput::new(epoch, kept, read_to)))
}
