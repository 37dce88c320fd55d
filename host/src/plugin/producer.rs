//! [`WasmProducer`]: one tool instance served by a wasm plugin.
//!
//! Model: a tool instance is (plugin version, instance config JSON). At
//! creation the plugin's `describe(config)` runs in a throwaway store and
//! becomes the [`Descriptor`]. Each invocation gets its own store from the
//! version's `InstancePre`: `prepare` calls `label` in it, the returned
//! [`PreparedRun`] calls `run` in the same store, and the store then belongs
//! to the task's driver until the task settles.
//!
//! Invariants:
//! - The current (version, descriptor) pair sits behind one lock and is
//!   swapped whole by [`WasmProducer::reload`], make-before-break: the new
//!   version is described first and a failure leaves the old one serving.
//!   Each task pins the version that prepared it (`producer_info` names it).
//! - Errors and faults in `describe`, `label` and `run` refuse the
//!   instance or the call with the guest's message or the fault detail; no
//!   task is registered and the store is dropped.

use std::sync::{Arc, RwLock};

use anyhow::{Context as _, anyhow, bail};
use wasmtime::Store;

use super::bindings::Plugin;
use super::bindings::taskhost::producer::types::RunMode as WitRunMode;
use super::component::PluginVersion;
use super::driver::{self, TaskParts};
use super::fault;
use super::state::StoreState;
use crate::capabilities::process::ProcessCapability;
use crate::producer::{Descriptor, PreparedRun, Producer, RunMode, runner};

/// A producer backed by a wasm plugin.
pub struct WasmProducer {
    config_json: Arc<str>,
    current: RwLock<Arc<Active>>,
    /// The `process` capability granted to this instance's task stores.
    process: Option<ProcessCapability>,
    /// The `subagents` grant given to every task store of this instance.
    subagents: Option<crate::capabilities::subagents::Subagents>,
}

/// The version new invocations use, with its description.
struct Active {
    version: Arc<PluginVersion>,
    descriptor: Arc<Descriptor>,
}

impl std::fmt::Debug for WasmProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let active = self.active();
        f.debug_struct("WasmProducer")
            .field("version", &active.version.version())
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
            current: RwLock::new(Arc::new(Active { version, descriptor })),
            process: None,
            subagents: None,
        })
    }

    /// Grants this instance's tasks the `subagents` capability.
    pub fn with_subagents(mut self, subagents: crate::capabilities::subagents::Subagents) -> Self {
        self.subagents = Some(subagents);
        self
    }

    /// Makes `version` serve new invocations, once it described itself with
    /// this instance's config and kept the kind. On error the old version
    /// keeps serving. Running tasks stay on the version that started them.
    pub async fn reload(&self, version: Arc<PluginVersion>) -> anyhow::Result<Arc<Descriptor>> {
        let descriptor = Arc::new(describe(&version, &self.config_json).await?);
        let old = self.active();
        if descriptor.kind != old.descriptor.kind {
            bail!(
                "plugin {} now describes kind `{}` where {} described `{}`; a reload cannot change \
                 the kind (task ids are per kind): load it as a new tool instance instead",
                version.version(),
                descriptor.kind,
                old.version.version(),
                old.descriptor.kind
            );
        }
        tracing::info!(from = old.version.version(), to = version.version(), "plugin reloaded");
        *self.current.write().unwrap_or_else(|e| e.into_inner()) =
            Arc::new(Active { version, descriptor: descriptor.clone() });
        Ok(descriptor)
    }

    /// Grants the `process` capability to the task stores of this instance
    /// (not to `describe`). Without it, the plugin's spawns are refused.
    pub fn with_process(mut self, capability: ProcessCapability) -> Self {
        self.process = Some(capability);
        self
    }

    /// The version new invocations run on.
    pub fn version(&self) -> Arc<PluginVersion> {
        self.active().version.clone()
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
    let (mut store, plugin) = instantiate(version, "describe".into()).await?;
    fault::arm(&mut store, deadline);
    let described =
        fault::bounded(deadline, plugin.taskhost_producer_producer().call_describe(&mut store, config_json)).await;
    let described = match described {
        Ok(Ok(d)) => d,
        Ok(Err(message)) => bail!("plugin {} refused its config in describe: {message}", version.name()),
        Err(err) => bail!(fault::classify(&store, deadline, "describe", &err)),
    };
    let problem = |what: String| anyhow!("plugin {} returned a bad descriptor from describe: {what}", version.name());
    if !crate::ids::is_valid_kind(&described.kind) {
        return Err(problem(format!(
            "kind {:?} is not a valid task kind (lowercase letters, digits, '_' or '-', starting with a letter, at most 64 bytes)",
            described.kind
        )));
    }
    if described.description.trim().is_empty() {
        return Err(problem("the description is empty".into()));
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
        return Err(problem(format!("parameters is not a valid JSON Schema: {err}")));
    }
    Ok(Descriptor {
        kind: described.kind,
        description: described.description,
        parameters,
        streams_output: described.streams_output,
    })
}

fn preview(text: &str) -> String {
    let mut out: String = text.chars().take(80).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// A fresh store and instance of `version`.
async fn instantiate(version: &PluginVersion, purpose: Arc<str>) -> anyhow::Result<(Store<StoreState>, Plugin)> {
    let mut store = version.new_store(purpose);
    fault::arm(&mut store, version.engine().config().call_deadline());
    let deadline = version.engine().config().call_deadline();
    let plugin = fault::bounded(deadline, version.pre().instantiate_async(&mut store)).await.map_err(|err| {
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

    async fn prepare(&self, args: serde_json::Value, mode: RunMode) -> anyhow::Result<PreparedRun> {
        let active = self.active();
        let version = active.version.clone();
        let run_number = version.next_run();
        let deadline = version.engine().config().call_deadline();
        let args_json = serde_json::to_string(&args).context("cannot encode the arguments")?;
        let config = self.config_json.clone();

        let (mut store, plugin) = instantiate(&version, format!("run {run_number}").into()).await?;
        store.data_mut().process().set_capability(self.process.clone(), mode == RunMode::Foreground);
        if let Some(subagents) = &self.subagents {
            store.data_mut().grant_subagents(subagents.clone());
        }
        let guest = plugin.taskhost_producer_producer().clone();
        fault::arm(&mut store, deadline);
        let label = match fault::bounded(deadline, guest.call_label(&mut store, &config, &args_json)).await {
            Ok(Ok(label)) => one_line(&label),
            Ok(Err(message)) => bail!("{message}"),
            Err(err) => bail!(fault::classify(&store, deadline, "label", &err)),
        };
        let streams_output = active.descriptor.streams_output;
        let plugin_name = version.name().to_string();
        let run = runner(async move {
            let mode = match mode {
                RunMode::Foreground => WitRunMode::Foreground,
                RunMode::Background => WitRunMode::Background,
            };
            fault::arm(&mut store, deadline);
            let task = match fault::bounded(deadline, guest.call_run(&mut store, &config, &args_json, mode)).await {
                Ok(Ok(task)) => task,
                Ok(Err(message)) => bail!("{message}"),
                Err(err) => bail!(fault::classify(&store, deadline, "run", &err)),
            };
            // Created here, inside the registry's start span (which carries
            // the owner and, once committed, the task id), so the driver's
            // events are tagged with them.
            let span = tracing::info_span!(
                "wasm_task",
                plugin = %plugin_name,
                version = version.version(),
                run = run_number
            );
            tracing::debug!(parent: &span, "wasm task started");
            // Keep the version alive as long as the task: its engine ticks the
            // epochs that bound the task's calls.
            let parts = TaskParts { store, guest, task, deadline, streams_output, _version: version };
            Ok(driver::spawn(parts, span))
        });
        Ok(PreparedRun { label, producer_info: Some(active.version.version().to_string()), run })
    }
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
