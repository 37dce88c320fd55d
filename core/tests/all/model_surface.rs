//! What agents expect of background work beyond the three control tools,
//! through the public tool surface of a [`Host`] serving the scripted kind:
//! views that do not consume (`task_output` `view`/`lines`/`grep`),
//! `task_wait`, `task_input`, milestone notices (`notify_on`) and the
//! promotion of a long foreground call. Time is paused: timers (promotion,
//! stalls, timeouts) fire when every task is idle, never by a real sleep.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use taskhost_core::agents::Agent;
use taskhost_core::native::scripted::{ScriptedProducer, ScriptedTask};
use taskhost_core::settings::TasksSettings;
use taskhost_core::tasks::TaskOutcome;
use taskhost_core::tools::producer_tool::ProducerToolOptions;
use taskhost_core::tools::{CallContext, ToolError};
use taskhost_core::{Host, ids::TaskId};

struct Fixture {
    host: Host,
    agent: Agent,
    streams: Arc<ScriptedProducer>,
    results: Arc<ScriptedProducer>,
}

fn fixture_with(settings: TasksSettings, promote_after: Option<Duration>) -> Fixture {
    let host = Host::new(&settings).unwrap();
    let streams = ScriptedProducer::new("job", true);
    let results = ScriptedProducer::new("answer", false);
    for (name, producer) in [("job", &streams), ("answer", &results)] {
        host.add_producer(
            Arc::new(producer.clone()),
            ProducerToolOptions::new(name)
                .with_foreground_timeout(Duration::from_secs(600))
                .with_promote_after(promote_after),
        )
        .unwrap();
    }
    let agent = host.create_agent("agent-a", "session-a").unwrap();
    Fixture { host, agent, streams, results }
}

fn fixture() -> Fixture {
    fixture_with(TasksSettings::default(), None)
}

impl Fixture {
    async fn call(&self, tool: &str, args: Value) -> Result<String, ToolError> {
        self.call_as(&self.agent, tool, args).await
    }

    async fn call_as(&self, agent: &Agent, tool: &str, args: Value) -> Result<String, ToolError> {
        self.host.call_tool(tool, args, &CallContext::for_agent(agent)).await.map(|out| out.text)
    }

    async fn ok(&self, tool: &str, args: Value) -> String {
        self.call(tool, args).await.unwrap_or_else(|e| panic!("{tool} failed: {e}"))
    }

    async fn err(&self, tool: &str, args: Value) -> String {
        match self.call(tool, args).await {
            Ok(text) => panic!("{tool} should have failed, answered {text:?}"),
            Err(error) => error.to_string(),
        }
    }

    /// Starts a background job task and returns its id and handle.
    async fn start_job(&self, extra: Value) -> (String, Arc<ScriptedTask>) {
        let mut args = json!({"label": "job", "run_in_background": true});
        args.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let reply = self.ok("job", args).await;
        let id = reply.rsplit(' ').next().unwrap().to_string();
        (id, self.streams.started().last().unwrap().clone())
    }

    /// Lets spawned drains and watchers run (time is paused; no real wait).
    async fn settle_io(&self) {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    fn unread(&self) -> Vec<String> {
        self.agent.take_unread().into_iter().map(|m| m.text).collect()
    }
}

fn numbered(from: usize, to: usize) -> String {
    (from..=to).map(|n| format!("line {n}\n")).collect()
}

#[tokio::test(start_paused = true)]
async fn views_show_the_output_without_consuming_it() {
    let f = fixture();
    let (id, task) = f.start_job(json!({})).await;
    task.push_output(&numbered(1, 100));
    let tail = f.ok("task_output", json!({"task_id": id, "view": "tail", "lines": 3})).await;
    assert_eq!(tail, "line 98\nline 99\nline 100\n[status: running]");
    let head = f.ok("task_output", json!({"task_id": id, "view": "head", "lines": 2})).await;
    assert_eq!(head, "line 1\nline 2\n[status: running]");
    let grep = f.ok("task_output", json!({"task_id": id, "view": "tail", "lines": 2, "grep": "^line 4"})).await;
    assert_eq!(grep, "48: line 48\n49: line 49\n[status: running]");
    let none = f.ok("task_output", json!({"task_id": id, "grep": "absent"})).await;
    assert_eq!(none, "(no matching lines)\n[status: running]");
    // The default tail is 40 lines.
    let default_tail = f.ok("task_output", json!({"task_id": id, "view": "tail"})).await;
    assert_eq!(default_tail.lines().count(), 41);
    assert!(default_tail.starts_with("line 61\n"));

    // The consuming read still returns everything, once.
    let read = f.ok("task_output", json!({"task_id": id})).await;
    assert_eq!(read, format!("{}[status: running]", numbered(1, 100)));
    assert_eq!(f.ok("task_output", json!({"task_id": id})).await, "(no new output)\n[status: running]");

    // Views of a finished task cover everything, and report nothing.
    task.push_output("last line\n");
    task.settle(TaskOutcome::completed(Some("exit code: 0".to_string())));
    f.settle_io().await;
    f.ok("task_output", json!({"task_id": id, "view": "head", "lines": 1})).await;
    let all = f.ok("task_output", json!({"task_id": id, "view": "all", "grep": "last|line 100$"})).await;
    assert_eq!(all, "100: line 100\n101: last line\n[status: completed, exit code: 0]");
    let notices = f.unread();
    assert_eq!(notices.len(), 1, "a view reports nothing, so the completion notice came: {notices:?}");
    assert_eq!(f.ok("task_output", json!({"task_id": id})).await, "last line\n[status: completed, exit code: 0]");

    // A final-output kind's view shows its result once settled.
    let reply = f.ok("answer", json!({"label": "q", "run_in_background": true})).await;
    let answer_id = reply.rsplit(' ').next().unwrap().to_string();
    let answer = f.results.started().last().unwrap().clone();
    answer.settle(TaskOutcome::completed(None).with_output("one\ntwo\nthree"));
    f.settle_io().await;
    let tail = f.ok("task_output", json!({"task_id": answer_id, "view": "tail", "lines": 1})).await;
    assert_eq!(tail, "three\n[status: completed]");
}

#[tokio::test(start_paused = true)]
async fn view_arguments_are_checked() {
    let f = fixture();
    let (id, _task) = f.start_job(json!({})).await;
    let error = f.err("task_output", json!({"task_id": id, "view": "middle"})).await;
    assert!(error.contains("unknown view \"middle\""), "{error}");
    let error = f.err("task_output", json!({"task_id": id, "view": "new", "grep": "x"})).await;
    assert!(error.contains("grep works with view"), "{error}");
    let error = f.err("task_output", json!({"task_id": id, "grep": "("})).await;
    assert!(error.contains("grep is not a valid regex"), "{error}");
    let error = f.err("task_output", json!({"task_id": id, "view": "tail", "lines": 0})).await;
    assert!(error.contains("lines must be at least 1"), "{error}");
    let error = f.err("task_output", json!({"task_id": "job-99", "view": "tail"})).await;
    assert!(error.contains("unknown task id job-99"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn task_wait_returns_the_first_to_finish_or_times_out() {
    let f = fixture();
    let (a, task_a) = f.start_job(json!({})).await;
    let (b, task_b) = f.start_job(json!({})).await;
    let timed_out = f.ok("task_wait", json!({"task_ids": [a, b], "timeout_ms": 50})).await;
    assert_eq!(timed_out, format!("none finished within 50 ms\n{a} [job] running — job\n{b} [job] running — job"));

    let waiting = {
        let host = f.host.clone();
        let agent = f.agent.clone();
        let ids = json!([a, b]);
        tokio::spawn(async move {
            host.call_tool("task_wait", json!({"task_ids": ids}), &CallContext::for_agent(&agent)).await.unwrap().text
        })
    };
    f.settle_io().await;
    task_b.push_output("b's output\n");
    task_b.settle(TaskOutcome::completed(None));
    let answer = waiting.await.unwrap();
    assert_eq!(answer, format!("{b} finished first\n{a} [job] running — job\n{b} [job] completed — job"));
    f.settle_io().await;
    assert!(f.unread().is_empty(), "task_wait reported b's end: no notice follows");
    // No output was consumed.
    assert_eq!(f.ok("task_output", json!({"task_id": b})).await, "b's output\n[status: completed]");

    task_a.settle(TaskOutcome::failed("boom"));
    let answer = f.ok("task_wait", json!({"task_ids": [a, b]})).await;
    assert!(answer.starts_with(&format!("{b} finished first\n")), "the earliest finished comes first: {answer}");

    let error = f.err("task_wait", json!({"task_ids": []})).await;
    assert!(error.contains("task_ids must hold 1 to 20 ids, got 0"), "{error}");
    let error = f.err("task_wait", json!({"task_ids": [a, "job-77"]})).await;
    assert!(error.contains("unknown task id job-77"), "{error}");
    let other = f.host.create_agent("agent-b", "session-b").unwrap();
    let error = f.call_as(&other, "task_wait", json!({"task_ids": [a]})).await.unwrap_err().to_string();
    assert!(error.contains(&format!("task {a} belongs to another session")), "{error}");
}

#[tokio::test(start_paused = true)]
async fn task_input_reaches_an_interactive_task_and_refuses_the_rest() {
    let f = fixture();
    let (id, task) = f.start_job(json!({"interactive": true})).await;
    assert_eq!(
        f.ok("task_input", json!({"task_id": id, "text": "hello\n"})).await,
        format!("sent 6 bytes to task {id}")
    );
    assert_eq!(
        f.ok("task_input", json!({"task_id": id, "text": "bye\n", "close": true})).await,
        format!("sent 4 bytes to task {id} and closed its input")
    );
    assert_eq!(task.input(), ("hello\nbye\n".to_string(), true));
    let error = f.err("task_input", json!({"task_id": id, "text": "more"})).await;
    assert!(error.contains(&format!("sending input to task {id} failed: its input is already closed")), "{error}");

    let (plain, _plain_task) = f.start_job(json!({})).await;
    let error = f.err("task_input", json!({"task_id": plain, "text": "x"})).await;
    assert!(error.contains(&format!("task {plain} was started without interactive: true")), "{error}");

    task.settle(TaskOutcome::completed(None));
    f.settle_io().await;
    let error = f.err("task_input", json!({"task_id": id, "text": "x"})).await;
    assert_eq!(error, format!("task {id} has already finished [status: completed]; it takes no more input"));

    let reply = f.ok("answer", json!({"label": "q", "run_in_background": true})).await;
    let answer = reply.rsplit(' ').next().unwrap().to_string();
    let error = f.err("task_input", json!({"task_id": answer, "text": "x"})).await;
    assert_eq!(error, format!("task {answer} is a answer task, and answer tasks take no input"));
    let error = f.err("answer", json!({"label": "q", "run_in_background": true, "interactive": true})).await;
    assert!(error.contains("the answer tool's tasks take no input"), "{error}");
    let error = f.err("job", json!({"label": "q", "interactive": true})).await;
    assert!(error.contains("interactive needs run_in_background: true"), "{error}");

    let other = f.host.create_agent("agent-b", "session-b").unwrap();
    let error = f.call_as(&other, "task_input", json!({"task_id": plain, "text": "x"})).await.unwrap_err().to_string();
    assert!(error.contains(&format!("task {plain} belongs to another session")), "{error}");
    let error = f.err("task_input", json!({"task_id": plain})).await;
    assert!(error.contains("nothing to do"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn a_matching_line_notifies_once_until_the_owner_reads() {
    let f = fixture();
    let (id, task) = f.start_job(json!({"notify_on": {"pattern": "ready on \\d+"}})).await;
    task.push_output("starting\n");
    f.settle_io().await;
    assert!(f.unread().is_empty());
    task.push_output("server ready on 8080\nready on 8081\n");
    f.settle_io().await;
    assert_eq!(
        f.unread(),
        vec![format!(
            "background task {id} (job: job) printed a line matching /ready on \\d+/: server ready on 8080 — still running. \
             Read its output with task_output."
        )]
    );
    task.push_output("ready on 9000\n");
    f.settle_io().await;
    assert!(f.unread().is_empty(), "once until the owner reads");
    f.ok("task_output", json!({"task_id": id})).await;
    task.push_output("ready on 9001 \u{1b}[31m\n");
    f.settle_io().await;
    let notices = f.unread();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(
        notices[0].contains(": ready on 9001 \\u{1b}[31m — still running."),
        "control characters escaped: {notices:?}"
    );

    let error = f.err("job", json!({"label": "x", "run_in_background": true, "notify_on": {"pattern": "("}})).await;
    assert!(error.contains("notify_on.pattern is not a valid regex"), "{error}");
    let error = f.err("job", json!({"label": "x", "run_in_background": true, "notify_on": {}})).await;
    assert!(error.contains("notify_on needs pattern, stalled_ms or both"), "{error}");
    let error =
        f.err("answer", json!({"label": "x", "run_in_background": true, "notify_on": {"stalled_ms": 1000}})).await;
    assert!(error.contains("call it without notify_on"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn a_stall_notifies_once_per_stall() {
    let f = fixture();
    let (id, task) = f.start_job(json!({"notify_on": {"stalled_ms": 2000}, "interactive": true})).await;
    f.agent.message_injected().await;
    assert_eq!(
        f.unread(),
        vec![format!(
            "background task {id} (job: job) has printed nothing for 2 s — still running (it may be waiting for input: \
             task_input can send it some)."
        )]
    );
    // Still silent: no second notice for the same stall.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(f.unread().is_empty());
    // Output ends the stall; the next one notifies again.
    task.push_output("tick\n");
    f.settle_io().await;
    let started = tokio::time::Instant::now();
    f.agent.message_injected().await;
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(f.unread().len(), 1);
    task.settle(TaskOutcome::completed(None));
    f.settle_io().await;
    let (plain, _t) = f.start_job(json!({"notify_on": {"stalled_ms": 1500}})).await;
    f.agent.message_injected().await;
    let notices = f.unread();
    let stall = notices.iter().find(|n| n.contains(&plain)).expect("a stall notice");
    assert_eq!(stall, &format!("background task {plain} (job: job) has printed nothing for 1.5 s — still running."));
}

#[tokio::test(start_paused = true)]
async fn a_long_foreground_call_moves_to_the_background() {
    let f = fixture_with(TasksSettings::default(), Some(Duration::from_secs(30)));
    let call = {
        let host = f.host.clone();
        let agent = f.agent.clone();
        tokio::spawn(async move {
            host.call_tool("job", json!({"label": "slow build"}), &CallContext::for_agent(&agent)).await.unwrap().text
        })
    };
    while f.streams.started().is_empty() {
        tokio::task::yield_now().await;
    }
    let task = f.streams.started()[0].clone();
    task.push_output("compiling\n");
    let reply = call.await.unwrap();
    assert_eq!(
        reply,
        "compiling\n[still running after 30 s: moved to the background as task job-1. Read the rest with task_output.]"
    );
    task.push_output("linking\n");
    assert_eq!(f.ok("task_output", json!({"task_id": "job-1"})).await, "linking\n[status: running]");
    assert_eq!(
        f.ok("task_output", json!({"task_id": "job-1", "view": "all"})).await,
        "compiling\nlinking\n[status: running]",
        "the log keeps what the foreground reply consumed"
    );
    assert!(f.ok("task_list", json!({})).await.contains("job-1 [job] running — slow build"));
    task.settle(TaskOutcome::completed(None));
    f.agent.message_injected().await;
    assert_eq!(
        f.unread(),
        vec!["background task job-1 (job: slow build) finished [status: completed]. Read its output with task_output."]
    );
    let _ = TaskId::new("job-1");
}

#[tokio::test(start_paused = true)]
async fn a_foreground_call_stays_when_the_cap_is_full() {
    let settings = TasksSettings { max_live_tasks_per_owner: 1, ..TasksSettings::default() };
    let f = fixture_with(settings, Some(Duration::from_secs(1)));
    let (_busy, _busy_task) = f.start_job(json!({})).await;
    let call = {
        let host = f.host.clone();
        let agent = f.agent.clone();
        tokio::spawn(async move {
            host.call_tool("job", json!({"label": "fg"}), &CallContext::for_agent(&agent)).await.unwrap().text
        })
    };
    while f.streams.started().len() < 2 {
        tokio::task::yield_now().await;
    }
    let task = f.streams.started()[1].clone();
    tokio::time::sleep(Duration::from_secs(5)).await;
    task.push_output("done\n");
    task.settle(TaskOutcome::completed(None));
    assert_eq!(call.await.unwrap(), "done\n[status: completed]");
}
