//! [`LoadingProducer`]: a tool instance listed at once from its cached
//! descriptor while its plugin loads in the background, behind a
//! [`LoadGate`]; and the cache entry's form of a descriptor.
//!
//! Invariants: see [`super`] (a call waits for the load; the real
//! descriptor wins; a failed load answers every call with its error).

use std::sync::Arc;

use anyhow::anyhow;

use super::{WasmProducer, start_reply};
use crate::plugin::bounds;
use taskhost_core::producer::{Descriptor, PreparedRun, Producer, RunMode};

/// What a background load ends with: the described producer, or why it
/// could not be served. `None` while it runs.
type LoadOutcome = Option<Result<Arc<WasmProducer>, Arc<str>>>;

/// A tool instance whose plugin may still be loading: the model for a start
/// served from a cached descriptor (see the module header).
///
/// It is registered at once with the cached descriptor; the load (engine,
/// deserialize, validation, the real `describe`) runs in the background and
/// ends by [`LoadingProducer::finish`]. From then on every listing and call
/// goes to the loaded [`WasmProducer`] (reloads included); a call made
/// before waits for it ([`Producer::ready`]); a failed load makes every call
/// answer with the load's error, and the server keeps serving the rest.
pub struct LoadingProducer {
    cached: Arc<Descriptor>,
    outcome: tokio::sync::watch::Receiver<LoadOutcome>,
    /// Opened by the first call: a call never waits for a gate nobody opens.
    gate: LoadGate,
}

/// When background loads may begin: they wait for it, so the work of a
/// start (answering the first `tools/list`) has the CPU to itself. Opened by
/// whoever knows that moment (`serve` after its first tool listing), and by
/// the first call to a [`LoadingProducer`]. Cheap to clone; opening is final.
#[derive(Clone, Debug)]
pub struct LoadGate(Arc<tokio::sync::watch::Sender<bool>>);

impl LoadGate {
    /// A closed gate.
    pub fn closed() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(false).0))
    }

    /// An open gate: loads begin at once.
    pub fn open_now() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(true).0))
    }

    pub fn open(&self) {
        if !*self.0.borrow() {
            tracing::debug!("background plugin loads may begin");
            self.0.send_replace(true);
        }
    }

    pub fn is_open(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the gate is open.
    pub async fn opened(&self) {
        let mut open = self.0.subscribe();
        // The sender lives as long as `self`: this cannot fail.
        let _ = open.wait_for(|open| *open).await;
    }
}

/// The end of a [`LoadingProducer`]'s background load. Dropped without
/// [`Self::finish`] (the loading task panicked), calls fail with that.
pub struct LoadDone(tokio::sync::watch::Sender<LoadOutcome>);

impl LoadDone {
    /// Serves `loaded` (or its error) from now on.
    pub fn finish(self, loaded: Result<Arc<WasmProducer>, String>) {
        self.0.send_replace(Some(loaded.map_err(Into::into)));
    }
}

impl LoadingProducer {
    /// A producer answering with `cached` until the load ends; its first
    /// call opens `gate`.
    pub fn new(cached: Descriptor, gate: LoadGate) -> (Arc<Self>, LoadDone) {
        let (sender, outcome) = tokio::sync::watch::channel(None);
        (Arc::new(Self { cached: Arc::new(cached), outcome, gate }), LoadDone(sender))
    }

    /// The loaded producer, once the load ended well.
    pub fn loaded(&self) -> Option<Arc<WasmProducer>> {
        match &*self.outcome.borrow() {
            Some(Ok(producer)) => Some(producer.clone()),
            _ => None,
        }
    }

    /// Waits for the end of the load.
    pub async fn wait(&self) -> anyhow::Result<Arc<WasmProducer>> {
        self.gate.open();
        let mut outcome = self.outcome.clone();
        let outcome = outcome
            .wait_for(Option::is_some)
            .await
            .map_err(|_| anyhow!("the plugin's background load stopped without a result (it panicked)"))?;
        match &*outcome {
            Some(Ok(producer)) => Ok(producer.clone()),
            Some(Err(why)) => Err(anyhow!("{why}")),
            None => unreachable!("waited for Some"),
        }
    }
}

#[async_trait::async_trait]
impl Producer for LoadingProducer {
    /// The loaded producer's (the real one wins over the cache), else the
    /// cached one: a failed load keeps listing the tool, whose calls then
    /// answer with the error.
    fn descriptor(&self) -> Arc<Descriptor> {
        match self.loaded() {
            Some(producer) => producer.descriptor(),
            None => self.cached.clone(),
        }
    }

    fn start_reply(&self, descriptor: &Descriptor, id: &taskhost_core::ids::TaskId) -> String {
        start_reply(descriptor, id)
    }

    async fn ready(&self) -> anyhow::Result<()> {
        self.wait().await.map(drop)
    }

    async fn prepare(&self, args: serde_json::Value, mode: RunMode) -> anyhow::Result<PreparedRun> {
        self.wait().await?.prepare(args, mode).await
    }
}

/// A descriptor as its cache entry holds it (JSON).
pub fn descriptor_to_json(descriptor: &Descriptor) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "kind": descriptor.kind,
        "description": descriptor.description,
        "parameters": descriptor.parameters,
        "streams_output": descriptor.streams_output,
        "takes_input": descriptor.takes_input,
    }))
    .expect("a JSON value encodes")
}

/// A descriptor from its cache entry; `None` when the entry does not hold
/// one a `describe` could have returned (then the cache is not used).
pub fn descriptor_from_json(json: &[u8]) -> Option<Descriptor> {
    let value: serde_json::Value = serde_json::from_slice(json).ok()?;
    let descriptor = Descriptor::new(
        value.get("kind")?.as_str()?,
        value.get("description")?.as_str()?,
        value.get("parameters")?.clone(),
    )
    .with_streams_output(value.get("streams_output")?.as_bool()?)
    .with_takes_input(value.get("takes_input")?.as_bool()?);
    let sane = taskhost_core::ids::is_valid_kind(&descriptor.kind)
        && !descriptor.description.trim().is_empty()
        && descriptor.description.len() <= bounds::MAX_DESCRIPTION_BYTES
        && descriptor.parameters.get("type").and_then(|t| t.as_str()) == Some("object");
    sane.then_some(descriptor)
}
