//! The HTTP surface's clients: each configured bearer token, its secret and
//! the owner agent its calls run as. Shared by the MCP endpoint
//! ([`super::http`]) and the dashboard ([`super::dashboard`]).
//!
//! Invariants: a secret is compared in constant time against every entry
//! (no early exit that would time which one matched); two tokens never share
//! a secret; each token's owner is created once, at start-up, and disposed
//! with the table. Each token has its own share of the listener: connection,
//! request and dashboard stream slots ([`super::admission`]).

use std::sync::Arc;

use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use super::McpServer;
use taskhost_core::agents::Agent;

/// The configured clients: secret and owner per token name.
pub struct TokenTable {
    entries: Vec<TokenEntry>,
}

pub(crate) struct TokenEntry {
    pub(crate) name: String,
    secret: Vec<u8>,
    pub(crate) owner: Agent,
    /// `admin = true`: the dashboard shows it every owner's tasks.
    pub(crate) admin: bool,
    /// Its connection slots (`max_connections_per_token`).
    pub(crate) connections: Arc<Semaphore>,
    pub(crate) max_connections: usize,
    /// Its requests in flight (`max_requests_per_token`).
    pub(crate) requests: Arc<Semaphore>,
    pub(crate) max_requests: usize,
    /// Its dashboard event streams (`max_event_streams_per_token`).
    pub(crate) streams: Arc<Semaphore>,
    pub(crate) max_streams: usize,
}

impl TokenTable {
    /// Resolves every configured token and creates its owner agent.
    pub fn from_config(server: &McpServer) -> anyhow::Result<Self> {
        let tokens = &server.settings().http.tokens;
        anyhow::ensure!(
            !tokens.is_empty(),
            "serving over HTTP needs at least one client token: add to taskhost.toml\n\
             [[serve.http.tokens]]\nname = \"me\"\ntoken_env = \"TASKHOST_TOKEN\"   # or token = \"<32+ random characters>\""
        );
        let mut entries = Vec::with_capacity(tokens.len());
        for token in tokens {
            let secret = token.resolve()?.into_bytes();
            anyhow::ensure!(
                entries.iter().all(|e: &TokenEntry| e.secret.ct_eq(&secret).unwrap_u8() == 0),
                "[serve.http] tokens {:?} and another token have the same secret; each owner needs its own",
                token.name
            );
            let id = format!("http:{}", token.name);
            // A token is a stable owner: its records survive a restart.
            let owner = server.host().create_durable_agent(id.as_str(), id.as_str())?;
            let http = &server.settings().http;
            entries.push(TokenEntry {
                name: token.name.clone(),
                secret,
                owner,
                admin: token.admin,
                connections: Arc::new(Semaphore::new(http.max_connections_per_token)),
                max_connections: http.max_connections_per_token,
                requests: Arc::new(Semaphore::new(http.max_requests_per_token)),
                max_requests: http.max_requests_per_token,
                streams: Arc::new(Semaphore::new(http.max_event_streams_per_token)),
                max_streams: http.max_event_streams_per_token,
            });
        }
        Ok(Self { entries })
    }

    /// Every configured client.
    pub(crate) fn entries(&self) -> &[TokenEntry] {
        &self.entries
    }

    /// The owner of a presented secret. Compares against every entry.
    pub(crate) fn authenticate(&self, presented: &[u8]) -> Option<&TokenEntry> {
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.secret.ct_eq(presented)) {
                found = Some(entry);
            }
        }
        found
    }

    /// Disposes every owner: their tasks are cancelled and awaited.
    pub async fn dispose(&self) {
        futures::future::join_all(self.entries.iter().map(|e| e.owner.dispose())).await;
    }
}

/// The secret of an `Authorization: Bearer <token>` header. The scheme is
/// case-insensitive (RFC 7235); the token is not.
pub(crate) fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&[u8]> {
    headers.get(axum::http::header::AUTHORIZATION).and_then(|value| {
        let value = value.as_bytes().trim_ascii();
        let space = value.iter().position(|&b| b == b' ')?;
        let (scheme, token) = value.split_at(space);
        scheme.eq_ignore_ascii_case(b"bearer").then(|| token.trim_ascii())
    })
}
