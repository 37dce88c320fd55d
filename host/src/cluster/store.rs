//! [`ClusterStore`]: the registry's [`TaskStore`] on a JetStream key-value
//! bucket shared by every node of a cluster (`taskhost-<name>`, replicated
//! 3 times when the JetStream cluster can, else once).
//!
//! Invariants:
//! - Every transition is a compare-and-set ([`super::bucket`]): a
//!   settlement from two nodes has one winner, a stop request moves only
//!   `running` to `stopping`, and a write that lost a race reads again.
//! - A NATS failure that may pass (a node died, a leader is being
//!   elected) is tried again for up to [`RETRY_WITHIN`] (less while the
//!   node reaches no NATS server: [`super::bucket::CUT_OFF_WITHIN`]); a write whose answer was lost
//!   is recognised by its token when read back, never applied twice.
//! - The seam is synchronous and the client async: the client lives on a
//!   runtime of its own (one thread, `taskhost-cluster`); a store call
//!   hands it the work and waits for the reply on a channel for at most
//!   [`CALL_TIMEOUT`], then fails with "cluster unavailable, retry". It
//!   never `block_on`s inside the caller's runtime, and the caller's thread
//!   is held at most that long.
//! - A node loads only the records naming it (claiming a silent node's
//!   records is the heartbeat's, docs/cluster.md).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, kv};
use futures::future::BoxFuture;
use taskhost_core::ids::TaskId;
use taskhost_core::tasks::TaskStatus;
use taskhost_core::tasks::store::{ReportState, StoreError, StoredEnd, StoredState, StoredTask, StoredTree, TaskStore};

use super::bucket::{Bucket, Change, Patience, RETRY_WITHIN, WriteError, failed};
use super::ids;
use super::record::{Record, nanos, task_key};

/// The longest a store call waits for the cluster: its retries while a
/// stream leader is elected, and the answer.
pub const CALL_TIMEOUT: Duration = RETRY_WITHIN.saturating_add(Duration::from_secs(5));
/// The longest a read waits to record its cursor or its renewed time to
/// live. The read is answered either way (what it took was taken); a
/// cursor not recorded means output after the last recorded one is shown
/// again after a restart, and the next read records a newer one. Without
/// this bound, every read during a NATS outage would wait [`CALL_TIMEOUT`].
pub const READ_RECORD_WITHIN: Duration = Duration::from_secs(3);
/// The JetStream error code of "replicas > 1 not supported in non-clustered mode".
const NOT_CLUSTERED: &str = "10074";

/// The cluster's task store. See the module invariants.
pub struct ClusterStore {
    node: String,
    bucket_name: String,
    bucket: Bucket,
    runtime: tokio::runtime::Handle,
    /// The id numbers this node took from each kind's counter and has not
    /// issued yet.
    blocks: std::sync::Mutex<std::collections::HashMap<String, ids::Block>>,
    /// Dropped with the store: the client's runtime then ends on its thread.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl ClusterStore {
    /// Connects with `connect` and opens (or creates) the bucket
    /// `bucket_name` as node `node`, all on a runtime thread of the store's
    /// own: the client's connection task runs there too, so a caller
    /// blocked on a store call never starves the connection that would
    /// answer it.
    pub async fn open<F, Fut>(connect: F, bucket_name: &str, node: &str) -> anyhow::Result<Self>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = anyhow::Result<async_nats::Client>>,
    {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let name = bucket_name.to_string();
        let span = tracing::Span::current();
        std::thread::Builder::new().name("taskhost-cluster".into()).spawn(move || {
            let _entered = span.enter();
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = ready_tx.send(Err(anyhow::anyhow!("the cluster client's runtime: {error}")));
                    return;
                }
            };
            runtime.block_on(async move {
                let opened = async { open_bucket(connect().await?, &name).await }.await;
                let failed = opened.is_err();
                let _ = ready_tx.send(opened.map(|bucket| (bucket, tokio::runtime::Handle::current())));
                if !failed {
                    let _ = stopped.await;
                }
            });
        })?;
        let (bucket, runtime) = ready_rx.await.map_err(|_| anyhow::anyhow!("the cluster client's thread ended"))??;
        Ok(Self {
            node: node.to_string(),
            bucket_name: bucket_name.to_string(),
            bucket,
            runtime,
            blocks: std::sync::Mutex::default(),
            _stop: stop,
        })
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// The bucket, for the roster and sweeps (used on [`Self::client_runtime`]).
    pub fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    /// The runtime the cluster client runs on.
    pub fn client_runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// Runs `work` on the client's runtime and waits for its answer.
    fn call<T: Send + 'static>(
        &self,
        doing: &str,
        work: impl FnOnce(Bucket) -> BoxFuture<'static, Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.call_within(doing, CALL_TIMEOUT, work)
    }

    /// As [`Self::call`], waiting at most `within` (the work is dropped
    /// then: a write it sent may still land, in order with later ones).
    fn call_within<T: Send + 'static>(
        &self,
        doing: &str,
        within: Duration,
        work: impl FnOnce(Bucket) -> BoxFuture<'static, Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let bucket = self.bucket.clone();
        let span = tracing::debug_span!("cluster store", node = %self.node, doing);
        self.runtime.spawn(tracing::Instrument::instrument(
            async move {
                let _ = reply.send(tokio::time::timeout(within, work(bucket)).await);
            },
            span,
        ));
        match answer.recv_timeout(within + Duration::from_secs(1)) {
            Ok(Ok(result)) => result,
            Ok(Err(_)) | Err(_) => Err(StoreError::new(format!(
                "cluster unavailable, retry: {doing} got no answer from NATS within {} s",
                within.as_secs()
            ))),
        }
    }
}

/// The bucket, created when missing: 3 replicas, or 1 on a JetStream
/// server that is not clustered.
async fn open_bucket(client: async_nats::Client, name: &str) -> anyhow::Result<Bucket> {
    let js = jetstream::new(client);
    let kv = open_kv(&js, name).await?;
    Ok(Bucket::new(kv, js, name))
}

async fn open_kv(js: &jetstream::Context, name: &str) -> anyhow::Result<kv::Store> {
    if let Ok(bucket) = js.get_key_value(name).await {
        return Ok(bucket);
    }
    match create_bucket(js, name, 3).await {
        Ok(bucket) => Ok(bucket),
        Err(error) if error.to_string().contains(NOT_CLUSTERED) => {
            tracing::warn!(
                bucket = name,
                "the JetStream server is not clustered: the registry is kept once, not 3 times"
            );
            create_bucket(js, name, 1).await
        }
        Err(error) => {
            // Another node may have created it meanwhile.
            js.get_key_value(name).await.map_err(|_| anyhow::anyhow!("creating the bucket {name}: {error}"))
        }
    }
}

/// The largest record value (a final-output kind's output is stored in
/// its record).
pub const MAX_VALUE_BYTES: i32 = 1 << 20;
/// The most the bucket holds.
pub const MAX_BUCKET_BYTES: i64 = 1 << 30;

/// Creates the key-value bucket `name` with `replicas` copies, holding one
/// value per key, read through the stream leader. The stream is made here, as the client's
/// `create_key_value` would make it, because that call first reads the
/// account's JetStream info, whose 2.9 form (Debian's server) async-nats
/// 0.52 cannot parse (`reserved_memory` is missing).
pub async fn create_bucket(js: &jetstream::Context, name: &str, replicas: usize) -> anyhow::Result<kv::Store> {
    js.create_stream(jetstream::stream::Config {
        name: format!("KV_{name}"),
        description: Some("taskhost task records and id counters".into()),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        max_bytes: MAX_BUCKET_BYTES,
        max_message_size: MAX_VALUE_BYTES,
        storage: jetstream::stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        // Reads go to the stream leader: a direct get may be answered by a
        // replica that is behind (a node just resumed), and a transition
        // must read the last settlement, not an older one.
        allow_direct: false,
        num_replicas: replicas,
        discard: jetstream::stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await?;
    Ok(js.get_key_value(name).await?)
}

/// Reads `id`'s record and, when it names node `node`, writes
/// `change(record)` back if nothing was written in the bucket since,
/// reading again when something was. `change` returns false to leave the
/// record as it is. Ok(false): no record, another node's, or left as it
/// is. A write whose answer was lost is read back: when its token is the
/// record's, it was applied and this call made the change.
pub async fn transition(
    bucket: &Bucket,
    id: &TaskId,
    doing: &str,
    node: &str,
    change: impl Fn(&mut Record) -> bool,
) -> Result<bool, StoreError> {
    let key = task_key(id);
    let token = super::record::write_token();
    bucket
        .update(&key, doing, |value| {
            let Some(value) = value else { return Ok(Change::Keep(false)) };
            let mut record = Record::parse(&key, value)?;
            if record.write == token {
                return Ok(Change::Keep(true));
            }
            // A node writes only its own records: one the cluster took
            // from it (it was silent too long) is no longer its to change.
            if record.node != node || !change(&mut record) {
                return Ok(Change::Keep(false));
            }
            record.write = token.clone();
            Ok(Change::Write(serde_json::to_vec(&record).expect("a record serializes").into(), true))
        })
        .await
}

fn live(status: TaskStatus) -> bool {
    matches!(status, TaskStatus::Running | TaskStatus::Stopping)
}

impl TaskStore for ClusterStore {
    fn load(&self) -> Result<StoredState, StoreError> {
        let node = self.node.clone();
        self.call("loading the registry", move |bucket| {
            Box::pin(async move {
                let doing = "loading the registry";
                let keys = bucket.keys_under("").await.map_err(|error| failed(doing, error))?;
                let mut state = StoredState::default();
                for key in keys {
                    let Some((value, _)) = bucket.read(&key).await.map_err(|error| failed(doing, error))? else {
                        continue;
                    };
                    if let Some(kind) = ids::kind_of(&key) {
                        state.counters.push((kind.to_string(), ids::parse(&value, kind)?));
                    } else if key.starts_with("task.") {
                        let record = Record::parse(&key, &value)?;
                        if record.node == node {
                            state.tasks.push(record.to_task());
                        }
                    }
                }
                state.tasks.sort_by_key(|task| (task.started_at, task.number()));
                Ok(state)
            })
        })
    }

    fn issue_number(&self, kind: &str, at_least: u64) -> Result<u64, StoreError> {
        if let Some(block) = self.blocks.lock().unwrap_or_else(|e| e.into_inner()).get_mut(kind) {
            let number = block.next.max(at_least);
            if number <= block.last {
                block.next = number + 1;
                return Ok(number);
            }
        }
        // A new block: the counter raised by ID_BLOCK at once, its numbers
        // this node's alone.
        let owned = kind.to_string();
        let last = self.call("issuing an id", move |bucket| {
            Box::pin(async move {
                ids::raise(&bucket, &owned, |last| last.max(at_least.saturating_sub(1)) + ids::ID_BLOCK).await
            })
        })?;
        let first = last + 1 - ids::ID_BLOCK;
        self.blocks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(kind.to_string(), ids::Block { next: first + 1, last });
        Ok(first)
    }

    fn record_start(&self, task: &StoredTask) -> Result<(), StoreError> {
        let record = Record::of(task, &self.node);
        let key = task_key(&task.id);
        let number = task.number();
        let kind = task.kind.clone();
        let issued_up_to =
            self.blocks.lock().unwrap_or_else(|e| e.into_inner()).get(&kind).map_or(0, |block| block.last);
        let span = tracing::info_span!("cluster start", node = %self.node, task = %task.id, owner = ?record.owner);
        let _entered = span.enter();
        self.call("recording a start", move |bucket| {
            Box::pin(async move {
                let doing = "recording a start";
                let value: bytes::Bytes = serde_json::to_vec(&record).expect("a record serializes").into();
                let mut patience = Patience::starting_now(&bucket);
                loop {
                    match bucket.create(&key, value.clone()).await {
                        Ok(_) => break,
                        Err(WriteError::Conflict) => {
                            // Ours, when an earlier try was applied but its
                            // answer lost; else the id is taken.
                            let stored = loop {
                                match bucket.read(&key).await {
                                    Ok(stored) => break stored,
                                    Err(error) => patience.again(doing, error).await?,
                                }
                            };
                            let ours = stored.is_some_and(|(stored, _)| {
                                serde_json::from_slice::<Record>(&stored).is_ok_and(|s| s.write == record.write)
                            });
                            if ours {
                                break;
                            }
                            return Err(StoreError::new(format!("cluster: the id {} is already recorded", record.id)));
                        }
                        Err(WriteError::Failed(error)) => patience.again(doing, error).await?,
                    }
                }
                // A number from this node's block is below its counter already.
                if let Some(number) = number.filter(|number| *number > issued_up_to) {
                    ids::raise(&bucket, &kind, |_| number).await?;
                }
                Ok(())
            })
        })
    }

    /// A start is recorded before its command runs: a start NATS cannot
    /// take is refused with nothing run, so a client that asks again after
    /// "cluster unavailable, retry" never makes a command run twice.
    fn fences_launches(&self) -> bool {
        true
    }

    fn record_tree(&self, id: &TaskId, tree: &StoredTree) -> Result<(), StoreError> {
        let (id, tree, node) = (id.clone(), tree.clone(), self.node.clone());
        self.call("recording a started task's tree", move |bucket| {
            Box::pin(async move {
                transition(&bucket, &id, "recording a started task's tree", &node, |record| {
                    record.tree = Some(tree.record.clone());
                    record.tree_cursor.clone_from(&tree.cursor);
                    true
                })
                .await
                .map(drop)
            })
        })
    }

    fn request_stop(&self, id: &TaskId) -> Result<bool, StoreError> {
        let (id, node) = (id.clone(), self.node.clone());
        self.call("recording a stop request", move |bucket| {
            Box::pin(async move {
                transition(&bucket, &id, "recording a stop request", &node, |record| {
                    let running = record.status() == TaskStatus::Running;
                    if running {
                        record.status = TaskStatus::Stopping.as_str().to_string();
                    }
                    running
                })
                .await
            })
        })
    }

    fn settle(&self, id: &TaskId, end: &StoredEnd) -> Result<bool, StoreError> {
        let (id, end, node) = (id.clone(), end.clone(), self.node.clone());
        let span = tracing::info_span!("cluster settle", node = %self.node, task = %id, status = end.status.as_str());
        let _entered = span.enter();
        self.call("recording an end", move |bucket| {
            Box::pin(async move {
                transition(&bucket, &id, "recording an end", &node, |record| {
                    if !live(record.status()) {
                        return false;
                    }
                    record.status = end.status.as_str().to_string();
                    record.detail = end.detail.clone();
                    record.finished_at_ns = Some(nanos(end.finished_at));
                    record.set_reporting(end.reporting, &node);
                    record.output = end.output.clone();
                    true
                })
                .await
            })
        })
    }

    fn set_reporting(&self, id: &TaskId, reporting: ReportState) -> Result<(), StoreError> {
        let (id, node) = (id.clone(), self.node.clone());
        self.call("recording who was told", move |bucket| {
            Box::pin(async move {
                transition(&bucket, &id, "recording who was told", &node, |record| {
                    record.set_reporting(reporting, &node);
                    true
                })
                .await
                .map(drop)
            })
        })
    }

    fn set_tree_cursor(&self, id: &TaskId, cursor: &str) -> Result<(), StoreError> {
        let (id, cursor, node) = (id.clone(), cursor.to_string(), self.node.clone());
        self.call_within("recording a read cursor", READ_RECORD_WITHIN, move |bucket| {
            Box::pin(async move {
                transition(&bucket, &id, "recording a read cursor", &node, |record| {
                    record.tree.is_some() && {
                        record.tree_cursor = Some(cursor.clone());
                        true
                    }
                })
                .await
                .map(drop)
            })
        })
    }

    fn set_expiry(&self, id: &TaskId, expires_at: SystemTime) -> Result<(), StoreError> {
        let (id, node) = (id.clone(), self.node.clone());
        self.call_within("recording a renewed time to live", READ_RECORD_WITHIN, move |bucket| {
            Box::pin(async move {
                transition(&bucket, &id, "recording a renewed time to live", &node, |record| {
                    record.expires_at_ns = Some(nanos(expires_at));
                    true
                })
                .await
                .map(drop)
            })
        })
    }

    fn forget(&self, ids: &[TaskId]) -> Result<(), StoreError> {
        let keys: Vec<String> = ids.iter().map(task_key).collect();
        let ids = ids.to_vec();
        self.call("deleting records", move |bucket| {
            Box::pin(async move {
                let mut patience = Patience::starting_now(&bucket);
                for key in keys {
                    while let Err(error) = bucket.kv.purge(key.as_str()).await {
                        patience.again("deleting records", error).await?;
                    }
                }
                // Their output goes with them (else the stream's own bound
                // drops it in time).
                super::output::forget(bucket.jetstream(), bucket.name(), &ids).await;
                Ok(())
            })
        })
    }

    fn describe(&self) -> String {
        format!("cluster bucket {} (node {})", self.bucket_name, self.node)
    }

    fn outlives_process(&self) -> bool {
        true
    }
}

/// The store as the registry takes it.
pub fn shared(store: ClusterStore) -> Arc<dyn TaskStore> {
    Arc::new(store)
}
