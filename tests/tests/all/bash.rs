//! The `bash` plugin end to end: the real built component, the host's
//! `process` capability, the task registry and the control tools.
//!
//! Leaks are checked through `/proc`, never through our bookkeeping: each
//! fixture's plugin config puts a unique marker variable into the
//! environment of every command, and a test fails while any live process
//! still carries it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use taskhost::Host;
use taskhost::agents::Agent;
use taskhost::ids::TaskId;
use taskhost::plugin::resources::ProcessCapability;
use taskhost::plugin::{PluginEngine, WasmProducer};
use taskhost::process::{EnvPolicy, ProcessGrant, ProcessHost, ProcessHostConfig};
use taskhost::producer::{Producer, RunMode};
use taskhost::settings::TasksSettings;
use taskhost::tasks::TaskStatus;
use taskhost::tools::CallContext;
use taskhost::tools::producer_tool::ProducerToolOptions;
use taskhost_tests::procfs::{ESCAPEES, ProcessMark};

const BOUND: Duration = Duration::from_secs(20);

struct Fixture {
    host: Host,
    agent: Agent,
    context: CallContext,
    /// Holds the spill directory (the output spill files live in it).
    _processes: Arc<ProcessHost>,
    producer: Arc<WasmProducer>,
    mark: ProcessMark,
    _engine: PluginEngine,
}

fn engine() -> PluginEngine {
    taskhost_tests::engine(|_| {})
}

fn grant() -> ProcessGrant {
    ProcessGrant {
        programs: vec!["bash".into()],
        working_dirs: vec![std::env::temp_dir()],
        // Each fixture's plugin config marks its processes (see `fixture_with`).
        env: EnvPolicy { plugin_may_set: vec![ProcessMark::NAME.into()], ..EnvPolicy::default() },
        ..ProcessGrant::default()
    }
}

/// A host serving the real bash plugin as tool `bash`, with `grant` (none:
/// the capability is not granted) and the plugin `config` (plus the marker).
async fn fixture_with(test: &str, grant: Option<ProcessGrant>, mut config: Value) -> Fixture {
    let mark = ProcessMark::new(&format!("bash-e2e-{test}"));
    config
        .as_object_mut()
        .unwrap()
        .entry("env")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .unwrap()
        .insert(mark.name.clone(), Value::String(mark.value.clone()));
    let engine = engine();
    let version = engine.load_file(taskhost::builtin::BASH_PATH).await.expect("load bash plugin");
    let processes = ProcessHost::new(&ProcessHostConfig::default()).expect("process host");
    let mut producer = WasmProducer::new(version, config).await.expect("describe");
    if let Some(grant) = grant {
        producer = producer.with_process(ProcessCapability { host: processes.clone(), grant: Arc::new(grant) });
    }
    let producer = Arc::new(producer);
    let host = Host::new(&TasksSettings::default()).unwrap();
    // As `taskhost serve` does: logs in each owner's own directory.
    host.registry().set_output_files(taskhost::task_logs::OwnerLogFiles::new(processes.clone()));
    host.add_producer(
        producer.clone(),
        ProducerToolOptions::new("bash").with_foreground_timeout(Duration::from_secs(60)).with_promote_after(None),
    )
    .expect("tool name is valid");
    let agent = host.create_agent("agent", format!("session-{test}")).unwrap();
    let context = CallContext::for_agent(&agent);
    Fixture { host, agent, context, _processes: processes, producer, mark, _engine: engine }
}

async fn fixture(test: &str) -> Fixture {
    fixture_with(test, Some(grant()), json!({})).await
}

impl Fixture {
    async fn call(&self, tool: &str, args: Value) -> String {
        match self.host.call_tool(tool, args, &self.context).await {
            Ok(output) => output.text,
            Err(error) => format!("ERROR: {error}"),
        }
    }

    async fn start(&self, command: &str) -> TaskId {
        let args = json!({"command": command, "run_in_background": true});
        let output = self.host.call_tool("bash", args, &self.context).await.expect("a start");
        output.started.unwrap_or_else(|| panic!("not started: {}", output.text))
    }

    /// Raw consuming reads until the task settles: every delta, concatenated.
    async fn read_to_end(&self, id: &TaskId) -> (String, taskhost::tasks::TaskSnapshot) {
        let deadline = Instant::now() + BOUND;
        let mut text = String::new();
        loop {
            let read = self.host.registry().read(id, Some(&self.agent)).await.expect("read");
            text.push_str(&read.text);
            if read.snapshot.status.is_terminal() {
                return (text, read.snapshot);
            }
            assert!(Instant::now() < deadline, "task {id} did not settle; read so far: {text:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn await_marked(&self, n: usize) {
        self.mark.await_at_least(n, BOUND).await;
    }

    async fn assert_no_marked(&self) {
        self.mark.assert_none_within(Duration::from_secs(5)).await;
    }
}

fn lines(prefix: &str, n: usize) -> String {
    (1..=n).map(|i| format!("{prefix} {i}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_deltas_never_repeat_or_lose_a_byte() {
    let fx = fixture("deltas").await;
    let id = fx
        .start("for i in $(seq 1 3000); do echo \"line $i\"; if (( i % 600 == 0 )); then sleep 0.1; fi; done; echo warn >&2; exit 3")
        .await;
    assert!(id.as_str().starts_with("bash-"), "{id}");
    let (text, snapshot) = fx.read_to_end(&id).await;
    assert_eq!(text, format!("{}[stderr]\nwarn\n", lines("line", 3000)));
    assert_eq!(snapshot.status, TaskStatus::Completed);
    assert_eq!(snapshot.status_line(), "[status: completed, exit code: 3]");
    assert_eq!(
        snapshot.label,
        "for i in $(seq 1 3000); do echo \"line $i\"; if (( i % 600 == 0 )); then sleep 0.1; fi; done; echo warn >&2; exit 3"
    );
    // Consuming: the control tool now has nothing new.
    let reply = fx.call("task_output", json!({"task_id": id.as_str()})).await;
    assert_eq!(reply, "(no new output)\n[status: completed, exit code: 3]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_returns_output_stderr_section_and_exit_code() {
    let fx = fixture("foreground").await;
    let reply = fx.call("bash", json!({"command": "echo hi; echo oops >&2; exit 2", "description": "demo"})).await;
    assert_eq!(reply, "hi\n[stderr]\noops\n[status: completed, exit code: 2]");
    let reply = fx.call("bash", json!({"command": "printf 'no newline'"})).await;
    assert_eq!(reply, "no newline\n[status: completed, exit code: 0]");
}

/// Output nobody reads is drained by the host as it appears: nothing is
/// dropped, a late read returns the latest 64 KiB (whole lines) and names
/// what it skipped: its lines, which the `lines` view shows, and the task's
/// log file, which the owner's own later commands can read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_background_output_is_kept_for_views_and_a_late_read_says_what_it_skipped() {
    let fx = fixture("spill").await;
    let id = fx.start("for i in $(seq 1 30000); do echo \"row $i\"; done").await;
    let snapshot = fx.host.registry().wait(&id, BOUND, Some(&fx.agent), None).await.expect("wait");
    assert_eq!(snapshot.status_line(), "[status: completed, exit code: 0]");
    let expected = lines("row", 30000);
    let head = fx.call("task_output", json!({"task_id": id.as_str(), "view": "head", "lines": 2})).await;
    assert_eq!(head, "row 1\nrow 2\n[status: completed, exit code: 0]");
    let grep = fx.call("task_output", json!({"task_id": id.as_str(), "grep": "^row (1|15000|30000)$"})).await;
    assert_eq!(grep, "1: row 1\n15000: row 15000\n30000: row 30000\n[status: completed, exit code: 0]");
    let read = fx.host.registry().read(&id, Some(&fx.agent)).await.unwrap();
    let (notice, tail) = read.text.split_once('\n').expect("a notice line");
    assert!(tail.len() <= 64 * 1024 && tail.len() > 60 * 1024, "{}", tail.len());
    assert!(tail.starts_with("row "), "a cut read starts at a whole line");
    assert!(expected.ends_with(tail));
    let skipped = expected.len() - tail.len();
    let last = expected[..skipped].lines().count();
    let (said, path) = notice.split_once("; your commands can read them in the full output: ").expect(notice);
    assert_eq!(
        said,
        format!(
            "[{skipped} bytes of output skipped here (lines 1-{last}); task_output with view \"lines\", from 1, to {last} shows them"
        )
    );
    let path = path.strip_suffix(']').expect(notice);
    assert_eq!(std::fs::read_to_string(path).expect("the task's log file"), expected);
    // The `lines` view gives the skipped lines back.
    let page = fx.call("task_output", json!({"task_id": id.as_str(), "view": "lines", "from": 100, "to": 102})).await;
    assert_eq!(page, "row 100\nrow 101\nrow 102\n[status: completed, exit code: 0]");
    // The owner's own next command reads the file (read-only).
    assert!(
        taskhost::process::confine::support().mount_namespace,
        "this test needs mount namespaces (root, or unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1)"
    );
    let command = format!("wc -l < {path}; {{ echo more >> {path}; }} 2>/dev/null && echo wrote || echo read-only");
    let reply = fx.call("bash", json!({"command": command})).await;
    assert_eq!(reply, "30000\nread-only\n[status: completed, exit code: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_truncation_names_a_file_that_outlives_the_call() {
    let fx = fixture("truncate").await;
    let reply = fx.call("bash", json!({"command": "for i in $(seq 1 30000); do echo \"row $i\"; done"})).await;
    let (notice, rest) = reply.split_once('\n').unwrap();
    let path = notice
        .strip_prefix("[output truncated; full output: ")
        .and_then(|p| p.strip_suffix(']'))
        .unwrap_or_else(|| panic!("no truncation notice: {notice:?}"));
    assert!(rest.ends_with("row 30000\n[status: completed, exit code: 0]"), "{}", &rest[rest.len() - 80..]);
    assert_eq!(std::fs::read_to_string(path).expect("spill file readable"), lines("row", 30000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_timeout_kills_the_group_and_says_so() {
    let fx = fixture("timeout").await;
    let started = Instant::now();
    // The timeout leaves a loaded machine ample time to run the `echo`
    // (300 ms did not always: the line was missing when CI was busy).
    let reply = fx
        .call("bash", json!({"command": "echo before; sleep 1000 & sleep 1000; echo never", "timeout_ms": 3000}))
        .await;
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(
        reply,
        "before\n[command timed out after 3000 ms and was killed]\n\
         [status: killed, signal: SIGTERM (timed out after 3000 ms)]"
    );
    fx.assert_no_marked().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_kill_ends_the_whole_tree_including_escapees() {
    let fx = fixture("kill").await;
    let id = fx.start(ESCAPEES).await;
    // bash itself carries the mark (it comes from the plugin config), so the
    // escapees are certainly up only once the command said `started`.
    let deadline = Instant::now() + BOUND;
    let mut said = String::new();
    while !said.contains("started") {
        assert!(Instant::now() < deadline, "the command never said started: {said:?}");
        said.push_str(&fx.host.registry().read(&id, Some(&fx.agent)).await.expect("read").text);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(said, "started\n");
    fx.await_marked(4).await;
    let reply = fx.call("task_kill", json!({"task_id": id.as_str(), "reason": "test"})).await;
    assert_eq!(reply, format!("requested cancellation of task {id}"));
    let reply = fx.call("task_output", json!({"task_id": id.as_str(), "wait": true, "timeout_ms": 10000})).await;
    assert_eq!(reply, "(no new output)\n[status: killed, signal: SIGTERM]");
    fx.assert_no_marked().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leak_after_agent_disposal() {
    let fx = fixture("dispose-agent").await;
    fx.start(ESCAPEES).await;
    fx.start("sleep 1000").await;
    fx.await_marked(5).await;
    fx.agent.dispose().await;
    fx.assert_no_marked().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leak_after_host_shutdown() {
    let fx = fixture("shutdown").await;
    fx.start(ESCAPEES).await;
    fx.await_marked(4).await;
    fx.host.dispose().await;
    fx.assert_no_marked().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leak_when_the_task_store_is_dropped() {
    // What a trap does to a task: its store is dropped mid-flight, without
    // the plugin's help. `abandon` (the registry's last resort) does the
    // same; so does forgetting every handle to the task.
    let fx = fixture("store-drop").await;
    let prepared = fx.producer.prepare(json!({"command": ESCAPEES}), RunMode::Background).await.unwrap();
    let hooks = (prepared.run)().await.unwrap();
    fx.await_marked(4).await;
    hooks.control.abandon();
    fx.assert_no_marked().await;
    let outcome = hooks.done.await.unwrap();
    assert!(outcome.detail.unwrap().contains("abandoned"));

    let prepared = fx.producer.prepare(json!({"command": ESCAPEES}), RunMode::Background).await.unwrap();
    let hooks = (prepared.run)().await.unwrap();
    fx.await_marked(4).await;
    drop(hooks);
    fx.assert_no_marked().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_outside_the_grant_are_refused_clearly() {
    let sh_only = ProcessGrant { programs: vec!["sh".into()], ..grant() };
    let fx = fixture_with("refused", Some(sh_only), json!({})).await;
    let reply = fx.call("bash", json!({"command": "echo hi"})).await;
    assert!(reply.starts_with("ERROR: "), "{reply}");
    assert!(
        reply.contains("the process grant refuses program \"bash\"") && reply.contains("allowed programs: sh"),
        "{reply}"
    );
    let reply = fx.call("bash", json!({"command": "echo hi", "run_in_background": true})).await;
    assert!(reply.contains("refuses program \"bash\""), "{reply}");
    assert!(fx.host.registry().list(Some(&fx.agent)).is_empty(), "nothing registered");

    let fx = fixture_with("no-grant", None, json!({})).await;
    let reply = fx.call("bash", json!({"command": "echo hi"})).await;
    assert!(reply.contains("has no process grant"), "{reply}");

    let fx = fixture_with("bad-cwd", Some(grant()), json!({"cwd": "/"})).await;
    let reply = fx.call("bash", json!({"command": "pwd"})).await;
    assert!(reply.contains("refuses working directory \"/\""), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_schema_and_errors_for_bad_arguments() {
    let fx = fixture("schema").await;
    let definition = fx.host.tool_definitions().into_iter().find(|d| d.name == "bash").unwrap();
    let properties = &definition.input_schema["properties"];
    assert_eq!(properties["command"]["type"], "string");
    assert_eq!(properties["timeout_ms"]["maximum"], 600_000);
    assert_eq!(properties["run_in_background"]["type"], "boolean");
    assert!(definition.description.contains("default 120000"), "{}", definition.description);
    let reply = fx.call("bash", json!({"command": "true", "timeout_ms": 600_001})).await;
    assert!(reply.starts_with("ERROR: invalid arguments for bash"), "{reply}");
}

/// A plugin that traps while it holds processes: the trap fails its task
/// alone, drops its store, and the store's processes (escapees included)
/// die with it. The fixture starts the tree itself through the capability.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leak_after_a_trapping_plugin() {
    let mark = ProcessMark::new("bash-e2e-trap");
    let engine = engine();
    let version = engine.load_file(taskhost_tests::fixtures::MISBEHAVE_PATH).await.expect("load misbehave");
    let processes = ProcessHost::new(&ProcessHostConfig::default()).expect("process host");
    let producer = WasmProducer::new(version, json!({}))
        .await
        .expect("describe")
        .with_process(ProcessCapability { host: processes, grant: Arc::new(grant()) });
    let host = Host::new(&TasksSettings::default()).unwrap();
    host.add_producer(
        Arc::new(producer),
        ProducerToolOptions::new("misbehave").with_foreground_timeout(BOUND).with_promote_after(None),
    )
    .expect("tool name is valid");
    let agent = host.create_agent("agent", "session-trap").unwrap();
    let context = CallContext::for_agent(&agent);
    let args = json!({
        "fault": "trap", "in": "read-output", "run_in_background": true,
        "spawn": format!("{}{ESCAPEES}", mark.export()),
    });
    let output = host.call_tool("misbehave", args, &context).await.expect("started");
    let id = output.started.unwrap_or_else(|| panic!("{}", output.text));
    mark.await_at_least(4, BOUND).await;
    // The read calls `read-output`, which traps.
    let reply = host.call_tool("task_output", json!({"task_id": id}), &context).await.expect("read");
    let snapshot = host.registry().get(&id, Some(&agent)).expect("still listed");
    assert_eq!(snapshot.status, TaskStatus::Failed, "{}", reply.text);
    assert!(snapshot.detail.as_deref().is_some_and(|d| d.contains("read-output")), "{snapshot:?}");
    mark.assert_none_within(Duration::from_secs(5)).await;
    host.dispose().await;
}

/// The read whose own `read-output` call trapped is the one that reports the
/// failure, every time: it used to answer `[status: running]` about one run
/// in three, because the failure settled after the reply.
#[tokio::test]
async fn a_read_that_traps_reports_the_failure_every_time() {
    let engine = engine();
    let version = engine.load_file(taskhost_tests::fixtures::MISBEHAVE_PATH).await.expect("load misbehave");
    let producer = WasmProducer::new(version, json!({})).await.expect("describe");
    let host = Host::new(&TasksSettings { max_finished_tasks_per_owner: 1_000, ..TasksSettings::default() }).unwrap();
    host.add_producer(
        Arc::new(producer),
        ProducerToolOptions::new("misbehave").with_foreground_timeout(BOUND).with_promote_after(None),
    )
    .expect("tool name is valid");
    let agent = host.create_agent("agent", "session-trap-loop").unwrap();
    let context = CallContext::for_agent(&agent);
    for round in 0..100 {
        let args = json!({"fault": "trap", "in": "read-output", "run_in_background": true});
        let output = host.call_tool("misbehave", args, &context).await.expect("started");
        let id = output.started.unwrap_or_else(|| panic!("{}", output.text));
        let reply = host.call_tool("task_output", json!({"task_id": id}), &context).await.expect("read").text;
        let status = reply.lines().last().unwrap_or_default();
        assert!(
            status.starts_with("[status: failed,") && status.contains("read-output"),
            "round {round}: the read that trapped must report the failure: {reply}"
        );
        assert!(host.registry().get(&id, Some(&agent)).unwrap().reported, "round {round}");
        assert!(agent.take_unread().is_empty(), "round {round}: no notice after the read reported the end");
    }
    host.dispose().await;
}

/// A finished task that ages out of its owner's history takes its output
/// spill file with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_dropped_from_the_history_removes_its_spill_files() {
    let engine = engine();
    let version = engine.load_file(taskhost::builtin::BASH_PATH).await.expect("load bash plugin");
    let processes = ProcessHost::new(&ProcessHostConfig::default()).expect("process host");
    let producer = WasmProducer::new(version, json!({}))
        .await
        .expect("describe")
        .with_process(ProcessCapability { host: processes.clone(), grant: Arc::new(grant()) });
    let host = Host::new(&TasksSettings { max_finished_tasks_per_owner: 1, ..TasksSettings::default() }).unwrap();
    // As `taskhost serve` does: logs in each owner's own directory.
    host.registry().set_output_files(taskhost::task_logs::OwnerLogFiles::new(processes.clone()));
    host.add_producer(
        Arc::new(producer),
        ProducerToolOptions::new("bash").with_foreground_timeout(BOUND).with_promote_after(None),
    )
    .expect("tool name is valid");
    let agent = host.create_agent("agent", "session-history").unwrap();
    let context = CallContext::for_agent(&agent);
    let run = |command: &str| {
        let args = json!({"command": command, "run_in_background": true});
        let (host, context) = (host.clone(), context.clone());
        async move {
            let output = host.call_tool("bash", args, &context).await.expect("started");
            let id = output.started.unwrap_or_else(|| panic!("{}", output.text));
            let args = json!({"task_id": id, "wait": true, "timeout_ms": 20_000});
            let out = host.call_tool("task_output", args, &context).await.expect("read").text;
            assert!(out.ends_with("[status: completed, exit code: 0]"), "{}", &out[out.len().saturating_sub(200)..]);
            (id, out)
        }
    };
    let (first, out) = run("for i in $(seq 1 30000); do echo \"row $i\"; done").await;
    assert!(out.starts_with("["), "a read past 64 KiB says what it skipped: {}", &out[..200]);
    let note = out.lines().next().unwrap();
    let path = note.split_once("full output: ").and_then(|(_, path)| path.strip_suffix(']')).expect(note);
    let path = std::path::PathBuf::from(path);
    assert!(path.exists(), "{}", path.display());
    let (second, _) = run("echo small").await;
    // Reported, over the cap of one: the first task is gone, and its file.
    assert!(host.registry().get(&TaskId::new(first.as_str()), Some(&agent)).is_err(), "{first} dropped");
    assert!(host.registry().get(&TaskId::new(second.as_str()), Some(&agent)).is_ok());
    assert!(!path.exists(), "the spill file {} went with its task", path.display());
    host.dispose().await;
}

/// Issue 28, item 5: finished tasks' output logs count against their
/// owner's disk budget (`[process] spill_bytes_per_owner`), with the spill
/// files of its processes: three tasks of 600 KB under a 1 MiB budget keep
/// at most 1 MiB on disk, and a read says what was not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_logs_are_charged_to_the_owner_disk_budget() {
    let engine = engine();
    let version = engine.load_file(taskhost::builtin::BASH_PATH).await.expect("load bash plugin");
    let budget = 1 << 20;
    let processes =
        ProcessHost::new(&ProcessHostConfig { spill_bytes_per_owner: budget, ..ProcessHostConfig::default() })
            .expect("process host");
    let producer = WasmProducer::new(version, json!({}))
        .await
        .expect("describe")
        .with_process(ProcessCapability { host: processes.clone(), grant: Arc::new(grant()) });
    let host = Host::new(&TasksSettings::default()).unwrap();
    host.registry().set_output_files(taskhost::task_logs::OwnerLogFiles::new(processes.clone()));
    host.add_producer(
        Arc::new(producer),
        ProducerToolOptions::new("bash").with_background(true).with_foreground_timeout(BOUND).with_promote_after(None),
    )
    .expect("tool name is valid");
    let agent = host.create_agent("agent", "session-budget").unwrap();
    let context = CallContext::for_agent(&agent);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let args = json!({"command": "for i in $(seq 1 60000); do echo \"row $i\"; done | head -c 600000", "run_in_background": true});
        let output = host.call_tool("bash", args, &context).await.expect("started");
        let id = output.started.unwrap_or_else(|| panic!("{}", output.text));
        let snapshot = host.registry().wait(&id, BOUND, Some(&agent), None).await.expect("wait");
        assert_eq!(snapshot.status_line(), "[status: completed, exit code: 0]");
        ids.push(id);
    }
    let dir = processes.owner_spill("session-budget").unwrap().dir().to_path_buf();
    let on_disk: u64 = std::fs::read_dir(&dir).unwrap().map(|entry| entry.unwrap().metadata().unwrap().len()).sum();
    assert!(on_disk <= budget, "{on_disk} bytes of logs on disk, over the owner's budget of {budget}");
    assert!(on_disk > budget - 64 * 1024, "the budget was used: {on_disk}");
    // The third task's log got nothing of the budget: its first bytes are
    // gone (the memory window keeps its last ones), and the view says so.
    let third = ids[2].as_str();
    let head = host.call_tool("task_output", json!({"task_id": third, "view": "head", "lines": 1}), &context).await;
    let head = head.unwrap().text;
    let gap = head.lines().next().unwrap();
    assert!(gap.starts_with('[') && gap.ends_with(" bytes of output were not kept here]"), "{head}");
    host.dispose().await;
}
