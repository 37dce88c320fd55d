//! Configuration: the `taskhost.toml` file and its defaults.
//!
//! Every field has a default, so an empty file (or none) is a working
//! configuration. Unknown keys are errors that name the key, so a typo never
//! silently falls back to a default. Loading validates everything that can be
//! checked without running anything.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use taskhost_core::settings::TasksSettings;

mod producer;

pub use producer::{Grants, NativeProducer, ProducerConfig, ProducerSource};

/// The whole configuration file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub tasks: TasksSettings,
    /// Producer tool instances. Empty means the built-in defaults
    /// ([`Config::default_producers`]).
    #[serde(default, rename = "producer")]
    pub producers: Vec<ProducerConfig>,
    /// `[serve]`: the MCP server (`taskhost serve`).
    #[serde(default)]
    pub serve: crate::mcp::settings::ServeSettings,
    /// `[plugins]`: the WebAssembly plugin runtime (memory cap, call
    /// deadline, instance pool, compile cache).
    #[serde(default)]
    pub plugins: crate::plugin::PluginRuntimeConfig,
    /// `[process]`: host-wide settings of the process capability.
    #[serde(default)]
    pub process: taskhost_process::ProcessHostConfig,
    /// `[subagents]`: the backends child runs are started on.
    #[serde(default)]
    pub subagents: crate::subagents::SubagentsConfig,
    /// `[state]`: where taskhost keeps its own state ([`crate::state`]).
    #[serde(default)]
    pub state: crate::state::StateSettings,
    /// `[cluster]`: the NATS JetStream cluster whose registry this node
    /// shares ([`crate::cluster`]); none: one machine.
    #[serde(default)]
    pub cluster: Option<crate::cluster::config::ClusterSettings>,
    /// The file this configuration was loaded from (absolute), if any.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// `path` made absolute against the current directory (not resolving
/// symlinks, so it works for paths that do not exist yet).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The file's bytes, refused when over [`MAX_CONFIG_BYTES`] (never read in part).
fn read_bounded(path: &Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes)?;
    anyhow::ensure!(bytes.len() as u64 <= MAX_CONFIG_BYTES, "it is over {MAX_CONFIG_BYTES} bytes");
    Ok(bytes)
}

impl Config {
    /// Parses and validates a configuration text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let config: Config = toml::from_str(text).map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates a configuration file. Relative
    /// `token_file` paths are taken from the file's directory. Trust is not
    /// checked: the commands load through [`Config::load_trusted`].
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        Ok(Self::read(path)?.0)
    }

    /// As [`Config::load`], and the SHA-256 of the bytes parsed.
    fn read(path: &Path) -> anyhow::Result<(Self, String)> {
        let bytes = read_bounded(path).with_context(|| format!("reading configuration {}", path.display()))?;
        let sha256 = crate::state::trust::sha256_hex(&bytes);
        let text = String::from_utf8(bytes)
            .map_err(|_| anyhow::anyhow!("configuration {} is not UTF-8 text", path.display()))?;
        let mut config = Self::parse(&text).with_context(|| format!("in configuration {}", path.display()))?;
        let source = absolute(path);
        let dir = source.parent().map(Path::to_path_buf).unwrap_or_default();
        for token in &mut config.serve.http.tokens {
            if let Some(file) = &mut token.token_file {
                *file = absolute(&dir.join(&*file));
            }
        }
        if let Some(cluster) = &mut config.cluster {
            cluster.resolve_paths(&dir);
        }
        config.source = Some(source);
        Ok((config, sha256))
    }

    /// Loads a configuration file the way every command does: read once,
    /// and used only when it lies outside every directory its process trees
    /// (or any server's in `cwd`) can write, or `trust` vouches for exactly
    /// these bytes ([`crate::state::trust`]), whose records lie outside all
    /// of them. The error of a refusal names the file, why, and the command
    /// to run.
    pub fn load_trusted(path: &Path, cwd: &Path, trust: &crate::state::trust::TrustStore) -> anyhow::Result<Self> {
        let (config, sha256) = Self::read(path)?;
        let policy = crate::state::trust::TrustPolicy::new(trust.clone(), config.writable_roots(cwd));
        // Records a tree could replace vouch for nothing.
        policy.ensure_out_of_reach("the trust records' directory", trust.dir())?;
        policy.admit(path, crate::state::trust::FileKind::Config, &sha256).map_err(|e| anyhow::Error::new(*e))?;
        Ok(config)
    }

    /// Where the process trees of this configuration can write, with why:
    /// `cwd` (the server's working directory: every grant's default
    /// workspace, and where any server started there, with the defaults,
    /// lets its trees write), every grant's `working_dirs` and
    /// `read_write_paths`. A file that lies in one is loaded only when trusted.
    pub fn writable_roots(&self, cwd: &Path) -> Vec<crate::state::trust::WritableRoot> {
        use crate::state::trust::WritableRoot;
        let mut roots = vec![WritableRoot::new(cwd, "the server's working directory")];
        for producer in self.effective_producers() {
            let Some(grant) = &producer.grants.process else { continue };
            for dir in &grant.working_dirs {
                roots.push(WritableRoot::new(&cwd.join(dir), format!("working_dirs of tool {:?}", producer.tool)));
            }
            for path in &grant.read_write_paths {
                roots.push(WritableRoot::new(&cwd.join(path), format!("read_write_paths of tool {:?}", producer.tool)));
            }
        }
        roots.dedup_by(|a, b| a.path == b.path);
        roots
    }

    /// The `.wasm` plugin files the producers name, absolute (relative ones
    /// are taken from the configuration file's directory, as they are
    /// loaded): process trees may read them, never write or replace them
    /// ([`taskhost_process::ProcessHostConfig::write_protected_paths`]).
    pub fn plugin_files(&self) -> Vec<PathBuf> {
        let dir = self.source.as_deref().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
        self.producers
            .iter()
            .filter_map(|p| match &p.plugin {
                ProducerSource::File(path) => Some(absolute(&dir.join(path))),
                _ => None,
            })
            .collect()
    }

    /// taskhost's own state, which no process tree may read: the
    /// configuration file, the HTTP token files, the compile cache
    /// directory, the state directory (the configured one and the default,
    /// which holds the trust records), taskhost's configuration directory
    /// and a configured spill root (the default one is in the state
    /// directory).
    pub fn protected_paths(&self) -> Vec<PathBuf> {
        let mut paths = Vec::new();
        paths.extend(self.source.clone());
        paths.extend(self.serve.http.tokens.iter().filter_map(|t| t.token_file.as_deref()).map(absolute));
        paths.extend(self.plugins.effective_cache_dir().as_deref().map(absolute));
        paths.extend(self.state.effective_dir().ok());
        paths.extend(crate::state::default_dir().ok());
        paths.extend(crate::state::config_dir());
        paths.extend(self.process.spill_root.as_deref().map(absolute));
        paths.extend(self.cluster.iter().flat_map(|cluster| cluster.secret_files()));
        paths.dedup();
        paths
    }

    /// Whether tokens are written inline in the configuration file, and the
    /// file lies in `workspace` (the directory process trees work in) or
    /// below: then every command there could read them, unless confinement
    /// denies the file. `None` when not; else the token names.
    pub fn inline_tokens_in(&self, workspace: &Path) -> Option<Vec<String>> {
        let source = self.source.as_deref()?;
        let names: Vec<String> =
            self.serve.http.tokens.iter().filter(|t| t.token.is_some()).map(|t| t.name.clone()).collect();
        if names.is_empty() {
            return None;
        }
        let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| absolute(p));
        canonical(source).starts_with(canonical(workspace)).then_some(names)
    }

    /// The producers served when the configuration lists none. The one
    /// place that decides what a bare `taskhost serve` offers.
    pub fn default_producers() -> Vec<ProducerConfig> {
        let producer = |tool: &str, plugin: ProducerSource, grants: Grants| {
            let mut entry = ProducerConfig::new(tool, plugin);
            entry.grants = grants;
            entry
        };
        // bash may start only bash, in the server's working directory and
        // below, with credentials scrubbed from its environment, no network,
        // and every tree in its own PID namespace.
        let bash_grant = taskhost_process::ProcessGrant { programs: vec!["bash".to_string()], ..Default::default() };
        vec![
            producer(
                "bash",
                ProducerSource::Builtin(crate::builtin::find("bash").expect("bash is built in")),
                Grants { process: Some(bash_grant), ..Default::default() },
            ),
            producer("ticker", ProducerSource::Native(NativeProducer::Ticker), Grants::default()),
        ]
    }

    /// The configured producers, or the defaults when none are configured.
    pub fn effective_producers(&self) -> Vec<ProducerConfig> {
        if self.producers.is_empty() { Self::default_producers() } else { self.producers.clone() }
    }

    /// The producers this node serves: those whose `node_labels` its
    /// `[cluster.labels]` has (a machine without `[cluster]` has none).
    pub fn producers_served_here(&self) -> Vec<ProducerConfig> {
        let no_labels = std::collections::BTreeMap::new();
        let labels = self.cluster.as_ref().map_or(&no_labels, |cluster| &cluster.labels);
        let mut producers = self.effective_producers();
        producers.retain(|producer| {
            let served = producer.served_with_labels(labels);
            if !served {
                tracing::info!(tool = %producer.tool, required = ?producer.node_labels, ?labels, "a [[producer]] is not served on this node: it lacks the node labels the producer requires");
            }
            served
        });
        producers
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.tasks.validate()?;
        self.serve.validate()?;
        self.subagents.validate()?;
        self.process.validate().map_err(anyhow::Error::msg)?;
        self.state.validate().map_err(anyhow::Error::msg)?;
        if let Some(cluster) = &self.cluster {
            cluster.validate().map_err(anyhow::Error::msg)?;
            // A consuming read answered through another node travels in one
            // NATS message (1 MiB), JSON-escaped (at most 6 bytes a byte).
            let most = crate::cluster::forward::MAX_FORWARDED_READ_BYTES;
            anyhow::ensure!(
                self.tasks.output_read_bytes <= most,
                "[tasks] output_read_bytes must be at most {most} with [cluster] (a read of another node's task travels in one NATS message)"
            );
        }
        let mut seen = std::collections::HashSet::new();
        for producer in &self.producers {
            anyhow::ensure!(
                !producer.tool.trim().is_empty(),
                "[[producer]] with plugin \"{}\" has an empty tool name",
                producer.plugin
            );
            taskhost_core::tools::check_tool_name(&producer.tool)
                .map_err(|error| anyhow::anyhow!("[[producer]] with plugin \"{}\": {error}", producer.plugin))?;
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
            anyhow::ensure!(
                producer.node_labels.len() <= crate::cluster::config::MAX_LABELS,
                "[[producer]] {:?}: node_labels: at most {}",
                producer.tool,
                crate::cluster::config::MAX_LABELS
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(text: &str) -> String {
        format!("{:#}", Config::parse(text).expect_err("must be refused"))
    }

    #[test]
    fn serve_defaults_are_loopback_with_no_tokens() {
        let config = Config::parse("").unwrap();
        assert_eq!(config.serve.http.listen, "127.0.0.1:8765");
        assert_eq!(config.serve.http.path, "/mcp");
        assert!(config.serve.http.tokens.is_empty());
        assert_eq!(config.serve.max_argument_bytes, 1024 * 1024);
        assert_eq!(Config::default().serve, config.serve);
    }

    #[test]
    fn serve_keys_are_checked() {
        assert!(error_of("[serve.http]\nlisten_on = \"x\"\n").contains("unknown field `listen_on`"));
        assert!(error_of("[serve.http]\nlisten = \"localhost\"\n").contains("is not a socket address"));
        assert!(error_of("[serve.http]\npath = \"mcp\"\n").contains("must start with '/'"));
        assert!(error_of("[serve]\nmax_argument_bytes = 0\n").contains("max_argument_bytes must be positive"));
        assert!(error_of("[serve.http]\nallowed_hosts = []\n").contains("allowed_hosts is empty"));
        assert!(error_of("[serve.http]\nmax_connections = 0\n").contains("max_connections must be positive"));
        assert!(error_of("[serve.http]\nallowed_origins = [\"evil.com\"]\n").contains("is not an origin"));
    }

    #[test]
    fn state_retention_keys_are_checked() {
        let config = Config::parse("[state]\nmax_finished_tasks = 50\n").unwrap();
        assert_eq!(config.state.retention().max_finished_tasks, 50);
        assert_eq!(config.state.retention().max_finished_age_secs, 30 * 24 * 3600, "the others keep their defaults");
        assert!(error_of("[state]\nmax_finished_tasks = 0\n").contains("[state] max_finished_tasks = 0"));
        assert!(error_of("[state]\nmax_finished_age_secs = 5\n").contains("[state] max_finished_age_secs = 5"));
        assert!(error_of("[state]\nmax_finished_bytes = 1\n").contains("[state] max_finished_bytes = 1"));
        assert!(error_of("[state]\nmax_finished_tasks = -1\n").contains("max_finished_tasks"));
        assert!(error_of("[state]\nmax_finished = 1\n").contains("unknown field `max_finished`"));
    }

    #[test]
    fn tokens_are_validated_without_echoing_secrets() {
        let short = error_of("[[serve.http.tokens]]\nname = \"a\"\ntoken = \"short\"\n");
        assert!(short.contains("token \"a\" is 5 bytes long; use at least 16"), "{short}");
        assert!(!short.contains("short\""), "the secret must not be echoed: {short}");
        let both = error_of("[[serve.http.tokens]]\nname = \"a\"\ntoken = \"0123456789abcdef\"\ntoken_env = \"X\"\n");
        assert!(both.contains("exactly one of `token_env`, `token_file` or `token`"), "{both}");
        let twice = error_of(
            "[[serve.http.tokens]]\nname = \"a\"\ntoken = \"0123456789abcdef\"\n\
             [[serve.http.tokens]]\nname = \"a\"\ntoken = \"fedcba9876543210\"\n",
        );
        assert!(twice.contains("two tokens are named \"a\""), "{twice}");
        let config =
            Config::parse("[[serve.http.tokens]]\nname = \"a\"\ntoken_env = \"TASKHOST_TEST_UNSET_VARIABLE\"\n")
                .unwrap();
        let unset = format!("{:#}", config.serve.http.tokens[0].resolve().unwrap_err());
        assert!(unset.contains("environment variable TASKHOST_TEST_UNSET_VARIABLE is not set"), "{unset}");
        let debug = format!(
            "{:?}",
            Config::parse("[[serve.http.tokens]]\nname = \"a\"\ntoken = \"0123456789abcdef\"\n").unwrap()
        );
        assert!(!debug.contains("0123456789abcdef") && debug.contains("<redacted>"), "{debug}");
    }

    #[test]
    fn token_files_are_relative_to_the_configuration_and_protected() {
        let dir = std::env::temp_dir().join(format!("taskhost-config-token-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.token"), "  0123456789abcdef0123\n").unwrap();
        let path = dir.join("taskhost.toml");
        std::fs::write(
            &path,
            "[[serve.http.tokens]]\nname = \"a\"\ntoken_file = \"a.token\"\n\
             [[serve.http.tokens]]\nname = \"b\"\ntoken = \"fedcba9876543210\"\n\
             [process]\nspill_root = \"/var/tmp\"\n",
        )
        .unwrap();
        let config = Config::load(&path).unwrap();
        assert_eq!(config.serve.http.tokens[0].resolve().unwrap(), "0123456789abcdef0123", "trimmed");
        let protected = config.protected_paths();
        assert_eq!(protected[..3], [path.clone(), dir.join("a.token"), config.plugins.effective_cache_dir().unwrap()]);
        assert!(protected.contains(&PathBuf::from("/var/tmp")), "{protected:?}");
        assert!(
            protected.contains(&crate::state::default_dir().unwrap()),
            "the trust records' directory: {protected:?}"
        );
        assert_eq!(config.inline_tokens_in(&dir), Some(vec!["b".to_string()]));
        assert_eq!(config.inline_tokens_in(&dir.join("elsewhere")), None, "a file outside the workspace is fine");
        std::fs::write(dir.join("a.token"), "short\n").unwrap();
        let short = format!("{:#}", config.serve.http.tokens[0].resolve().unwrap_err());
        assert!(short.contains("token \"a\" is 5 bytes long"), "{short}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_builtin_plugin_that_grants_nothing_runs_with_its_default_grants() {
        let config = Config::parse(
            "[[producer]]\ntool = \"s\"\nplugin = \"builtin:subagent\"\n\
             [[producer]]\ntool = \"t\"\nplugin = \"builtin:ticker\"\n\
             [[producer]]\ntool = \"n\"\nplugin = \"builtin:subagent\"\ngrants.subagents = { backends = [\"x\"] }\n",
        )
        .unwrap();
        let grants: Vec<Grants> = config.producers.iter().map(|p| p.effective_grants().unwrap()).collect();
        assert_eq!(grants[0].subagents, Some(crate::subagents::SubagentsGrant::default()), "its default configuration");
        assert_eq!(grants[1], Grants::default(), "the ticker is granted nothing");
        assert_eq!(grants[2].subagents.as_ref().unwrap().backends, ["x"], "a written grant wins");
        let unknown = Config::parse("[[producer]]\ntool = \"s\"\nplugin = \"builtin:ticker\"\ngrants.net = {}\n");
        assert!(format!("{:#}", unknown.unwrap_err()).contains("unknown field `net`"));
    }

    #[test]
    fn default_producers_serve_bash_with_a_narrow_grant_and_the_ticker() {
        let config = Config::default();
        assert_eq!(config.effective_producers(), Config::default_producers());
        let defaults = Config::default_producers();
        let plugins: Vec<(&str, String)> = defaults.iter().map(|p| (p.tool.as_str(), p.plugin.to_string())).collect();
        assert_eq!(plugins, [("bash", "builtin:bash".to_string()), ("ticker", "native:ticker".to_string())]);
        let grant = defaults[0].grants.process.as_ref().expect("bash has a process grant");
        assert_eq!(grant.programs, ["bash"]);
        assert!(!grant.network && grant.pid_namespace && grant.working_dirs.is_empty());
        assert!(defaults[1].grants.process.is_none(), "the ticker starts no processes");
    }
}
