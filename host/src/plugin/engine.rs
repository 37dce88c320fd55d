//! The shared wasmtime engine: one [`PluginEngine`] per host owns a `wasmtime::Engine` set up
//! for async calls with epoch interruption, the pooling instance allocator (sized for
//! [`PluginRuntimeConfig::max_live_stores`] live task stores) and a compile cache directory.
//!
//! Invariants:
//! - Every loaded plugin version keeps a clone of its `PluginEngine`, so the engine (and its
//!   epoch ticker) lives exactly as long as anything that can still call into a guest.
//! - A background thread increments the epoch every [`PluginRuntimeConfig::epoch_tick_ms`]
//!   (without it no call deadline could fire); it stops when the last clone drops.
//! - If the pooling allocator cannot reserve its address space the engine falls back to
//!   on-demand allocation and logs a warning; it never fails for that reason alone.
//! - The compile cache is used only when its directory passes the checks of [`super::cache`];
//!   otherwise the engine compiles every load and says so. It may be opened before the engine
//!   ([`open_cache`], [`PluginEngine::with_cache`]): `setup` reads cached descriptors from it
//!   while the engine is not built.
//! - `component-model-async` stays off and `concurrency_support(false)`: the plugin ABI is the
//!   stable WASI 0.2 component model.
//! - A pool slot freed by a dropped store is reset before reuse (a new store never sees an old
//!   store's memory or tables): the pages the old store dirtied (found with `PAGEMAP_SCAN` on
//!   kernels 6.7+) are zeroed or restored in place up to [`KEEP_RESIDENT_MEMORY_BYTES`] per
//!   memory and [`KEEP_RESIDENT_TABLE_BYTES`] per table, sparing the next store those page
//!   faults at that much RSS per warm slot; the rest are decommitted.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::cache::CompileCache;

/// The least deadline an instantiation gets (see
/// [`PluginRuntimeConfig::instantiation_deadline`]).
pub const INSTANTIATION_DEADLINE_FLOOR: Duration = Duration::from_secs(1);

/// Tunables of the plugin runtime. Every field has a default
/// (`#[serde(default)]`), so a host configuration may name only what it changes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PluginRuntimeConfig {
    /// Linear memory cap per task store, in bytes (default 64 MiB). A guest
    /// that grows past it fails its task with a "memory limit" detail.
    pub memory_limit_bytes: u64,
    /// Deadline of every single call into a guest, in milliseconds
    /// (default 1000). A call running past it is interrupted and its task fails.
    pub call_deadline_ms: u64,
    /// Epoch tick period in milliseconds (default 10): the resolution of the
    /// call deadline and how often a busy guest yields to the async executor.
    pub epoch_tick_ms: u64,
    /// Whether to use the pooling instance allocator (default true).
    pub pooling: bool,
    /// How many task stores may be live at once with the pooling allocator
    /// (default 1 024). A start beyond it is refused with a clear error.
    ///
    /// Not free to raise: the pool's fiber stacks are two mappings each
    /// (stack and guard page), and `fork` copies every mapping of the host,
    /// so each process the `process` capability starts pays for them. Measured
    /// here: 43 mappings fork in 0.09 ms; with 1 024 stores (2 100 mappings)
    /// 0.67 ms; with 10 240 (20 500 mappings) 7.9 ms.
    pub max_live_stores: u32,
    /// Compiled-component cache directory. `None` uses
    /// `$XDG_CACHE_HOME/taskhost/components` (or `~/.cache/...`, or the temp
    /// dir). See `cache`.
    pub cache_dir: Option<PathBuf>,
    /// Whether compiled components are cached on disk (default true).
    pub cache: bool,
    /// Size cap of the compile cache directory, in bytes (default 512 MiB).
    /// After each store the least recently used entries are deleted until the
    /// directory fits; a single artifact larger than the cap is not cached.
    pub cache_max_bytes: u64,
}

/// Default of [`PluginRuntimeConfig::cache_max_bytes`]: 512 MiB.
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 512 << 20;

impl Default for PluginRuntimeConfig {
    fn default() -> Self {
        Self {
            memory_limit_bytes: 64 << 20,
            call_deadline_ms: 1000,
            epoch_tick_ms: 10,
            pooling: true,
            max_live_stores: 1_024,
            cache_dir: None,
            cache: true,
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
        }
    }
}

impl PluginRuntimeConfig {
    /// Checks the values for sense; the engine refuses a config that fails this.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.memory_limit_bytes >= 1 << 20,
            "plugin memory_limit_bytes {} is below 1 MiB: no real plugin fits",
            self.memory_limit_bytes
        );
        anyhow::ensure!(
            self.memory_limit_bytes <= 4 << 30,
            "plugin memory_limit_bytes {} is above 4 GiB, the 32-bit wasm limit",
            self.memory_limit_bytes
        );
        anyhow::ensure!(self.call_deadline_ms > 0, "plugin call_deadline_ms must be positive");
        anyhow::ensure!(self.epoch_tick_ms > 0, "plugin epoch_tick_ms must be positive");
        anyhow::ensure!(
            self.epoch_tick_ms <= self.call_deadline_ms,
            "plugin epoch_tick_ms ({}) must not exceed call_deadline_ms ({})",
            self.epoch_tick_ms,
            self.call_deadline_ms
        );
        anyhow::ensure!(self.max_live_stores > 0, "plugin max_live_stores must be positive");
        anyhow::ensure!(
            self.cache_max_bytes > 0,
            "plugin cache_max_bytes must be positive (use `cache = false` to turn the cache off)"
        );
        Ok(())
    }

    /// The per-call deadline as a duration.
    pub fn call_deadline(&self) -> Duration {
        Duration::from_millis(self.call_deadline_ms)
    }

    /// The deadline of an instantiation: the call deadline, but at least
    /// [`INSTANTIATION_DEADLINE_FLOOR`]. An instantiation is mostly the
    /// host's own work (linking, memory set-up) with no epoch check inside,
    /// so a core taken away from it by the OS on a saturated machine shows
    /// as the guest's time; a guest's initialization that never ends is
    /// still stopped.
    pub fn instantiation_deadline(&self) -> Duration {
        self.call_deadline().max(INSTANTIATION_DEADLINE_FLOOR)
    }

    /// The cache directory in effect, or `None` when caching is off.
    pub fn effective_cache_dir(&self) -> Option<PathBuf> {
        if !self.cache {
            return None;
        }
        Some(self.cache_dir.clone().unwrap_or_else(default_cache_dir))
    }
}

/// `$XDG_CACHE_HOME/taskhost/components`, else `~/.cache/taskhost/components`,
/// else `<temp dir>/taskhost-components`.
pub fn default_cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")));
    match base {
        Some(base) => base.join("taskhost").join("components"),
        None => std::env::temp_dir().join("taskhost-components"),
    }
}

/// Bytes of a freed linear-memory slot kept resident (reset in place rather
/// than decommitted) for the next store of the slot. A small Rust plugin
/// dirties about 40 KiB of its memory per task (shadow stack top, data,
/// heap); a store that dirtied more has the rest decommitted.
pub const KEEP_RESIDENT_MEMORY_BYTES: usize = 64 << 10;

/// Bytes of a freed table slot kept resident for the next store of the slot.
pub const KEEP_RESIDENT_TABLE_BYTES: usize = 16 << 10;

/// The shared engine. Cheap to clone.
#[derive(Clone)]
pub struct PluginEngine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    engine: Engine,
    config: PluginRuntimeConfig,
    pooling: bool,
    /// Address space reserved by engine creation (the pool), from `VmSize`.
    reserved_bytes: Option<u64>,
    cache: Option<Arc<CompileCache>>,
    ticker: EpochTicker,
}

impl std::fmt::Debug for PluginEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginEngine")
            .field("config", &self.inner.config)
            .field("pooling", &self.inner.pooling)
            .field("reserved_bytes", &self.inner.reserved_bytes)
            .finish_non_exhaustive()
    }
}

impl PluginEngine {
    /// Builds the engine, its epoch ticker and (unless disabled) its cache dir.
    pub fn new(config: PluginRuntimeConfig) -> anyhow::Result<Self> {
        config.validate().context("invalid plugin runtime configuration")?;
        let cache = open_cache(&config);
        Self::with_cache(config, cache)
    }

    /// As [`Self::new`], with the compile cache already opened (by
    /// [`open_cache`]), so a caller can read it while the engine is built.
    pub fn with_cache(config: PluginRuntimeConfig, cache: Option<Arc<CompileCache>>) -> anyhow::Result<Self> {
        config.validate().context("invalid plugin runtime configuration")?;
        let before = vm_size_bytes();
        let (engine, pooling) = if config.pooling {
            match Engine::new(&wasmtime_config(&config, true)) {
                Ok(engine) => (engine, true),
                Err(err) => {
                    tracing::warn!(
                        error = %format!("{err:#}"),
                        max_live_stores = config.max_live_stores,
                        "cannot create the pooling instance allocator; falling back to on-demand allocation"
                    );
                    (build_on_demand(&config)?, false)
                }
            }
        } else {
            (build_on_demand(&config)?, false)
        };
        let reserved_bytes = match (before, vm_size_bytes()) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before)),
            _ => None,
        };
        let cache_dir = cache.as_ref().map(|c| c.dir().to_path_buf());
        tracing::info!(
            pooling,
            max_live_stores = config.max_live_stores,
            memory_limit_bytes = config.memory_limit_bytes,
            call_deadline_ms = config.call_deadline_ms,
            reserved_virtual_bytes = reserved_bytes,
            cache_dir = cache_dir.as_ref().map(|d| d.display().to_string()),
            "plugin engine ready"
        );
        let ticker = EpochTicker::start(&engine, Duration::from_millis(config.epoch_tick_ms))?;
        Ok(Self { inner: Arc::new(EngineInner { engine, config, pooling, reserved_bytes, cache, ticker }) })
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The configuration the engine was built with.
    pub fn config(&self) -> &PluginRuntimeConfig {
        &self.inner.config
    }

    /// True when the pooling allocator is in use (false after a fallback).
    pub fn is_pooling(&self) -> bool {
        self.inner.pooling
    }

    /// Virtual address space reserved when the engine was created (the
    /// instance pool), as measured from `/proc/self/status`. Linux only.
    pub fn reserved_virtual_bytes(&self) -> Option<u64> {
        self.inner.reserved_bytes
    }

    /// Where compiled components are cached, if anywhere: `None` when the
    /// cache is off or its directory could not be trusted.
    pub fn cache_dir(&self) -> Option<&std::path::Path> {
        self.inner.cache.as_deref().map(CompileCache::dir)
    }

    /// The compile cache, if any.
    pub(crate) fn cache(&self) -> Option<&CompileCache> {
        self.inner.cache.as_deref()
    }

    /// The epoch tick period.
    pub fn epoch_tick(&self) -> Duration {
        self.inner.ticker.period
    }
}

/// Opens the compile cache `config` asks for, keyed from the default state
/// directory: `None` when it is off, or (with one warning) when its
/// directory cannot be trusted or there is no key.
pub fn open_cache(config: &PluginRuntimeConfig) -> Option<Arc<CompileCache>> {
    open_cache_in(config, &crate::state::StateSettings::default())
}

/// As [`open_cache`], with the key from the state directory `state` names.
pub fn open_cache_in(config: &PluginRuntimeConfig, state: &crate::state::StateSettings) -> Option<Arc<CompileCache>> {
    let dir = config.effective_cache_dir()?;
    let key = match crate::state::StateDir::open_configured(state).and_then(|state| state.cache_key()) {
        Ok(key) => key,
        Err(err) => {
            tracing::warn!(
                dir = %dir.display(),
                "no key for the compile cache ({err:#}); compiling without a cache"
            );
            return None;
        }
    };
    match CompileCache::open(&dir, config.cache_max_bytes, key) {
        Ok(cache) => Some(Arc::new(cache)),
        Err(why) => {
            tracing::warn!(
                dir = %dir.display(),
                "the compile cache directory cannot be trusted ({why}); compiling without a cache"
            );
            None
        }
    }
}

fn build_on_demand(config: &PluginRuntimeConfig) -> anyhow::Result<Engine> {
    Engine::new(&wasmtime_config(config, false))
        .map_err(anyhow::Error::from)
        .context("cannot create the wasmtime engine")
}

fn wasmtime_config(config: &PluginRuntimeConfig, pooling: bool) -> Config {
    let mut c = Config::new();
    c.wasm_component_model(true);
    c.concurrency_support(false);
    c.epoch_interruption(true);
    // Memories never move and never exceed the cap: reserve exactly the cap
    // (plus a small guard) instead of the 4 GiB default, so 10 000 live
    // stores fit in the address space. Bounds checks become explicit.
    c.memory_reservation(config.memory_limit_bytes);
    c.memory_guard_size(2 << 20);
    c.memory_reservation_for_growth(0);
    if pooling {
        let n = config.max_live_stores;
        let mut pool = PoolingAllocationConfig::default();
        // A Rust wasip2 component is one component instance holding about
        // three core instances (main module, shim, fixups), one memory and
        // two tables. Totals are caps, not preallocations, except for memory,
        // table and stack slots, whose address space is reserved up front
        // (about 66 MiB per store with the default memory cap: 66 GiB of
        // address space, no RSS, for 1 024 stores).
        pool.total_component_instances(n)
            .total_core_instances(n.saturating_mul(4))
            .total_memories(n)
            .total_tables(n.saturating_mul(2))
            .max_memory_size(config.memory_limit_bytes as usize)
            .table_elements(10_000)
            // A store keeps the fiber stack of its last async call cached
            // until it is dropped, so every live store holds one stack.
            .total_stacks(n)
            // Reset a freed slot in place (only the pages it dirtied, when
            // PAGEMAP_SCAN is available) instead of decommitting it whole:
            // the next store of the slot then takes no page faults for them.
            // Measured here, page faults and `madvise` were about a third of
            // the CPU time of a stream of short wasm tasks.
            .pagemap_scan(wasmtime::Enabled::Auto)
            .linear_memory_keep_resident(KEEP_RESIDENT_MEMORY_BYTES)
            .table_keep_resident(KEEP_RESIDENT_TABLE_BYTES);
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    c
}

/// `VmSize` of this process in bytes (Linux), to measure the pool reservation.
pub fn vm_size_bytes() -> Option<u64> {
    proc_status_kib("VmSize:").map(|k| k * 1024)
}

/// `VmRSS` of this process in bytes (Linux).
pub fn rss_bytes() -> Option<u64> {
    proc_status_kib("VmRSS:").map(|k| k * 1024)
}

fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].trim().trim_end_matches("kB").trim().parse().ok()
}

/// The background thread that advances the engine's epoch.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    period: Duration,
}

impl EpochTicker {
    fn start(engine: &Engine, period: Duration) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let weak = engine.weak();
        let thread = std::thread::Builder::new()
            .name("taskhost-epoch".into())
            .spawn({
                let stop = stop.clone();
                move || {
                    while !stop.load(Ordering::Acquire) {
                        std::thread::park_timeout(period);
                        match weak.upgrade() {
                            Some(engine) => engine.increment_epoch(),
                            None => break,
                        }
                    }
                }
            })
            .context("cannot start the epoch ticker thread")?;
        Ok(Self { stop, thread: Some(thread), period })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> PluginRuntimeConfig {
        PluginRuntimeConfig { pooling: false, cache: false, ..PluginRuntimeConfig::default() }
    }

    #[test]
    fn the_epoch_ticker_does_not_keep_the_engine_alive() {
        let engine = PluginEngine::new(PluginRuntimeConfig { epoch_tick_ms: 1, ..small() }).unwrap();
        let weak = engine.engine().weak();
        let thread = engine.inner.ticker.thread.as_ref().unwrap().thread().id();
        std::thread::sleep(Duration::from_millis(20));
        drop(engine);
        // The ticker thread held no strong reference: the engine is gone.
        assert!(weak.upgrade().is_none(), "the wasmtime engine outlived its owner (ticker {thread:?})");
    }

    #[test]
    fn invalid_configs_are_refused_with_the_field_named() {
        let err = PluginEngine::new(PluginRuntimeConfig { memory_limit_bytes: 1024, ..small() }).unwrap_err();
        assert!(format!("{err:#}").contains("memory_limit_bytes"), "{err:#}");
        let err =
            PluginEngine::new(PluginRuntimeConfig { call_deadline_ms: 5, epoch_tick_ms: 10, ..small() }).unwrap_err();
        assert!(format!("{err:#}").contains("epoch_tick_ms"), "{err:#}");
        let parsed: PluginRuntimeConfig = toml::from_str("call_deadline_ms = 250").unwrap();
        assert_eq!(parsed, PluginRuntimeConfig { call_deadline_ms: 250, ..PluginRuntimeConfig::default() });
        assert!(toml::from_str::<PluginRuntimeConfig>("memory_limit = 3").is_err());
    }
}
