//! Serving a configuration: the host with every wasm plugin as a reloadable
//! tool ([`served_from_config_gated`]), on the task store `[state]` or
//! `[cluster]` names ([`served_on_state`]), with plugins whose descriptor is
//! cached served at once and loaded in the background ([`serve_loading`]).
//!
//! Invariants: as the parent module's (cached descriptors, the load gate,
//! trust); a cluster node's membership serves the host it built before any
//! call reaches it.

use super::*;

/// A reloadable plugin that may still be loading: resolves once its load
/// ended (at once for a plugin loaded before serving), to the error of a
/// failed background load otherwise.
pub type PendingPlugin = Shared<BoxFuture<'static, Result<Arc<ReloadablePlugin>, Arc<str>>>>;

/// A wasm plugin a host serves as a reloadable tool, and its file (`None`
/// for a built-in plugin).
pub struct ServedPlugin {
    pub plugin: PendingPlugin,
    pub file: Option<PathBuf>,
}

/// As [`host_from_config`], with every wasm plugin served as a
/// [`ReloadablePlugin`] (its versions, live tasks per version and reloads
/// are what `serve --watch` and the web dashboard use).
pub async fn served_from_config(config: &Config, base_dir: &Path) -> anyhow::Result<(Host, Vec<ServedPlugin>)> {
    served_from_config_gated(config, base_dir, LoadGate::open_now(), None, None).await
}

/// As [`served_from_config`], with the background loads of plugins served
/// from cached descriptors (and the engine they need) held until `gate`
/// opens: `serve` opens it once its first tool listing is answered. Plugin
/// files pass `trust` (when given) at load and on every reload. Tasks are
/// recorded in `store` (its earlier records restored), else in memory.
pub async fn served_from_config_gated(
    config: &Config,
    base_dir: &Path,
    gate: LoadGate,
    trust: Option<Arc<TrustPolicy>>,
    store: Option<Arc<dyn taskhost_core::tasks::store::TaskStore>>,
) -> anyhow::Result<(Host, Vec<ServedPlugin>)> {
    let outlives_process = store.as_ref().is_some_and(|store| store.outlives_process());
    let host = match store {
        Some(store) => Host::with_store(&config.tasks, store)?,
        None => Host::new(&config.tasks)?,
    };
    let mut runtime = PluginRuntime::new(config).with_gate(gate).with_trust(trust);
    if outlives_process {
        let root = StateDir::open_configured(&config.state)?.trees_root()?;
        runtime.durable_trees = Some(DurableTrees { root });
    }
    let producers = config.producers_served_here();
    let subagents = Subagents::for_host(&host, &config.subagents)?;
    let mut plugins = Vec::new();
    for producer in producers {
        let context = || format!("[[producer]] {:?}", producer.tool);
        if let Some(plan) =
            WasmPlan::of(&producer, base_dir, &mut runtime, Some(&subagents)).await.with_context(context)?
        {
            let file = plan.file.clone();
            let plugin = match runtime.cached_descriptor(&plan) {
                Some((cached, key)) => serve_loading(&host, &mut runtime, plan, &producer, cached, key)?,
                None => {
                    let engine = runtime.engine().await.with_context(context)?;
                    let built = plan.build(&engine).await.with_context(context)?;
                    runtime.store_descriptor(&built);
                    let plugin = ReloadablePlugin::serve_producer(&host, &engine, built, producer.tool_options())
                        .with_context(context)?;
                    runtime.guard(&plugin);
                    let ready: BoxFuture<'static, _> = Box::pin(std::future::ready(Ok(plugin)));
                    ready.shared()
                }
            };
            plugins.push(ServedPlugin { plugin, file });
            continue;
        }
        let built = build_producer(&producer, base_dir, &mut runtime, &subagents).await.with_context(context)?;
        host.add_producer(built, producer.tool_options()).map_err(anyhow::Error::new)?;
    }
    // Task output logs go to each owner's own spill directory, which only
    // that owner's commands see (read-only), charged to its disk budget;
    // without process trees, to a private directory nothing else sees.
    match runtime.process_host.as_ref() {
        Some(process_host) => {
            host.registry().set_output_files(crate::task_logs::OwnerLogFiles::new(process_host.clone()));
        }
        None => {
            let parent = runtime.spill_root().context("placing the task output directory")?;
            host.registry().set_output_spill_dir(&parent).context("creating the task output directory")?;
        }
    }
    // Trees handed over before a restart go on (their output files are set).
    let adopter = crate::durable_tasks::DurableTreeAdopter::default();
    host.registry().readopt(&adopter);
    if let Some(trees) = &runtime.durable_trees {
        adopter.sweep(&trees.root);
    }
    Ok((host, plugins))
}

/// The host `serve` runs: as [`served_from_config_gated`], on the task store
/// `[state]` names (SQLite in the state directory by default; the
/// cluster's registry with `[cluster]`), so its
/// earlier records are restored and its stable owners' handed-over trees
/// re-adopted. The store's lock is held until the host and every plugin
/// are dropped.
pub async fn served_on_state(
    config: &Config,
    base_dir: &Path,
    gate: LoadGate,
    trust: Option<Arc<TrustPolicy>>,
) -> anyhow::Result<Served> {
    let state = StateDir::open_configured(&config.state)?;
    let (store, membership) = match &config.cluster {
        Some(cluster) => {
            let (store, membership) = crate::cluster::join(cluster).await?;
            (store, Some(membership))
        }
        None => (state.task_store(&config.state)?, None),
    };
    let (host, plugins) = served_from_config_gated(config, base_dir, gate, trust, Some(store)).await?;
    if let Some(membership) = &membership {
        crate::cluster::serve(membership, host.clone(), state.trees_root().ok());
    }
    Ok(Served { host, plugins, membership })
}

/// What [`served_on_state`] serves.
pub struct Served {
    pub host: Host,
    pub plugins: Vec<ServedPlugin>,
    /// This node's membership of the cluster, with `[cluster]`: calls are
    /// answered only while it confirms it ([`crate::cluster::membership::Membership::confirm`]).
    pub membership: Option<std::sync::Arc<crate::cluster::membership::Membership>>,
}

/// Serves `plan` as a [`LoadingProducer`] listed with its cached
/// descriptor, and loads it in the background: the engine, the compiled
/// code, the validation instance and a real `describe`, which wins over the
/// cache when they differ (the entry is then rewritten). A failed load
/// deletes the entry (the next start describes the plugin before serving,
/// and fails there) and leaves the tool answering every call with the error.
fn serve_loading(
    host: &Host,
    runtime: &mut PluginRuntime,
    plan: WasmPlan,
    entry: &ProducerConfig,
    cached: Descriptor,
    key: String,
) -> anyhow::Result<PendingPlugin> {
    let options = entry.tool_options();
    let tool = options.name.clone();
    let (loading, done) = LoadingProducer::new(cached.clone(), runtime.gate.clone());
    host.add_producer(loading as Arc<dyn Producer>, options)?;
    tracing::debug!(tool = %tool, "serving from the cached descriptor; loading in the background");
    let engine = runtime.engine_start();
    let cache = runtime.cache();
    let trust = runtime.trust.clone();
    let host = host.clone();
    let what = plan.tool.clone();
    let load = async move {
        let engine = engine.await.map_err(|err| anyhow::anyhow!("{err}"))?;
        let producer = plan.build(&engine).await?;
        anyhow::Ok((engine, producer))
    };
    let (sender, receiver) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let plugin = match load.await {
            Ok((engine, producer)) => {
                let real = producer.descriptor();
                if *real != cached {
                    tracing::warn!(tool = %tool, "the cached descriptor differs from the plugin's describe; serving the real one");
                    if let Some(cache) = &cache {
                        store_descriptor(cache, &key, &real);
                    }
                }
                done.finish(Ok(producer.clone()));
                let plugin = ReloadablePlugin::attach(&host, &engine, producer, tool);
                if let Some(policy) = trust {
                    plugin.guard_reloads(policy);
                }
                Ok(plugin)
            }
            Err(err) => {
                let why = format!("{what} failed to load: {err:#}");
                tracing::error!(tool = %tool, error = %why, "plugin load failed after serving from the cached descriptor; its calls answer with the error");
                if let Some(cache) = &cache {
                    cache.discard_descriptor(&key);
                }
                done.finish(Err(why.clone()));
                Err(Arc::<str>::from(why))
            }
        };
        let _ = sender.send(plugin);
    });
    let pending: BoxFuture<'static, _> =
        Box::pin(async move { receiver.await.unwrap_or_else(|_| Err("the plugin's background load panicked".into())) });
    Ok(pending.shared())
}
