//! The bash plugin's environment: a credential in the host's environment is
//! invisible to commands, explicit entries from the plugin config win over
//! the scrub, and the terminal is model-friendly.
//!
//! Its own test binary with a single test: it sets a variable in the test
//! process's environment, which must not race other threads reading it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use taskhost::Host;
use taskhost::capabilities::process::{ProcessCapability, ProcessGrant, ProcessHost, ProcessHostConfig};
use taskhost::config::TasksSettings;
use taskhost::plugin::{PluginEngine, PluginRuntimeConfig, WasmProducer};
use taskhost::tools::CallContext;
use taskhost::tools::producer_tool::ProducerToolOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_secrets_are_scrubbed_and_config_entries_win() {
    // SAFETY: the only test of this binary sets it before any other thread
    // of ours reads the environment.
    unsafe {
        std::env::set_var("TASKHOST_E2E_SECRET_TOKEN", "hunter2");
        std::env::set_var("TASKHOST_E2E_DB_PASSWORD", "swordfish");
        std::env::set_var("TASKHOST_E2E_PLAIN", "visible");
    }
    let engine = PluginEngine::new(PluginRuntimeConfig {
        cache_dir: Some(std::env::temp_dir().join(format!("taskhost-bash-env-cache-{}", std::process::id()))),
        ..PluginRuntimeConfig::default()
    })
    .unwrap();
    let version = engine.load_file(taskhost::builtin::BASH_PATH).await.unwrap();
    let config = json!({"env": {"MY_API_KEY": "from-config"}});
    let grant = ProcessGrant { programs: vec!["bash".into()], ..ProcessGrant::default() };
    let processes = ProcessHost::new(&ProcessHostConfig::default()).unwrap();
    let producer = WasmProducer::new(version, config)
        .await
        .unwrap()
        .with_process(ProcessCapability { host: processes, grant: Arc::new(grant) });
    let host = Host::new(&TasksSettings::default()).unwrap();
    host.add_producer(
        Arc::new(producer),
        ProducerToolOptions { name: "bash".into(), background: true, foreground_timeout: Duration::from_secs(30) },
    )
    .expect("tool name is valid");
    let agent = host.create_agent("agent", "session").unwrap();
    let command = "echo \"[${TASKHOST_E2E_SECRET_TOKEN:-unset}] [${TASKHOST_E2E_DB_PASSWORD:-unset}] \
                   [${TASKHOST_E2E_PLAIN:-unset}] [$MY_API_KEY] [$NO_COLOR $TERM $PAGER $GIT_PAGER]\"; \
                   env | grep -c -e hunter2 -e swordfish";
    let reply = host.call_tool("bash", json!({"command": command}), &CallContext::for_agent(&agent)).await.unwrap();
    assert_eq!(
        reply.text,
        "[unset] [unset] [visible] [from-config] [1 dumb cat cat]\n0\n[status: completed, exit code: 1]"
    );
}
