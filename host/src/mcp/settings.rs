//! `[serve]` of the configuration file: the MCP server's settings, its HTTP
//! transport's and the bearer tokens (with how a token's secret is read).
//!
//! Invariants: every field has a default (an empty `[serve]` serves stdio and
//! loopback HTTP); unknown keys are errors; a secret is never printed
//! (`TokenConfig`'s `Debug` redacts it) and is at least [`MIN_TOKEN_LEN`]
//! bytes; a token file is read up to [`MAX_TOKEN_FILE_BYTES`].

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

/// `[serve]`: settings of the MCP server.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ServeSettings {
    /// Tool-call arguments larger than this (serialized JSON bytes) are
    /// refused with an error result before any tool sees them. A model never
    /// needs megabytes of arguments; a runaway client must not make the
    /// server parse, validate and echo them.
    pub max_argument_bytes: usize,
    /// How often a long tool call reports progress to a client that sent a
    /// progress token.
    pub progress_interval_ms: u64,
    /// `[serve.http]`: the streamable HTTP transport.
    pub http: HttpSettings,
    /// The stable owner of the stdio connection (`serve --owner NAME`):
    /// its tasks' records outlive the server, and the next server with the
    /// same owner hands them back (lost ones told once). Unset: the
    /// connection owns its tasks, and they end with it.
    pub owner: Option<String>,
}

impl Default for ServeSettings {
    fn default() -> Self {
        Self { max_argument_bytes: 1024 * 1024, progress_interval_ms: 1000, http: HttpSettings::default(), owner: None }
    }
}

/// The longest stable owner name.
pub const MAX_OWNER_NAME: usize = 64;

/// Checks a stable owner name (`serve --owner`, `[serve] owner`): 1 to
/// [`MAX_OWNER_NAME`] bytes of ASCII letters, digits, `.`, `_` and `-`.
pub fn check_owner_name(name: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !name.is_empty()
            && name.len() <= MAX_OWNER_NAME
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')),
        "owner name {name:?} must be 1 to {MAX_OWNER_NAME} ASCII letters, digits, '.', '_' or '-'"
    );
    Ok(())
}

/// `[serve.http]`: the streamable HTTP transport (`taskhost serve --http`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// The socket address to listen on. Loopback by default; `--http ADDR`
    /// overrides it.
    pub listen: String,
    /// The URL path of the MCP endpoint.
    pub path: String,
    /// Accepted `Host` headers (names or `name:port`), against DNS
    /// rebinding. `["*"]` accepts any host (only behind a trusted proxy).
    pub allowed_hosts: Vec<String>,
    /// The clients allowed in. Each token's `name` is one owner: one
    /// long-lived agent session whose tasks only that token sees.
    pub tokens: Vec<TokenConfig>,
    /// Accepted `Origin` headers (`scheme://host[:port]`, compared without
    /// case), against web pages calling a local server. A request without
    /// `Origin` (every non-browser client) is always accepted; by default no
    /// origin is, `null` included.
    pub allowed_origins: Vec<String>,
    /// Open connections served at once. When all are taken, a new
    /// connection closes the oldest one that has not shown a valid token
    /// yet; when all are held by token holders, it gets a `503` with a
    /// JSON-RPC error body and is closed. Keep it under the process's
    /// descriptor limit.
    pub max_connections: usize,
    /// A connection must send a request's headers within this time of
    /// opening or of its previous answer (so an idle keep-alive connection
    /// closes after it), and a request's body within this time of its
    /// headers.
    pub header_timeout_ms: u64,
    /// Connections one token may hold at once; its request on one more gets
    /// `429` and the connection is closed.
    pub max_connections_per_token: usize,
    /// Requests one token may have in flight at once (over all its
    /// connections); one more gets `429` with `Retry-After`.
    pub max_requests_per_token: usize,
    /// Dashboard event streams one token may hold open at once (the
    /// dashboard's 64 over every token stay).
    pub max_event_streams_per_token: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8765".to_string(),
            path: "/mcp".to_string(),
            allowed_hosts: vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()],
            tokens: Vec::new(),
            allowed_origins: Vec::new(),
            max_connections: 256,
            header_timeout_ms: 30_000,
            max_connections_per_token: 64,
            max_requests_per_token: 32,
            max_event_streams_per_token: 8,
        }
    }
}

/// One bearer token: `{ name = "alice", token_env = "ALICE_TOKEN" }` (read
/// at start), `{ name = "alice", token_file = "/etc/taskhost/alice.token" }`
/// (read at start; relative to the configuration file; surrounding
/// whitespace trimmed), or `{ name = "alice", token = "..." }` (inline: the
/// secret is in the configuration file, so keep that file out of the served
/// workspace). Token files and the configuration file are protected paths: no
/// process tree can read them.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    pub name: String,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub token_env: Option<String>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The web dashboard shows this token every owner's tasks (grouped by
    /// owner) and lets it kill them. Its MCP calls still run as its own
    /// owner only.
    #[serde(default)]
    pub admin: bool,
}

impl std::fmt::Debug for TokenConfig {
    // Never print a secret into a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConfig")
            .field("name", &self.name)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_env", &self.token_env)
            .field("token_file", &self.token_file)
            .field("admin", &self.admin)
            .finish()
    }
}

/// Tokens shorter than this are refused: a bearer token is the whole
/// authentication.
pub const MIN_TOKEN_LEN: usize = 16;

/// Token files larger than this are refused (a token is a line, not a file).
pub const MAX_TOKEN_FILE_BYTES: u64 = 4096;

impl TokenConfig {
    /// How many of `token`, `token_env`, `token_file` are given.
    fn sources(&self) -> usize {
        usize::from(self.token.is_some())
            + usize::from(self.token_env.is_some())
            + usize::from(self.token_file.is_some())
    }

    /// The secret, from the file, the named environment variable or the
    /// token file.
    pub fn resolve(&self) -> anyhow::Result<String> {
        anyhow::ensure!(
            self.sources() == 1,
            "[serve.http] token {:?}: give exactly one of `token_env`, `token_file` or `token`",
            self.name
        );
        let secret = if let Some(token) = &self.token {
            token.clone()
        } else if let Some(var) = &self.token_env {
            std::env::var(var).map_err(|_| {
                anyhow::anyhow!(
                    "[serve.http] token {:?}: environment variable {var} is not set (or not UTF-8)",
                    self.name
                )
            })?
        } else {
            let file = self.token_file.as_deref().expect("one source is given");
            read_token_file(&self.name, file)?
        };
        anyhow::ensure!(
            secret.len() >= MIN_TOKEN_LEN,
            "[serve.http] token {:?} is {} bytes long; use at least {MIN_TOKEN_LEN} random bytes \
             (e.g. `openssl rand -hex 32`)",
            self.name,
            secret.len()
        );
        Ok(secret)
    }
}

fn read_token_file(name: &str, file: &Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::PermissionsExt as _;
    let context = || format!("[serve.http] token {name:?}: token_file {}", file.display());
    let handle = std::fs::File::open(file).with_context(context)?;
    let meta = handle.metadata().with_context(context)?;
    anyhow::ensure!(meta.is_file(), "{}: not a regular file", context());
    anyhow::ensure!(meta.len() <= MAX_TOKEN_FILE_BYTES, "{}: larger than {MAX_TOKEN_FILE_BYTES} bytes", context());
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!(
            token = %name,
            file = %file.display(),
            "the token file is readable by others (mode {mode:04o}); `chmod 600` it"
        );
    }
    let mut text = String::new();
    handle.take(MAX_TOKEN_FILE_BYTES).read_to_string(&mut text).with_context(|| format!("{}: not UTF-8", context()))?;
    let secret = text.trim();
    anyhow::ensure!(!secret.is_empty(), "{}: the file is empty", context());
    Ok(secret.to_string())
}

impl ServeSettings {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.max_argument_bytes > 0, "[serve] max_argument_bytes must be positive");
        anyhow::ensure!(self.progress_interval_ms > 0, "[serve] progress_interval_ms must be positive");
        if let Some(owner) = &self.owner {
            check_owner_name(owner).context("[serve] owner")?;
        }
        let http = &self.http;
        http.listen.parse::<std::net::SocketAddr>().map_err(|e| {
            anyhow::anyhow!("[serve.http] listen = {:?} is not a socket address like 127.0.0.1:8765: {e}", http.listen)
        })?;
        anyhow::ensure!(
            http.path.starts_with('/') && http.path.len() > 1,
            "[serve.http] path = {:?} must start with '/' and name a path, like \"/mcp\"",
            http.path
        );
        anyhow::ensure!(
            !http.allowed_hosts.is_empty(),
            "[serve.http] allowed_hosts is empty; list the Host names clients use, or [\"*\"] to accept any"
        );
        anyhow::ensure!(http.max_connections > 0, "[serve.http] max_connections must be positive");
        anyhow::ensure!(http.header_timeout_ms > 0, "[serve.http] header_timeout_ms must be positive");
        for (name, value) in [
            ("max_connections_per_token", http.max_connections_per_token),
            ("max_requests_per_token", http.max_requests_per_token),
            ("max_event_streams_per_token", http.max_event_streams_per_token),
        ] {
            anyhow::ensure!(value > 0, "[serve.http] {name} must be positive");
        }
        for origin in &http.allowed_origins {
            anyhow::ensure!(
                origin.contains("://") && !origin.ends_with('/'),
                "[serve.http] allowed_origins entry {origin:?} is not an origin like \"https://app.example.com\" \
                 (scheme://host[:port], no path)"
            );
        }
        let mut names = std::collections::HashSet::new();
        for token in &http.tokens {
            anyhow::ensure!(!token.name.trim().is_empty(), "[serve.http] a token has an empty name");
            anyhow::ensure!(
                names.insert(token.name.as_str()),
                "[serve.http] two tokens are named {:?}; each name is one owner and must be unique",
                token.name
            );
            anyhow::ensure!(
                token.sources() == 1,
                "[serve.http] token {:?}: give exactly one of `token_env`, `token_file` or `token`",
                token.name
            );
            // Secrets in the file are checked now; env secrets when serving.
            if token.token.is_some() {
                token.resolve()?;
            }
        }
        Ok(())
    }
}
