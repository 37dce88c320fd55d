//! Building a [`Host`] from a [`Config`]: the one place that turns `[[producer]]` entries into
//! served tools. [`build_producer`] turns each entry into a producer and wires in the
//! capabilities it needs (the subagents service, the process host).
//!
//! Invariants:
//! - Every `plugin` value is parsed once, with the configuration, into a [`ProducerSource`]
//!   (`native:<name>`, `builtin:<name>`, or a path to a `.wasm` component); anything else is
//!   an error that lists what is supported, so a typo never serves a half-configured host.
//! - The plugin engine is created only when a wasm producer is configured, and lives as long
//!   as the plugins loaded into it.
//! - A plugin file is read once; with a trust policy ([`PluginRuntime::with_trust`], what the
//!   commands give) it is admitted by the hash of those bytes before anything else, and its
//!   reloads are guarded the same way ([`crate::reload`]). Plugin files, like taskhost's own
//!   state, are handed to the process host as paths no tree may write.
//! - Start from cached descriptors ([`served_from_config_gated`]): a wasm entry's bytes are
//!   read and hashed (a built-in plugin's are neither copied nor hashed: `build.rs` hashed
//!   them) and its grants checked first. When the compile cache holds a descriptor for
//!   (bytes, config, host version), a [`LoadingProducer`] serves the tool at once and the rest
//!   (engine on a thread of its own, load, validation, `describe`) runs in the background once
//!   the [`LoadGate`] opens. Otherwise the entry is loaded and described before serving, and
//!   its descriptor is cached for next time.
//! - The process host's spill directory is made at once; its start-ahead work (tree limiter
//!   and its cgroups, the sweep of dead hosts' spill directories, confinement probe, warm
//!   keeper) begins when a producer using it is built.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use serde_json::json;

use crate::config::{Config, NativeProducer, ProducerConfig, ProducerSource};
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use taskhost_core::Host;

use crate::plugin::cache::{CompileCache, Lookup, descriptor_key};
use crate::plugin::component::content_hash;
use crate::plugin::engine::open_cache_in;
use crate::plugin::producer::{LoadGate, LoadingProducer, descriptor_from_json, descriptor_to_json};
use crate::plugin::resources::{DurableTrees, HttpCapability, ProcessCapability};
use crate::plugin::{PluginEngine, PluginRuntimeConfig, WasmProducer};
use crate::reload::ReloadablePlugin;
use crate::state::trust::{FileKind, TrustPolicy};
use crate::state::{StateDir, StateSettings};
use crate::subagents::{SubagentProducer, Subagents};
use taskhost_core::producer::{Descriptor, Producer};
use taskhost_process::{ProcessHost, ProcessHostConfig};

/// Builds the producer a `[[producer]]` entry names. `base_dir` resolves
/// relative `.wasm` paths; the runtimes are created on first use.
pub async fn build_producer(
    config: &ProducerConfig,
    base_dir: &Path,
    runtime: &mut PluginRuntime,
    subagents: &Subagents,
) -> anyhow::Result<Arc<dyn Producer>> {
    match &config.plugin {
        ProducerSource::Native(NativeProducer::Ticker) => {
            anyhow::ensure!(
                config.grants == crate::config::Grants::default(),
                "tool {:?}: the native ticker uses no capability; remove its grants",
                config.tool
            );
            Ok(Arc::new(taskhost_core::native::ticker::TickerProducer::new(&config.config_json())?))
        }
        ProducerSource::Native(NativeProducer::Subagent) => {
            let instance = subagent_instance_config(config)?;
            Ok(Arc::new(SubagentProducer::new(subagents.clone(), &instance).with_context(|| tool_context(config))?))
        }
        ProducerSource::Builtin(_) | ProducerSource::File(_) => {
            let wasm = build_wasm_producer(config, base_dir, runtime, Some(subagents)).await?;
            Ok(wasm.expect("a wasm source builds a wasm producer").producer)
        }
    }
}

/// What an error about this entry names: the `[[producer]]` entry the author
/// wrote, or the plugin itself for an entry with no tool name (what `dev`,
/// `check` and `call` build from a bare `.wasm`, whose name comes from the
/// plugin's kind once it is described).
fn tool_context(config: &ProducerConfig) -> String {
    if config.tool.is_empty() { format!("plugin {}", config.plugin) } else { format!("[[producer]] {:?}", config.tool) }
}

/// The instance config of a subagent producer (native or built-in): the
/// entry's `background` flag is written into it as `background` (a
/// conflicting explicit value is an error), so the producer describes
/// background collection exactly when the host offers `run_in_background`.
fn subagent_instance_config(entry: &ProducerConfig) -> anyhow::Result<serde_json::Value> {
    let mut config = entry.config_json();
    let object =
        config.as_object_mut().ok_or_else(|| anyhow::anyhow!("{}: config must be a table", tool_context(entry)))?;
    match object.get("background") {
        Some(serde_json::Value::Bool(flag)) if *flag != entry.background => anyhow::bail!(
            "{}: config.background = {flag} contradicts background = {}; set only the latter",
            tool_context(entry),
            entry.background
        ),
        _ => {
            object.insert("background".into(), json!(entry.background));
        }
    }
    Ok(config)
}

/// A wasm plugin served from a `[[producer]]` entry, with its grants.
pub struct WasmEntry {
    pub producer: Arc<WasmProducer>,
    /// The component file it was loaded from; `None` for a built-in plugin.
    pub file: Option<PathBuf>,
}

/// Builds the wasm producer of an entry whose plugin is `builtin:<name>` or
/// a `.wasm` path, with the capabilities its grants name (the `subagents`
/// service among them when it is given and granted); `Ok(None)`
/// for a native producer (see [`build_producer`]). Also what `taskhost dev`
/// serves, so a plugin under development gets exactly the authority it will
/// get in production.
pub async fn build_wasm_producer(
    config: &ProducerConfig,
    base_dir: &Path,
    runtime: &mut PluginRuntime,
    subagents: Option<&Subagents>,
) -> anyhow::Result<Option<WasmEntry>> {
    let Some(plan) = WasmPlan::of(config, base_dir, runtime, subagents).await? else { return Ok(None) };
    let engine = runtime.engine().await?;
    let file = plan.file.clone();
    let producer = plan.build(&engine).await?;
    runtime.store_descriptor(&producer);
    Ok(Some(WasmEntry { producer, file }))
}

/// Everything a wasm entry's producer is built from, read and checked
/// before any engine is needed: the bytes (and their hash, the cache key;
/// a built-in plugin's was computed when the binary was built),
/// the instance config, and the capabilities its grants name.
struct WasmPlan {
    tool: String,
    name: String,
    /// A built-in plugin's bytes are borrowed from the binary.
    bytes: Cow<'static, [u8]>,
    /// The SHA-256 of `bytes` (for a built-in plugin, computed at build time).
    hash: String,
    file: Option<PathBuf>,
    instance_config: serde_json::Value,
    config_json: String,
    subagents: Option<Subagents>,
    process: Option<ProcessCapability>,
    durable_trees: Option<DurableTrees>,
    http: Option<HttpCapability>,
}

impl WasmPlan {
    async fn of(
        config: &ProducerConfig,
        base_dir: &Path,
        runtime: &mut PluginRuntime,
        subagents: Option<&Subagents>,
    ) -> anyhow::Result<Option<Self>> {
        let (name, bytes, hash, file) = match &config.plugin {
            ProducerSource::Native(_) => return Ok(None),
            // Hashed at build time; copied only when loaded (after the gate).
            ProducerSource::Builtin(builtin) => {
                (builtin.name.to_string(), Cow::Borrowed(builtin.wasm), builtin.sha256.to_string(), None)
            }
            ProducerSource::File(path) => {
                let file = base_dir.join(path);
                let bytes = tokio::fs::read(&file)
                    .await
                    .with_context(|| format!("cannot read plugin {}", file.display()))
                    .with_context(|| format!("cannot load plugin {}", file.display()))?;
                let hash = content_hash(&bytes);
                // Read once: these bytes are the ones admitted and loaded.
                if let Some(policy) = &runtime.trust {
                    policy.admit(&file, FileKind::Plugin, &hash).map_err(|e| anyhow::Error::new(*e))?;
                }
                (crate::plugin::component::plugin_name_of(&file), Cow::Owned(bytes), hash, Some(file))
            }
        };
        let grants = config.effective_grants().with_context(|| tool_context(config))?;
        // A capability the plugin imports but is not granted refuses it now,
        // naming the grant to add, not at its first call (before compiling:
        // the component's type information alone).
        // (The caller names the `[[producer]]` entry.)
        if let Some(imports) = crate::plugin::preflight::imports_of(&bytes) {
            crate::plugin::preflight::check_grants(&imports, |capability| grants.grants(capability))?;
        }
        // A plugin granted subagents collects its children in the background
        // exactly when the host offers `run_in_background` (see
        // [`subagent_instance_config`]).
        let instance_config =
            if grants.subagents.is_some() { subagent_instance_config(config)? } else { config.config_json() };
        let config_json = serde_json::to_string(&instance_config).context("cannot encode the plugin config")?;
        let subagents = match (&grants.subagents, subagents) {
            (Some(grant), Some(service)) => Some(service.restricted_to(grant).with_context(|| tool_context(config))?),
            _ => None,
        };
        let process = match &grants.process {
            Some(grant) => {
                // Checked now, once: a grant that names a program found through
                // a directory process trees could write, or whose workspace is
                // `/` or the home directory, refuses to load.
                let grant = grant.clone();
                grant.check_at_load().with_context(|| {
                    if config.tool.is_empty() {
                        format!("plugin {}", config.plugin)
                    } else {
                        format!("tool {:?}", config.tool)
                    }
                })?;
                Some(ProcessCapability { host: runtime.process_host()?, grant: Arc::new(grant) })
            }
            None => None,
        };
        // Checked now, once: origins, methods, bounds; credentials read.
        let http = match &grants.http {
            Some(grant) => {
                Some(HttpCapability::new(grant.check_at_load(base_dir).with_context(|| tool_context(config))?)?)
            }
            None => None,
        };
        Ok(Some(Self {
            tool: tool_context(config),
            name,
            bytes,
            hash,
            file,
            instance_config,
            config_json,
            subagents,
            durable_trees: process.as_ref().and(runtime.durable_trees.clone()),
            process,
            http,
        }))
    }

    /// Loads, validates and describes the plugin: the producer.
    async fn build(self, engine: &PluginEngine) -> anyhow::Result<Arc<WasmProducer>> {
        if let Some(process) = &self.process {
            process.host.start_ahead();
        }
        let version = match &self.file {
            None => engine.load_bytes(&self.name, self.bytes.into_owned()).await?,
            Some(file) => engine.load_file_bytes(file, self.bytes.into_owned()).await?,
        };
        let mut producer = WasmProducer::new(version, self.instance_config).await.with_context(|| self.tool.clone())?;
        if let Some(subagents) = self.subagents {
            producer = producer.with_subagents(subagents);
        }
        if let Some(process) = self.process {
            producer = producer.with_process(process);
        }
        if let Some(trees) = self.durable_trees {
            producer = producer.with_durable_trees(trees);
        }
        if let Some(http) = self.http {
            producer = producer.with_http(http);
        }
        Ok(Arc::new(producer))
    }
}

/// The plugin engine being built on its own thread (the pool reservation
/// takes milliseconds), or its error.
type EngineStart = Shared<BoxFuture<'static, Result<PluginEngine, Arc<str>>>>;

/// The shared runtimes wasm producers need, created on first use so a host
/// serving only native producers starts neither. The engine is built on a
/// thread of its own from [`Self::start_engine`] on, so reading and checking
/// entries (and answering from cached descriptors) does not wait for it.
pub struct PluginRuntime {
    engine_config: PluginRuntimeConfig,
    process_config: ProcessHostConfig,
    /// `[state]`: where the compile cache's key and the default spill root are.
    state: StateSettings,
    /// The compile cache (also the descriptor cache), opened once and shared
    /// with the engine; `Some(None)` when it is off or untrusted.
    cache: Option<Option<Arc<CompileCache>>>,
    engine: Option<EngineStart>,
    process_host: Option<Arc<ProcessHost>>,
    /// When the engine may start being built (see [`LoadGate`]).
    gate: LoadGate,
    /// What plugin files must pass, at load and on every reload (none:
    /// every file is loaded, as an embedder building a host wants).
    trust: Option<Arc<TrustPolicy>>,
    /// Where handed-over trees of stable owners are made durable; `None`
    /// when the task store does not outlive the process.
    durable_trees: Option<DurableTrees>,
}

impl PluginRuntime {
    pub fn new(config: &Config) -> Self {
        let mut process_config = config.process.clone();
        // taskhost's own state is out of every tree's reach.
        for path in config.protected_paths() {
            if !process_config.protected_paths.contains(&path) {
                process_config.protected_paths.push(path);
            }
        }
        // What it loads later (plugin files) trees may read, never replace.
        for path in config.plugin_files() {
            if !process_config.write_protected_paths.contains(&path) {
                process_config.write_protected_paths.push(path);
            }
        }
        Self {
            engine_config: config.plugins.clone(),
            process_config,
            state: config.state.clone(),
            cache: None,
            engine: None,
            process_host: None,
            gate: LoadGate::open_now(),
            trust: None,
            durable_trees: None,
        }
    }

    /// Admits plugin files through `policy` (see [`crate::state::trust`]),
    /// at load and on every reload of the plugins built here.
    pub fn with_trust(mut self, policy: Option<Arc<TrustPolicy>>) -> Self {
        self.trust = policy;
        self
    }

    /// Guards `plugin`'s reloads with this runtime's trust policy, if any.
    pub fn guard(&self, plugin: &ReloadablePlugin) {
        if let Some(policy) = &self.trust {
            plugin.guard_reloads(policy.clone());
        }
    }

    /// Builds the engine only once `gate` opens (or an eager load needs it).
    pub fn with_gate(mut self, gate: LoadGate) -> Self {
        self.gate = gate;
        self
    }

    /// The compile cache, opened on first use.
    fn cache(&mut self) -> Option<Arc<CompileCache>> {
        let (config, state) = (&self.engine_config, &self.state);
        self.cache.get_or_insert_with(|| open_cache_in(config, state)).clone()
    }

    /// Starts building the engine on its own thread, unless it was started.
    /// Prepares the engine's start: it is built on a thread of its own once
    /// the gate opens and something awaits it.
    fn start_engine(&mut self) {
        if self.engine.is_some() {
            return;
        }
        let config = self.engine_config.clone();
        let cache = self.cache();
        let gate = self.gate.clone();
        let start: BoxFuture<'static, Result<PluginEngine, Arc<str>>> = Box::pin(async move {
            gate.opened().await;
            let (sender, receiver) = tokio::sync::oneshot::channel();
            std::thread::Builder::new()
                .name("taskhost-engine-start".into())
                .spawn(move || {
                    let engine = PluginEngine::with_cache(config, cache)
                        .context("starting the plugin engine")
                        .map_err(|err| Arc::<str>::from(format!("{err:#}")));
                    let _ = sender.send(engine);
                })
                .map_err(|err| Arc::<str>::from(format!("cannot start a thread to build the plugin engine: {err}")))?;
            receiver.await.unwrap_or_else(|_| Err("the plugin engine start panicked".into()))
        });
        self.engine = Some(start.shared());
    }

    /// The engine, once built. Opens the gate: what awaits this is on the
    /// start's path anyway.
    pub async fn engine(&mut self) -> anyhow::Result<PluginEngine> {
        self.gate.open();
        self.engine_start().await.map_err(|err| anyhow::anyhow!("{err}"))
    }

    /// The engine's start, to await elsewhere (a background load).
    fn engine_start(&mut self) -> EngineStart {
        self.start_engine();
        self.engine.clone().expect("just started")
    }

    /// The descriptor cached for `plan`'s bytes and config, if the cache
    /// holds a sound one (a refused entry is logged and deleted).
    fn cached_descriptor(&mut self, plan: &WasmPlan) -> Option<(Descriptor, String)> {
        let cache = self.cache()?;
        let key = descriptor_key(&plan.hash, &plan.config_json);
        match cache.load_descriptor(&key) {
            Lookup::Hit(json) => match descriptor_from_json(&json) {
                Some(descriptor) => Some((descriptor, key)),
                None => {
                    tracing::warn!(file = %cache.descriptor_path(&key).display(), "unusable descriptor cache entry; describing the plugin");
                    cache.discard_descriptor(&key);
                    None
                }
            },
            Lookup::Miss => None,
            Lookup::Refused(why) => {
                tracing::warn!(
                    file = %cache.descriptor_path(&key).display(),
                    "refused a descriptor cache entry ({why}); deleted it and describing the plugin"
                );
                None
            }
        }
    }

    /// Writes `producer`'s descriptor to the cache, for the next start.
    fn store_descriptor(&mut self, producer: &WasmProducer) {
        let Some(cache) = self.cache() else { return };
        let key = descriptor_key(producer.version().content_hash(), producer.config_json());
        store_descriptor(&cache, &key, &producer.descriptor());
    }

    /// Where spill files go: `[process] spill_root`, else the state
    /// directory's spill root (hidden from every tree with the directory).
    fn spill_root(&self) -> anyhow::Result<PathBuf> {
        match &self.process_config.spill_root {
            Some(root) => Ok(root.clone()),
            None => StateDir::open_configured(&self.state)?.spill_root(),
        }
    }

    /// The process host. Its start-ahead work (tree limiter, spill sweep,
    /// confinement probe, warm keeper) begins when a producer using it is built
    /// ([`WasmPlan::build`]), after the gate.
    pub fn process_host(&mut self) -> anyhow::Result<Arc<ProcessHost>> {
        if self.process_host.is_none() {
            if self.process_config.spill_root.is_none() {
                self.process_config.spill_root = Some(self.spill_root()?);
            }
            self.process_host =
                Some(ProcessHost::new_unstarted(&self.process_config).context("creating the process spill directory")?);
        }
        Ok(self.process_host.clone().expect("just created"))
    }
}

/// A host serving the configuration's producers (or the defaults).
/// `base_dir` is the configuration file's directory.
pub async fn host_from_config(config: &Config, base_dir: &Path) -> anyhow::Result<Host> {
    Ok(served_from_config(config, base_dir).await?.0)
}

fn store_descriptor(cache: &CompileCache, key: &str, descriptor: &Descriptor) {
    if let Err(err) = cache.store_descriptor(key, &descriptor_to_json(descriptor)) {
        tracing::warn!(file = %cache.descriptor_path(key).display(), error = %err, "cannot write the descriptor cache");
    }
}

mod serving;
pub use serving::{PendingPlugin, Served, ServedPlugin, served_from_config, served_from_config_gated, served_on_state};

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn defaults_serve_bash_the_ticker_and_the_control_tools() {
        let host = host_from_config(&Config::default(), Path::new(".")).await.unwrap();
        let names: Vec<String> = host.tool_definitions().into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["bash", "task_input", "task_kill", "task_list", "task_output", "task_wait", "ticker"]);
    }

    #[test]
    fn an_unknown_plugin_names_what_is_supported() {
        for plugin in ["native:nope", "builtin:nope", "nope"] {
            let error = Config::parse(&format!("[[producer]]\ntool = \"x\"\nplugin = \"{plugin}\"\n")).unwrap_err();
            let error = format!("{error:#}");
            assert!(error.contains(&format!("unsupported plugin \"{plugin}\"")), "{error}");
            assert!(error.contains("plugin = "), "the error points at the entry: {error}");
            assert!(
                error.contains("native:ticker, native:subagent, builtin:ticker, builtin:bash, builtin:subagent"),
                "{error}"
            );
        }
    }

    #[test]
    fn the_process_host_protects_taskhosts_own_state() {
        let mut config = Config::parse("[process]\nprotected_paths = [\"/srv/extra\"]\n").unwrap();
        config.source = Some(PathBuf::from("/srv/project/taskhost.toml"));
        let runtime = PluginRuntime::new(&config);
        let protected = &runtime.process_config.protected_paths;
        assert_eq!(protected[0], Path::new("/srv/extra"), "configured paths stay first");
        assert!(protected.contains(&PathBuf::from("/srv/project/taskhost.toml")), "{protected:?}");
        assert!(protected.contains(&config.plugins.effective_cache_dir().unwrap()), "{protected:?}");
    }

    #[test]
    fn plugin_files_are_write_protected_for_every_tree() {
        let mut config = Config::parse("[[producer]]\ntool = \"x\"\nplugin = \"plugins/x.wasm\"\n").unwrap();
        config.source = Some(PathBuf::from("/srv/project/taskhost.toml"));
        let runtime = PluginRuntime::new(&config);
        let write_protected = &runtime.process_config.write_protected_paths;
        assert_eq!(write_protected, &[PathBuf::from("/srv/project/plugins/x.wasm")]);
    }

    #[tokio::test]
    async fn a_missing_wasm_file_is_named() {
        let config = Config::parse("[[producer]]\ntool = \"x\"\nplugin = \"plugins/missing.wasm\"\n").unwrap();
        let error = format!("{:#}", host_from_config(&config, Path::new("/nowhere")).await.err().unwrap());
        assert!(error.contains("/nowhere/plugins/missing.wasm"), "{error}");
    }
}
