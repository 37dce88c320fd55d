//! Joining the NATS cluster: the client's options from `[cluster]`
//! (credentials, user and password file, TLS), the connection, and the
//! refusal of a server that accepts anonymous clients.
//!
//! Invariants: a secret is read from its file here and nowhere else, and
//! never logged; a server whose INFO says `auth_required: false` (anyone
//! may connect, and so read and forge the registry) is refused unless
//! `[cluster] insecure = true`, which joins it with a warning.

use std::time::Duration;

use anyhow::Context as _;

use super::config::ClusterSettings;

/// How long the first connection may take before `serve` gives up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest password file read.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// Connects as `settings` says, naming the client after the node, and
/// checks that the server requires authentication.
pub async fn connect(settings: &ClusterSettings, node: &str) -> anyhow::Result<async_nats::Client> {
    let mut options = match (&settings.credentials, &settings.user, &settings.password_file) {
        (Some(file), _, _) => async_nats::ConnectOptions::with_credentials_file(file)
            .await
            .with_context(|| format!("[cluster] credentials: reading {}", file.display()))?,
        (None, Some(user), Some(file)) => {
            async_nats::ConnectOptions::with_user_and_password(user.clone(), read_secret(file)?)
        }
        _ => async_nats::ConnectOptions::new(),
    };
    if let Some(ca) = &settings.tls.ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&settings.tls.cert_file, &settings.tls.key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if settings.tls.required {
        options = options.require_tls(true);
    }
    if settings.tls.first {
        options = options.tls_first();
    }
    let client = options
        .name(format!("taskhost {node}"))
        .connection_timeout(CONNECT_TIMEOUT)
        .event_callback(|event| async move { tracing::info!(%event, "cluster connection") })
        .connect(settings.nats.as_slice())
        .await
        .with_context(|| format!("joining the cluster at {}", settings.nats.join(",")))?;
    let info = client.server_info();
    if !info.auth_required {
        anyhow::ensure!(
            settings.insecure,
            "the NATS server {} ({}) accepts anonymous clients, so anyone who reaches it can read and \
             change the task registry; configure users on it (docs/cluster.md), or set [cluster] \
             insecure = true to join it anyway",
            info.server_name,
            info.host
        );
        tracing::warn!(server = %info.server_name, "joining a NATS server that accepts anonymous clients ([cluster] insecure = true)");
    }
    tracing::info!(node, server = %info.server_name, version = %info.version, "joined the cluster");
    Ok(client)
}

/// The password in `file`: its first line, at most [`MAX_SECRET_BYTES`].
fn read_secret(file: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(MAX_SECRET_BYTES).read_to_string(&mut text))
        .with_context(|| format!("[cluster] password_file: reading {}", file.display()))?;
    let password = text.lines().next().unwrap_or_default().to_string();
    anyhow::ensure!(!password.is_empty(), "[cluster] password_file {} is empty", file.display());
    Ok(password)
}
