//! Hot reload of wasm plugins, make-before-break and never orphaning a task: a
//! [`ReloadablePlugin`] is one tool instance whose plugin can be replaced while it runs;
//! [`watch()`](watch::watch) reloads it when its file changes.
//!
//! A reload: 1. load the new bytes (compile or take the compile cache, validate against the
//! `plugin` world, pre-instantiate: [`PluginEngine`]); 2. `describe` them with this instance's
//! config and check the kind is unchanged ([`WasmProducer::reload`]); 3. swap the one pointer
//! new starts read.
//!
//! Invariants:
//! - Nothing changes before step 3: a version that fails to compile, validate or `describe`
//!   leaves the old one serving; the failure is returned, logged and broadcast as
//!   [`ReloadEvent::Failed`] with the reason.
//! - A reload never blocks or refuses a start: before the swap it uses the old version, after
//!   it the new one. A schema change shows at once (listings read the serving descriptor).
//! - Running tasks stay on the version that started them until they settle (their store keeps
//!   an `Arc` of its version's `InstancePre`), and in the task registry, which owns every
//!   registration: readable, killable, notices as usual. A plugin never owns a task;
//!   [`ReloadablePlugin::unload`] removes the tool (no new starts) and touches no running task.
//! - Each version served gets this instance's next sequence number (`v1`, `v2`, …) beside its
//!   content hash; tasks record both in `producer_info` ([`ServingVersion::info`]).
//! - Under its server's [`TrustPolicy`] ([`ReloadablePlugin::guard_reloads`], for a file where
//!   process trees can write), a reload from a file (`reload_file`, the watcher) reads it once,
//!   hashes those bytes and loads them only if the policy admits the hash (`taskhost trust`, or
//!   the file `dev` started on); otherwise it fails like any other, naming the file and the fix.
//! - A tool `serve` started from a cached descriptor becomes reloadable
//!   ([`ReloadablePlugin::attach`]) when its background load ends; no reload or watch before.

pub mod watch;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::sync::broadcast;
use tracing::Instrument as _;

use crate::plugin::component::content_hash;
use crate::plugin::{CompileSource, PluginEngine, PluginVersion, ServingVersion, WasmProducer};
use crate::state::trust::{FileKind, TrustPolicy};
use taskhost_core::Host;
use taskhost_core::producer::Producer;
use taskhost_core::tools::producer_tool::ProducerToolOptions;

pub use watch::{WatchHandle, WatchOptions, watch};

/// A successful reload.
#[derive(Clone, Debug)]
pub struct Reloaded {
    pub tool: String,
    pub from: ServingVersion,
    pub to: ServingVersion,
    /// Whether the new version's code came from the compile cache.
    pub compile: CompileSource,
    /// From the start of the load to the swap.
    pub took: Duration,
    /// Live tasks still running on older versions, by sequence number, at
    /// the moment of the swap.
    pub still_running: BTreeMap<u64, usize>,
    /// The argument schema or description changed.
    pub schema_changed: bool,
}

/// A refused reload: the previous version still serves.
#[derive(Clone, Debug)]
pub struct ReloadFailed {
    pub tool: String,
    /// The version that keeps serving.
    pub serving: ServingVersion,
    /// Why, with context (`cannot load plugin …: the file is truncated …`).
    pub reason: String,
}

/// What a reload attempt did, as broadcast to subscribers.
#[derive(Clone, Debug)]
pub enum ReloadEvent {
    Reloaded(Reloaded),
    Failed(ReloadFailed),
}

impl fmt::Display for Reloaded {
    /// `reloaded ticker: v3 serving new starts; 2 tasks still on v2`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reloaded {}: {} serving new starts", self.tool, self.to.tag())?;
        if self.still_running.is_empty() {
            write!(f, "; no tasks on older versions")?;
        } else {
            let parts: Vec<String> = self
                .still_running
                .iter()
                .map(|(seq, n)| format!("{n} task{} still on v{seq}", if *n == 1 { "" } else { "s" }))
                .collect();
            write!(f, "; {}", parts.join(", "))?;
        }
        if self.schema_changed {
            write!(f, " (the tool's schema changed)")?;
        }
        Ok(())
    }
}

impl fmt::Display for ReloadFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reload of {} failed, {} still serving: {}", self.tool, self.serving.tag(), self.reason)
    }
}

impl fmt::Display for ReloadEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReloadEvent::Reloaded(r) => r.fmt(f),
            ReloadEvent::Failed(r) => r.fmt(f),
        }
    }
}

/// One reloadable wasm tool instance, served by a [`Host`].
pub struct ReloadablePlugin {
    tool: String,
    engine: PluginEngine,
    producer: Arc<WasmProducer>,
    host: Host,
    events: broadcast::Sender<ReloadEvent>,
    /// What reloads from files must pass (see the module docs).
    trust: std::sync::OnceLock<Arc<TrustPolicy>>,
}

impl fmt::Debug for ReloadablePlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadablePlugin")
            .field("tool", &self.tool)
            .field("serving", &self.producer.serving().info())
            .finish_non_exhaustive()
    }
}

impl ReloadablePlugin {
    /// Describes `version` with `config`, then serves it on `host` as the
    /// tool `options.name` (replacing a tool of that name).
    pub async fn serve(
        host: &Host,
        engine: &PluginEngine,
        version: Arc<PluginVersion>,
        config: serde_json::Value,
        options: ProducerToolOptions,
    ) -> anyhow::Result<Arc<Self>> {
        let producer = Arc::new(
            WasmProducer::new(version, config)
                .await
                .with_context(|| format!("cannot serve the tool {}", options.name))?,
        );
        Self::serve_producer(host, engine, producer, options)
    }

    /// Serves an already described producer (with whatever capabilities it
    /// was granted; a reload keeps them) on `host` as the tool
    /// `options.name`. New versions are loaded into `engine`.
    pub fn serve_producer(
        host: &Host,
        engine: &PluginEngine,
        producer: Arc<WasmProducer>,
        options: ProducerToolOptions,
    ) -> anyhow::Result<Arc<Self>> {
        let tool = options.name.clone();
        host.add_producer(producer.clone() as Arc<dyn Producer>, options)?;
        Ok(Self::attach(host, engine, producer, tool))
    }

    /// Makes `producer` reloadable as the tool `tool` that `host` already
    /// serves through a [`crate::plugin::producer::LoadingProducer`] whose
    /// load ended with `producer` (a start from a cached descriptor).
    pub fn attach(host: &Host, engine: &PluginEngine, producer: Arc<WasmProducer>, tool: String) -> Arc<Self> {
        let (events, _) = broadcast::channel(64);
        tracing::info!(tool = %tool, version = %producer.serving().info(), "plugin serving");
        Arc::new(Self {
            tool,
            engine: engine.clone(),
            producer,
            host: host.clone(),
            events,
            trust: std::sync::OnceLock::new(),
        })
    }

    /// The tool name.
    pub fn tool(&self) -> &str {
        &self.tool
    }

    pub fn engine(&self) -> &PluginEngine {
        &self.engine
    }

    pub fn producer(&self) -> &Arc<WasmProducer> {
        &self.producer
    }

    /// The version new starts use.
    pub fn serving(&self) -> ServingVersion {
        self.producer.serving()
    }

    /// Live tasks of this instance by version sequence number.
    pub fn live_tasks_by_version(&self) -> BTreeMap<u64, usize> {
        self.producer.live_tasks_by_version()
    }

    /// Every reload attempt from now on (successes and failures).
    pub fn subscribe(&self) -> broadcast::Receiver<ReloadEvent> {
        self.events.subscribe()
    }

    /// Makes every later reload from a file pass `policy` (set once; a
    /// second call changes nothing).
    pub fn guard_reloads(&self, policy: Arc<TrustPolicy>) {
        let _ = self.trust.set(policy);
    }

    /// The trust records' file reloads pass, when they are guarded.
    pub fn trust_records_file(&self) -> Option<&Path> {
        self.trust.get().map(|policy| policy.records_file())
    }

    /// Whether the bytes of `path` that hash to `sha256` may be served: an
    /// error that names the file and the command to run when not.
    pub fn admit_file(&self, path: &Path, sha256: &str) -> anyhow::Result<()> {
        match self.trust.get() {
            Some(policy) => policy.admit(path, FileKind::Plugin, sha256).map_err(|e| anyhow::Error::new(*e)),
            None => Ok(()),
        }
    }

    /// Loads `path` as the new version: read once, admitted by hash, and
    /// loaded from those bytes.
    pub async fn reload_file(&self, path: &Path) -> Result<Reloaded, ReloadFailed> {
        let started = Instant::now();
        let work = async {
            let loaded = match tokio::fs::read(path).await {
                Ok(bytes) => match self.admit_file(path, &content_hash(&bytes)) {
                    Ok(()) => self.engine.load_file_bytes(path, bytes).await,
                    Err(refused) => Err(refused),
                },
                Err(err) => Err(anyhow::Error::new(err).context(format!("cannot read plugin {}", path.display()))),
            };
            self.finish(started, loaded).await
        };
        work.instrument(self.span()).await
    }

    /// Loads `bytes` (named `name`) as the new version. The same bytes as
    /// the serving version still make a new version (`v<n+1>`), with its
    /// code from the compile cache.
    pub async fn reload_bytes(&self, name: &str, bytes: impl Into<Vec<u8>>) -> Result<Reloaded, ReloadFailed> {
        let started = Instant::now();
        let bytes = bytes.into();
        let work = async {
            let loaded = self.engine.load_bytes(name, bytes).await;
            self.finish(started, loaded).await
        };
        work.instrument(self.span()).await
    }

    /// Serves an already loaded version (still described first).
    pub async fn reload_version(&self, version: Arc<PluginVersion>) -> Result<Reloaded, ReloadFailed> {
        self.finish(Instant::now(), Ok(version)).instrument(self.span()).await
    }

    /// Serves the outcome of a load that began at `started` (the watcher
    /// loads first, so that a torn file can be retried before it is
    /// reported).
    pub(crate) async fn serve_loaded(
        &self,
        started: Instant,
        loaded: anyhow::Result<Arc<PluginVersion>>,
    ) -> Result<Reloaded, ReloadFailed> {
        self.finish(started, loaded).instrument(self.span()).await
    }

    fn span(&self) -> tracing::Span {
        tracing::info_span!("reload", tool = %self.tool, from = %self.producer.serving().info())
    }

    async fn finish(
        &self,
        started: Instant,
        loaded: anyhow::Result<Arc<PluginVersion>>,
    ) -> Result<Reloaded, ReloadFailed> {
        let from = self.producer.serving();
        let old_descriptor = self.producer.descriptor();
        let swapped = match loaded {
            Ok(version) => {
                let compile = version.compile_source();
                self.producer.reload(version).await.map(|(to, descriptor)| (to, descriptor, compile))
            }
            Err(error) => Err(error),
        };
        match swapped {
            Ok((to, descriptor, compile)) => {
                let mut still_running = self.producer.live_tasks_by_version();
                still_running.remove(&to.seq);
                let reloaded = Reloaded {
                    tool: self.tool.clone(),
                    from,
                    to,
                    compile,
                    took: started.elapsed(),
                    still_running,
                    schema_changed: *descriptor != *old_descriptor,
                };
                tracing::info!(
                    tool = %self.tool,
                    version = %reloaded.to.info(),
                    compile = ?compile,
                    took_ms = reloaded.took.as_secs_f64() * 1000.0,
                    "{reloaded}"
                );
                let _ = self.events.send(ReloadEvent::Reloaded(reloaded.clone()));
                Ok(reloaded)
            }
            Err(error) => {
                let failed = ReloadFailed { tool: self.tool.clone(), serving: from, reason: format!("{error:#}") };
                tracing::warn!(tool = %self.tool, serving = %failed.serving.info(), reason = %failed.reason, "reload failed; the previous version keeps serving");
                let _ = self.events.send(ReloadEvent::Failed(failed.clone()));
                Err(failed)
            }
        }
    }

    /// Stops new starts by removing the tool. Running tasks keep running on
    /// their version and stay readable and killable through the registry.
    /// Returns whether the tool was still being served.
    pub fn unload(&self) -> bool {
        let removed = self.host.toolbox().remove(&self.tool);
        tracing::info!(
            tool = %self.tool,
            live_tasks = self.live_tasks_by_version().values().sum::<usize>(),
            "plugin unloaded; running tasks continue"
        );
        removed
    }
}
