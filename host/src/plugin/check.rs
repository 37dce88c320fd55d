//! Load, validate and describe a plugin without serving it: the library
//! form of `taskhost check` (the command, `cli/check.rs`, adds the
//! pre-compile contract report and goes through the `serve` path to print
//! the tool definition as the model sees it).
//!
//! Model: [`check_plugin`] runs the exact load path a host uses (header,
//! compile, imports, exports, signatures, then `describe(config)`) on a
//! private engine without the instance pool, and reports what the plugin
//! would serve. Its `Display` is the text the CLI prints.

use std::fmt;
use std::path::Path;

use anyhow::Context as _;

use super::component::CompileSource;
use super::engine::{PluginEngine, PluginRuntimeConfig};
use super::producer::describe;
use taskhost_core::producer::Descriptor;

/// What a checked plugin would serve.
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub path: std::path::PathBuf,
    /// `<name>@<short hash>`.
    pub version: String,
    pub content_hash: String,
    pub compile_source: CompileSource,
    pub imports: Vec<String>,
    pub descriptor: Descriptor,
}

/// Loads the plugin at `path`, validates it against the `plugin` world and
/// describes it with `config_json` (`{}` when empty).
pub async fn check_plugin(path: impl AsRef<Path>, config_json: &str) -> anyhow::Result<CheckReport> {
    let config = PluginRuntimeConfig { pooling: false, ..PluginRuntimeConfig::default() };
    check_plugin_with(&PluginEngine::new(config)?, path, config_json).await
}

/// [`check_plugin`] on an existing engine.
pub async fn check_plugin_with(
    engine: &PluginEngine,
    path: impl AsRef<Path>,
    config_json: &str,
) -> anyhow::Result<CheckReport> {
    let path = path.as_ref();
    let config_json = if config_json.trim().is_empty() { "{}" } else { config_json };
    let _: serde_json::Value = serde_json::from_str(config_json).context("the plugin config is not valid JSON")?;
    let version = engine.load_file(path).await?;
    let descriptor = describe(&version, config_json)
        .await
        .with_context(|| format!("plugin {} loads but cannot describe itself", path.display()))?;
    Ok(CheckReport {
        path: path.to_path_buf(),
        version: version.version().to_string(),
        content_hash: version.content_hash().to_string(),
        compile_source: version.compile_source(),
        imports: version.imports().to_vec(),
        descriptor,
    })
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.descriptor;
        writeln!(f, "ok: {} is a valid taskhost producer plugin", self.path.display())?;
        writeln!(f, "version: {} (sha256 {})", self.version, self.content_hash)?;
        writeln!(f, "imports: {}", if self.imports.is_empty() { "none".to_string() } else { self.imports.join(", ") })?;
        writeln!(f)?;
        writeln!(f, "tool kind: {}", d.kind)?;
        writeln!(f, "output: {}", if d.streams_output { "streamed (consuming reads)" } else { "final output only" })?;
        writeln!(f, "description:")?;
        for line in d.description.lines() {
            writeln!(f, "  {line}")?;
        }
        writeln!(f, "parameters (JSON Schema, without run_in_background):")?;
        let schema = serde_json::to_string_pretty(&d.parameters).map_err(|_| fmt::Error)?;
        for line in schema.lines() {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}
