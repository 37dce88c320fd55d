//! `taskhost serve [--config PATH] [--http [ADDR]] [--watch]`: every tool over MCP.
//!
//! Configuration: `--config PATH`, else `./taskhost.toml` when it exists,
//! else the built-in defaults. A configuration with inline HTTP tokens inside
//! the served workspace (the working directory or below) is warned about at
//! start, naming `token_env` / `token_file` as the fix. Transport: stdio unless `--http` is given
//! (`--http` alone listens on `[serve.http] listen`; it also serves the web
//! dashboard at `/`). `--watch` reloads each `.wasm` plugin when its file
//! changes. SIGINT and SIGTERM
//! stop serving and dispose the host — every agent, every task — before
//! the process exits, so no task outlives the server.

use std::path::{Path, PathBuf};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::mcp::{McpServer, http, stdio};
use crate::reload::WatchOptions;
use crate::setup::served_from_config;

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
    /// Reload a `.wasm` plugin when its file changes (make-before-break: running tasks stay on their version)
    #[arg(long)]
    pub watch: bool,
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
    warn_about_inline_tokens(&config);
    let (host, plugins) = served_from_config(&config, &base_dir).await?;
    let tools: Vec<String> = host.tool_definitions().into_iter().map(|d| d.name).collect();
    tracing::info!(tools = %tools.join(", "), "host ready");
    // Kept until the server stops: dropping a handle stops its watch.
    let mut watches = Vec::new();
    if args.watch {
        for served in plugins.iter() {
            if let Some(file) = &served.file {
                watches.push(crate::reload::watch(served.plugin.clone(), file, WatchOptions::default())?);
                tracing::info!(tool = %served.plugin.tool(), file = %file.display(), "watching the plugin file");
            }
        }
        if watches.is_empty() {
            tracing::warn!("--watch: no [[producer]] is a .wasm file; nothing to watch");
        }
    }
    let plugins = plugins.into_iter().map(|served| served.plugin).collect();
    let server = McpServer::with_plugins(host.clone(), config.serve.clone(), plugins);
    let shutdown = CancellationToken::new();
    // Registered here, before anything is served: a SIGTERM right after the
    // address is printed must still dispose the host.
    let signals = tokio::spawn(stop_on_signal(listen_for_signals(), shutdown.clone()));

    let served = match args.http {
        None => stdio::serve_connection(server, tokio::io::stdin(), tokio::io::stdout(), shutdown.clone()).await,
        Some(address) => {
            let address = if address.is_empty() { config.serve.http.listen.clone() } else { address };
            // Tokens first: a server nobody may call must not start.
            let tokens = crate::mcp::tokens::TokenTable::from_config(&server)?;
            let listener = tokio::net::TcpListener::bind(&address)
                .await
                .with_context(|| format!("listening on {address} for --http"))?;
            let bound = listener.local_addr()?;
            // Always printed (not a log line), so scripts and tests can find
            // the port of `--http 127.0.0.1:0` whatever RUST_LOG says.
            eprintln!("taskhost: serving MCP on http://{bound}{}", config.serve.http.path);
            eprintln!("taskhost: dashboard on http://{bound}/");
            http::serve(server, tokens, listener, shutdown.clone()).await
        }
    };
    signals.abort();
    drop(watches);
    host.dispose().await;
    // Backstop: disposal awaited every task, but a producer that broke its
    // contract may have left a process tree; none may outlive the host.
    let stragglers = taskhost_process::kill_all();
    if stragglers > 0 {
        tracing::warn!(stragglers, "killed process trees left after disposal");
    }
    tracing::info!("host disposed; exiting");
    served
}

/// Inline secrets in a configuration file inside the served workspace are
/// one readable file away from every command the model runs: say so, and
/// how to fix it, at every start.
fn warn_about_inline_tokens(config: &Config) {
    let Ok(workspace) = std::env::current_dir() else { return };
    let Some(names) = config.inline_tokens_in(&workspace) else { return };
    let file = config.source.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
    tracing::warn!(
        config = %file,
        tokens = %names.join(", "),
        "the configuration file holds inline HTTP tokens and lies inside the served workspace {}; \
         move each secret out of it: `token_env = \"NAME\"` (an environment variable of the server) or \
         `token_file = \"/path/outside/the/workspace\"` in its [[serve.http.tokens]] entry",
        workspace.display()
    );
}

type Signals = Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>;

/// SIGINT and SIGTERM handlers, installed when this returns.
fn listen_for_signals() -> Signals {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(interrupt), Ok(terminate)) => Some((interrupt, terminate)),
        _ => None,
    }
}

async fn stop_on_signal(signals: Signals, shutdown: CancellationToken) {
    let Some((mut interrupt, mut terminate)) = signals else {
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
