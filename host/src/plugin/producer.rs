//! [`WasmProducer`]: one tool instance (plugin version, instance config JSON) served by a wasm
//! plugin; [`LoadingProducer`]: the same while its version may still be loading behind a
//! cached descriptor.
//!
//! Model: at creation `describe(config)` runs in a throwaway store and becomes the
//! [`Descriptor`]. Each invocation gets its own store from the version's `InstancePre`:
//! `prepare` calls `label` in it, the returned [`PreparedRun`] calls `run` in the same store,
//! and the store then belongs to the task's driver until the task settles.
//!
//! Invariants:
//! - The current (version, descriptor) pair sits behind one lock and is swapped whole by
//!   [`WasmProducer::reload`], make-before-break (the new version is described first; a
//!   failure leaves the old one serving). Reloads are serialized, so the kind check and the
//!   swap see the version really serving. Each served version gets the next sequence number
//!   (v1 at creation, one more per successful reload: two loads of the same bytes differ), and
//!   each task pins the version that prepared it ([`ServingVersion::info`], e.g.
//!   `ticker@0123456789ab v2`).
//! - Strings from `describe`, `label` and `run` are bounded ([`super::bounds`]): descriptions,
//!   labels and error messages are cut; a schema over its bound refuses the plugin.
//! - An error or fault in `describe`, `label` or `run` refuses the instance or the call with
//!   the guest's message or the fault detail; no task is registered and the store is dropped.
//! - A [`LoadingProducer`] (descriptor from `super::cache`, keyed by content hash, config and
//!   host version) is listed at once; its load waits for the [`LoadGate`] (opened by `serve`'s
//!   first `tools/list` or by a call), then builds the engine, loads, validates and runs a
//!   real `describe`. Every call awaits the load ([`Producer::ready`]) before its arguments
//!   are checked, against the real schema. Once loaded, the real descriptor wins (the cache
//!   entry is rewritten if it differed; no `tools/list_changed` is sent), and reloads work on
//!   the loaded `WasmProducer`. A failed load keeps the tool listed, answers each call with the
//!   load's error and deletes the cache entry (the next start describes first); the server's
//!   other tools keep serving.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use anyhow::{Context as _, anyhow, bail};
use wasmtime::Store;

use super::bounds;
use super::component::PluginVersion;
use super::driver::{self, TaskParts};
use super::fault;
use super::state::StoreState;
use super::versions::Guest;
use crate::plugin::resources::{DurableTrees, HttpCapability, ProcessCapability};
use taskhost_core::producer::{Descriptor, PreparedRun, Producer, RunMode, runner};

mod loading;
pub use loading::{LoadDone, LoadGate, LoadingProducer, descriptor_from_json, descriptor_to_json};

/// A producer backed by a wasm plugin.
pub struct WasmProducer {
    config_json: Arc<str>,
    current: RwLock<Arc<Active>>,
    /// The `process` capability granted to this instance's task stores.
    process: Option<ProcessCapability>,
    /// The `subagents` grant given to every task store of this instance.
    subagents: Option<crate::subagents::Subagents>,
    /// Where a stable owner's handed-over trees are made durable.
    durable_trees: Option<DurableTrees>,
    /// The `http` capability given to every task store of this instance.
    http: Option<HttpCapability>,
    /// Held for a whole reload, so two reloads cannot interleave their
    /// describe, kind check and swap (the later one would compare against a
    /// stale "old" version, and sequence numbers could go backwards).
    reloading: tokio::sync::Mutex<()>,
    /// Live (started, not yet settled) tasks per version sequence number.
    /// Counted here rather than from the registry so the count is exact per
    /// tool instance even when two instances share a kind.
    live: Arc<Mutex<BTreeMap<u64, usize>>>,
}

/// Counts one live task of a version; dropping it (when the task's `done`
/// future finished or was dropped) uncounts it.
struct LiveGuard {
    live: Arc<Mutex<BTreeMap<u64, usize>>>,
    seq: u64,
}

impl LiveGuard {
    fn new(live: Arc<Mutex<BTreeMap<u64, usize>>>, seq: u64) -> Self {
        *live.lock().unwrap_or_else(|e| e.into_inner()).entry(seq).or_default() += 1;
        Self { live, seq }
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = live.get_mut(&self.seq) {
            *count -= 1;
            if *count == 0 {
                live.remove(&self.seq);
            }
        }
    }
}

/// The version new invocations use, with its description.
struct Active {
    serving: ServingVersion,
    descriptor: Arc<Descriptor>,
    /// `serving.info()`, formatted once: every task records it.
    info: Arc<str>,
}

impl Active {
    fn new(serving: ServingVersion, descriptor: Arc<Descriptor>) -> Arc<Self> {
        let info = serving.info().into();
        Arc::new(Self { serving, descriptor, info })
    }
}

/// A plugin version as one tool instance serves it: the loaded build and its
/// sequence number within this instance (1 for the first load).
#[derive(Clone, Debug)]
pub struct ServingVersion {
    pub seq: u64,
    pub version: Arc<PluginVersion>,
}

impl ServingVersion {
    /// `v<seq>`, how consoles name the version.
    pub fn tag(&self) -> String {
        format!("v{}", self.seq)
    }

    /// What a task records in `producer_info`: `<name>@<hash12> v<seq>`.
    pub fn info(&self) -> String {
        format!("{} v{}", self.version.version(), self.seq)
    }

    /// The sequence number in a `producer_info` written by [`Self::info`].
    pub fn seq_of_info(info: &str) -> Option<u64> {
        info.rsplit_once(" v")?.1.parse().ok()
    }
}

impl std::fmt::Debug for WasmProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let active = self.active();
        f.debug_struct("WasmProducer")
            .field("version", &active.serving.info())
            .field("kind", &active.descriptor.kind)
            .finish_non_exhaustive()
    }
}

impl WasmProducer {
    /// Describes `version` with `config` (the instance's JSON config, `{}`
    /// when there is none) and serves it.
    pub async fn new(version: Arc<PluginVersion>, config: serde_json::Value) -> anyhow::Result<Self> {
        let config_json: Arc<str> = serde_json::to_string(&config).context("cannot encode the plugin config")?.into();
        let descriptor = Arc::new(describe(&version, &config_json).await?);
        Ok(Self {
            config_json,
            current: RwLock::new(Active::new(ServingVersion { seq: 1, version }, descriptor)),
            reloading: tokio::sync::Mutex::new(()),
            live: Arc::default(),
            process: None,
            subagents: None,
            durable_trees: None,
            http: None,
        })
    }

    /// Grants this instance's tasks the `subagents` capability.
    pub fn with_subagents(mut self, subagents: crate::subagents::Subagents) -> Self {
        self.subagents = Some(subagents);
        self
    }

    /// Grants this instance's tasks outbound HTTP (`wasi:http`) within its grant.
    pub fn with_http(mut self, http: HttpCapability) -> Self {
        self.http = Some(http);
        self
    }

    /// Makes `version` serve new invocations, once it described itself with
    /// this instance's config and kept the kind. On error the old version
    /// keeps serving. Running tasks stay on the version that started them.
    ///
    /// Make-before-break: `version` is already compiled and pre-instantiated
    /// (a [`PluginVersion`] only exists once it was), and `describe` must
    /// succeed before anything changes. Until the one pointer swap at the
    /// end, every `prepare` keeps using the old version; after it, the new
    /// one. No call is refused or delayed by a reload.
    pub async fn reload(&self, version: Arc<PluginVersion>) -> anyhow::Result<(ServingVersion, Arc<Descriptor>)> {
        let _serialized = self.reloading.lock().await;
        // A new version may not start importing what this instance is not granted.
        super::preflight::check_grants(version.imports(), |capability| match capability {
            super::preflight::GatedCapability::Subagents => self.subagents.is_some(),
            super::preflight::GatedCapability::Http => self.http.is_some(),
        })
        .with_context(|| format!("the new version {} cannot replace the serving one", version.version()))?;
        let descriptor = Arc::new(
            describe(&version, &self.config_json)
                .await
                .with_context(|| format!("the new version {} failed describe", version.version()))?,
        );
        let old = self.active();
        if descriptor.kind != old.descriptor.kind {
            bail!(
                "plugin {} now describes kind `{}` where {} described `{}`; a reload cannot change \
                 the kind (task ids are per kind): load it as a new tool instance instead",
                version.version(),
                descriptor.kind,
                old.serving.version.version(),
                old.descriptor.kind
            );
        }
        let serving = ServingVersion { seq: old.serving.seq + 1, version };
        tracing::info!(from = %old.serving.info(), to = %serving.info(), "plugin reloaded");
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Active::new(serving.clone(), descriptor.clone());
        Ok((serving, descriptor))
    }

    /// Grants the `process` capability to the task stores of this instance
    /// (not to `describe`). Without it, the plugin's spawns are refused.
    pub fn with_process(mut self, capability: ProcessCapability) -> Self {
        self.process = Some(capability);
        self
    }

    /// Makes the trees a plugin hands over (`process.spawn-handed-over`)
    /// for a stable owner durable, under `trees` (see
    /// [`crate::plugin::resources::Tree::HandedOver`]).
    pub fn with_durable_trees(mut self, trees: DurableTrees) -> Self {
        self.durable_trees = Some(trees);
        self
    }

    /// The version new invocations run on.
    pub fn version(&self) -> Arc<PluginVersion> {
        self.active().serving.version.clone()
    }

    /// The version new invocations run on, with its sequence number.
    pub fn serving(&self) -> ServingVersion {
        self.active().serving.clone()
    }

    /// Tasks started by this instance and not yet settled, by version
    /// sequence number (versions with none are absent).
    pub fn live_tasks_by_version(&self) -> BTreeMap<u64, usize> {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The instance config, as JSON text.
    pub fn config_json(&self) -> &str {
        &self.config_json
    }

    fn active(&self) -> Arc<Active> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Calls `describe(config)` in a throwaway store and checks the result.
pub async fn describe(version: &PluginVersion, config_json: &str) -> anyhow::Result<Descriptor> {
    let deadline = version.engine().config().call_deadline();
    let (mut store, guest) = instantiate(version, "describe".into()).await?;
    let clock = fault::arm(&mut store, deadline);
    let described = fault::bounded(&clock, guest.describe(&mut store, config_json)).await;
    let described = match described {
        Ok(Ok(d)) => d,
        Ok(Err(message)) => bail!(
            "plugin {} refused its config in describe: {}",
            version.name(),
            bounds::cap(message, bounds::MAX_DETAIL_BYTES, "error message")
        ),
        Err(err) => bail!(fault::classify(&store, deadline, "describe", &err)),
    };
    let problem = |what: String| anyhow!("plugin {} returned a bad descriptor from describe: {what}", version.name());
    if !taskhost_core::ids::is_valid_kind(&described.kind) {
        return Err(problem(format!(
            "kind {:?} is not a valid task kind (lowercase letters, digits, '_' or '-', starting with a letter, at most 64 bytes)",
            described.kind
        )));
    }
    if described.description.trim().is_empty() {
        return Err(problem("the description is empty".into()));
    }
    if described.parameters.len() > bounds::MAX_SCHEMA_BYTES {
        return Err(problem(format!(
            "parameters is {} bytes of JSON, over the {}-byte limit of a parameter schema",
            described.parameters.len(),
            bounds::MAX_SCHEMA_BYTES
        )));
    }
    let parameters: serde_json::Value = serde_json::from_str(&described.parameters)
        .map_err(|err| problem(format!("parameters is not JSON ({err}): {:?}", preview(&described.parameters))))?;
    let Some(object) = parameters.as_object() else {
        return Err(problem(format!(
            "parameters must be a JSON Schema object, got {}",
            preview(&described.parameters)
        )));
    };
    if object.get("type").and_then(|t| t.as_str()) != Some("object") {
        return Err(problem("parameters must be an object schema (`\"type\": \"object\"`)".into()));
    }
    if object.get("properties").and_then(|p| p.get("run_in_background")).is_some() {
        return Err(problem("parameters must not declare `run_in_background`: the host adds it".into()));
    }
    if let Err(err) = jsonschema::validator_for(&parameters) {
        // The location inside the schema, as a JSON pointer (`/properties/n/type`).
        let at = err.instance_path().to_string();
        let at = if at.is_empty() { "/".to_string() } else { at };
        return Err(problem(format!("parameters is not a valid JSON Schema: at {at}: {err}")));
    }
    if described.description.len() > bounds::MAX_DESCRIPTION_BYTES {
        tracing::warn!(
            plugin = version.name(),
            bytes = described.description.len(),
            limit = bounds::MAX_DESCRIPTION_BYTES,
            "plugin description over its limit; truncated"
        );
    }
    Ok(Descriptor::new(
        described.kind,
        bounds::cap(described.description, bounds::MAX_DESCRIPTION_BYTES, "description"),
        parameters,
    )
    .with_streams_output(described.streams_output)
    .with_takes_input(described.takes_input))
}

fn preview(text: &str) -> String {
    let mut out: String = text.chars().take(80).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// A fresh store and instance of `version`.
async fn instantiate(version: &PluginVersion, purpose: Arc<str>) -> anyhow::Result<(Store<StoreState>, Guest)> {
    let deadline = version.engine().config().instantiation_deadline();
    let mut retries = 0;
    let (store, instantiated) = loop {
        let mut store = version.new_store(purpose.clone());
        let clock = fault::arm(&mut store, deadline);
        let instantiated = fault::bounded(&clock, version.pre().instantiate_async(&mut store)).await;
        match instantiated {
            Err(err) if retries < super::versions::TRANSIENT_RETRIES && super::versions::is_transient(&err) => {
                retries += 1;
                tracing::debug!(plugin = %version.name(), error = %format!("{err:#}"), "instantiation failed for a passing reason; trying again");
                tokio::task::yield_now().await;
            }
            instantiated => break (store, instantiated),
        }
    };
    let plugin = instantiated.map_err(|err| {
        let text = format!("{err:#}");
        if text.contains("maximum concurrent limit of") {
            anyhow!(
                "cannot start another instance of plugin {}: the wasm instance pool is full ({text}); \
                 wait for running tasks to finish or raise plugin max_live_stores",
                version.name()
            )
        } else {
            anyhow!(fault::classify(&store, deadline, "instantiation", &err))
        }
    })?;
    Ok((store, plugin))
}

#[async_trait::async_trait]
impl Producer for WasmProducer {
    fn descriptor(&self) -> Arc<Descriptor> {
        self.active().descriptor.clone()
    }

    /// Every kind names itself (`started background bash task bash-1`);
    /// clients read the id from `ToolOutput::started`, never from this text.
    fn start_reply(&self, descriptor: &Descriptor, id: &taskhost_core::ids::TaskId) -> String {
        start_reply(descriptor, id)
    }

    async fn prepare(&self, args: serde_json::Value, mode: RunMode) -> anyhow::Result<PreparedRun> {
        let active = self.active();
        let version = active.serving.version.clone();
        let run_number = version.next_run();
        let deadline = version.engine().config().call_deadline();
        let args_json = serde_json::to_string(&args).context("cannot encode the arguments")?;
        let config = self.config_json.clone();

        let (mut store, guest) = instantiate(&version, format!("run {run_number}").into()).await?;
        store.data_mut().process().set_capability(self.process.clone(), mode == RunMode::Foreground);
        if let Some(owner) = taskhost_core::producer::preparing_for() {
            store.data_mut().process().set_owner(&owner);
            if let Some(trees) =
                self.durable_trees.clone().filter(|_| taskhost_core::producer::preparing_for_stable_owner())
            {
                store.data_mut().process().set_durable(trees);
            }
        }
        if let Some(subagents) = &self.subagents {
            store.data_mut().grant_subagents(subagents.clone());
        }
        if let Some(http) = &self.http {
            store.data_mut().grant_http(http.clone());
        }
        let clock = fault::arm(&mut store, deadline);
        let label = match fault::bounded(&clock, guest.label(&mut store, &config, &args_json)).await {
            Ok(Ok(label)) => one_line(&bounds::cap(label, bounds::MAX_LABEL_BYTES, "label")),
            Ok(Err(message)) => bail!("{}", bounds::cap(message, bounds::MAX_DETAIL_BYTES, "error message")),
            Err(err) => bail!(fault::classify(&store, deadline, "label", &err)),
        };
        let streams_output = active.descriptor.streams_output;
        let plugin_name = version.name().to_string();
        let info = active.info.to_string();
        let seq = active.serving.seq;
        let live = self.live.clone();
        let run = runner(async move {
            // A 0.1 descriptor never takes input, so the tool adapter never
            // asks a 0.1 plugin for an interactive run (see `versions`).
            let clock = fault::arm(&mut store, deadline);
            let task = match fault::bounded(&clock, guest.run(&mut store, &config, &args_json, mode)).await {
                Ok(Ok(task)) => task,
                Ok(Err(message)) => bail!("{}", bounds::cap(message, bounds::MAX_DETAIL_BYTES, "error message")),
                Err(err) => bail!(fault::classify(&store, deadline, "run", &err)),
            };
            // Created here, inside the registry's start span (which carries
            // the owner and, once committed, the task id), so the driver's
            // events are tagged with them.
            let span = tracing::info_span!(
                "wasm_task",
                plugin = %plugin_name,
                version = version.version(),
                seq,
                run = run_number
            );
            tracing::debug!(parent: &span, "wasm task started");
            // Keep the version alive as long as the task: its engine ticks the
            // epochs that bound the task's calls.
            let parts = TaskParts { store, guest, task, deadline, streams_output, _version: version };
            let hooks = driver::spawn(parts, span);
            let counted = LiveGuard::new(live, seq);
            let done = hooks.done;
            Ok(taskhost_core::tasks::TaskHooks::new(
                hooks.control,
                Box::pin(async move {
                    let outcome = done.await;
                    drop(counted);
                    outcome
                }),
            ))
        });
        Ok(PreparedRun::new(label, run).with_producer_info(Some(info)))
    }
}

/// One rule for every kind: the reply names the kind and the task (the id
/// itself travels as data, in `ToolOutput::started`).
fn start_reply(descriptor: &Descriptor, id: &taskhost_core::ids::TaskId) -> String {
    format!("started background {} task {id}", descriptor.kind)
}

/// Labels are one line: newlines become spaces, and they are capped.
fn one_line(label: &str) -> String {
    let flat: String = label.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 200 {
        let mut cut: String = flat.chars().take(199).collect();
        cut.push('…');
        cut
    } else {
        flat
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_single_capped_lines() {
        assert_eq!(one_line("sleep 1\n  && echo hi"), "sleep 1 && echo hi");
        assert_eq!(one_line(&"y".repeat(500)).chars().count(), 200);
    }
}
