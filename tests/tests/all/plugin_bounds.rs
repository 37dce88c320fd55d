//! Every string a plugin hands the host is bounded, with a visible notice:
//! the `flood` modes of the `misbehave` fixture return a 200 KiB
//! description, a 100 KiB schema, a 100 KiB label, a 100 KiB log line, one
//! 3 MiB `read-output` result and a 100 KiB outcome detail.

use std::time::Duration;

use serde_json::json;
use taskhost::plugin::bounds::{
    MAX_CHUNK_BYTES, MAX_DESCRIPTION_BYTES, MAX_DETAIL_BYTES, MAX_LOG_LINE_BYTES, MAX_SCHEMA_BYTES,
};
use taskhost::plugin::{PluginEngine, WasmProducer};
use taskhost::producer::Producer as _;
use taskhost::tasks::TaskStatus;
use taskhost_tests::fixtures;
use taskhost_tests::registry_fixture::OwnedRegistry;

/// Room for the truncation notice after a capped string.
const NOTICE: usize = 200;

fn engine() -> PluginEngine {
    taskhost_tests::engine(|config| {
        config.pooling = false;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_description_is_cut_with_a_notice_and_a_huge_schema_refused() {
    let engine = engine();
    let version = engine.load_file(fixtures::MISBEHAVE_PATH).await.unwrap();
    let producer = WasmProducer::new(version.clone(), json!({"describe": "flood"})).await.unwrap();
    let description = producer.descriptor().description.clone();
    assert!(description.len() <= MAX_DESCRIPTION_BYTES + NOTICE, "{} bytes", description.len());
    assert!(
        description.ends_with(&format!(
            "… [taskhost: description truncated to {MAX_DESCRIPTION_BYTES} of {} bytes; the limit is {MAX_DESCRIPTION_BYTES}]",
            200 * 1024
        )),
        "{}",
        &description[description.len() - NOTICE..]
    );

    let error = format!("{:#}", WasmProducer::new(version, json!({"describe": "huge-schema"})).await.unwrap_err());
    assert!(error.contains(&format!("over the {MAX_SCHEMA_BYTES}-byte limit of a parameter schema")), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_task_has_its_label_output_detail_and_log_line_cut() {
    let engine = engine();
    let version = engine.load_file(fixtures::MISBEHAVE_PATH).await.unwrap();
    let producer = WasmProducer::new(version, json!({})).await.unwrap();
    let owned = OwnedRegistry::new();
    let (registry, agent) = (&owned.registry, &owned.agent);
    let prepared = OwnedRegistry::prepare(&producer, json!({"fault": "flood"})).await;
    assert_eq!(prepared.label.chars().count(), 200, "labels are one line of 200 characters at most");
    let id = owned.start(&producer, prepared).await;
    let snapshot = registry.wait(&id, Duration::from_secs(10), Some(agent), None).await.unwrap();
    assert_eq!(snapshot.status, TaskStatus::Completed, "{snapshot:?}");
    let detail = snapshot.detail.expect("detail");
    assert!(detail.len() <= MAX_DETAIL_BYTES + NOTICE, "{} bytes", detail.len());
    assert!(detail.contains("[taskhost: outcome detail truncated to 4096 of 102400 bytes"), "{}", &detail[4000..]);

    let mut output = String::new();
    loop {
        let read = registry.read(&id, Some(agent)).await.unwrap();
        output.push_str(&read.text);
        if read.text.is_empty() {
            break;
        }
    }
    assert!(output.len() <= MAX_CHUNK_BYTES + NOTICE, "{} bytes of output", output.len());
    assert!(
        output.ends_with(&format!(
            "… [taskhost: read-output chunk truncated to {MAX_CHUNK_BYTES} of {} bytes; the limit is {MAX_CHUNK_BYTES}]",
            3 << 20
        )),
        "{}",
        &output[output.len().saturating_sub(NOTICE)..]
    );

    let logs = taskhost_tests::logs::captured();
    let line = logs.lines().find(|l| l.contains("ggggg")).expect("the flooding log line was logged");
    assert!(line.len() <= MAX_LOG_LINE_BYTES + 2 * NOTICE, "a log line of {} bytes", line.len());
    assert!(line.contains("[taskhost: log line truncated to 8192 of 102400 bytes"), "{}", &line[line.len() - NOTICE..]);
}
