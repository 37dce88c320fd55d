//! Set-up the process and stream benches share: the built-in bash plugin on
//! a process host, and a `Host` serving it as the `bash` tool with
//! background runs.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use taskhost::Host;
use taskhost::plugin::resources::ProcessCapability;
use taskhost::plugin::{PluginEngine, PluginRuntimeConfig, WasmProducer};
use taskhost::process::{ProcessGrant, ProcessHost};
use taskhost::settings::TasksSettings;
use taskhost::tools::producer_tool::ProducerToolOptions;

/// The built-in bash plugin, loaded in a fresh engine (its compile cache in
/// the temporary directory), spawning through `host` under `grant`.
pub async fn bash_producer(host: &Arc<ProcessHost>, grant: &ProcessGrant) -> (PluginEngine, Arc<WasmProducer>) {
    let engine = PluginEngine::new(PluginRuntimeConfig {
        cache_dir: Some(std::env::temp_dir().join("taskhost-bench-cache")),
        ..PluginRuntimeConfig::default()
    })
    .unwrap();
    let version = engine.load_bytes("bash", taskhost::builtin::BASH_WASM.to_vec()).await.unwrap();
    let producer = WasmProducer::new(version, json!({}))
        .await
        .unwrap()
        .with_process(ProcessCapability { host: host.clone(), grant: Arc::new(grant.clone()) });
    (engine, Arc::new(producer))
}

/// A `Host` with the default task settings serving `producer` as the
/// `bash` tool, background runs offered.
pub fn bash_tool(producer: Arc<WasmProducer>) -> Host {
    let tools = Host::new(&TasksSettings::default()).unwrap();
    tools
        .add_producer(
            producer,
            ProducerToolOptions::new("bash").with_foreground_timeout(Duration::from_secs(60)).with_promote_after(None),
        )
        .expect("tool name is valid");
    tools
}
