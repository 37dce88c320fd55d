//! Loading a plugin: bytes → validated, compiled, pre-instantiated version.
//!
//! Model: a [`PluginVersion`] is one immutable build of a plugin, identified
//! by the SHA-256 of its bytes (`<name>@<first 12 hex digits>`). Loading
//! checks, in order, and stops at the first problem with an error that says
//! what is wrong: the bytes are WebAssembly at all; they are a component, not
//! a core module; its imports and exports fit the `plugin` world by name and
//! contract version, read without compiling ([`super::preflight`], skipped
//! when the compiled code is cached); they compile (truncated or corrupt files fail here); every
//! import is one the host provides (named when not); the component exports
//! `taskhost:producer/producer@<version>` of a contract version the host
//! serves (0.1.z or 0.2.z: that export's version is the plugin's
//! [`ContractVersion`]) with every function of that version's contract, at
//! the right signature (checked one by one in a throwaway instance).
//!
//! Invariants:
//! - A loaded version is never mutated; reload makes a new one. Each task
//!   keeps an `Arc` of the version that started it.
//! - `InstancePre` is built once per version; a task store costs one
//!   pre-instantiation from it.
//! - Compiled code is cached under the engine's cache dir, keyed by content
//!   hash and engine compatibility hash. A cached load deserializes from
//!   verified in-memory bytes and never compiles; an entry that fails a check
//!   of [`super::cache`] (owner, mode, symlink, digest) or is incompatible is
//!   deleted, recompiled and replaced.

use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use sha2::Digest as _;
use wasmtime::Store;
use wasmtime::component::{Component, Instance, Resource, ResourceAny};
use wasmtime_wasi::p2::DynPollable;

use super::bindings::{v0_1, v0_2};
use super::cache::Lookup;
use super::contract::{ContractVersion, PRODUCER_EXPORT};
use super::contract::{PRODUCER_EXPORT_PREFIX, sniff};
use super::engine::PluginEngine;
use super::fault;
use super::state::{StoreState, StoreTag};
use super::versions::PluginPre;

/// Where a plugin version came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PluginSource {
    File(PathBuf),
    /// Bytes handed to the host (a built-in plugin embedded in the binary).
    Bytes,
}

/// How the compiled code was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileSource {
    /// Compiled now (and written to the cache if there is one).
    Compiled,
    /// Deserialized from the compile cache; nothing was compiled.
    Cache,
}

/// One loaded, validated and pre-instantiated build of a plugin.
pub struct PluginVersion {
    engine: PluginEngine,
    name: Arc<str>,
    version: Arc<str>,
    hash: String,
    source: PluginSource,
    component: Component,
    contract: ContractVersion,
    pre: PluginPre,
    compile_source: CompileSource,
    load_time: Duration,
    imports: Vec<String>,
    runs: AtomicU64,
}

impl std::fmt::Debug for PluginVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginVersion")
            .field("version", &self.version)
            .field("source", &self.source)
            .field("compile_source", &self.compile_source)
            .finish_non_exhaustive()
    }
}

impl PluginVersion {
    /// The plugin name (file stem or the name given with the bytes).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `<name>@<12 hex digits of the content hash>`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The full SHA-256 of the component bytes, in hex.
    pub fn content_hash(&self) -> &str {
        &self.hash
    }

    pub fn source(&self) -> &PluginSource {
        &self.source
    }

    /// Whether the compiled code came from the cache.
    pub fn compile_source(&self) -> CompileSource {
        self.compile_source
    }

    /// Wall time of the whole load (read, compile or deserialize, validate).
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// The component's imports, by name.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    pub fn engine(&self) -> &PluginEngine {
        &self.engine
    }

    pub fn component(&self) -> &Component {
        &self.component
    }

    pub(crate) fn pre(&self) -> &PluginPre {
        &self.pre
    }

    /// The contract version the plugin was built against.
    pub fn contract(&self) -> ContractVersion {
        self.contract
    }

    /// A new store for this version, tagged with `purpose`.
    pub(crate) fn new_store(&self, purpose: impl Into<Arc<str>>) -> Store<StoreState> {
        let tag = StoreTag { plugin: self.name.clone(), version: self.version.clone(), purpose: purpose.into() };
        StoreState::new(&self.engine, tag).into_store(&self.engine)
    }

    /// The sequence number of the next task this version runs (from 1).
    pub(crate) fn next_run(&self) -> u64 {
        self.runs.fetch_add(1, Ordering::Relaxed) + 1
    }
}

impl PluginEngine {
    /// Loads a plugin from a file. The plugin name is the file stem.
    pub async fn load_file(&self, path: impl AsRef<Path>) -> anyhow::Result<Arc<PluginVersion>> {
        let path = path.as_ref();
        let bytes = tokio::fs::read(path).await.with_context(|| format!("cannot read plugin {}", path.display()))?;
        self.load_file_bytes(path, bytes).await
    }

    /// Loads the bytes already read from the plugin file `path`.
    pub async fn load_file_bytes(&self, path: &Path, bytes: Vec<u8>) -> anyhow::Result<Arc<PluginVersion>> {
        self.load(plugin_name_of(path), bytes, PluginSource::File(path.to_path_buf()))
            .await
            .with_context(|| format!("cannot load plugin {}", path.display()))
    }

    /// Loads a plugin from bytes (a built-in plugin embedded in the binary).
    pub async fn load_bytes(&self, name: &str, bytes: impl Into<Vec<u8>>) -> anyhow::Result<Arc<PluginVersion>> {
        self.load(name.to_string(), bytes.into(), PluginSource::Bytes)
            .await
            .with_context(|| format!("cannot load plugin {name}"))
    }

    async fn load(&self, name: String, bytes: Vec<u8>, source: PluginSource) -> anyhow::Result<Arc<PluginVersion>> {
        let started = Instant::now();
        sniff(&bytes)?;
        let hash = content_hash(&bytes);
        let version: Arc<str> = format!("{name}@{}", &hash[..12]).into();
        let engine = self.clone();
        let key = hash.clone();
        let (component, compile_source) = tokio::task::spawn_blocking(move || engine.compile_cached(&key, &bytes))
            .await
            .context("the compile worker panicked")??;

        let imports =
            component.component_type().imports(self.engine()).map(|(name, _)| name.to_string()).collect::<Vec<_>>();
        let linker = super::host::linker(self)?;
        let instance_pre = linker.instantiate_pre(&component).map_err(|err| {
            anyhow!(
                "the component imports something taskhost does not provide: {err:#}. \
                 taskhost provides {}",
                super::host::PROVIDED_IMPORTS
            )
        })?;
        let (contract, export) = check_export_names(self, &component)?;
        let pre = PluginPre::new(contract, instance_pre)
            .map_err(anyhow::Error::from)
            .context("the component does not match the `plugin` world")?;

        let version = PluginVersion {
            engine: self.clone(),
            name: name.into(),
            version,
            hash,
            source,
            component,
            contract,
            pre,
            compile_source,
            load_time: Duration::ZERO,
            imports,
            runs: AtomicU64::new(0),
        };
        // Signatures can only be checked against an instance: make one.
        let deadline = self.config().instantiation_deadline();
        let mut retries = 0;
        let (mut store, instantiated) = loop {
            let mut store = version.new_store("validate");
            let clock = fault::arm(&mut store, deadline);
            let instantiated = fault::bounded(&clock, version.pre.instance_pre().instantiate_async(&mut store)).await;
            match instantiated {
                Err(err) if retries < super::versions::TRANSIENT_RETRIES && super::versions::is_transient(&err) => {
                    retries += 1;
                    tracing::debug!(plugin = %version.name, error = %format!("{err:#}"), "instantiation failed for a passing reason; trying again");
                    tokio::task::yield_now().await;
                }
                instantiated => break (store, instantiated),
            }
        };
        let instance = instantiated.map_err(|err| {
            anyhow!("cannot instantiate the component: {}", fault::classify(&store, deadline, "instantiation", &err))
        })?;
        check_signatures(&mut store, &instance, contract, &export)?;
        drop(store);

        let version = PluginVersion { load_time: started.elapsed(), ..version };
        tracing::info!(
            plugin = %version.name,
            version = %version.version,
            contract = %version.contract,
            compile = ?version.compile_source,
            load_ms = version.load_time.as_secs_f64() * 1000.0,
            "plugin loaded"
        );
        Ok(Arc::new(version))
    }

    /// Compiles `bytes`, or deserializes them from the verified cache.
    fn compile_cached(&self, hash: &str, bytes: &[u8]) -> anyhow::Result<(Component, CompileSource)> {
        let cache = self.cache().map(|cache| {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            self.engine().precompile_compatibility_hash().hash(&mut hasher);
            (cache, format!("{hash}-{:016x}", hasher.finish()))
        });
        if let Some((cache, key)) = &cache {
            match cache.load(key) {
                Lookup::Hit(artifact) => {
                    // SAFETY: `artifact` is in memory, was read from an
                    // owner-only file of the server's user in its checked
                    // cache directory, and matches the digest written with it
                    // for this key (content hash + engine compatibility hash),
                    // so it is what `Component::serialize` produced here for
                    // these bytes (see `cache`). wasmtime re-checks the engine
                    // compatibility on deserialize.
                    match unsafe { Component::deserialize(self.engine(), &artifact) } {
                        Ok(component) => return Ok((component, CompileSource::Cache)),
                        Err(err) => {
                            tracing::warn!(
                                file = %cache.entry_path(key).display(),
                                error = %format!("{err:#}"),
                                "unusable compile cache entry; recompiling"
                            );
                            cache.discard(key);
                        }
                    }
                }
                Lookup::Miss => {}
                Lookup::Refused(why) => tracing::warn!(
                    file = %cache.entry_path(key).display(),
                    "refused a compile cache entry ({why}); deleted it and recompiling"
                ),
            }
        }
        // The contract is checked on the names and types before compiling:
        // compiling a large component takes seconds, this milliseconds. Only
        // here: cached code passed it when it was compiled (a component that
        // fails it is never compiled, so never cached).
        super::preflight::preflight(bytes)?;
        let component = Component::new(self.engine(), bytes).map_err(|err| {
            let text = format!("{err:#}");
            let truncated = text.contains("end-of-file")
                || text.contains("unexpected end")
                || (text.contains("section range") && text.contains("out of bounds"));
            if truncated {
                anyhow!("the file is truncated: it is not a complete WebAssembly component ({text})")
            } else {
                anyhow!("the file is not a valid WebAssembly component (corrupt?): {text}")
            }
        })?;
        if let Some((cache, key)) = &cache {
            let stored = component
                .serialize()
                .map_err(anyhow::Error::from)
                .and_then(|artifact| cache.store(key, &artifact).map_err(anyhow::Error::from));
            if let Err(err) = stored {
                tracing::warn!(
                    file = %cache.entry_path(key).display(),
                    error = %format!("{err:#}"),
                    "cannot write the compile cache"
                );
            }
        }
        Ok((component, CompileSource::Compiled))
    }
}

/// Finds the `producer` export, reads the contract version from its name,
/// and checks that each function of that version is exported.
fn check_export_names(engine: &PluginEngine, component: &Component) -> anyhow::Result<(ContractVersion, String)> {
    let exports: Vec<String> =
        component.component_type().exports(engine.engine()).map(|(name, _)| name.to_string()).collect();
    let found = exports.iter().find(|name| name.starts_with(PRODUCER_EXPORT_PREFIX));
    let Some((name, contract)) = found.and_then(|name| Some((name, ContractVersion::of_export(name)?))) else {
        if let Some(name) = found {
            bail!(
                "the component exports `{name}`, a contract version this host does not serve; this host \
                 speaks {} (newest: {PRODUCER_EXPORT}): build the plugin against the `wit/` of this taskhost",
                ContractVersion::spoken()
            );
        }
        let exports = if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports.iter().map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", ")
        };
        bail!(
            "the component does not export `{PRODUCER_EXPORT}`, so it is not a taskhost producer \
             (world `taskhost:producer/plugin`); it exports {exports}"
        );
    };
    let iface =
        component.get_export_index(None, name).ok_or_else(|| anyhow!("the component lost its `{name}` export"))?;
    let missing = contract
        .functions()
        .iter()
        .filter(|f| component.get_export_index(Some(&iface), f).is_none())
        .map(|f| format!("`{f}`"))
        .collect::<Vec<_>>();
    if !missing.is_empty() {
        bail!("the export `{name}` lacks {} of the contract", missing.join(", "));
    }
    Ok((contract, name.clone()))
}

/// Type-checks each contract function against the WIT signature of the
/// plugin's contract version.
fn check_signatures(
    store: &mut Store<StoreState>,
    instance: &Instance,
    contract: ContractVersion,
    export: &str,
) -> anyhow::Result<()> {
    let iface = instance
        .get_export_index(&mut *store, None, export)
        .ok_or_else(|| anyhow!("the component does not export `{export}`"))?;
    macro_rules! check {
        ($name:literal, $sig:literal, $params:ty, $results:ty) => {{
            let index = instance
                .get_export_index(&mut *store, Some(&iface), $name)
                .ok_or_else(|| anyhow!("the export `{export}` lacks `{}`", $name))?;
            instance.get_typed_func::<$params, $results>(&mut *store, &index).map_err(|err| {
                anyhow!("`{}` in `{export}` has the wrong signature (expected `{}`): {err:#}", $name, $sig)
            })?;
        }};
    }
    macro_rules! check_common {
        ($($segment:ident)::+) => {{
            use $($segment)::+::{Descriptor, Outcome, RunMode};
            check!("describe", "func(config: string) -> result<descriptor, string>", (&str,), (Result<Descriptor, String>,));
            check!(
                "label",
                "func(config: string, args: string) -> result<string, string>",
                (&str, &str),
                (Result<String, String>,)
            );
            check!(
                "run",
                "func(config: string, args: string, mode: run-mode) -> result<task, string>",
                (&str, &str, RunMode),
                (Result<ResourceAny, String>,)
            );
            check!("[method]task.cancel", "func(reason: option<string>)", (ResourceAny, Option<&str>), ());
            check!("[method]task.subscribe", "func() -> pollable", (ResourceAny,), (Resource<DynPollable>,));
            check!("[method]task.done", "func() -> option<outcome>", (ResourceAny,), (Option<Outcome>,));
            check!("[method]task.read-output", "func() -> string", (ResourceAny,), (String,));
        }};
    }
    match contract {
        ContractVersion::V0_1 => check_common!(v0_1::exports::taskhost::producer::producer),
        ContractVersion::V0_2 => {
            check_common!(v0_2::exports::taskhost::producer::producer);
            check!(
                "[method]task.write-input",
                "func(data: list<u8>, close: bool) -> result<_, string>",
                (ResourceAny, &[u8], bool),
                (Result<(), String>,)
            );
        }
    }
    Ok(())
}

/// The name a plugin file is loaded under: its stem, `_` spelled `-`.
pub fn plugin_name_of(path: &Path) -> String {
    path.file_stem().and_then(|s| s.to_str()).map(|s| s.replace('_', "-")).unwrap_or_else(|| "plugin".to_string())
}

/// The SHA-256 of a component's bytes, in hex: what identifies a version
/// ([`PluginVersion::content_hash`]) and keys its cache entries.
pub fn content_hash(bytes: &[u8]) -> String {
    hex(&sha2::Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniff_tells_core_modules_garbage_and_truncation_apart() {
        let core = sniff(b"\0asm\x01\0\0\0").unwrap_err().to_string();
        assert!(core.contains("core WebAssembly module, not a component"), "{core}");
        let garbage = sniff(b"#!/bin/sh\necho").unwrap_err().to_string();
        assert!(garbage.contains("not a WebAssembly file"), "{garbage}");
        let short = sniff(b"\0asm\x0d").unwrap_err().to_string();
        assert!(short.contains("truncated"), "{short}");
        assert!(sniff(b"\0asm\x0d\0\x01\0").is_ok());
    }
}
