//! `taskhost serve [--config PATH] [--http [ADDR]] [--watch]`: every tool over MCP, on stdio
//! unless `--http` is given (`--http` alone listens on `[serve.http] listen`, and also serves
//! the web dashboard at `/`).
//!
//! - Configuration: `--config PATH`, else `./taskhost.toml` when it exists, else the defaults.
//! - Trust: a configuration file that lies where process trees can write (the working
//!   directory and below, a grant's `working_dirs` or `read_write_paths`) is loaded only when
//!   `taskhost trust` recorded exactly its bytes; otherwise `serve` exits 1 naming the file,
//!   why, and the command to run. The same holds for every `.wasm` plugin file it names, at
//!   start (exit 1) and on each `--watch` reload (the reload fails, the previous version keeps
//!   serving).
//! - Inline HTTP tokens in a configuration inside the served workspace (the working directory
//!   or below) are warned about at start, naming `token_env` / `token_file` as the fix.
//! - `--watch` reloads each `.wasm` plugin when its file changes.
//! - A plugin served from its cached descriptor while it loads (`setup`) joins the server, and
//!   its file watch starts, when the load ends. The loads begin after the first `tools/list`
//!   answer on stdio, at once over HTTP or with `--watch`; over HTTP (whose dashboard follows
//!   every plugin from its start) the server waits for them before listening.
//! - `--cluster URLS` (or `[cluster]`) joins a NATS JetStream cluster: the task registry is then
//!   the cluster's (`crate::cluster`, docs/cluster.md).
//! - SIGINT and SIGTERM stop serving and dispose the host (every agent, every task) before the
//!   process exits, so no task outlives the server.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::mcp::{McpServer, http, stdio};
use crate::plugin::producer::LoadGate;
use crate::reload::{ReloadablePlugin, WatchOptions};
use crate::setup::served_on_state;
use crate::state::StateDir;
use crate::state::trust::{TrustPolicy, TrustStore};

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
    /// The stdio connection's stable owner [default: [serve] owner]: its tasks' records survive a
    /// restart of the server, and the next `serve --owner NAME` gets them back (lost ones told once)
    #[arg(long, value_name = "NAME")]
    pub owner: Option<String>,
    /// Join the cluster on these NATS servers (comma-separated; overrides [cluster] nats): the
    /// task registry is the cluster's (docs/cluster.md)
    #[arg(long, value_name = "URLS")]
    pub cluster: Option<String>,
}

/// Loads the configuration the way `serve` documents it, with the
/// directory relative plugin paths are resolved against. A file that lies
/// where process trees can write is loaded only when trusted
/// ([`Config::load_trusted`]); otherwise this fails with the reason and
/// the command to run, and the server does not start (neither with that
/// file nor with the defaults in its place: a planted configuration must
/// not be mistaken for the user's, nor the user's silently dropped).
pub fn load_config(explicit: Option<&Path>) -> anyhow::Result<(Config, PathBuf)> {
    let directory_of = |path: &Path| path.parent().map(Path::to_path_buf).unwrap_or_default();
    let cwd = std::env::current_dir().context("the working directory")?;
    let trust = || anyhow::Ok(TrustStore::new(&StateDir::open_default()?));
    if let Some(path) = explicit {
        return Ok((Config::load_trusted(path, &cwd, &trust()?)?, directory_of(path)));
    }
    let default = Path::new(DEFAULT_CONFIG_FILE);
    if default.exists() {
        tracing::info!(path = %default.display(), "using the configuration in the working directory");
        return Ok((Config::load_trusted(default, &cwd, &trust()?)?, PathBuf::from(".")));
    }
    tracing::info!("no configuration file; using the built-in defaults");
    Ok((Config::default(), PathBuf::from(".")))
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let (mut config, base_dir) = load_config(args.config.as_deref())?;
    if let Some(urls) = &args.cluster {
        match &mut config.cluster {
            Some(cluster) => cluster.nats = crate::cluster::config::split_urls(urls),
            None => config.cluster = Some(crate::cluster::config::ClusterSettings::joining(urls)),
        }
        config.validate().context("--cluster")?;
    }
    let cwd = std::env::current_dir().context("the working directory")?;
    let trust = Arc::new(TrustPolicy::new(TrustStore::new(&StateDir::open_default()?), config.writable_roots(&cwd)));
    ensure_state_out_of_reach(&config, &trust)?;
    warn_about_inline_tokens(&config);
    // Over HTTP or with --watch (whose file watches start with the loads),
    // plugins load at once; otherwise once the first tool listing is
    // answered (or a call needs one).
    let gate = if args.http.is_some() || args.watch { LoadGate::open_now() } else { LoadGate::closed() };
    let owner = args.owner.clone().or_else(|| config.serve.owner.clone());
    if let Some(owner) = &owner {
        crate::mcp::settings::check_owner_name(owner).context("--owner")?;
    }
    let served = served_on_state(&config, &base_dir, gate.clone(), Some(trust)).await?;
    let (host, plugins, membership) = (served.host, served.plugins, served.membership);
    let tools: Vec<String> = host.tool_definitions().into_iter().map(|d| d.name).collect();
    tracing::info!(tools = %tools.join(", "), "host ready");
    // Over HTTP the dashboard follows every plugin's reloads from its start:
    // wait for the plugins still loading. On stdio nothing waits for them:
    // each joins the server (and its file watch starts) when its load ends.
    let mut ready = Vec::new();
    let mut loading = Vec::new();
    for served in plugins {
        match (args.http.is_some(), served.plugin.peek()) {
            (_, Some(Ok(plugin))) => ready.push((plugin.clone(), served.file)),
            (_, Some(Err(_))) => {}
            (true, None) => {
                if let Ok(plugin) = served.plugin.await {
                    ready.push((plugin, served.file));
                }
            }
            (false, None) => loading.push(served),
        }
    }
    if args.watch && ready.iter().all(|(_, file)| file.is_none()) && loading.iter().all(|s| s.file.is_none()) {
        tracing::warn!("--watch: no [[producer]] is a .wasm file; nothing to watch");
    }
    // Kept until the server stops: dropping a handle stops its watch.
    let watches = Arc::new(std::sync::Mutex::new(Vec::new()));
    let watch_file = {
        let watches = watches.clone();
        move |plugin: &Arc<ReloadablePlugin>, file: &Path| -> anyhow::Result<()> {
            let handle = crate::reload::watch(plugin.clone(), file, WatchOptions::default())?;
            watches.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
            tracing::info!(tool = %plugin.tool(), file = %file.display(), "watching the plugin file");
            Ok(())
        }
    };
    if args.watch {
        for (plugin, file) in &ready {
            if let Some(file) = file {
                watch_file(plugin, file)?;
            }
        }
    }
    let server = McpServer::with_load_gate(
        host.clone(),
        config.serve.clone(),
        ready.into_iter().map(|(p, _)| p).collect(),
        gate,
    );
    if let Some(membership) = membership {
        server.set_membership(membership);
    }
    let mut joining = Vec::new();
    for served in loading {
        let server = server.clone();
        let watch_file = watch_file.clone();
        let watch = args.watch;
        joining.push(tokio::spawn(async move {
            let Ok(plugin) = served.plugin.await else { return };
            if let (true, Some(file)) = (watch, &served.file)
                && let Err(err) = watch_file(&plugin, file)
            {
                tracing::error!(tool = %plugin.tool(), error = %format!("{err:#}"), "cannot watch the plugin file");
            }
            server.add_plugin(plugin);
        }));
    }
    let shutdown = CancellationToken::new();
    // Registered here, before anything is served: a SIGTERM right after the
    // address is printed must still dispose the host.
    let signals = tokio::spawn(stop_on_signal(listen_for_signals(), shutdown.clone()));

    let served = match args.http {
        None => {
            stdio::serve_connection_as(
                server,
                tokio::io::stdin(),
                tokio::io::stdout(),
                shutdown.clone(),
                owner.as_deref(),
            )
            .await
        }
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
    for join in joining {
        join.abort();
    }
    drop(std::mem::take(&mut *watches.lock().unwrap_or_else(|e| e.into_inner())));
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

/// taskhost's own state must lie outside every directory the trees of this
/// configuration can write (see [`TrustPolicy::ensure_out_of_reach`]).
pub fn ensure_state_out_of_reach(config: &Config, trust: &TrustPolicy) -> anyhow::Result<()> {
    trust.ensure_out_of_reach("taskhost's state directory", &crate::state::default_dir()?)?;
    trust.ensure_out_of_reach("the [state] dir", &config.state.effective_dir()?)
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
