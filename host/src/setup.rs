//! Building a [`Host`] from a [`Config`]: the one place that turns
//! `[[producer]]` entries into served tools.
//!
//! Every `plugin` value a configuration may name is resolved in
//! [`build_producer`]: `native:ticker` (in process), `builtin:<name>` (a
//! WebAssembly plugin embedded in the binary) or a path to a `.wasm`
//! component (relative to the configuration file). Anything else is an error
//! that lists what is supported, so a typo never serves a half-configured
//! host. The plugin engine is created only when a wasm producer is
//! configured, and lives as long as the plugins loaded into it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use crate::Host;
use crate::capabilities::process::{ProcessHost, ProcessHostConfig, wasm::ProcessCapability};
use crate::capabilities::subagents::{Subagents, is_subagent_plugin, subagent_producer};
use crate::config::{Config, ProducerConfig};
use crate::plugin::{PluginEngine, PluginRuntimeConfig, WasmProducer};
use crate::producer::Producer;
use crate::reload::ReloadablePlugin;

/// The native producers this build can serve.
pub const NATIVE_PRODUCERS: &[&str] = &["native:ticker", "native:subagent"];

fn supported() -> String {
    let builtins: Vec<String> = crate::builtin::BUILTIN_PLUGINS.iter().map(|p| format!("builtin:{}", p.name)).collect();
    format!("{}, {}, or a path to a .wasm component", NATIVE_PRODUCERS.join(", "), builtins.join(", "))
}

/// Builds the producer a `[[producer]]` entry names. `base_dir` resolves
/// relative `.wasm` paths; `engine` is created on the first wasm producer.
pub async fn build_producer(
    config: &ProducerConfig,
    base_dir: &Path,
    runtime: &mut PluginRuntime,
    subagents: &Subagents,
) -> anyhow::Result<Arc<dyn Producer>> {
    let plugin = config.plugin.as_str();
    if is_subagent_plugin(plugin) {
        let engine = if plugin == "builtin:subagent" { Some(runtime.engine()?) } else { None };
        let producer = subagent_producer(config, subagents, engine).await?;
        return producer.ok_or_else(|| anyhow::anyhow!("{plugin:?} is not a subagent plugin"));
    }
    if plugin == "native:ticker" {
        anyhow::ensure!(
            config.grants.process.is_none(),
            "tool {:?}: the native ticker starts no processes; remove its process grant",
            config.tool
        );
        return Ok(Arc::new(crate::native::ticker::TickerProducer::new(&config.config_json())?));
    }
    match build_wasm_producer(config, base_dir, runtime).await? {
        Some(wasm) => Ok(wasm.producer),
        None => anyhow::bail!("unsupported plugin {plugin:?} for tool {:?}; supported: {}", config.tool, supported()),
    }
}

/// A wasm plugin served from a `[[producer]]` entry, with its grants.
pub struct WasmEntry {
    pub producer: Arc<WasmProducer>,
    /// The component file it was loaded from; `None` for a built-in plugin.
    pub file: Option<PathBuf>,
}

/// Builds the wasm producer of an entry whose plugin is `builtin:<name>` or
/// a `.wasm` path, with the capabilities its grants name; `Ok(None)` for
/// native and subagent plugins (see [`build_producer`]). Also what
/// `taskhost dev` serves, so a plugin under development gets exactly the
/// authority it will get in production.
pub async fn build_wasm_producer(
    config: &ProducerConfig,
    base_dir: &Path,
    runtime: &mut PluginRuntime,
) -> anyhow::Result<Option<WasmEntry>> {
    let plugin = config.plugin.as_str();
    let (version, file) = if is_subagent_plugin(plugin) || plugin.starts_with("native:") {
        return Ok(None);
    } else if let Some(name) = plugin.strip_prefix("builtin:") {
        let Some(builtin) = crate::builtin::find(name) else {
            anyhow::bail!("unknown built-in plugin {plugin:?} for tool {:?}; supported: {}", config.tool, supported());
        };
        (runtime.engine()?.load_bytes(builtin.name, builtin.wasm).await?, None)
    } else if plugin.ends_with(".wasm") {
        let file = base_dir.join(plugin);
        (runtime.engine()?.load_file(&file).await?, Some(file))
    } else {
        return Ok(None);
    };
    let mut producer = WasmProducer::new(version, config.config_json()).await?;
    if let Some(grant) = &config.grants.process {
        // Programs are resolved now, once: a grant that names a program found
        // through a directory process trees could write refuses to load.
        let grant = grant.clone();
        grant.resolve_programs().with_context(|| format!("tool {:?}", config.tool))?;
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
    let subagents = Subagents::new(&host, &config.subagents)?;
    let mut plugins = Vec::new();
    for producer in config.effective_producers() {
        let context = || format!("[[producer]] {:?}", producer.tool);
        if let Some(wasm) = build_wasm_producer(&producer, base_dir, &mut runtime).await.with_context(context)? {
            let plugin =
                ReloadablePlugin::serve_producer(&host, runtime.engine()?, wasm.producer, producer.tool_options())
                    .with_context(context)?;
            plugins.push(ServedPlugin { plugin, file: wasm.file });
            continue;
        }
        let built = build_producer(&producer, base_dir, &mut runtime, &subagents).await.with_context(context)?;
        host.add_producer(built, producer.tool_options()).map_err(anyhow::Error::new)?;
    }
    Ok((host, plugins))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn defaults_serve_bash_the_ticker_and_the_control_tools() {
        let host = host_from_config(&Config::default(), Path::new(".")).await.unwrap();
        let names: Vec<String> = host.tool_definitions().into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["bash", "task_kill", "task_list", "task_output", "ticker"]);
    }

    #[tokio::test]
    async fn an_unknown_plugin_names_what_is_supported() {
        for plugin in ["native:nope", "builtin:nope", "nope"] {
            let config = Config::parse(&format!("[[producer]]\ntool = \"x\"\nplugin = \"{plugin}\"\n")).unwrap();
            let error = format!("{:#}", host_from_config(&config, Path::new(".")).await.err().unwrap());
            assert!(error.contains(&format!("plugin \"{plugin}\" for tool \"x\"")), "{error}");
            assert!(error.contains("native:ticker, native:subagent, builtin:ticker"), "{error}");
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
