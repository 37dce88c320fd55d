//! The registry's key-value bucket and its one write: a compare-and-set on
//! the whole bucket's last sequence, which NATS 2.9 serializes correctly
//! across nodes (its per-key check does not; see below).
//!
//! Invariants: a write lands only when nothing was written anywhere in the
//! bucket since the caller read the sequence it names, so a value read
//! after that sequence is still the key's latest; reads go to the stream
//! leader (never a replica that is behind).
//! - This node's last write that landed is remembered with its sequence:
//!   while the bucket's last sequence is still that one, that value is its
//!   key's latest, so the key's next transition writes at once (one round
//!   trip, not three); the write's own check proves the premise.
//!
//! Why not the key-value `update(key, value, revision)`: on nats-server
//! 2.9.10 in a 3-node cluster, two updates racing on one key with the same
//! revision both succeeded in 82 of 100 tries (the per-subject expected
//! sequence is checked before the earlier proposal is applied); the
//! stream-wide expected sequence had no double winner in 100 tries. The
//! price: every write in the bucket competes with every other (a loser
//! reads again), measured in docs/cluster.md.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, kv};
use taskhost_core::tasks::store::StoreError;

/// The bucket as the store writes it.
#[derive(Clone)]
pub struct Bucket {
    pub kv: kv::Store,
    js: jetstream::Context,
    name: String,
    last_write: Arc<Mutex<Option<LastWrite>>>,
}

/// A write of this node that landed: the bucket held exactly this value of
/// `key` when its last sequence was `sequence`.
struct LastWrite {
    key: String,
    value: bytes::Bytes,
    sequence: u64,
}

/// Why a write did not land.
#[derive(Debug)]
pub enum WriteError {
    /// Something was written in the bucket since: read again.
    Conflict,
    /// NATS did not answer, or refused for another reason (may pass).
    Failed(String),
}

impl Bucket {
    pub fn new(kv: kv::Store, js: jetstream::Context, name: &str) -> Self {
        Self { kv, js, name: name.to_string(), last_write: Arc::default() }
    }

    /// The bucket's name (`taskhost-<cluster>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The JetStream context the bucket is read and written with.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// The NATS client the bucket is read and written with.
    pub fn client(&self) -> async_nats::Client {
        self.js.client()
    }

    /// The bucket's last sequence now, from the stream leader.
    pub async fn last_sequence(&self) -> Result<u64, String> {
        let stream = self.js.get_stream(format!("KV_{}", self.name)).await.map_err(|error| error.to_string())?;
        Ok(stream.cached_info().state.last_sequence)
    }

    /// The keys that start with `prefix` (every key for ""), from the
    /// stream's subject list (paged by the server). Not the key-value
    /// `keys()`: its consumer listing never ended while another write
    /// landed in the bucket during it (a heartbeat), and a load hung.
    pub async fn keys_under(&self, prefix: &str) -> Result<Vec<String>, String> {
        use futures::TryStreamExt as _;
        let stream = self.js.get_stream(format!("KV_{}", self.name)).await.map_err(|error| error.to_string())?;
        let subjects = stream
            .info_with_subjects(format!("$KV.{}.{prefix}>", self.name))
            .await
            .map_err(|error| error.to_string())?;
        let subjects: Vec<(String, usize)> = subjects.try_collect().await.map_err(|error| error.to_string())?;
        let head = format!("$KV.{}.", self.name);
        let mut keys: Vec<String> =
            subjects.into_iter().filter_map(|(subject, _)| subject.strip_prefix(&head).map(str::to_string)).collect();
        keys.sort();
        Ok(keys)
    }

    /// The latest value of `key` with its revision, `None` when absent or
    /// deleted.
    pub async fn read(&self, key: &str) -> Result<Option<(bytes::Bytes, u64)>, String> {
        let entry = self.kv.entry(key).await.map_err(|error| error.to_string())?;
        Ok(entry.filter(|entry| entry.operation == kv::Operation::Put).map(|entry| (entry.value, entry.revision)))
    }

    /// Writes `key = value` if the key was never written: one round trip,
    /// for a key only this node can make (a task's record under an id from
    /// this node's own block), so the per-key check races with nobody.
    /// `Conflict`: the key exists.
    pub async fn create(&self, key: &str, value: bytes::Bytes) -> Result<u64, WriteError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Expected-Last-Subject-Sequence", "0");
        self.publish(key, headers, value).await
    }

    async fn publish(&self, key: &str, headers: async_nats::HeaderMap, value: bytes::Bytes) -> Result<u64, WriteError> {
        let subject = format!("$KV.{}.{key}", self.name);
        let ack = self
            .js
            .publish_with_headers(subject, headers, value.clone())
            .await
            .map_err(|error| WriteError::Failed(error.to_string()))?;
        match ack.await {
            Ok(ack) => {
                self.remember(key, value, ack.sequence);
                Ok(ack.sequence)
            }
            Err(error) if error.kind() == PublishErrorKind::WrongLastSequence => Err(WriteError::Conflict),
            Err(error) => Err(WriteError::Failed(error.to_string())),
        }
    }

    /// Keeps the latest of this node's landed writes (acks of concurrent
    /// writes may arrive out of order).
    fn remember(&self, key: &str, value: bytes::Bytes, sequence: u64) {
        let mut last = self.last_write.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_ref().is_none_or(|last| last.sequence < sequence) {
            *last = Some(LastWrite { key: key.to_string(), value, sequence });
        }
    }

    /// `key`'s value and the sequence it was written at, when this node's
    /// last landed write was to `key`.
    fn last_write_of(&self, key: &str) -> Option<(bytes::Bytes, u64)> {
        let last = self.last_write.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref().filter(|last| last.key == key).map(|last| (last.value.clone(), last.sequence))
    }

    /// Writes `key = value` if the bucket's last sequence is still `last`.
    pub async fn write(&self, key: &str, value: bytes::Bytes, last: u64) -> Result<u64, WriteError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Expected-Last-Sequence", last.to_string().as_str());
        self.publish(key, headers, value).await
    }
}

/// What [`Bucket::update`]'s `change` makes of a key's value.
pub enum Change<T> {
    /// Write this value (if nothing else was written meanwhile), then answer `T`.
    Write(bytes::Bytes, T),
    /// Leave the key as it is and answer `T`.
    Keep(T),
}

/// How many lost races one update takes before it gives up (each lost race
/// means another write landed in the bucket meanwhile).
const MAX_RACES: usize = 1_000;

impl Bucket {
    /// Reads `key` and writes what `change` makes of its value, if nothing
    /// was written in the bucket since the read; reads again when something
    /// was, so `change` always decides on the latest value. A failure that
    /// may pass is tried again with [`Patience`]; `change`'s error ends it.
    pub async fn update<T>(
        &self,
        key: &str,
        doing: &str,
        mut change: impl FnMut(Option<&bytes::Bytes>) -> Result<Change<T>, StoreError>,
    ) -> Result<T, StoreError> {
        let mut patience = Patience::starting_now(self);
        let mut races = 0;
        // This node wrote the key last: if nothing was written since, that
        // value is the latest, and the write's check says whether it was.
        // Only a write is decided on it; `Keep` and errors are decided on a
        // fresh read.
        if let Some((value, sequence)) = self.last_write_of(key)
            && let Ok(Change::Write(value, answer)) = change(Some(&value))
        {
            match self.write(key, value, sequence).await {
                Ok(_) => return Ok(answer),
                Err(WriteError::Conflict) => races += 1,
                Err(WriteError::Failed(error)) => patience.again(doing, error).await?,
            }
        }
        loop {
            let read = async { Ok::<_, String>((self.last_sequence().await?, self.read(key).await?)) };
            let (sequence, entry) = match read.await {
                Ok(read) => read,
                Err(error) => {
                    patience.again(doing, error).await?;
                    continue;
                }
            };
            let (value, answer) = match change(entry.as_ref().map(|(value, _)| value))? {
                Change::Keep(answer) => return Ok(answer),
                Change::Write(value, answer) => (value, answer),
            };
            match self.write(key, value, sequence).await {
                Ok(_) => return Ok(answer),
                Err(WriteError::Conflict) => {
                    races += 1;
                    if races > MAX_RACES {
                        return Err(StoreError::new(format!(
                            "cluster: {doing} lost {MAX_RACES} races in a row; retry"
                        )));
                    }
                }
                Err(WriteError::Failed(error)) => patience.again(doing, error).await?,
            }
        }
    }
}

/// How long a NATS operation is tried again after a failure that may pass
/// (no answer, no stream leader yet) before the call gives up. When a
/// stream's leader dies, its followers wait 4-9 s (randomized) before they
/// campaign (nats-server's Raft election timeout), and a split vote takes
/// a second round: 20 s covers one full timeout, a second round and the
/// answer. At 8 s, a start after the leader's SIGKILL was refused in 2 of
/// 16 loaded runs of `killing_a_nats_node_changes_nothing_a_client_sees`.
pub const RETRY_WITHIN: Duration = Duration::from_secs(20);
/// How long a failure is tried again while the client reaches no NATS
/// server at all (no election to wait for: the node is cut off).
pub const CUT_OFF_WITHIN: Duration = Duration::from_secs(8);

/// Retries after a failure that may pass: a short, growing pause (a new
/// stream leader is elected within seconds), until [`RETRY_WITHIN`], or
/// [`CUT_OFF_WITHIN`] while the client is connected to no server.
pub struct Patience {
    started: tokio::time::Instant,
    pause: Duration,
    client: async_nats::Client,
}

impl Patience {
    /// Patience for the calls of `bucket`'s client, from now.
    pub fn starting_now(bucket: &Bucket) -> Self {
        Self { started: tokio::time::Instant::now(), pause: Duration::from_millis(50), client: bucket.client() }
    }

    /// Waits before the next try; `Err` when the time is up.
    pub async fn again(&mut self, doing: &str, error: impl std::fmt::Display) -> Result<(), StoreError> {
        let cut_off = self.client.connection_state() != async_nats::connection::State::Connected;
        let within = if cut_off { CUT_OFF_WITHIN } else { RETRY_WITHIN };
        if self.started.elapsed() + self.pause > within {
            return Err(failed(doing, error));
        }
        tracing::debug!(doing, %error, "cluster: trying again");
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_millis(500));
        Ok(())
    }
}

/// A store error for a NATS failure.
pub fn failed(doing: &str, error: impl std::fmt::Display) -> StoreError {
    StoreError::new(format!("cluster unavailable, retry: {doing}: {error}"))
}
