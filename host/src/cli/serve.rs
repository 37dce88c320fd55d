//! `taskhost serve [--config PATH] [--http [ADDR]]`: every tool over MCP.
//!
//! Configuration: `--config PATH`, else `./taskhost.toml` when it exists,
//! else the built-in defaults. Transport: stdio unless `--http` is given
//! (`--http` alone listens on `[serve.http] listen`). SIGINT and SIGTERM
//! stop serving and dispose the host — every agent, every task — before
//! the process exits, so no task outlives the server.

use std::path::{Path, PathBuf};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::setup::host_from_config;
use crate::surfaces::mcp::{McpServer, http, stdio};

/// The configuration file used when `--config` is not given and it exists.
pub const DEFAULT_CONFIG_FILE: &str = "taskhost.toml";

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Configuration file [default: ./taskhost.toml if present, else built-in defaults]
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Serve streamable HTTP instead of stdio, on ADDR [default: [serve.http] listen, 127.0.0.1:8765]
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
    pub http: Option<String>,
}

/// Loads the configuration the way `serve` documents it, with the
/// directory relative plugin paths are resolved against.
pub fn load_config(explicit: Option<&Path>) -> anyhow::Result<(Config, PathBuf)> {
    let directory_of = |path: &Path| path.parent().map(Path::to_path_buf).unwrap_or_default();
    if let Some(path) = explicit {
        return Ok((Config::load(path)?, directory_of(path)));
    }
    let default = Path::new(DEFAULT_CONFIG_FILE);
    if default.exists() {
        tracing::info!(path = %default.display(), "using the configuration in the working directory");
        return Ok((Config::load(default)?, PathBuf::from(".")));
    }
    tracing::info!("no configuration file; using the built-in defaults");
    Ok((Config::default(), PathBuf::from(".")))
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let (config, base_dir) = load_config(args.config.as_deref())?;
    let host = host_from_config(&config, &base_dir).await?;
    let tools: Vec<String> = host.tool_definitions().into_iter().map(|d| d.name).collect();
    tracing::info!(tools = %tools.join(", "), "host ready");
    let server = McpServer::new(host.clone(), config.serve.clone());
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(stop_on_signal(shutdown.clone()));

    let served = match args.http {
        None => stdio::serve_connection(server, tokio::io::stdin(), tokio::io::stdout(), shutdown.clone()).await,
        Some(address) => {
            let address = if address.is_empty() { config.serve.http.listen.clone() } else { address };
            // Tokens first: a server nobody may call must not start.
            let tokens = http::TokenTable::from_config(&server)?;
            let listener = tokio::net::TcpListener::bind(&address)
                .await
                .with_context(|| format!("listening on {address} for --http"))?;
            let bound = listener.local_addr()?;
            // Always printed (not a log line), so scripts and tests can find
            // the port of `--http 127.0.0.1:0` whatever RUST_LOG says.
            eprintln!("taskhost: serving MCP on http://{bound}{}", config.serve.http.path);
            http::serve(server, tokens, listener, shutdown.clone()).await
        }
    };
    signals.abort();
    host.dispose().await;
    tracing::info!("host disposed; exiting");
    served
}

async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        tracing::warn!("cannot listen for SIGINT/SIGTERM; stop the server by closing its input");
        return;
    };
    let name = tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    };
    tracing::info!(signal = %name, "stopping: disposing every task");
    shutdown.cancel();
}
