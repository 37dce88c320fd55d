//! `taskhost check <plugin.wasm|taskhost.toml> [--config JSON]`: is this a
//! plugin taskhost can serve, and what will the model see?
//!
//! Model: two stages, stopping at the first that fails. First the contract,
//! on the component's names and types alone, without compiling
//! ([`crate::plugin::preflight`]): imports taskhost does not provide,
//! contract version skew, a missing export or function, a capability it
//! imports that its configuration does not grant (naming the grant to add;
//! a `.wasm` target is granted only what its flags grant). Then the exact load
//! path of `taskhost serve` ([`super::target::open`]: compile, link,
//! signatures, `describe(config)`, the descriptor checks, the grants), and
//! the tool definition(s) printed as the model sees them, with
//! `run_in_background` when the instance offers it.
//!
//! Exit codes: 0 the plugin is valid, 1 it is not (the message says what to
//! change), 2 a usage mistake (bad flags, a missing file, `--config` not a
//! JSON object), 141 stdout was closed before the answer was written (`|
//! head -1`; see [`super::out`]).

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use crate::config::ProducerSource;

use super::out::outln;
use super::target::{PluginTarget, usage};
use crate::plugin::preflight::preflight;
use taskhost_core::producer::Producer as _;

/// The `--help` epilogue: what scripts may rely on.
pub const EXIT_CODES: &str = "\
Exit codes: 0 the plugin is valid; 1 it is not (the error says what to change); \
2 a usage mistake (bad arguments, a missing file, --config that is not a JSON object); \
141 stdout was closed before the whole answer was written (e.g. `| head -1`), quietly.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXIT_CODES)]
pub struct CheckArgs {
    #[command(flatten)]
    pub target: PluginTarget,
}

pub async fn run(args: CheckArgs) -> anyhow::Result<()> {
    let target = &args.target;
    let (config, base_dir) = target.config()?;

    // Stage 1: the contract, per plugin file, without compiling.
    for entry in &config.producers {
        let (path, bytes) = match &entry.plugin {
            ProducerSource::Native(_) => continue,
            ProducerSource::Builtin(builtin) => (PathBuf::from(entry.plugin.to_string()), builtin.wasm.to_vec()),
            ProducerSource::File(file) => {
                let path = base_dir.join(file);
                match std::fs::read(&path) {
                    Ok(bytes) => (path, bytes),
                    Err(err) => usage!("cannot read plugin {}: {err}", path.display()),
                }
            }
        };
        let started = Instant::now();
        // A capability it imports but is not granted first: the grant to add
        // (a ComponentizeJS component importing wasi:http by default among them).
        if let Some(imports) = crate::plugin::preflight::imports_of(&bytes) {
            let grants = entry.effective_grants()?;
            crate::plugin::preflight::check_grants(&imports, |capability| grants.grants(capability))
                .map_err(|err| err.context(format!("plugin {}", path.display())))?;
        }
        let checked = preflight(&bytes).map_err(|err| err.context(format!("plugin {}", path.display())))?;
        let took = started.elapsed();
        match checked {
            Some(found) => {
                outln!(
                    "contract: {} fits taskhost:producer@{} (checked in {:.1} ms, before compiling)",
                    path.display(),
                    found.contract_version,
                    took.as_secs_f64() * 1000.0
                )?;
                let imports = if found.imports.is_empty() { "none".to_string() } else { found.imports.join(", ") };
                outln!("imports: {imports}")?;
            }
            None => outln!("contract: {} could not be decoded; compiling it will say why", path.display())?,
        }
    }

    // Stage 2: the load path of `serve`, and describe.
    let started = Instant::now();
    let session = super::target::open(target, "check", super::target::Records::Memory).await?;
    // Disposed whatever the printing does (a closed stdout stops it).
    let printed = print_definitions(&session, started);
    session.host.dispose().await;
    printed?;
    outln!()?;
    outln!("ok: {} is a valid taskhost producer plugin", target.target.display())?;
    Ok(())
}

/// The tool definition(s) as the model sees them.
fn print_definitions(session: &super::target::Session, started: Instant) -> anyhow::Result<()> {
    outln!("loaded and described in {:.0} ms", started.elapsed().as_secs_f64() * 1000.0)?;
    let definitions = session.host.tool_definitions();
    for served in &session.served {
        let serving = served.plugin.serving();
        let descriptor = served.plugin.producer().descriptor().clone();
        let Some(definition) = definitions.iter().find(|d| d.name == served.plugin.tool()) else {
            continue;
        };
        outln!()?;
        outln!(
            "tool {} — plugin {} ({}), kind {}, {}",
            definition.name,
            serving.version.version(),
            match serving.version.compile_source() {
                crate::plugin::CompileSource::Compiled => "compiled now",
                crate::plugin::CompileSource::Cache => "from the compile cache",
            },
            descriptor.kind,
            if descriptor.streams_output { "streamed output (consuming reads)" } else { "final output only" }
        )?;
        outln!("as the model sees it:")?;
        let shown = json!({
            "name": definition.name,
            "description": definition.description,
            "inputSchema": definition.input_schema,
        });
        outln!("{}", serde_json::to_string_pretty(&shown)?)?;
    }
    Ok(())
}
