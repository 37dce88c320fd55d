//! The messages a plugin author gets for the runtime mistakes `check` cannot
//! see before running: a schema error (with its location) and an export that
//! blocks (naming the deadline and the fix). Real `misbehave` fixture
//! component, real engine and registry.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use taskhost::plugin::fault::DEADLINE_FIX;
use taskhost::plugin::{PluginVersion, WasmProducer};
use taskhost::producer::{Producer, RunMode};
use taskhost::tasks::{RegistryConfig, TaskRegistry, TaskStart, TaskStatus};
use taskhost_tests::fixtures;

const CALL_DEADLINE_MS: u64 = 1000;
const BOUND: Duration = Duration::from_secs(20);

async fn misbehave() -> Arc<PluginVersion> {
    let engine = taskhost_tests::engine(|config| {
        config.call_deadline_ms = CALL_DEADLINE_MS;
        config.pooling = false;
    });
    engine.load_file(fixtures::MISBEHAVE_PATH).await.expect("load misbehave")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_error_names_its_location() {
    let err = WasmProducer::new(misbehave().await, json!({"describe": "bad-schema"})).await.expect_err("bad schema");
    let text = format!("{err:#}");
    assert!(
        text.contains(
            "plugin misbehave returned a bad descriptor from describe: parameters is not a valid JSON Schema: \
             at /properties/count/type: "
        ),
        "{text}"
    );
    assert!(text.contains("\"integr\""), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_export_is_told_the_deadline_and_the_fix() {
    let producer = WasmProducer::new(misbehave().await, json!({})).await.expect("describe");
    let want = |export: &str| {
        format!(
            "plugin misbehave exceeded its {CALL_DEADLINE_MS} ms call deadline in {export} while blocked in a host \
             function (a sleep or a blocking wait, such as Python's `time.sleep` or a `block` on a pollable): \
             {DEADLINE_FIX}"
        )
    };

    // In `run`: the call is refused with the message.
    let prepared = producer.prepare(json!({"fault": "block", "in": "run"}), RunMode::Background).await.unwrap();
    let refused = match tokio::time::timeout(BOUND, (prepared.run)()).await.expect("bounded") {
        Ok(_) => panic!("a run that blocks past its deadline was accepted"),
        Err(err) => format!("{err:#}"),
    };
    assert!(refused.contains(&want("run")), "{refused}");

    // In `done`: the task fails with it.
    let agents = taskhost::agents::AgentRegistry::new();
    let agent = agents.create("agent", "session-1").expect("agent");
    let registry = TaskRegistry::new(agents, RegistryConfig::default());
    let _surface = registry.attach_surface("test");
    let prepared = producer.prepare(json!({"fault": "block", "in": "done"}), RunMode::Background).await.unwrap();
    let id = registry
        .start(
            TaskStart::new(producer.descriptor().kind.clone(), prepared.label, prepared.run)
                .with_owner(Some(agent.clone()))
                .with_producer_info(prepared.producer_info),
        )
        .await
        .expect("start");
    let snapshot = registry.wait(&id, BOUND, Some(&agent), None).await.expect("wait");
    assert_eq!(snapshot.status, TaskStatus::Failed, "{snapshot:?}");
    let detail = snapshot.detail.unwrap_or_default();
    assert!(detail.contains(&want("task.done")), "{detail}");
}
