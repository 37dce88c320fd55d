//! The model-facing tools through the `Host` facade: exact texts, schemas,
//! argument validation, the run_in_background gate and foreground runs.

use std::sync::Arc;
use std::time::Duration;

use agent_calls::{call, start_task};
use serde_json::json;
use taskhost::Host;
use taskhost::config::Config;
use taskhost::native::scripted::{CancelMode, ScriptedProducer};
use taskhost::native::ticker::TickerProducer;
use taskhost::settings::TasksSettings;
use taskhost::tasks::TaskOutcome;
use taskhost::tools::producer_tool::ProducerToolOptions;
use taskhost::tools::{CallContext, ToolError};
use taskhost_tests::agent_calls;

fn host() -> Host {
    let host = Host::new(&TasksSettings::default()).unwrap();
    host.add_producer_named("ticker", Arc::new(TickerProducer::new(&json!({})).unwrap())).expect("tool name is valid");
    host
}

#[tokio::test]
async fn tool_definitions_and_schemas() {
    let host = host();
    let names: Vec<String> = host.tool_definitions().into_iter().map(|d| d.name).collect();
    assert_eq!(names, ["task_input", "task_kill", "task_list", "task_output", "task_wait", "ticker"]);
    let ticker = host.tool_definitions().into_iter().find(|d| d.name == "ticker").unwrap();
    assert_eq!(ticker.input_schema["properties"]["run_in_background"]["type"], "boolean");
    let output = host.tool_definitions().into_iter().find(|d| d.name == "task_output").unwrap();
    assert_eq!(output.input_schema["required"], json!(["task_id"]));
    assert!(output.description.contains("30000 ms"));

    // Disabled background: omitted from the schema, refused when forced.
    host.add_producer(
        Arc::new(TickerProducer::new(&json!({})).unwrap()),
        ProducerToolOptions::new("ticker")
            .with_background(false)
            .with_foreground_timeout(Duration::from_secs(5))
            .with_promote_after(None),
    )
    .expect("tool name is valid");
    let ticker = host.tool_definitions().into_iter().find(|d| d.name == "ticker").unwrap();
    assert!(ticker.input_schema["properties"].get("run_in_background").is_none());
    let context = CallContext::default();
    let refused = call(&host, &context, "ticker", json!({"count": 1, "run_in_background": true})).await;
    assert_eq!(
        refused,
        "ERROR: invalid arguments for ticker: run_in_background is disabled for the ticker tool in this deployment; \
         call it without run_in_background"
    );
    assert!(host.registry().list(None).is_empty(), "nothing started");
}

#[tokio::test]
async fn background_ticker_through_the_control_tools() {
    let host = host();
    let agent = host.create_agent("a", "s-a").unwrap();
    let context = CallContext::for_agent(&agent);
    let started =
        call(&host, &context, "ticker", json!({"count": 3, "interval_ms": 30, "run_in_background": true})).await;
    assert_eq!(started, "started background ticker task ticker-1");
    assert_eq!(call(&host, &context, "task_list", json!({})).await, "ticker-1 [ticker] running — 3 ticks every 30 ms");

    let mut collected = String::new();
    loop {
        let out = call(&host, &context, "task_output", json!({"task_id": "ticker-1"})).await;
        let (body, status) = out.rsplit_once('\n').unwrap();
        if body != "(no new output)" {
            collected.push_str(body);
            collected.push('\n');
        }
        if status != "[status: running]" {
            assert_eq!(status, "[status: completed, ticks: 3]");
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(collected, "tick 1\ntick 2\ntick 3\n", "every tick exactly once");
    assert_eq!(
        call(&host, &context, "task_kill", json!({"task_id": "ticker-1"})).await,
        "task ticker-1 had already finished [status: completed, ticks: 3]"
    );
}

#[tokio::test]
async fn wait_kill_and_notices() {
    let host = host();
    let agent = host.create_agent("a", "s-a").unwrap();
    let context = CallContext::for_agent(&agent);
    call(&host, &context, "ticker", json!({"count": 2, "interval_ms": 10, "run_in_background": true})).await;
    let waited = call(&host, &context, "task_output", json!({"task_id": "ticker-1", "wait": true})).await;
    assert_eq!(waited, "tick 1\ntick 2\n[status: completed, ticks: 2]");

    call(&host, &context, "ticker", json!({"count": 5, "interval_ms": 60000, "run_in_background": true})).await;
    let timed_out =
        call(&host, &context, "task_output", json!({"task_id": "ticker-2", "wait": true, "timeout_ms": 20})).await;
    assert_eq!(timed_out, "(no new output)\n[status: running]");
    assert_eq!(
        call(&host, &context, "task_kill", json!({"task_id": "ticker-2", "reason": "not needed"})).await,
        "requested cancellation of task ticker-2"
    );
    let killed = call(&host, &context, "task_output", json!({"task_id": "ticker-2", "wait": true})).await;
    assert_eq!(killed, "(no new output)\n[status: killed, after 0 ticks]");

    // Unreported completion: the owner gets exactly one notice, delivered
    // before the registry announces the settlement.
    let mut events = host.registry().subscribe();
    call(&host, &context, "ticker", json!({"count": 1, "interval_ms": 1, "run_in_background": true})).await;
    loop {
        match events.recv().await.expect("the registry outlives the test") {
            taskhost::tasks::TaskEvent::Settled { task } if task.id.as_str() == "ticker-3" => break,
            _ => {}
        }
    }
    let log: Vec<String> = agent.take_unread().into_iter().map(|m| m.text).collect();
    assert_eq!(
        log,
        ["background task ticker-3 (ticker: 1 ticks every 1 ms) finished [status: completed, ticks: 1]. \
          Read its output with task_output."]
    );
    assert!(agent.take_unread().is_empty());
}

#[tokio::test]
async fn bad_arguments_and_ids_get_clear_errors() {
    let host = host();
    let alice = host.create_agent("alice", "s-alice").unwrap();
    let bob = host.create_agent("bob", "s-bob").unwrap();
    let (a, b) = (CallContext::for_agent(&alice), CallContext::for_agent(&bob));
    call(&host, &a, "ticker", json!({"count": 1, "interval_ms": 60000, "run_in_background": true})).await;

    let cases = [
        ("task_output", json!({}), "ERROR: invalid arguments for task_output: missing field `task_id`"),
        (
            "task_output",
            json!({"task_id": 7}),
            "ERROR: invalid arguments for task_output: invalid type: integer `7`, expected a string",
        ),
        (
            "task_output",
            json!({"task_id": " "}),
            "ERROR: invalid arguments for task_output: task_id is empty; pass an id from a start reply or from task_list",
        ),
        (
            "task_output",
            json!("ticker-1"),
            "ERROR: invalid arguments for task_output: expected a JSON object, got a string",
        ),
        (
            "task_output",
            json!({"task_id": "ticker-1", "timeout_ms": -5}),
            "ERROR: invalid arguments for task_output: invalid value: integer `-5`, expected u64",
        ),
        (
            "task_list",
            json!({"all": true}),
            "ERROR: invalid arguments for task_list: unknown field `all`, there are no fields",
        ),
        (
            "task_kill",
            json!({"task_id": "ticker-9"}),
            "ERROR: unknown task id ticker-9: no background task has this id (task_list shows your tasks)",
        ),
        ("task_output", json!({"task_id": "ticker-1"}), "ERROR: task ticker-1 belongs to another session"),
        ("task_kill", json!({"task_id": "ticker-1"}), "ERROR: task ticker-1 belongs to another session"),
        (
            "ticker",
            json!({"count": "many"}),
            "ERROR: invalid arguments for ticker: at /count: \"many\" is not of type \"integer\"",
        ),
        (
            "ticker",
            json!({"count": 1, "run_in_background": "yes"}),
            "ERROR: invalid arguments for ticker: run_in_background must be a boolean, got a string",
        ),
        (
            "nope",
            json!({}),
            "ERROR: unknown tool \"nope\"; available tools: task_input, task_kill, task_list, task_output, task_wait, ticker",
        ),
    ];
    for (tool, args, expected) in cases {
        let got = call(&host, &b, tool, args.clone()).await;
        assert!(got.starts_with(expected), "{tool} {args}: got {got:?}, expected {expected:?}");
    }
    assert_eq!(call(&host, &b, "task_list", json!({})).await, "(no background tasks)");
    assert!(
        call(&host, &a, "ticker", json!({"count": 200000}))
            .await
            .contains("200000 is greater than the maximum of 100000")
    );
}

#[tokio::test]
async fn wait_timeouts_are_clamped_and_configurable() {
    let config = Config::parse("[tasks]\nwait_timeout_ms = 50\nmax_wait_timeout_ms = 100\n").unwrap();
    let host = Host::new(&config.tasks).unwrap();
    host.add_producer_named("ticker", Arc::new(TickerProducer::new(&json!({})).unwrap())).expect("tool name is valid");
    let context = CallContext::default();
    call(&host, &context, "ticker", json!({"count": 1, "interval_ms": 60000, "run_in_background": true})).await;
    let started = std::time::Instant::now();
    let out =
        call(&host, &context, "task_output", json!({"task_id": "ticker-1", "wait": true, "timeout_ms": 3_600_000}))
            .await;
    assert_eq!(out, "(no new output)\n[status: running]");
    assert!(started.elapsed() < Duration::from_secs(30), "clamped to the 100 ms cap");

    let error = Config::parse("[tasks]\nwait_timeout_ms = 700000\n").unwrap_err();
    assert_eq!(
        format!("{error:#}"),
        "[tasks] wait_timeout_ms (700000) is larger than max_wait_timeout_ms (600000); lower it or raise the cap"
    );
    let typo = Config::parse("[tasks]\nwait_timeout = 5\n").unwrap_err();
    assert!(format!("{typo:#}").contains("unknown field `wait_timeout`"), "{typo:#}");
}

// Paused time: the ticks, the timeout and the cancel land at exact instants
// however loaded the machine is.
#[tokio::test(start_paused = true)]
async fn foreground_runs_return_output_and_honour_timeouts() {
    let host = host();
    let context = CallContext::default();
    let out = host.call_tool("ticker", json!({"count": 2, "interval_ms": 5}), &context).await.unwrap();
    assert_eq!(out.text, "tick 1\ntick 2\n[status: completed, ticks: 2]");
    assert!(!out.is_error);

    host.add_producer(
        Arc::new(TickerProducer::new(&json!({"default_message": "beat"})).unwrap()),
        ProducerToolOptions::new("slow").with_foreground_timeout(Duration::from_millis(50)).with_promote_after(None),
    )
    .expect("tool name is valid");
    let out = host.call_tool("slow", json!({"count": 100, "interval_ms": 20}), &context).await.unwrap();
    assert!(out.is_error);
    assert!(out.text.starts_with("beat 1\n"), "{}", out.text);
    assert!(out.text.ends_with("[status: killed, after 2 ticks, timed out after 50 ms]"), "{}", out.text);
    assert!(host.registry().list(None).is_empty(), "foreground runs never enter the registry");

    // Cancelling the call kills the foreground work.
    let cancel = CallContext::default();
    let token = cancel.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        token.cancel();
    });
    let out = host.call_tool("ticker", json!({"count": 100, "interval_ms": 10}), &cancel).await.unwrap();
    assert!(out.text.ends_with("the call was cancelled]"), "{}", out.text);
}

#[tokio::test]
async fn a_pre_cancelled_background_call_starts_nothing() {
    let host = host();
    let scripted = ScriptedProducer::new("job", true);
    host.add_producer_named("job", Arc::new(scripted.clone())).expect("tool name is valid");
    let context = CallContext::default();
    context.cancel.cancel();
    let error = host.call_tool("job", json!({"run_in_background": true}), &context).await.unwrap_err();
    assert!(matches!(error, ToolError::Cancelled(_)));
    assert_eq!(scripted.runs(), 0);

    // Once the id is returned, the call's cancellation no longer reaches the task.
    let context = CallContext::default();
    let started = host.call_tool("job", json!({"label": "x", "run_in_background": true}), &context).await.unwrap();
    assert_eq!(started.text, "started background job task job-1");
    context.cancel.cancel();
    // A window for a wrongly wired cancellation to arrive (a negative check).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let task = &scripted.started()[0];
    assert!(task.cancel_requests().is_empty());
    task.set_cancel_mode(CancelMode::Settle);
    task.settle(TaskOutcome::completed(None));
}

#[tokio::test]
async fn the_system_prompt_section_teaches_the_habit() {
    let section = host().system_prompt_section();
    for phrase in ["task id", "task_output", "task_kill", "task_list", "busy-poll", "duplicates", "final answer"] {
        assert!(section.contains(phrase), "missing {phrase:?}");
    }
}

/// A producer that panics where it is told to: `{"in": "prepare" | "run" | "done"}`.
struct Panicky;

#[taskhost::async_trait::async_trait]
impl taskhost::producer::Producer for Panicky {
    fn descriptor(&self) -> Arc<taskhost::producer::Descriptor> {
        Arc::new(
            taskhost::producer::Descriptor::new(
                "panicky",
                "Panics on request.",
                json!({"type": "object", "properties": {"in": {"type": "string"}}}),
            )
            .with_streams_output(true),
        )
    }

    async fn prepare(
        &self,
        args: serde_json::Value,
        _mode: taskhost::producer::RunMode,
    ) -> anyhow::Result<taskhost::producer::PreparedRun> {
        let place = args["in"].as_str().unwrap_or("done").to_string();
        let code = 42;
        if place == "prepare" {
            panic!("prepare blew up {code}");
        }
        Ok(taskhost::producer::PreparedRun::new(
            "panicky",
            taskhost::producer::runner(async move {
                if place == "run" {
                    panic!("run blew up {code}");
                }
                let task = taskhost::native::scripted::ScriptedTask::new(true);
                let done = async move {
                    tokio::task::yield_now().await;
                    panic!("done blew up {code}")
                };
                Ok(taskhost::tasks::TaskHooks::new(task, Box::pin(done)))
            }),
        ))
    }
}

#[tokio::test]
async fn a_panicking_producer_never_unwinds_into_the_caller() {
    let host = host();
    host.add_producer_named("panicky", Arc::new(Panicky)).expect("tool name is valid");
    let agent = host.create_agent("a", "s-a").unwrap();
    let context = CallContext::for_agent(&agent);
    // Foreground: each place fails the call (or the task) with its message.
    let out = call(&host, &context, "panicky", json!({"in": "prepare"})).await;
    assert!(out.starts_with("ERROR: ") && out.contains("the producer panicked: prepare blew up 42"), "{out}");
    let out = call(&host, &context, "panicky", json!({"in": "run"})).await;
    assert!(out.contains("the producer panicked: run blew up 42"), "{out}");
    let out = host.call_tool("panicky", json!({"in": "done"}), &context).await.unwrap();
    assert!(out.is_error);
    assert_eq!(out.text, "(no output)\n[status: failed, producer panicked: done blew up 42]");
    // Background: the same panic is the task's failure.
    let started = call(&host, &context, "panicky", json!({"in": "done", "run_in_background": true})).await;
    assert_eq!(started, "started background panicky task panicky-1");
    let out = call(&host, &context, "task_output", json!({"task_id": "panicky-1", "wait": true})).await;
    assert_eq!(out, "(no new output)\n[status: failed, producer panicked: done blew up 42]");
}

#[tokio::test]
async fn tool_names_follow_the_rule_and_spare_the_control_tools() {
    let host = host();
    let ticker = || Arc::new(TickerProducer::new(&json!({})).unwrap());
    for reserved in ["task_output", "task_list", "task_kill", "task_wait", "task_input"] {
        let error = host.add_producer_named(reserved, ticker()).unwrap_err();
        assert!(error.to_string().contains("reserved for taskhost's control tools"), "{error}");
    }
    for invalid in ["My Tool", "", "tool.name", &"x".repeat(65), "naïve"] {
        let error = host.add_producer_named(invalid, ticker()).unwrap_err();
        assert!(error.to_string().contains("1 to 64 ASCII letters"), "{invalid:?}: {error}");
    }
    host.add_producer_named(&"x".repeat(64), ticker()).expect("64 characters are fine");
    // The control tools still answer as themselves.
    let out = call(&host, &CallContext::default(), "task_list", json!({})).await;
    assert_eq!(out, "(no background tasks)");
    // The configuration refuses the same names before anything is served.
    for (tool, expected) in [("My Tool", "1 to 64 ASCII letters"), ("task_wait", "reserved")] {
        let toml = format!("[[producer]]\ntool = {tool:?}\nplugin = \"native:ticker\"\n");
        let error = format!("{:#}", Config::parse(&toml).unwrap_err());
        assert!(error.contains(expected), "{error}");
    }
}

#[tokio::test]
async fn the_read_that_reports_an_end_carries_no_notice_of_it() {
    let host = host();
    let agent = host.create_agent("a", "s-a").unwrap();
    let context = CallContext::for_agent(&agent);
    let mut told = std::collections::HashMap::<String, usize>::new();
    for n in 1..=40 {
        let id =
            start_task(&host, &context, "ticker", json!({"count": 1, "interval_ms": 0, "run_in_background": true}))
                .await;
        // Race the read against the settlement (and its notice).
        let out = call(&host, &context, "task_output", json!({"task_id": id, "wait": n % 2 == 0})).await;
        let unread: Vec<String> = agent.take_unread().into_iter().map(|m| m.text).collect();
        let reported_here = out.ends_with("[status: completed, ticks: 1]");
        if reported_here {
            *told.entry(id.clone()).or_default() += 1;
        }
        for notice in &unread {
            let about = notice.split(' ').nth(2).unwrap().to_string();
            assert!(
                !(reported_here && about == id),
                "the read reported {id}'s end, so its notice may not join it: {out} {unread:?}"
            );
            *told.entry(about).or_default() += 1;
        }
    }
    // Settle the stragglers, then every task was told of exactly once.
    host.dispose().await;
    let last: Vec<String> = agent.take_unread().into_iter().map(|m| m.text).collect();
    for notice in &last {
        *told.entry(notice.split(' ').nth(2).unwrap().to_string()).or_default() += 1;
    }
    assert_eq!(told.len(), 40, "{told:?}");
    assert!(told.values().all(|&n| n == 1), "each end told once: {told:?}");
}

#[tokio::test]
async fn task_list_says_how_many_finished_tasks_were_dropped() {
    let config = Config::parse("[tasks]\nmax_finished_tasks_per_owner = 2\n").unwrap();
    let host = Host::new(&config.tasks).unwrap();
    host.add_producer_named("ticker", Arc::new(TickerProducer::new(&json!({})).unwrap())).expect("tool name is valid");
    let agent = host.create_agent("a", "s-a").unwrap();
    let context = CallContext::for_agent(&agent);
    for _ in 0..5 {
        let id =
            start_task(&host, &context, "ticker", json!({"count": 1, "interval_ms": 0, "run_in_background": true}))
                .await;
        call(&host, &context, "task_output", json!({"task_id": id, "wait": true})).await;
    }
    let listed = call(&host, &context, "task_list", json!({})).await;
    assert_eq!(
        listed,
        "ticker-4 [ticker] completed — 1 ticks every 0 ms\nticker-5 [ticker] completed — 1 ticks every 0 ms\n\
         (3 older finished tasks were dropped from this list)"
    );
    let out = call(&host, &context, "task_output", json!({"task_id": "ticker-1"})).await;
    assert!(out.starts_with("ERROR: unknown task id ticker-1"), "{out}");
}
