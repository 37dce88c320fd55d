//! What `dev`, `check` and `call` serve: a plugin file or a configuration.
//!
//! Model: a [`PluginTarget`] (the command-line arguments the three share) is
//! resolved into a [`Config`] exactly as `taskhost serve` reads one: a
//! `.toml` target is loaded as `serve` loads it (trusted when it lies where
//! trees can write: [`Config::load_trusted`]); a `.wasm` target becomes a
//! configuration of one `[[producer]]` entry built from the flags
//! (`--config`, `--tool`, `--program`). [`open`] then serves every wasm
//! producer of it on an in-process [`Host`] with one agent, with the same
//! resolution, grants and trust as `serve`: the plugin files a
//! configuration names are admitted by hash at load and on every reload; a
//! `.wasm` target, the one plugin its developer named (which gets its own
//! grant, no more), is served and reloaded whatever its hash. Errors name what the author wrote: the plugin file for a
//! `.wasm` target, the `[[producer]]` entry for a configuration.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::config::{Config, Grants, ProducerConfig};
use crate::reload::ReloadablePlugin;
use crate::setup::{PluginRuntime, build_wasm_producer};
use crate::state::StateDir;
use crate::state::trust::{TrustPolicy, TrustStore};
use taskhost_core::Host;
use taskhost_core::agents::Agent;
use taskhost_core::producer::Producer as _;
use taskhost_process::ProcessGrant;

#[derive(Debug, Clone, clap::Args)]
pub struct PluginTarget {
    /// A plugin component (`.wasm`) or a configuration file (`.toml`) whose
    /// `[[producer]]` entries name plugins.
    pub target: PathBuf,
    /// The instance config passed to the plugin, as a JSON object (a `.wasm`
    /// target only).
    #[arg(long, default_value = "{}")]
    pub config: String,
    /// The tool name (a `.wasm` target: the name to serve it as, default the
    /// plugin's kind; a configuration: which of its tools to use).
    #[arg(long)]
    pub tool: Option<String>,
    /// Grant the plugin the `process` capability for this program (a
    /// `.wasm` target only; repeatable): in the current directory and below,
    /// no network, credentials scrubbed. A configuration file states its
    /// grants in `[producer.grants.process]` instead.
    #[arg(long = "program", value_name = "PROGRAM")]
    pub programs: Vec<String>,
}

/// A command-line mistake (as opposed to a plugin that is wrong): the
/// commands that promise exit codes exit 2 for it.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Fails with a [`UsageError`].
macro_rules! usage {
    ($($arg:tt)*) => { return Err(anyhow::Error::new($crate::cli::target::UsageError(format!($($arg)*)))) };
}
pub(crate) use usage;

impl PluginTarget {
    pub fn is_config_file(&self) -> bool {
        self.target.extension().is_some_and(|e| e == "toml")
    }

    /// The configuration the target stands for, and the directory its
    /// relative plugin paths are resolved against.
    pub fn config(&self) -> anyhow::Result<(Config, PathBuf)> {
        if !self.target.exists() {
            usage!("{} does not exist", self.target.display());
        }
        if self.is_config_file() {
            let cwd = std::env::current_dir().context("the working directory")?;
            let trust = TrustStore::new(&StateDir::open_default()?);
            let config = Config::load_trusted(&self.target, &cwd, &trust)?;
            let base = self.target.parent().unwrap_or(Path::new(".")).to_path_buf();
            return Ok((config, base));
        }
        let config: Value = match serde_json::from_str(&self.config) {
            Ok(config) => config,
            Err(err) => usage!("--config is not JSON ({err}): pass the instance config as a JSON object"),
        };
        let Value::Object(config) = config else { usage!("--config must be a JSON object, like '{{\"n\": 1}}'") };
        let table: toml::Table = match serde_json::from_value(Value::Object(config)) {
            Ok(table) => table,
            Err(err) => usage!("--config cannot be a configuration table: {err}"),
        };
        let process = (!self.programs.is_empty())
            .then(|| ProcessGrant { programs: self.programs.clone(), ..ProcessGrant::default() });
        let mut entry = ProducerConfig::new(
            self.tool.clone().unwrap_or_default(),
            crate::config::ProducerSource::File(self.target.clone()),
        );
        entry.config = table;
        entry.grants = Grants { process, ..Default::default() };
        Ok((Config { producers: vec![entry], ..Config::default() }, PathBuf::from(".")))
    }
}

/// One served plugin and where it came from.
pub struct Served {
    pub plugin: Arc<ReloadablePlugin>,
    pub file: Option<PathBuf>,
}

/// A host serving a target's wasm producers, and the one agent using it.
pub struct Session {
    pub host: Host,
    pub agent: Agent,
    pub served: Vec<Served>,
}

/// Where a session records its tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Records {
    /// In memory: nothing outlives the command (`check`, `call`, a `dev`
    /// script, whose transcript names the ids it gets).
    Memory,
    /// The `dev` console's own store, `[state] store` in the state
    /// directory ([`DEV_STORE_FILE`]): its ids go on across runs, and it
    /// never opens `serve`'s store, so it never claims a stopped server's
    /// records or settles its stable owners' handed-over trees.
    DevStore,
}

/// The `dev` console's store file in the state directory.
pub const DEV_STORE_FILE: &str = "dev-tasks.sqlite3";

/// Serves every wasm producer of `target` (see the module docs), its tasks
/// recorded as `records` says.
pub async fn open(target: &PluginTarget, agent_name: &str, records: Records) -> anyhow::Result<Session> {
    let (config, base_dir) = target.config()?;
    let host = match records {
        Records::Memory => Host::new(&config.tasks)?,
        Records::DevStore => {
            let store = StateDir::open_configured(&config.state)?.task_store_in(&config.state, DEV_STORE_FILE)?;
            Host::with_store(&config.tasks, store)?
        }
    };
    let agent = host.create_agent("dev", agent_name).context("cannot create the console's agent")?;
    // The same resolution, grants and trust as `taskhost serve`; a `.wasm`
    // target is the one plugin its developer named: trusted as it changes.
    let cwd = std::env::current_dir().context("the working directory")?;
    let mut policy = TrustPolicy::new(TrustStore::new(&StateDir::open_default()?), config.writable_roots(&cwd));
    super::serve::ensure_state_out_of_reach(&config, &policy)?;
    if !target.is_config_file() {
        policy = policy.with_named(&target.target);
    }
    let mut runtime = PluginRuntime::new(&config).with_trust(Some(Arc::new(policy)));
    let mut served = Vec::new();
    for entry in &config.producers {
        let built = build_wasm_producer(entry, &base_dir, &mut runtime, None).await;
        let built = if target.is_config_file() {
            built.with_context(|| format!("[[producer]] {:?}", entry.tool))?
        } else {
            built?
        };
        let Some(wasm) = built else {
            tracing::warn!(tool = %entry.tool, plugin = %entry.plugin, "only wasm plugins are served here; skipping");
            continue;
        };
        // The tool name defaults to the plugin's kind.
        let mut options = entry.tool_options();
        if options.name.is_empty() {
            options.name = wasm.producer.descriptor().kind.clone();
        }
        let name = options.name.clone();
        let engine = runtime.engine().await?;
        let plugin = ReloadablePlugin::serve_producer(&host, &engine, wasm.producer, options).with_context(|| {
            format!("cannot serve {} as the tool {name:?} (choose another with --tool)", entry.plugin)
        })?;
        runtime.guard(&plugin);
        served.push(Served { plugin, file: wasm.file });
    }
    if served.is_empty() {
        bail!("{} serves no wasm plugin", target.target.display());
    }
    Ok(Session { host, agent, served })
}
