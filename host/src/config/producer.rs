//! `[[producer]]`: one producer tool instance of the configuration, where
//! its code comes from (`native:`, `builtin:`, a `.wasm` path) and the
//! capabilities it is granted.
//!
//! Invariants: `plugin` is parsed once, at load ([`ProducerSource`]); a
//! plugin gets no capability its entry (or, for a built-in plugin whose
//! entry grants nothing, its default configuration) does not grant.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// `[[producer]]`: one producer tool instance.
///
/// Non-exhaustive (a key added later is one more field): outside this
/// crate, build it with [`ProducerConfig::new`] and set fields on it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ProducerConfig {
    /// The model-facing tool name.
    pub tool: String,
    /// Where the producer comes from: `builtin:<name>` (a plugin embedded in
    /// the binary), `native:<name>` (an in-process Rust producer), or a path
    /// to a `.wasm` component (relative to the configuration file).
    pub plugin: ProducerSource,
    /// The instance's plugin configuration, passed to the producer as JSON.
    #[serde(default = "empty_table")]
    pub config: toml::Table,
    /// Offer `run_in_background` on this tool.
    #[serde(default = "yes")]
    pub background: bool,
    /// How long a foreground call may run before it is cancelled.
    #[serde(default = "default_foreground_timeout_ms")]
    pub foreground_timeout_ms: u64,
    /// A foreground call still running after this long moves to the
    /// background (only with `background` on; 0 disables).
    #[serde(default = "default_promote_after_ms")]
    pub promote_after_ms: u64,
    /// Capabilities granted to this instance's plugin. None by default: a
    /// plugin has no ambient authority.
    #[serde(default)]
    pub grants: Grants,
    /// On a cluster, the node labels (`[cluster.labels]`) a node must have
    /// to serve this tool: a node without them leaves it out (its spread
    /// starts go to a node that has them). Needs `[cluster]`.
    #[serde(default)]
    pub node_labels: std::collections::BTreeMap<String, String>,
}

/// The producers written in Rust that a configuration can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NativeProducer {
    /// `native:ticker` ([`taskhost_core::native::ticker::TickerProducer`]).
    Ticker,
    /// `native:subagent` ([`crate::subagents::SubagentProducer`]).
    Subagent,
}

impl NativeProducer {
    /// Every native producer, in the order error messages list them.
    pub const ALL: [NativeProducer; 2] = [NativeProducer::Ticker, NativeProducer::Subagent];

    pub fn name(self) -> &'static str {
        match self {
            NativeProducer::Ticker => "ticker",
            NativeProducer::Subagent => "subagent",
        }
    }
}

/// Where a `[[producer]]`'s code comes from: parsed once, when the
/// configuration is read, so a typo is an error that lists what is supported
/// and no other code parses `plugin` strings.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum ProducerSource {
    /// `native:<name>`: a producer written in Rust, run in process.
    Native(NativeProducer),
    /// `builtin:<name>`: a plugin embedded in the binary ([`crate::builtin`]).
    Builtin(&'static crate::builtin::BuiltinPlugin),
    /// A path to a `.wasm` component, relative to the configuration file.
    File(PathBuf),
}

impl ProducerSource {
    /// What a `plugin` value may be, for error messages.
    pub fn supported() -> String {
        let natives = NativeProducer::ALL.iter().map(|n| format!("native:{}", n.name()));
        let builtins = crate::builtin::BUILTIN_PLUGINS.iter().map(|p| format!("builtin:{}", p.name));
        let names: Vec<String> = natives.chain(builtins).collect();
        format!("{}, or a path to a .wasm component", names.join(", "))
    }

    /// True when the producer is a WebAssembly plugin (built in or a file).
    pub fn is_wasm(&self) -> bool {
        !matches!(self, ProducerSource::Native(_))
    }
}

impl TryFrom<String> for ProducerSource {
    type Error = String;

    fn try_from(plugin: String) -> Result<Self, String> {
        let unsupported = || format!("unsupported plugin {plugin:?}; supported: {}", Self::supported());
        if let Some(name) = plugin.strip_prefix("native:") {
            NativeProducer::ALL.into_iter().find(|n| n.name() == name).map(Self::Native).ok_or_else(unsupported)
        } else if let Some(name) = plugin.strip_prefix("builtin:") {
            crate::builtin::find(name).map(Self::Builtin).ok_or_else(unsupported)
        } else if plugin.ends_with(".wasm") {
            Ok(Self::File(PathBuf::from(plugin)))
        } else {
            Err(unsupported())
        }
    }
}

impl std::fmt::Display for ProducerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProducerSource::Native(native) => write!(f, "native:{}", native.name()),
            ProducerSource::Builtin(builtin) => write!(f, "builtin:{}", builtin.name),
            ProducerSource::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// `[producer.grants]`: what the host lets one producer instance do, for
/// any plugin, built in or not: the one typed bundle carried from the
/// configuration to the plugin's store. A capability not granted here is not
/// available to the plugin.
///
/// Non-exhaustive (a capability added later is one more field): outside
/// this crate, build it with [`Grants::none`] and the `with_*` methods.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Grants {
    /// `[producer.grants.process]`: start processes (the `process` capability).
    pub process: Option<taskhost_process::ProcessGrant>,
    /// `[producer.grants.subagents]`: start child agent runs (the `subagents` capability).
    pub subagents: Option<crate::subagents::SubagentsGrant>,
    /// `[producer.grants.http]`: outbound HTTP to the origins it lists (`wasi:http`).
    pub http: Option<crate::outbound::grant::HttpGrant>,
}

impl Grants {
    /// No capability granted.
    pub fn none() -> Self {
        Self::default()
    }

    /// These grants and the `process` capability with `grant`.
    pub fn with_process(mut self, grant: taskhost_process::ProcessGrant) -> Self {
        self.process = Some(grant);
        self
    }

    /// These grants and the `subagents` capability with `grant`.
    pub fn with_subagents(mut self, grant: crate::subagents::SubagentsGrant) -> Self {
        self.subagents = Some(grant);
        self
    }

    /// These grants and outbound HTTP with `grant`.
    pub fn with_http(mut self, grant: crate::outbound::grant::HttpGrant) -> Self {
        self.http = Some(grant);
        self
    }

    /// The grants written in TOML (a `[producer.grants]` table's body).
    pub fn from_toml(text: &str) -> anyhow::Result<Self> {
        toml::from_str(text).map_err(|e| anyhow::anyhow!("invalid grants: {e}"))
    }

    /// Whether these grants give `capability` (what a plugin's imports are
    /// checked against when it loads).
    pub fn grants(&self, capability: crate::plugin::preflight::GatedCapability) -> bool {
        match capability {
            crate::plugin::preflight::GatedCapability::Subagents => self.subagents.is_some(),
            crate::plugin::preflight::GatedCapability::Http => self.http.is_some(),
        }
    }
}

fn empty_table() -> toml::Table {
    toml::Table::new()
}

fn yes() -> bool {
    true
}

fn default_foreground_timeout_ms() -> u64 {
    taskhost_core::tools::producer_tool::DEFAULT_FOREGROUND_TIMEOUT_MS
}

fn default_promote_after_ms() -> u64 {
    taskhost_core::tools::producer_tool::DEFAULT_PROMOTE_AFTER_MS
}

impl ProducerConfig {
    /// An entry for `tool` from `plugin`, every other key at its default
    /// (the struct is non-exhaustive: set the rest field by field).
    pub fn new(tool: impl Into<String>, plugin: ProducerSource) -> Self {
        Self {
            tool: tool.into(),
            plugin,
            config: empty_table(),
            background: true,
            foreground_timeout_ms: default_foreground_timeout_ms(),
            promote_after_ms: default_promote_after_ms(),
            grants: Grants::default(),
            node_labels: std::collections::BTreeMap::new(),
        }
    }

    /// Whether a node labelled `labels` serves this entry (see
    /// [`Self::node_labels`]): it has every one of them.
    pub fn served_with_labels(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.node_labels.iter().all(|(name, value)| labels.get(name) == Some(value))
    }

    /// How the host serves this entry's tool.
    pub fn tool_options(&self) -> taskhost_core::tools::producer_tool::ProducerToolOptions {
        taskhost_core::tools::producer_tool::ProducerToolOptions::new(&self.tool)
            .with_background(self.background)
            .with_foreground_timeout(Duration::from_millis(self.foreground_timeout_ms))
            .with_promote_after(
                (self.background && self.promote_after_ms > 0).then(|| Duration::from_millis(self.promote_after_ms)),
            )
    }

    /// The grants this instance runs with: the entry's, or, for a built-in
    /// plugin whose entry grants nothing, the plugin's default grants (its
    /// default configuration, [`crate::builtin::BuiltinPlugin::default_grants`]),
    /// so configurations written before the grant existed keep working.
    pub fn effective_grants(&self) -> anyhow::Result<Grants> {
        match &self.plugin {
            ProducerSource::Builtin(builtin) if self.grants == Grants::default() => {
                builtin.default_grants().map_or_else(|| Ok(Grants::default()), Grants::from_toml)
            }
            _ => Ok(self.grants.clone()),
        }
    }

    /// The instance configuration as JSON, the form producers receive.
    pub fn config_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.config).unwrap_or(serde_json::Value::Object(Default::default()))
    }
}
