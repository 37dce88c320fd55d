//! The background-subagent RFC's Testing section, through the `Host` facade
//! and the real control tools, with the native `subagent` producer on the
//! offline `scripted` backend (children are real agents of the host whose
//! own tasks are real `ticker` tasks).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_calls::{STOP_REASON_CASES, call, child_agents, collect, start_subagent, start_task};
use serde_json::json;
use taskhost::Host;
use taskhost::config::Config;
use taskhost::producer::{Producer, RunMode};
use taskhost::setup::host_from_config;
use taskhost::subagents::{RunResult, StopReason};
use taskhost::subagents::{Subagents, outcome_of};
use taskhost::tasks::{TaskError, TaskRegistry, TaskStart, TaskStatus, TerminalStatus};
use taskhost::tools::{CallContext, ToolError};
use taskhost_tests::agent_calls;

const CONFIG: &str = concat!(
    r#"
[tasks]
max_live_tasks_per_owner = 4

[[producer]]
tool = "ticker"
plugin = "native:ticker"

[[producer]]
tool = "subagent"
plugin = "native:subagent"

[[producer]]
tool = "subagent_fork"
plugin = "native:subagent"
background = false
config = { profile = "offline", description = "Fork this conversation into a subagent." }

[subagents]
default_backend = "offline"
"#,
    taskhost_tests::offline_subagent_backend!()
);

/// A host built by the real configuration path (`taskhost serve`'s).
async fn host_from(text: &str) -> Host {
    let config = Config::parse(text).unwrap();
    host_from_config(&config, Path::new(".")).await.unwrap()
}

#[test]
fn stop_reason_mapping_is_the_contracts_run_outcome() {
    let completed = outcome_of(&RunResult::completed("the answer"));
    assert_eq!((completed.status, completed.output.as_deref()), (TerminalStatus::Completed, Some("the answer")));
    let aborted = outcome_of(&RunResult::aborted(Some("task_kill".into())));
    assert_eq!((aborted.status, aborted.detail.as_deref()), (TerminalStatus::Killed, Some("task_kill")));
    for (reason, detail) in [
        (StopReason::Error, "error"),
        (StopReason::MaxTokens, "max-tokens"),
        (StopReason::Refusal, "refusal"),
        (StopReason::Other("merge-extensible".into()), "merge-extensible"),
    ] {
        let outcome = outcome_of(&RunResult::stopped("", reason));
        assert_eq!((outcome.status, outcome.detail.as_deref()), (TerminalStatus::Failed, Some(detail)));
    }
    let error = outcome_of(&RunResult::error("HTTP 500: oops"));
    assert_eq!(error.detail.as_deref(), Some("error: HTTP 500: oops"));
}

#[tokio::test]
async fn every_stop_reason_collected_through_task_output() {
    let host = host_from(CONFIG).await;
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    for (prompt, expected) in STOP_REASON_CASES {
        let id = start_subagent(&host, &context, &format!("case {prompt}"), prompt).await;
        assert!(id.starts_with("subagent-"), "{id}");
        assert_eq!(collect(&host, &context, &id).await, expected, "prompt {prompt:?}");
        // Final reads are idempotent.
        assert_eq!(collect(&host, &context, &id).await, expected, "prompt {prompt:?}, second read");
    }
    assert!(child_agents(&host).is_empty(), "every child released: {:?}", child_agents(&host));
    host.dispose().await;
}

#[tokio::test]
async fn foreground_returns_the_text_or_an_error_result() {
    let host = host_from(CONFIG).await;
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    let ok = host.call_tool("subagent", json!({"description": "fg", "prompt": "say hi"}), &context).await.unwrap();
    assert_eq!((ok.text.as_str(), ok.is_error), ("answer to: say hi\n[status: completed]", false));
    let failed =
        host.call_tool("subagent_fork", json!({"description": "fg", "prompt": "say refusal"}), &context).await.unwrap();
    assert!(failed.is_error, "{failed:?}");
    assert!(failed.text.ends_with("[status: failed, refusal]"), "{}", failed.text);
    assert!(child_agents(&host).is_empty());
    assert!(host.registry().list(Some(&parent)).is_empty(), "foreground runs register nothing");
    host.dispose().await;
}

/// Records, at each task's settlement, which child agents were still
/// registered and which tasks had settled before it.
#[derive(Default)]
struct Settlements {
    seen: Mutex<Vec<(String, TaskStatus, Vec<String>)>>,
}

#[tokio::test]
async fn done_is_reported_only_after_the_child_is_disposed_on_both_paths() {
    let host = host_from(CONFIG).await;
    let log = Arc::new(Settlements::default());
    let agents = host.agents().clone();
    let sink = log.clone();
    let _guard = host.registry().on_task_done(Arc::new(move |done| {
        let children: Vec<String> =
            agents.list().iter().map(|a| a.id().to_string()).filter(|id| id.starts_with("subagent-")).collect();
        sink.seen.lock().unwrap().push((done.snapshot.id.to_string(), done.snapshot.status, children));
    }));
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    for (prompt, expected_status) in
        [("start a ticker", TaskStatus::Completed), ("ticker then fail", TaskStatus::Failed)]
    {
        let id = start_subagent(&host, &context, prompt, prompt).await;
        let output = collect(&host, &context, &id).await;
        assert!(output.contains(&format!("[status: {expected_status}")), "{output}");
        let seen = log.seen.lock().unwrap().clone();
        let at = seen.iter().position(|(task, _, _)| *task == id).expect("the subagent task settled");
        let (_, status, children_then) = &seen[at];
        assert_eq!(*status, expected_status);
        assert!(children_then.is_empty(), "child agents still registered at settlement: {children_then:?}");
        // The child's own background ticker settled (killed by the child's
        // disposal) BEFORE the subagent task reported.
        let ticker = seen[..at].iter().find(|(task, _, _)| task.starts_with("ticker-"));
        assert!(
            matches!(ticker, Some((_, TaskStatus::Killed, _))),
            "the child's ticker was not killed before the report: {seen:?}"
        );
        log.seen.lock().unwrap().clear();
    }
    host.dispose().await;
}

#[tokio::test]
async fn detached_signal_pre_cancelled_refuses_and_started_ids_outlive_the_call() {
    let host = host_from(CONFIG).await;
    let parent = host.create_agent("parent", "parent-session").unwrap();

    let cancelled = CallContext::for_agent(&parent);
    cancelled.cancel.cancel();
    let refused =
        call(&host, &cancelled, "subagent", json!({"description": "d", "prompt": "say hi", "run_in_background": true}))
            .await;
    assert_eq!(refused, "ERROR: the call to subagent was cancelled");
    assert!(child_agents(&host).is_empty(), "no child was created");
    assert!(host.registry().list(Some(&parent)).is_empty());

    let context = CallContext::for_agent(&parent);
    let id = start_subagent(&host, &context, "d", "say detached").await;
    // The calling request ends (its token fires): the child keeps running.
    context.cancel.cancel();
    let reader = CallContext::for_agent(&parent);
    assert_eq!(collect(&host, &reader, &id).await, "answer to: say detached\n[status: completed]");
    host.dispose().await;
}

#[tokio::test]
async fn task_kill_stops_a_background_subagent_and_its_child() {
    let host = host_from(CONFIG).await;
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    let id = start_subagent(&host, &context, "slow one", "slow").await;
    let running = call(&host, &context, "task_output", json!({"task_id": id})).await;
    assert_eq!(running, "(no new output)\n[status: running]");
    assert_eq!(child_agents(&host).len(), 1);
    let killed = call(&host, &context, "task_kill", json!({"task_id": id, "reason": "no longer needed"})).await;
    assert_eq!(killed, format!("requested cancellation of task {id}"));
    assert_eq!(collect(&host, &context, &id).await, "(no new output)\n[status: killed, no longer needed]");
    assert!(child_agents(&host).is_empty());
    let again = call(&host, &context, "task_kill", json!({"task_id": id})).await;
    assert_eq!(again, format!("task {id} had already finished [status: killed, no longer needed]"));
    // Another session can neither read nor kill it.
    let other = host.create_agent("other", "other-session").unwrap();
    let foreign = call(&host, &CallContext::for_agent(&other), "task_kill", json!({"task_id": id})).await;
    assert_eq!(foreign, format!("ERROR: task {id} belongs to another session"));
    host.dispose().await;
}

#[tokio::test]
async fn a_failed_start_preflight_never_starts_a_child() {
    // Per-owner cap reached: the subagent start is refused before any child exists.
    let host = host_from(&CONFIG.replace("max_live_tasks_per_owner = 4", "max_live_tasks_per_owner = 1")).await;
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    let ticker =
        call(&host, &context, "ticker", json!({"count": 1000, "interval_ms": 50, "run_in_background": true})).await;
    assert_eq!(ticker, "started background ticker task ticker-1");
    let refused = host
        .call_tool("subagent", json!({"description": "d", "prompt": "say hi", "run_in_background": true}), &context)
        .await;
    assert!(matches!(refused, Err(ToolError::Task(TaskError::TooManyTasks { .. }))), "{refused:?}");
    assert!(child_agents(&host).is_empty(), "a child was created: {:?}", child_agents(&host));

    // No control surface: a registry nobody attached tools to refuses the
    // start before the producer's runner (which creates the child) is called.
    let bare = TaskRegistry::new(host.agents().clone(), Default::default());
    let config = Config::parse(CONFIG).unwrap();
    let subagents = Subagents::for_host(&host, &config.subagents).unwrap();
    let native = taskhost::subagents::SubagentProducer::new(subagents, &json!({})).unwrap();
    let prepared = native.prepare(json!({"description": "d", "prompt": "say hi"}), RunMode::Background).await.unwrap();
    let started =
        bare.start(TaskStart::new("subagent", prepared.label, prepared.run).with_owner(Some(parent.clone()))).await;
    assert!(matches!(started, Err(TaskError::NoControlSurface)), "{started:?}");
    assert!(child_agents(&host).is_empty(), "a child was created: {:?}", child_agents(&host));
    host.dispose().await;
}

#[tokio::test]
async fn schema_and_description_are_gated_per_instance() {
    let host = host_from(CONFIG).await;
    let definitions = host.tool_definitions();
    let find = |name: &str| definitions.iter().find(|d| d.name == name).unwrap().clone();
    let subagent = find("subagent");
    let fork = find("subagent_fork");
    assert_eq!(subagent.input_schema["properties"]["run_in_background"]["type"], "boolean");
    assert!(subagent.description.contains("task_output"), "{}", subagent.description);
    assert!(fork.input_schema["properties"].get("run_in_background").is_none());
    assert!(!fork.description.contains("task_output") && !fork.description.contains("background"));
    assert!(fork.description.starts_with("Fork this conversation"));
    assert_eq!(fork.input_schema["required"], json!(["description", "prompt"]));

    let parent = host.create_agent("parent", "parent-session").unwrap();
    let forced = call(
        &host,
        &CallContext::for_agent(&parent),
        "subagent_fork",
        json!({"description": "d", "prompt": "p", "run_in_background": true}),
    )
    .await;
    assert!(forced.contains("run_in_background is disabled for the subagent_fork tool"), "{forced}");
    assert!(child_agents(&host).is_empty());

    // A contradicting instance flag and an unknown profile are config errors.
    let config = Config::parse(
        "[[producer]]\ntool = \"s\"\nplugin = \"native:subagent\"\nbackground = false\nconfig = { background = true }",
    )
    .unwrap();
    let error = format!("{:#}", host_from_config(&config, Path::new(".")).await.err().unwrap());
    assert!(error.contains("contradicts background = false"), "{error}");
    let config =
        Config::parse("[[producer]]\ntool = \"s\"\nplugin = \"native:subagent\"\nconfig = { profile = \"nope\" }")
            .unwrap();
    let error = format!("{:#}", host_from_config(&config, Path::new(".")).await.err().unwrap());
    assert!(error.contains("no backend named \"nope\""), "{error}");
    host.dispose().await;
}

#[tokio::test]
async fn owner_disposal_awaits_every_child_and_the_childrens_tasks() {
    let host = host_from(CONFIG).await;
    let settled = Arc::new(Mutex::new(Vec::new()));
    let sink = settled.clone();
    let _guard = host.registry().on_task_done(Arc::new(move |done| {
        sink.lock().unwrap().push((done.snapshot.id.to_string(), done.snapshot.status));
    }));
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    let mut ids = Vec::new();
    for n in 0..2 {
        ids.push(start_subagent(&host, &context, &format!("holder {n}"), "hold a ticker").await);
    }
    // Wait until both children run their own background ticker: each start
    // is an event of the registry, so the count is checked after each.
    let mut events = host.registry().subscribe();
    tokio::time::timeout(Duration::from_secs(20), async {
        while children_tickers(&host) < 2 {
            // A lagged receiver only means more events came: check again.
            if let Err(tokio::sync::broadcast::error::RecvError::Closed) = events.recv().await {
                panic!("the registry's event stream closed");
            }
        }
    })
    .await
    .expect("both children started a ticker within 20 s");
    assert!(settled.lock().unwrap().is_empty(), "nothing settled before the disposal: {:?}", settled.lock().unwrap());
    assert_eq!(children_tickers(&host), 2, "both children started a ticker");
    tokio::time::timeout(Duration::from_secs(20), parent.dispose()).await.expect("owner disposal finished");
    assert!(child_agents(&host).is_empty(), "children left: {:?}", child_agents(&host));
    let settled = settled.lock().unwrap().clone();
    let tickers: Vec<_> = settled.iter().filter(|(id, _)| id.starts_with("ticker-")).collect();
    assert_eq!(tickers.len(), 2, "{settled:?}");
    assert!(tickers.iter().all(|(_, status)| *status == TaskStatus::Killed), "{settled:?}");
    for id in &ids {
        assert!(settled.iter().any(|(task, status)| task == id && *status == TaskStatus::Killed), "{settled:?}");
    }
    host.dispose().await;
}

/// Live ticker tasks owned by child agents.
fn children_tickers(host: &Host) -> usize {
    host.agents()
        .list()
        .iter()
        .filter(|a| a.id().as_str().starts_with("subagent-"))
        .map(|child| {
            host.registry().list(Some(child)).iter().filter(|t| t.kind == "ticker" && !t.status.is_terminal()).count()
        })
        .sum()
}

#[tokio::test]
async fn two_subagents_and_a_ticker_in_one_session_listed_and_collected_together() {
    let host = host_from(CONFIG).await;
    let parent = host.create_agent("parent", "parent-session").unwrap();
    let context = CallContext::for_agent(&parent);
    let a = start_subagent(&host, &context, "research A", "say A").await;
    let b = start_subagent(&host, &context, "research B", "start a ticker").await;
    // Ticker ids are per kind; the child of B starts its own ticker
    // concurrently, so the parent's may be any ticker-N.
    let ticker = start_task(
        &host,
        &context,
        "ticker",
        json!({"count": 3, "interval_ms": 100, "message": "tick", "run_in_background": true}),
    )
    .await;
    let list = call(&host, &context, "task_list", json!({})).await;
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 3, "{list}");
    assert!(lines[0].starts_with(&format!("{a} [subagent] ")) && lines[0].ends_with(" — research A"), "{list}");
    assert!(lines[1].starts_with(&format!("{b} [subagent] ")) && lines[1].ends_with(" — research B"), "{list}");
    assert!(
        lines[2].starts_with(&format!("{ticker} [ticker] ")) && lines[2].ends_with(" — 3 ticks every 100 ms"),
        "{list}"
    );

    let (out_a, out_b, out_t) =
        tokio::join!(collect(&host, &context, &a), collect(&host, &context, &b), collect(&host, &context, &ticker));
    assert_eq!(out_a, "answer to: say A\n[status: completed]");
    // The child's own ticker was started as the child, so its id is the
    // child's, and it is not in the parent's list.
    assert!(out_b.starts_with("child: started background ticker task ticker-"), "{out_b}");
    assert!(out_b.ends_with("[status: completed]"), "{out_b}");
    assert!(out_t.ends_with("[status: completed, ticks: 3]"), "{out_t}");
    let list = call(&host, &context, "task_list", json!({})).await;
    assert_eq!(list.lines().count(), 3, "only the parent's three tasks: {list}");
    assert!(list.lines().all(|line| line.contains(" completed — ")), "{list}");
    host.dispose().await;
}
