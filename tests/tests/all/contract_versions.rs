//! A plugin built against the previous contract keeps working when the next
//! one ships: the `contract-v0_1` fixture (built from its own copy of the
//! frozen `taskhost:producer@0.1.0` WIT) is served in the same host as the
//! real 0.2.0 plugins (`bash`, `ticker`), through the public surface:
//! load, the pre-compile check, `describe`, foreground and background runs,
//! streamed output, cancel, the 0.1.0 `process` import, and input refused
//! for a kind that cannot take it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use taskhost::Host;
use taskhost::plugin::resources::ProcessCapability;
use taskhost::plugin::{ContractVersion, PluginEngine, WasmProducer};
use taskhost::process::{ProcessGrant, ProcessHost, ProcessHostConfig};
use taskhost::settings::TasksSettings;
use taskhost::tools::CallContext;
use taskhost::tools::producer_tool::ProducerToolOptions;
use taskhost_tests::fixtures;

struct Fixture {
    host: Host,
    context: CallContext,
    _engine: PluginEngine,
    _processes: Arc<ProcessHost>,
}

async fn fixture(test: &str) -> Fixture {
    taskhost_tests::logs::init();
    let engine = taskhost_tests::engine(|_| {});
    let processes = ProcessHost::new(&ProcessHostConfig::default()).expect("process host");
    let grant = Arc::new(ProcessGrant {
        programs: vec!["bash".into()],
        working_dirs: vec![std::env::temp_dir()],
        ..ProcessGrant::default()
    });
    let capability = ProcessCapability { host: processes.clone(), grant };
    let host = Host::new(&TasksSettings::default()).unwrap();
    for (path, name) in [
        (fixtures::CONTRACT_V0_1_PATH, "legacy"),
        (taskhost::builtin::BASH_PATH, "bash"),
        (taskhost_tests::TICKER_PATH, "ticker"),
    ] {
        let version = engine.load_file(path).await.unwrap_or_else(|e| panic!("load {name}: {e:#}"));
        let producer = WasmProducer::new(version, json!({})).await.expect("describe").with_process(capability.clone());
        let options =
            ProducerToolOptions::new(name).with_foreground_timeout(Duration::from_secs(60)).with_promote_after(None);
        host.add_producer(Arc::new(producer), options).expect("tool name is valid");
    }
    let context = CallContext::for_agent(&host.create_agent("a", format!("s-contract-{test}")).unwrap());
    Fixture { host, context, _engine: engine, _processes: processes }
}

impl Fixture {
    async fn call(&self, tool: &str, args: Value) -> String {
        match self.host.call_tool(tool, args, &self.context).await {
            Ok(output) => output.text,
            Err(error) => format!("ERROR: {error}"),
        }
    }

    async fn start(&self, tool: &str, mut args: Value) -> String {
        args["run_in_background"] = json!(true);
        let output = self.host.call_tool(tool, args, &self.context).await.expect("a start");
        output.started.unwrap_or_else(|| panic!("not started: {}", output.text)).to_string()
    }

    async fn wait_end(&self, id: &str) -> String {
        self.call("task_output", json!({"task_id": id, "wait": true, "timeout_ms": 20_000})).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_plugin_is_loaded_at_the_version_it_was_built_against() {
    let engine = taskhost_tests::engine(|_| {});
    let legacy = engine.load_file(fixtures::CONTRACT_V0_1_PATH).await.expect("a 0.1.0 plugin loads");
    assert_eq!(legacy.contract(), ContractVersion::V0_1);
    assert_eq!(legacy.contract().to_string(), "taskhost:producer@0.1.0");
    let bash = engine.load_file(taskhost::builtin::BASH_PATH).await.expect("bash loads");
    assert_eq!(bash.contract(), ContractVersion::V0_2);
    assert!(legacy.imports().iter().any(|i| i == "taskhost:producer/process@0.1.0"), "{:?}", legacy.imports());

    // The pre-compile check and `check` accept it, and say which version.
    let bytes = std::fs::read(fixtures::CONTRACT_V0_1_PATH).unwrap();
    let found = taskhost::plugin::preflight::preflight(&bytes).expect("fits").expect("decodes");
    assert_eq!(found.contract_version, "0.1.0");
    let report = taskhost::plugin::check_plugin(fixtures::CONTRACT_V0_1_PATH, "{}").await.expect("check");
    assert_eq!(report.descriptor.kind, "legacy");
    assert!(!report.descriptor.takes_input);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_plugin_runs_next_to_0_2_plugins_in_one_host() {
    let fx = fixture("side-by-side").await;
    let definitions = fx.host.tool_definitions();
    let legacy = definitions.iter().find(|d| d.name == "legacy").expect("legacy tool");
    assert!(legacy.input_schema["properties"].get("run_in_background").is_some());
    assert!(legacy.input_schema["properties"].get("interactive").is_none(), "0.1.0 tasks take no input");

    // Foreground, in the 0.1.0 run mode it knows.
    assert_eq!(
        fx.call("legacy", json!({"lines": 2})).await,
        "legacy foreground run (taskhost:producer@0.1.0)\nlegacy line 1\nlegacy line 2\n[status: completed, legacy done]"
    );
    // Background next to a 0.2.0 interactive bash task.
    let old = fx.start("legacy", json!({"lines": 1})).await;
    let new = fx.start("bash", json!({"command": "read l; echo \"bash got $l\"", "interactive": true})).await;
    assert_eq!(
        fx.call("task_input", json!({"task_id": new, "text": "hi\n"})).await,
        format!("sent 3 bytes to task {new}")
    );
    assert_eq!(
        fx.wait_end(&old).await,
        "legacy background run (taskhost:producer@0.1.0)\nlegacy line 1\n[status: completed, legacy done]"
    );
    assert_eq!(fx.wait_end(&new).await, "bash got hi\n[status: completed, exit code: 0]");

    // The 0.1.0 process import: stdin is /dev/null, as 0.1.0 promises.
    let spawned = fx.start("legacy", json!({"command": "cat; echo \"from a 0.1.0 process\""})).await;
    assert_eq!(fx.wait_end(&spawned).await, "from a 0.1.0 process\n[status: completed, exit code: 0]");

    // Cancel, and input refused for its kind.
    let forever = fx.start("legacy", json!({"lines": 0, "forever": true})).await;
    assert_eq!(
        fx.call("task_input", json!({"task_id": forever, "text": "x"})).await,
        format!("ERROR: task {forever} is a legacy task, and legacy tasks take no input")
    );
    fx.call("task_kill", json!({"task_id": forever})).await;
    let end = fx.wait_end(&forever).await;
    assert!(end.ends_with("[status: killed, cancelled]"), "{end}");

    // And the 0.2.0 ticker still runs beside it.
    let ticker = fx.start("ticker", json!({"count": 2, "interval_ms": 0})).await;
    let end = fx.wait_end(&ticker).await;
    assert!(end.ends_with("[status: completed]") || end.contains("[status: completed"), "{end}");
}

/// The frozen 0.1.0 WIT the host serves (`wit/v0.1.0/`) and the copy the
/// fixture was built from are the same files: a frozen version never
/// changes, and the fixture really is a 0.1.0 plugin.
#[test]
fn the_frozen_wit_is_the_one_the_0_1_fixture_was_built_against() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let frozen = root.join("wit/v0.1.0");
    let fixture = root.join("tests/fixtures/contract-v0_1/wit");
    let mut compared = 0;
    for dir in ["", "deps"] {
        for entry in std::fs::read_dir(frozen.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "wit") {
                let name = path.strip_prefix(&frozen).unwrap();
                let copy = std::fs::read(fixture.join(name)).unwrap_or_else(|e| panic!("{}: {e}", name.display()));
                assert!(std::fs::read(&path).unwrap() == copy, "{} differs from the fixture's copy", name.display());
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 9, "producer, process, subagents and six WASI deps");
    let producer = std::fs::read_to_string(frozen.join("producer.wit")).unwrap();
    assert!(producer.contains("package taskhost:producer@0.1.0;"));
}

/// Every file under `dir` (recursively, `skip` left out), relative to it.
fn wit_files(dir: &std::path::Path, skip: &str) -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap_or_else(|e| panic!("{}: {e}", next.display())) {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(dir).unwrap().to_path_buf();
            if name == std::path::Path::new(skip) {
                continue;
            }
            if path.is_dir() {
                pending.push(path);
            } else {
                files.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// The SDK builds from its own copy of the contract (`plugins/sdk/wit/`), so
/// a git dependency on it builds outside this repository; that copy is the
/// repository's `wit/` file for file, minus the frozen `v0.1.0/`. Fails on a
/// file that differs, is missing or is extra: after editing `wit/`, run
/// `rm -r plugins/sdk/wit && cp -r wit plugins/sdk/wit && rm -r plugins/sdk/wit/v0.1.0`.
#[test]
fn the_sdk_carries_the_current_wit_exactly() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let wit = wit_files(&root.join("wit"), "v0.1.0");
    let copy = wit_files(&root.join("plugins/sdk/wit"), "v0.1.0");
    let names = |files: &std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>| {
        files.keys().map(|k| k.display().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(names(&copy), names(&wit), "plugins/sdk/wit/ holds other files than wit/ (minus v0.1.0/)");
    for (name, text) in &wit {
        assert!(copy[name] == *text, "plugins/sdk/wit/{} differs from wit/{}", name.display(), name.display());
    }
    assert!(wit.len() >= 9, "producer, process, subagents and the WASI deps: {:?}", names(&wit));
    assert!(!root.join("plugins/sdk/wit/v0.1.0").exists(), "the SDK builds against the current contract only");
}

/// The patch rule of the versioning policy: a plugin built against 0.2.0
/// (the `contract-v0_2_0` fixture, from its own copy of that WIT) loads on
/// this 0.2.2 host as a 0.2 plugin and is driven like any other, input
/// through its 0.2.0 `process` import included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_2_0_plugin_is_served_by_the_0_2_2_host() {
    let engine = taskhost_tests::engine(|_| {});
    let older = engine.load_file(fixtures::CONTRACT_V0_2_0_PATH).await.expect("a 0.2.0 plugin loads");
    assert_eq!(older.contract(), ContractVersion::V0_2);
    assert!(older.imports().iter().any(|i| i == "taskhost:producer/process@0.2.0"), "{:?}", older.imports());
    let bytes = std::fs::read(fixtures::CONTRACT_V0_2_0_PATH).unwrap();
    let found = taskhost::plugin::preflight::preflight(&bytes).expect("fits").expect("decodes");
    assert_eq!(found.contract_version, "0.2.0");

    let fx = fixture("patch").await;
    let version = engine.load_file(fixtures::CONTRACT_V0_2_0_PATH).await.unwrap();
    let processes = ProcessHost::new(&ProcessHostConfig::default()).expect("process host");
    let grant = Arc::new(ProcessGrant { programs: vec!["bash".into()], ..ProcessGrant::default() });
    let producer = WasmProducer::new(version, json!({}))
        .await
        .expect("describe")
        .with_process(ProcessCapability { host: processes, grant });
    let options =
        ProducerToolOptions::new("older").with_foreground_timeout(Duration::from_secs(60)).with_promote_after(None);
    fx.host.add_producer(Arc::new(producer), options).expect("tool name is valid");
    let definitions = fx.host.tool_definitions();
    let older = definitions.iter().find(|d| d.name == "older").expect("older tool");
    assert!(older.input_schema["properties"].get("interactive").is_some(), "0.2.0 tasks take input");

    assert_eq!(
        fx.call("older", json!({"lines": 1})).await,
        "older foreground run (taskhost:producer@0.2.0)\nolder line 1\n[status: completed, older done]"
    );
    let id = fx.start("older", json!({"command": "read l; echo \"0.2.0 got $l\"", "interactive": true})).await;
    assert_eq!(
        fx.call("task_input", json!({"task_id": id, "text": "hi\n"})).await,
        format!("sent 3 bytes to task {id}")
    );
    assert_eq!(fx.wait_end(&id).await, "0.2.0 got hi\n[status: completed, exit code: 0]");
    // Beside the 0.2.2 bash plugin, whose background output is handed over.
    let bash = fx.start("bash", json!({"command": "echo out; echo err >&2; exit 2"})).await;
    assert_eq!(fx.wait_end(&bash).await, "out\n[stderr]\nerr\n[status: completed, exit code: 2]");
    fx.host.dispose().await;
}

/// The 0.2.0 fixture really is a 0.2.0 plugin: its WIT declares 0.2.0 and
/// has no trace of what 0.2.1 and 0.2.2 added.
#[test]
fn the_0_2_0_fixture_was_built_against_0_2_0() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let fixture = root.join("tests/fixtures/contract-v0_2_0/wit");
    let producer = std::fs::read_to_string(fixture.join("producer.wit")).unwrap();
    assert!(producer.contains("package taskhost:producer@0.2.0;"));
    let process = std::fs::read_to_string(fixture.join("process.wit")).unwrap();
    assert!(!process.contains("forward-output") && !process.contains("spawn-handed-over"));
    let current = std::fs::read_to_string(root.join("wit/process.wit")).unwrap();
    assert!(current.contains("package taskhost:producer@0.2.2;") && current.contains("forward-output: func()"));
    assert!(current.contains("spawn-handed-over: func(request: spawn-request) -> result<process, string>;"));
}
