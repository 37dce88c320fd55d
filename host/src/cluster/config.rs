//! `[cluster]` in `taskhost.toml`: the NATS servers a node joins, the
//! cluster's and the node's names, how it authenticates, and its timeouts.
//!
//! Invariants: every key is checked at load, and an error names the key
//! (`[cluster] name = "a b"`: ...); secrets are never written inline (a
//! credentials file or a password file, both protected from process
//! trees); a server that accepts anonymous clients is refused unless
//! `insecure = true` ([`super::connect`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The default `node_timeout_ms`: how long a node may be silent before the
/// others count it gone.
pub const DEFAULT_NODE_TIMEOUT_MS: u64 = 15_000;
/// The bounds of `node_timeout_ms`.
pub const NODE_TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 1_000..=3_600_000;
/// The most `nats` URLs and `labels` taken.
pub const MAX_URLS: usize = 64;
pub const MAX_LABELS: usize = 64;
/// The longest cluster or node name (a key-value bucket name and key part).
pub const MAX_NAME_LEN: usize = 64;
/// The default `output_stream_bytes`: what the cluster's output stream
/// holds before it drops its oldest output.
pub const DEFAULT_OUTPUT_STREAM_BYTES: u64 = 1 << 30;
/// The bounds of a nonzero `output_stream_bytes` (0 turns the stream off).
pub const OUTPUT_STREAM_BYTES_RANGE: std::ops::RangeInclusive<u64> = (1 << 20)..=(1 << 40);

/// `[cluster]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ClusterSettings {
    /// The NATS servers (`nats://host:port`, `tls://host:port`); any one
    /// reached is enough, the client learns the rest of the cluster.
    #[serde(default)]
    pub nats: Vec<String>,
    /// The cluster's name: nodes of one name share one registry (the
    /// key-value bucket `taskhost-<name>`).
    #[serde(default = "default_cluster_name")]
    pub name: String,
    /// This node's name, unique in the cluster [default: the host name].
    pub node: Option<String>,
    /// This node's labels (`[cluster.labels] gpu = "a100"`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A NATS credentials file (a user JWT and its NKey seed).
    pub credentials: Option<PathBuf>,
    /// A NATS user, with its password in `password_file`.
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
    /// TLS, as the NATS client takes it.
    #[serde(default)]
    pub tls: ClusterTls,
    /// Join a server that accepts anonymous clients (with a warning).
    #[serde(default)]
    pub insecure: bool,
    /// A node silent this long is counted gone.
    #[serde(default = "default_node_timeout_ms")]
    pub node_timeout_ms: u64,
    /// Which node runs a start.
    #[serde(default)]
    pub placement: Placement,
    /// The most the cluster's output stream holds (JetStream file store on
    /// each of its replicas), the oldest output dropped first; 0: stable
    /// owners' output is not copied, and a gone node's tasks are taken in
    /// without it.
    #[serde(default = "default_output_stream_bytes")]
    pub output_stream_bytes: u64,
}

/// `[cluster.tls]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ClusterTls {
    /// Refuse a server connection without TLS.
    #[serde(default)]
    pub required: bool,
    /// Start TLS before the server's INFO (servers configured `handshake_first`).
    #[serde(default)]
    pub first: bool,
    /// PEM root certificates to trust (besides the system's).
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate and its key (mutual TLS).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// `[cluster] placement`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Placement {
    /// The node that took the call runs it.
    #[default]
    Local,
    /// A stable owner's background start runs on the live node with the
    /// fewest live tasks that serves the tool (ties taken in turn).
    Spread,
}

fn default_cluster_name() -> String {
    "default".to_string()
}

fn default_node_timeout_ms() -> u64 {
    DEFAULT_NODE_TIMEOUT_MS
}

fn default_output_stream_bytes() -> u64 {
    DEFAULT_OUTPUT_STREAM_BYTES
}

/// A name usable as a bucket name and a key part: ASCII letters, digits,
/// `-` and `_`, at most [`MAX_NAME_LEN`].
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl ClusterSettings {
    /// Settings joining `urls` (`serve --cluster`), every other key at its
    /// default.
    pub fn joining(urls: &str) -> Self {
        Self {
            nats: split_urls(urls),
            name: default_cluster_name(),
            node: None,
            labels: BTreeMap::new(),
            credentials: None,
            user: None,
            password_file: None,
            tls: ClusterTls::default(),
            insecure: false,
            node_timeout_ms: DEFAULT_NODE_TIMEOUT_MS,
            placement: Placement::Local,
            output_stream_bytes: DEFAULT_OUTPUT_STREAM_BYTES,
        }
    }

    /// The node's name: `node`, else the host name (its characters outside
    /// [`is_plain_name`] replaced by `-`).
    pub fn node_name(&self) -> String {
        if let Some(node) = &self.node {
            return node.clone();
        }
        let host = host_name();
        let plain: String =
            host.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect();
        let plain: String = plain.chars().take(MAX_NAME_LEN).collect();
        if plain.is_empty() { "node".to_string() } else { plain }
    }

    /// The key-value bucket of this cluster's task records.
    pub fn bucket(&self) -> String {
        format!("taskhost-{}", self.name)
    }

    /// Relative file paths taken from `dir` (the configuration's directory).
    pub fn resolve_paths(&mut self, dir: &Path) {
        let files = [
            &mut self.credentials,
            &mut self.password_file,
            &mut self.tls.ca_file,
            &mut self.tls.cert_file,
            &mut self.tls.key_file,
        ];
        for file in files.into_iter().flatten() {
            *file = std::path::absolute(dir.join(&*file)).unwrap_or_else(|_| dir.join(&*file));
        }
    }

    /// The secret files a process tree must never read: the credentials,
    /// the password and the TLS client key.
    pub fn secret_files(&self) -> Vec<PathBuf> {
        [&self.credentials, &self.password_file, &self.tls.key_file].into_iter().flatten().cloned().collect()
    }

    /// Checks that there is a server to join (`nats`, or `serve --cluster`).
    pub fn check_servers(&self) -> Result<(), String> {
        if self.nats.is_empty() {
            return Err("[cluster] nats: name at least one NATS server (nats = [\"nats://host:4222\"] or \
                        `taskhost serve --cluster URL`), or leave out [cluster] to run on one machine"
                .into());
        }
        Ok(())
    }

    /// Checks every key; the error names it. An empty `nats` passes (the
    /// servers may come from `serve --cluster`; [`Self::check_servers`]).
    pub fn validate(&self) -> Result<(), String> {
        if self.nats.len() > MAX_URLS {
            return Err(format!("[cluster] nats: at most {MAX_URLS} servers"));
        }
        for url in &self.nats {
            url.parse::<async_nats::ServerAddr>()
                .map_err(|error| format!("[cluster] nats = {url:?}: not a NATS server address ({error})"))?;
        }
        if !is_plain_name(&self.name) {
            return Err(format!(
                "[cluster] name = {:?}: use 1 to {MAX_NAME_LEN} ASCII letters, digits, '-' or '_'",
                self.name
            ));
        }
        if let Some(node) = &self.node
            && !is_plain_name(node)
        {
            return Err(format!(
                "[cluster] node = {node:?}: use 1 to {MAX_NAME_LEN} ASCII letters, digits, '-' or '_'"
            ));
        }
        if self.labels.len() > MAX_LABELS {
            return Err(format!("[cluster] labels: at most {MAX_LABELS}"));
        }
        for (key, value) in &self.labels {
            if !is_plain_name(key) || value.len() > 256 || value.chars().any(char::is_control) {
                return Err(format!(
                    "[cluster.labels] {key:?} = {value:?}: a label's name is 1 to {MAX_NAME_LEN} ASCII letters, \
                     digits, '-' or '_', its value at most 256 characters with no control character"
                ));
            }
        }
        if self.credentials.is_some() && (self.user.is_some() || self.password_file.is_some()) {
            return Err("[cluster] credentials and user/password_file: give one way to authenticate".into());
        }
        if self.user.is_some() != self.password_file.is_some() {
            return Err("[cluster] user and password_file go together (the password is read from the file)".into());
        }
        if let Some(user) = &self.user
            && (user.is_empty() || user.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(format!("[cluster] user = {user:?}: a NATS user name has no space or control character"));
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return Err("[cluster.tls] cert_file and key_file go together".into());
        }
        if !NODE_TIMEOUT_MS_RANGE.contains(&self.node_timeout_ms) {
            return Err(format!(
                "[cluster] node_timeout_ms = {}: use {} to {}",
                self.node_timeout_ms,
                NODE_TIMEOUT_MS_RANGE.start(),
                NODE_TIMEOUT_MS_RANGE.end()
            ));
        }
        if self.output_stream_bytes != 0 && !OUTPUT_STREAM_BYTES_RANGE.contains(&self.output_stream_bytes) {
            return Err(format!(
                "[cluster] output_stream_bytes = {}: use 0 (no output stream) or {} to {}",
                self.output_stream_bytes,
                OUTPUT_STREAM_BYTES_RANGE.start(),
                OUTPUT_STREAM_BYTES_RANGE.end()
            ));
        }
        Ok(())
    }
}

/// `--cluster` URLs, comma-separated.
pub fn split_urls(urls: &str) -> Vec<String> {
    urls.split(',').map(str::trim).filter(|url| !url.is_empty()).map(str::to_string).collect()
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "node".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(text: &str) -> String {
        let settings: ClusterSettings =
            toml::from_str(text).map_err(|e| e.to_string()).unwrap_or_else(|e| panic!("{e}"));
        settings.validate().expect_err("must be refused")
    }

    #[test]
    fn keys_are_checked_and_named() {
        let ok: ClusterSettings = toml::from_str("nats = [\"nats://127.0.0.1:4222\"]\n").unwrap();
        ok.validate().unwrap();
        assert_eq!(ok.name, "default");
        assert_eq!(ok.node_timeout_ms, DEFAULT_NODE_TIMEOUT_MS);
        let no_servers: ClusterSettings = toml::from_str("nats = []\n").unwrap();
        no_servers.validate().unwrap();
        assert!(no_servers.check_servers().unwrap_err().contains("[cluster] nats"));
        assert!(error_of("nats = [\"nats://a:1\"]\nname = \"a b\"\n").contains("[cluster] name = \"a b\""));
        assert!(error_of("nats = [\"nats://a:1\"]\nnode = \"x.y\"\n").contains("[cluster] node = \"x.y\""));
        assert!(error_of("nats = [\"nats://a:1\"]\nuser = \"u\"\n").contains("password_file"));
        assert!(
            error_of("nats = [\"nats://a:1\"]\ncredentials = \"c\"\nuser = \"u\"\npassword_file = \"p\"\n")
                .contains("one way")
        );
        assert!(error_of("nats = [\"nats://a:1\"]\nnode_timeout_ms = 5\n").contains("[cluster] node_timeout_ms = 5"));
        assert!(
            error_of("nats = [\"nats://a:1\"]\noutput_stream_bytes = 1000\n")
                .contains("[cluster] output_stream_bytes = 1000: use 0")
        );
        assert_eq!(ok.output_stream_bytes, DEFAULT_OUTPUT_STREAM_BYTES);
        let off: ClusterSettings = toml::from_str("nats = [\"nats://a:1\"]\noutput_stream_bytes = 0\n").unwrap();
        assert!(off.validate().is_ok());
        let placement = toml::from_str::<ClusterSettings>("nats = [\"nats://a:1\"]\nplacement = \"everywhere\"\n")
            .unwrap_err()
            .to_string();
        assert!(placement.contains("unknown variant `everywhere`"), "{placement}");
        let spread: ClusterSettings = toml::from_str("nats = [\"nats://a:1\"]\nplacement = \"spread\"\n").unwrap();
        assert!(spread.validate().is_ok());
        assert!(error_of("nats = [\"nats://a:1\"]\n[tls]\ncert_file = \"c\"\n").contains("key_file"));
        let unknown = toml::from_str::<ClusterSettings>("nats = []\nnodes = 1\n").unwrap_err().to_string();
        assert!(unknown.contains("unknown field `nodes`"), "{unknown}");
    }

    #[test]
    fn the_node_name_defaults_to_a_plain_host_name() {
        let settings = ClusterSettings::joining("nats://127.0.0.1:4222, nats://127.0.0.1:4223");
        assert_eq!(settings.nats.len(), 2);
        assert!(is_plain_name(&settings.node_name()), "{}", settings.node_name());
    }
}
