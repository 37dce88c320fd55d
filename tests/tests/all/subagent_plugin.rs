//! The `plugins/subagent` guest end to end: the built-in wasm plugin,
//! granted the host's `subagents` capability, through the real tools, on the
//! offline scripted backend; the children's own tasks are real wasm `ticker`
//! tasks. Covers the RFC's Testing section for the plugin (mapping, dispose
//! before report, detached signal, task_output/task_kill, preflight, schema
//! gating), owner disposal, a plugin without the grant, and a dropped task
//! store disposing its child.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use taskhost::Host;
use taskhost::config::Config;
use taskhost::plugin::{PluginEngine, WasmProducer};
use taskhost::producer::{Producer, RunMode};
use taskhost::setup::host_from_config;
use taskhost::subagents::Subagents;
use taskhost::tasks::{TaskError, TaskStatus};
use taskhost::tools::producer_tool::ProducerToolOptions;
use taskhost::tools::{CallContext, ToolError};
use taskhost_tests::agent_calls::{STOP_REASON_CASES, call, child_agents, collect, start_subagent};
use taskhost_tests::procfs::{ESCAPEES, ProcessMark};

/// The tag of the mark exported by the child's bash in "hold a bash".
const CHILD_BASH_MARK: &str = "subagent-child-bash";

const CONFIG: &str = concat!(
    r#"
[tasks]
max_live_tasks_per_owner = 4

[[producer]]
tool = "ticker"
plugin = "builtin:ticker"

[[producer]]
tool = "bash"
plugin = "builtin:bash"
grants.process = { programs = ["bash"] }

[[producer]]
tool = "subagent"
plugin = "builtin:subagent"

[[producer]]
tool = "subagent_fork"
plugin = "builtin:subagent"
background = false
config = { profile = "offline", description = "Fork this conversation into a subagent." }
"#,
    taskhost_tests::offline_subagent_backend!()
);

fn engine() -> PluginEngine {
    taskhost_tests::engine(|_| {})
}

/// A host built by the real configuration path (`taskhost serve`'s), and an
/// engine for the tests that load a plugin by hand.
async fn host_from(text: &str) -> (Host, PluginEngine) {
    let engine = engine();
    let hold_bash = format!("{}{ESCAPEES}", ProcessMark::new(CHILD_BASH_MARK).export());
    let config = Config::parse(&text.replace("__HOLD_BASH_COMMAND__", &hold_bash)).unwrap();
    let host = host_from_config(&config, Path::new(".")).await.unwrap();
    (host, engine)
}

#[tokio::test]
async fn every_stop_reason_maps_to_its_outcome() {
    let (host, _engine) = host_from(CONFIG).await;
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    for (prompt, expected) in STOP_REASON_CASES {
        let id = start_subagent(&host, &context, &format!("case {prompt}"), prompt).await;
        assert_eq!(collect(&host, &context, &id).await, expected, "prompt {prompt:?}");
        assert_eq!(collect(&host, &context, &id).await, expected, "idempotent final read");
    }
    let list = call(&host, &context, "task_list", json!({})).await;
    assert!(list.lines().next().unwrap().ends_with(" — case say hello"), "label = description: {list}");
    assert!(child_agents(&host).is_empty());

    let fg = host.call_tool("subagent_fork", json!({"description": "fg", "prompt": "say hi"}), &context).await.unwrap();
    assert_eq!((fg.text.as_str(), fg.is_error), ("answer to: say hi\n[status: completed]", false));
    let fg =
        host.call_tool("subagent_fork", json!({"description": "fg", "prompt": "say refusal"}), &context).await.unwrap();
    assert!(fg.is_error && fg.text.ends_with("[status: failed, refusal]"), "{fg:?}");
    host.dispose().await;
}

#[tokio::test]
async fn the_report_comes_after_the_child_and_its_tasks_are_gone() {
    let (host, _engine) = host_from(CONFIG).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (agents, sink) = (host.agents().clone(), seen.clone());
    let _guard = host.registry().on_task_done(Arc::new(move |done| {
        let children = agents.list().iter().filter(|a| a.id().as_str().starts_with("subagent-")).count();
        sink.lock().unwrap().push((done.snapshot.id.to_string(), done.snapshot.status, children));
    }));
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    for (prompt, status) in [("start a ticker", TaskStatus::Completed), ("ticker then fail", TaskStatus::Failed)] {
        let id = start_subagent(&host, &context, prompt, prompt).await;
        let output = collect(&host, &context, &id).await;
        assert!(output.contains(&format!("[status: {status}")), "{output}");
        let log = seen.lock().unwrap().clone();
        let at = log.iter().position(|(task, _, _)| *task == id).unwrap();
        assert_eq!(log[at].2, 0, "a child agent was still registered at the report: {log:?}");
        assert!(
            log[..at].iter().any(|(task, status, _)| task.starts_with("ticker-") && *status == TaskStatus::Killed),
            "the child's ticker did not settle before the report: {log:?}"
        );
        seen.lock().unwrap().clear();
    }
    host.dispose().await;
}

#[tokio::test]
async fn detached_signal_kill_and_foreign_access() {
    let (host, _engine) = host_from(CONFIG).await;
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let cancelled = CallContext::for_agent(&parent);
    cancelled.cancel.cancel();
    let refused =
        call(&host, &cancelled, "subagent", json!({"description": "d", "prompt": "p", "run_in_background": true}))
            .await;
    assert_eq!(refused, "ERROR: the call to subagent was cancelled");
    assert!(child_agents(&host).is_empty());

    let context = CallContext::for_agent(&parent);
    let detached = start_subagent(&host, &context, "detached", "say detached").await;
    context.cancel.cancel();
    let reader = CallContext::for_agent(&parent);
    assert_eq!(collect(&host, &reader, &detached).await, "answer to: say detached\n[status: completed]");

    let slow = start_subagent(&host, &reader, "slow one", "slow").await;
    assert_eq!(
        call(&host, &reader, "task_output", json!({"task_id": slow})).await,
        "(no new output)\n[status: running]"
    );
    let other = host.create_agent("other", "other-session").unwrap();
    let foreign = call(&host, &CallContext::for_agent(&other), "task_output", json!({"task_id": slow})).await;
    assert_eq!(foreign, format!("ERROR: task {slow} belongs to another session"));
    assert_eq!(
        call(&host, &reader, "task_kill", json!({"task_id": slow, "reason": "not needed"})).await,
        format!("requested cancellation of task {slow}")
    );
    assert_eq!(collect(&host, &reader, &slow).await, "(no new output)\n[status: killed, not needed]");
    assert!(child_agents(&host).is_empty());
    host.dispose().await;
}

#[tokio::test]
async fn preflight_failure_starts_no_child_and_schemas_are_gated() {
    let (host, _engine) =
        host_from(&CONFIG.replace("max_live_tasks_per_owner = 4", "max_live_tasks_per_owner = 1")).await;
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    call(&host, &context, "ticker", json!({"count": 1000, "interval_ms": 50, "run_in_background": true})).await;
    let refused = host
        .call_tool("subagent", json!({"description": "d", "prompt": "p", "run_in_background": true}), &context)
        .await;
    assert!(matches!(refused, Err(ToolError::Task(TaskError::TooManyTasks { .. }))), "{refused:?}");
    assert!(child_agents(&host).is_empty(), "{:?}", child_agents(&host));

    let definitions = host.tool_definitions();
    let find = |name: &str| definitions.iter().find(|d| d.name == name).unwrap().clone();
    let (subagent, fork) = (find("subagent"), find("subagent_fork"));
    assert_eq!(subagent.input_schema["properties"]["run_in_background"]["type"], "boolean");
    assert!(subagent.description.contains("task_output"));
    assert!(fork.input_schema["properties"].get("run_in_background").is_none());
    assert!(fork.description.starts_with("Fork this conversation") && !fork.description.contains("task_output"));
    host.dispose().await;
}

#[tokio::test]
async fn owner_disposal_releases_children_and_their_wasm_tasks() {
    let (host, _engine) = host_from(CONFIG).await;
    let settled = Arc::new(Mutex::new(Vec::new()));
    let sink = settled.clone();
    let _guard = host.registry().on_task_done(Arc::new(move |done| {
        sink.lock().unwrap().push((done.snapshot.id.to_string(), done.snapshot.status));
    }));
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    let a = start_subagent(&host, &context, "holder a", "hold a ticker").await;
    let b = start_subagent(&host, &context, "holder b", "hold a ticker").await;
    let mine =
        call(&host, &context, "ticker", json!({"count": 100000, "interval_ms": 10, "run_in_background": true})).await;
    // Ticker ids are per kind and the children start theirs concurrently, so
    // the parent's may be any ticker-N.
    assert!(mine.starts_with("started background ticker task ticker-"), "{mine}");
    let list = call(&host, &context, "task_list", json!({})).await;
    assert_eq!(list.lines().count(), 3, "two subagents and a ticker, listed together: {list}");
    for _ in 0..300 {
        let tickers: usize = host
            .agents()
            .list()
            .iter()
            .filter(|agent| agent.id().as_str().starts_with("subagent-"))
            .map(|child| host.registry().list(Some(child)).iter().filter(|t| t.kind == "ticker").count())
            .sum();
        if tickers == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::timeout(Duration::from_secs(20), parent.dispose()).await.expect("disposal finished");
    assert!(child_agents(&host).is_empty(), "{:?}", child_agents(&host));
    let settled = settled.lock().unwrap().clone();
    let tickers =
        settled.iter().filter(|(id, status)| id.starts_with("ticker-") && *status == TaskStatus::Killed).count();
    assert_eq!(tickers, 3, "both children's tickers and the parent's were killed: {settled:?}");
    for id in [&a, &b] {
        assert!(settled.iter().any(|(task, status)| task == id && *status == TaskStatus::Killed), "{settled:?}");
    }
    host.dispose().await;
}

#[tokio::test]
async fn two_subagents_and_a_bash_task_collected_together() {
    let (host, _engine) = host_from(CONFIG).await;
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    let a = start_subagent(&host, &context, "research A", "say A").await;
    let b = start_subagent(&host, &context, "research B", "say B").await;
    let bash = call(
        &host,
        &context,
        "bash",
        json!({"command": "sleep 0.2; echo built; echo warned >&2", "run_in_background": true}),
    )
    .await;
    assert_eq!(bash, "started background bash task bash-1");
    let list = call(&host, &context, "task_list", json!({})).await;
    let kinds: Vec<&str> = list.lines().filter_map(|line| line.split(' ').nth(1)).collect();
    assert_eq!(kinds, ["[subagent]", "[subagent]", "[bash]"], "listed together: {list}");
    let (out_a, out_b, out_bash) =
        tokio::join!(collect(&host, &context, &a), collect(&host, &context, &b), collect(&host, &context, "bash-1"));
    assert_eq!(out_a, "answer to: say A\n[status: completed]");
    assert_eq!(out_b, "answer to: say B\n[status: completed]");
    assert_eq!(out_bash, "built\n[stderr]\nwarned\n[status: completed, exit code: 0]");
    host.dispose().await;
}

/// A child's own background bash, with processes that left its process
/// group, dies with the parent's owner: disposal returns only after the
/// child, its session and its task are gone, and /proc shows no process.
#[tokio::test]
async fn owner_disposal_leaves_no_process_of_a_childs_background_bash() {
    let (host, _engine) = host_from(CONFIG).await;
    let mark = ProcessMark::new(CHILD_BASH_MARK);
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    let id = start_subagent(&host, &context, "bash holder", "hold a bash").await;
    mark.await_at_least(4, Duration::from_secs(20)).await;
    // The bash task is the child's, not the parent's.
    let list = call(&host, &context, "task_list", json!({})).await;
    assert_eq!(list, format!("{id} [subagent] running — bash holder"));
    let child = host.agents().list().into_iter().find(|a| a.id().as_str().starts_with("subagent-")).expect("a child");
    let childs_tasks = host.registry().list(Some(&child));
    assert_eq!(childs_tasks.iter().map(|t| t.kind.as_str()).collect::<Vec<_>>(), ["bash"]);
    let bash_id = childs_tasks[0].id.clone();

    tokio::time::timeout(Duration::from_secs(20), parent.dispose()).await.expect("disposal finished");
    assert!(child_agents(&host).is_empty(), "{:?}", child_agents(&host));
    // Its record went with its owner; if one is still seen, it is settled.
    let bash = host.registry().get(&bash_id, None).ok();
    assert!(bash.as_ref().is_none_or(|t| t.status.is_terminal()), "the child's bash outlived disposal: {bash:?}");
    mark.assert_none_within(Duration::from_secs(5)).await;
    host.dispose().await;
}

#[tokio::test]
async fn a_plugin_without_the_grant_gets_a_clear_error() {
    let (host, engine) = host_from(CONFIG).await;
    let version = engine.load_bytes("subagent", taskhost::builtin::SUBAGENT_WASM).await.unwrap();
    let ungranted = WasmProducer::new(version, json!({})).await.unwrap();
    host.add_producer(
        Arc::new(ungranted),
        ProducerToolOptions::new("ungranted").with_foreground_timeout(Duration::from_secs(5)).with_promote_after(None),
    )
    .expect("tool name is valid");
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let reply =
        call(&host, &CallContext::for_agent(&parent), "ungranted", json!({"description": "d", "prompt": "p"})).await;
    assert!(reply.contains("is not granted the subagents capability"), "{reply}");
    assert!(child_agents(&host).is_empty());
    host.dispose().await;
}

/// A plugin loaded from a file is third-party code: it gets the `subagents`
/// capability from `[producer.grants.subagents]` alone, limited to the
/// backends the grant names; without the grant, or with one naming a backend
/// that is not configured, it refuses to load.
#[tokio::test]
async fn a_file_plugin_runs_children_only_through_its_configuration_grant() {
    let plugin = taskhost::builtin::SUBAGENT_PATH;
    let config = |grants: &str| {
        format!(
            "[[producer]]\ntool = \"subagent\"\nplugin = {plugin:?}\n{grants}\n{}",
            taskhost_tests::offline_subagent_backend!()
        )
    };
    let granted = Config::parse(&config("grants.subagents = { backends = [\"offline\"] }")).unwrap();
    let host = host_from_config(&granted, Path::new(".")).await.unwrap();
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    let id = start_subagent(&host, &context, "granted", "say hello").await;
    assert_eq!(collect(&host, &context, &id).await, STOP_REASON_CASES[0].1);
    host.dispose().await;

    // Not granted: refused when it loads, naming the grant, not at its first call.
    let ungranted = Config::parse(&config("")).unwrap();
    let error = format!("{:#}", host_from_config(&ungranted, Path::new(".")).await.err().expect("refused at load"));
    assert!(
        error.contains(
            "imports `taskhost:producer/subagents@0.2.2`, which its configuration does not grant: add \
                        [producer.grants.subagents]"
        ),
        "{error}"
    );

    let unknown = Config::parse(&config("grants.subagents = { backends = [\"cloud\"] }")).unwrap();
    let error = format!("{:#}", host_from_config(&unknown, Path::new(".")).await.err().expect("refused at load"));
    assert!(error.contains("names backend \"cloud\", which is not configured; configured: offline"), "{error}");
}

#[tokio::test]
async fn dropping_a_task_store_disposes_its_child() {
    let (host, engine) = host_from(CONFIG).await;
    let config = Config::parse(CONFIG).unwrap();
    let subagents = Subagents::for_host(&host, &config.subagents).unwrap();
    let version = engine.load_bytes("subagent", taskhost::builtin::SUBAGENT_WASM).await.unwrap();
    let producer = WasmProducer::new(version, json!({})).await.unwrap().with_subagents(subagents);
    let prepared = producer.prepare(json!({"description": "d", "prompt": "slow"}), RunMode::Background).await.unwrap();
    let hooks = (prepared.run)().await.unwrap();
    assert_eq!(child_agents(&host).len(), 1);
    // Nobody holds the task any more: its driver drops the store.
    drop(hooks);
    for _ in 0..300 {
        if child_agents(&host).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(child_agents(&host).is_empty(), "the child outlived its store: {:?}", child_agents(&host));
    host.dispose().await;
}
