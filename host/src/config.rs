//! Configuration: the `taskhost.toml` file and its defaults.
//!
//! Every field has a default, so an empty file (or none) is a working
//! configuration. Unknown keys are errors that name the key, so a typo never
//! silently falls back to a default. Loading validates everything that can be
//! checked without running anything.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

use crate::tasks::RegistryConfig;
use crate::tools::control::ControlToolsConfig;

/// The whole configuration file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub tasks: TasksSettings,
    /// Producer tool instances. Empty means the built-in defaults.
    #[serde(default, rename = "producer")]
    pub producers: Vec<ProducerConfig>,
    /// `[subagents]`: the backends child runs are started on.
    #[serde(default)]
    pub subagents: crate::capabilities::subagents::SubagentsConfig,
}

/// `[tasks]`: the registry and the control tools.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TasksSettings {
    pub max_live_tasks_per_owner: usize,
    /// 0 waits forever for a cancelled task during teardown.
    pub teardown_timeout_ms: u64,
    pub wait_timeout_ms: u64,
    pub max_wait_timeout_ms: u64,
}

impl Default for TasksSettings {
    fn default() -> Self {
        let registry = RegistryConfig::default();
        let control = ControlToolsConfig::default();
        Self {
            max_live_tasks_per_owner: registry.max_live_tasks_per_owner,
            teardown_timeout_ms: registry.teardown_timeout.map_or(0, |t| t.as_millis() as u64),
            wait_timeout_ms: control.wait_timeout_ms,
            max_wait_timeout_ms: control.max_wait_timeout_ms,
        }
    }
}

impl TasksSettings {
    pub fn registry(&self) -> RegistryConfig {
        RegistryConfig {
            max_live_tasks_per_owner: self.max_live_tasks_per_owner,
            teardown_timeout: (self.teardown_timeout_ms > 0).then(|| Duration::from_millis(self.teardown_timeout_ms)),
        }
    }

    pub fn control_tools(&self) -> ControlToolsConfig {
        ControlToolsConfig { wait_timeout_ms: self.wait_timeout_ms, max_wait_timeout_ms: self.max_wait_timeout_ms }
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.control_tools().validate().map_err(|e| anyhow::anyhow!("[tasks] {e}"))?;
        anyhow::ensure!(self.max_live_tasks_per_owner > 0, "[tasks] max_live_tasks_per_owner must be at least 1");
        Ok(())
    }
}

/// `[[producer]]`: one producer tool instance.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProducerConfig {
    /// The model-facing tool name.
    pub tool: String,
    /// Where the producer comes from: `builtin:<name>` (a plugin embedded in
    /// the binary), `native:<name>` (an in-process Rust producer), or a path
    /// to a `.wasm` component (relative to the configuration file).
    pub plugin: String,
    /// The instance's plugin configuration, passed to the producer as JSON.
    #[serde(default = "empty_table")]
    pub config: toml::Table,
    /// Offer `run_in_background` on this tool.
    #[serde(default = "yes")]
    pub background: bool,
    /// How long a foreground call may run before it is cancelled.
    #[serde(default = "default_foreground_timeout_ms")]
    pub foreground_timeout_ms: u64,
}

fn empty_table() -> toml::Table {
    toml::Table::new()
}

fn yes() -> bool {
    true
}

fn default_foreground_timeout_ms() -> u64 {
    600_000
}

impl ProducerConfig {
    /// The instance configuration as JSON, the form producers receive.
    pub fn config_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.config).unwrap_or(serde_json::Value::Object(Default::default()))
    }
}

impl Config {
    /// Parses and validates a configuration text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let config: Config = toml::from_str(text).map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates a configuration file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading configuration {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in configuration {}", path.display()))
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.tasks.validate()?;
        self.subagents.validate()?;
        let mut seen = std::collections::HashSet::new();
        for producer in &self.producers {
            anyhow::ensure!(
                !producer.tool.trim().is_empty(),
                "[[producer]] with plugin {:?} has an empty tool name",
                producer.plugin
            );
            anyhow::ensure!(
                !["task_output", "task_list", "task_kill"].contains(&producer.tool.as_str()),
                "[[producer]] tool name {:?} is reserved for a control tool; pick another",
                producer.tool
            );
            anyhow::ensure!(
                seen.insert(producer.tool.clone()),
                "two [[producer]] entries are named {:?}; tool names must be unique",
                producer.tool
            );
            anyhow::ensure!(
                producer.foreground_timeout_ms > 0,
                "[[producer]] {:?}: foreground_timeout_ms must be positive",
                producer.tool
            );
        }
        Ok(())
    }
}
