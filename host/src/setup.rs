//! Building a [`Host`] from a [`Config`]: the one place that turns
//! `[[producer]]` entries into served tools.
//!
//! Every `plugin` value is parsed once, with the configuration, into a
//! [`ProducerSource`] (`native:<name>`, `builtin:<name>`, or a path to a
//! `.wasm` component); anything else is an error that lists what is
//! supported, so a typo never serves a half-configured host.
//! [`build_producer`] turns each source into a producer, and is where the
//! capabilities a producer needs are wired in (the subagents service, the
//! process host). The plugin engine is created only when a wasm producer is
//! configured, and lives as long as the plugins loaded into it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use serde_json::json;

use crate::Host;
use crate::config::{Config, NativeProducer, ProducerConfig, ProducerSource};
use crate::plugin::resources::ProcessCapability;
use crate::plugin::{PluginEngine, PluginRuntimeConfig, WasmProducer};
use crate::producer::Producer;
use crate::reload::ReloadablePlugin;
use crate::subagents::{SubagentProducer, Subagents};
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
                config.grants.process.is_none(),
                "tool {:?}: the native ticker starts no processes; remove its process grant",
                config.tool
            );
            Ok(Arc::new(crate::native::ticker::TickerProducer::new(&config.config_json())?))
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
/// a `.wasm` path, with the capabilities its grants name (and, for
/// `builtin:subagent`, the `subagents` service when one is given); `Ok(None)`
/// for a native producer (see [`build_producer`]). Also what `taskhost dev`
/// serves, so a plugin under development gets exactly the authority it will
/// get in production.
pub async fn build_wasm_producer(
    config: &ProducerConfig,
    base_dir: &Path,
    runtime: &mut PluginRuntime,
    subagents: Option<&Subagents>,
) -> anyhow::Result<Option<WasmEntry>> {
    let (version, file) = match &config.plugin {
        ProducerSource::Native(_) => return Ok(None),
        ProducerSource::Builtin(builtin) => (runtime.engine()?.load_bytes(builtin.name, builtin.wasm).await?, None),
        ProducerSource::File(path) => {
            let file = base_dir.join(path);
            (runtime.engine()?.load_file(&file).await?, Some(file))
        }
    };
    let is_subagent = matches!(&config.plugin, ProducerSource::Builtin(builtin) if builtin.name == "subagent");
    let instance_config = if is_subagent { subagent_instance_config(config)? } else { config.config_json() };
    let mut producer = WasmProducer::new(version, instance_config).await.with_context(|| tool_context(config))?;
    if let (true, Some(subagents)) = (is_subagent, subagents) {
        producer = producer.with_subagents(subagents.clone());
    }
    if let Some(grant) = &config.grants.process {
        // Programs are resolved now, once: a grant that names a program found
        // through a directory process trees could write refuses to load.
        let grant = grant.clone();
        grant.resolve_programs().with_context(|| {
            if config.tool.is_empty() { format!("plugin {}", config.plugin) } else { format!("tool {:?}", config.tool) }
        })?;
        producer = producer.with_process(ProcessCapability { host: runtime.process_host()?, grant: Arc::new(grant) });
    }
    Ok(Some(WasmEntry { producer: Arc::new(producer), file }))
}

/// The shared runtimes wasm producers need, created on first use so a host
/// serving only native producers starts neither.
pub struct PluginRuntime {
    engine_config: PluginRuntimeConfig,
    process_config: ProcessHostConfig,
    engine: Option<PluginEngine>,
    process_host: Option<Arc<ProcessHost>>,
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
        Self { engine_config: config.plugins.clone(), process_config, engine: None, process_host: None }
    }

    pub fn engine(&mut self) -> anyhow::Result<&PluginEngine> {
        if self.engine.is_none() {
            self.engine = Some(PluginEngine::new(self.engine_config.clone()).context("starting the plugin engine")?);
        }
        Ok(self.engine.as_ref().expect("just created"))
    }

    pub fn process_host(&mut self) -> anyhow::Result<Arc<ProcessHost>> {
        if self.process_host.is_none() {
            self.process_host =
                Some(ProcessHost::new(&self.process_config).context("creating the process spill directory")?);
        }
        Ok(self.process_host.clone().expect("just created"))
    }
}

/// A host serving the configuration's producers (or the defaults).
/// `base_dir` is the configuration file's directory.
pub async fn host_from_config(config: &Config, base_dir: &Path) -> anyhow::Result<Host> {
    Ok(served_from_config(config, base_dir).await?.0)
}

/// A wasm plugin a host serves as a reloadable tool, and its file (`None`
/// for a built-in plugin).
pub struct ServedPlugin {
    pub plugin: Arc<ReloadablePlugin>,
    pub file: Option<PathBuf>,
}

/// As [`host_from_config`], with every wasm plugin served as a
/// [`ReloadablePlugin`] (its versions, live tasks per version and reloads
/// are what `serve --watch` and the web dashboard use).
pub async fn served_from_config(config: &Config, base_dir: &Path) -> anyhow::Result<(Host, Vec<ServedPlugin>)> {
    let host = Host::new(&config.tasks)?;
    let mut runtime = PluginRuntime::new(config);
    let subagents = Subagents::for_host(&host, &config.subagents)?;
    let mut plugins = Vec::new();
    for producer in config.effective_producers() {
        let context = || format!("[[producer]] {:?}", producer.tool);
        if let Some(wasm) =
            build_wasm_producer(&producer, base_dir, &mut runtime, Some(&subagents)).await.with_context(context)?
        {
            let plugin =
                ReloadablePlugin::serve_producer(&host, runtime.engine()?, wasm.producer, producer.tool_options())
                    .with_context(context)?;
            plugins.push(ServedPlugin { plugin, file: wasm.file });
            continue;
        }
        let built = build_producer(&producer, base_dir, &mut runtime, &subagents).await.with_context(context)?;
        host.add_producer(built, producer.tool_options()).map_err(anyhow::Error::new)?;
    }
    // Task output beyond memory spills where no sandboxed command can look:
    // inside the process capability's hidden directory when there is one.
    let output_parent = match runtime.process_host.as_ref() {
        Some(process_host) => process_host.spill_dir().to_path_buf(),
        None => config.process.spill_root.clone().unwrap_or_else(std::env::temp_dir),
    };
    host.registry().set_output_spill_dir(&output_parent).context("creating the task output directory")?;
    Ok((host, plugins))
}

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

    #[tokio::test]
    async fn a_missing_wasm_file_is_named() {
        let config = Config::parse("[[producer]]\ntool = \"x\"\nplugin = \"plugins/missing.wasm\"\n").unwrap();
        let error = format!("{:#}", host_from_config(&config, Path::new("/nowhere")).await.err().unwrap());
        assert!(error.contains("/nowhere/plugins/missing.wasm"), "{error}");
    }
}
