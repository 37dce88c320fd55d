//! Input to running tasks, end to end: the real bash plugin (contract 0.2.0)
//! started with `interactive: true`, driven with `task_input` through
//! `Host::call_tool`, answers read with `task_output`; and every refusal,
//! with its exact text.
//!
//! Model: one host serves `bash` (granted `bash`) and the real `ticker`
//! plugin (a kind that takes no input); alice starts the tasks, bob is
//! another session. Every wait is on an output line or the task's end
//! (`read_until` reads until a line appears; `task_output` with `wait`
//! until the end), never a fixed sleep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use taskhost::Host;
use taskhost::plugin::resources::ProcessCapability;
use taskhost::plugin::{PluginEngine, WasmProducer};
use taskhost::process::{EnvPolicy, ProcessGrant, ProcessHost, ProcessHostConfig};
use taskhost::settings::TasksSettings;
use taskhost::tools::CallContext;
use taskhost::tools::producer_tool::ProducerToolOptions;
use taskhost_tests::procfs::ProcessMark;

const BOUND: Duration = Duration::from_secs(20);

struct Fixture {
    host: Host,
    alice: CallContext,
    bob: CallContext,
    mark: ProcessMark,
    _engine: PluginEngine,
    _processes: Arc<ProcessHost>,
}

async fn fixture(test: &str) -> Fixture {
    taskhost_tests::logs::init();
    let mark = ProcessMark::new(&format!("task-input-{test}"));
    let engine = taskhost_tests::engine(|_| {});
    let processes = ProcessHost::new(&ProcessHostConfig::default()).expect("process host");
    let grant = ProcessGrant {
        programs: vec!["bash".into()],
        working_dirs: vec![std::env::temp_dir()],
        env: EnvPolicy { plugin_may_set: vec![mark.name.clone()], ..EnvPolicy::default() },
        ..ProcessGrant::default()
    };
    let bash = engine.load_file(taskhost::builtin::BASH_PATH).await.expect("load bash");
    let config = json!({"env": {mark.name.clone(): mark.value.clone()}});
    let bash = WasmProducer::new(bash, config)
        .await
        .expect("describe bash")
        .with_process(ProcessCapability { host: processes.clone(), grant: Arc::new(grant) });
    let ticker = engine.load_file(taskhost_tests::TICKER_PATH).await.expect("load ticker");
    let ticker = WasmProducer::new(ticker, json!({})).await.expect("describe ticker");
    let host = Host::new(&TasksSettings::default()).unwrap();
    for (producer, name) in [(bash, "bash"), (ticker, "ticker")] {
        let options =
            ProducerToolOptions::new(name).with_foreground_timeout(Duration::from_secs(60)).with_promote_after(None);
        host.add_producer(Arc::new(producer), options).expect("tool name is valid");
    }
    let alice = CallContext::for_agent(&host.create_agent("alice", format!("s-alice-{test}")).unwrap());
    let bob = CallContext::for_agent(&host.create_agent("bob", format!("s-bob-{test}")).unwrap());
    Fixture { host, alice, bob, mark, _engine: engine, _processes: processes }
}

impl Fixture {
    async fn call_as(&self, context: &CallContext, tool: &str, args: Value) -> String {
        match self.host.call_tool(tool, args, context).await {
            Ok(output) => output.text,
            Err(error) => format!("ERROR: {error}"),
        }
    }

    async fn call(&self, tool: &str, args: Value) -> String {
        self.call_as(&self.alice, tool, args).await
    }

    async fn start(&self, command: &str, interactive: bool) -> String {
        let mut args = json!({"command": command, "run_in_background": true});
        if interactive {
            args["interactive"] = json!(true);
        }
        self.start_kind("bash", args).await
    }

    /// Starts a background task of `tool` as alice; its id, as data.
    async fn start_kind(&self, tool: &str, args: Value) -> String {
        let output = self.host.call_tool(tool, args, &self.alice).await.expect("a start");
        output.started.unwrap_or_else(|| panic!("not started: {}", output.text)).to_string()
    }

    async fn input(&self, id: &str, text: &str, close: bool) -> String {
        self.call("task_input", json!({"task_id": id, "text": text, "close": close})).await
    }

    /// Consuming reads (`task_output`, status lines dropped) until the
    /// output so far contains `line`; returns everything read.
    async fn read_until(&self, id: &str, line: &str) -> String {
        let deadline = Instant::now() + BOUND;
        let mut text = String::new();
        loop {
            let reply = self.call("task_output", json!({"task_id": id})).await;
            let (body, status) = reply.rsplit_once('\n').unwrap_or(("", reply.as_str()));
            if body != "(no new output)" {
                text.push_str(body);
                text.push('\n');
            }
            if text.contains(line) {
                return text;
            }
            assert!(status == "[status: running]", "task {id} ended before printing {line:?}: {text:?} {status}");
            assert!(Instant::now() < deadline, "task {id} never printed {line:?}; read so far: {text:?}");
            // Poll again; the bash plugin's pollable wakes on its exit only.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `task_output` with `wait`: the rest of the output and the status line.
    async fn wait_end(&self, id: &str) -> String {
        self.call("task_output", json!({"task_id": id, "wait": true, "timeout_ms": BOUND.as_millis() as u64})).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_read_loop_answers_each_line_and_ends_when_its_input_closes() {
    let fx = fixture("loop").await;
    let id = fx.start("while read l; do echo \"got $l\"; done; echo \"input closed\"", true).await;
    assert_eq!(fx.input(&id, "one\n", false).await, format!("sent 4 bytes to task {id}"));
    assert_eq!(fx.read_until(&id, "got one").await, "got one\n");
    // A line may come in pieces; several lines in one call.
    assert_eq!(fx.input(&id, "tw", false).await, format!("sent 2 bytes to task {id}"));
    assert_eq!(fx.input(&id, "o\nthree\n", false).await, format!("sent 8 bytes to task {id}"));
    assert_eq!(fx.read_until(&id, "got three").await, "got two\ngot three\n");
    assert_eq!(fx.input(&id, "four\n", true).await, format!("sent 5 bytes to task {id} and closed its input"));
    assert_eq!(fx.wait_end(&id).await, "got four\ninput closed\n[status: completed, exit code: 0]");
    fx.mark.assert_none_within(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_alone_sends_end_of_file() {
    let fx = fixture("close-only").await;
    let id = fx.start("cat; echo \"cat is done\"", true).await;
    assert_eq!(
        fx.call("task_input", json!({"task_id": id, "close": true})).await,
        format!("sent 0 bytes to task {id} and closed its input")
    );
    assert_eq!(fx.wait_end(&id).await, "cat is done\n[status: completed, exit code: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_interactive_stdin_is_empty_and_a_reader_ends_at_once() {
    let fx = fixture("not-interactive").await;
    let id = fx.start("cat; read l || echo \"read got end-of-file\"", false).await;
    assert_eq!(fx.wait_end(&id).await, "read got end-of-file\n[status: completed, exit code: 0]");
    // A foreground call too.
    let reply = fx.call("bash", json!({"command": "cat; echo fg done"})).await;
    assert_eq!(reply, "fg done\n[status: completed, exit code: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_refusals_name_the_task_and_say_why() {
    let fx = fixture("refusals").await;

    // A task started without interactive (still running).
    let plain = fx.start("sleep 600", false).await;
    assert_eq!(
        fx.input(&plain, "hello\n", false).await,
        format!(
            "ERROR: task {plain} was started without interactive: true, so its input is closed (it reads \
             end-of-file); to send input, start the command again with run_in_background: true and interactive: true"
        )
    );

    // A kind that takes no input.
    let ticker = fx.start_kind("ticker", json!({"count": 1000, "interval_ms": 1000, "run_in_background": true})).await;
    assert_eq!(
        fx.input(&ticker, "x", false).await,
        format!("ERROR: task {ticker} is a ticker task, and ticker tasks take no input")
    );
    assert_eq!(
        fx.call("ticker", json!({"count": 1, "run_in_background": true, "interactive": true})).await,
        "ERROR: invalid arguments for ticker: the ticker tool's tasks take no input; call it without interactive"
    );

    // Another session's interactive task, and an unknown id.
    let open = fx.start("while read l; do echo \"got $l\"; done; echo \"end of input\"; exec sleep 600", true).await;
    assert_eq!(
        fx.call_as(&fx.bob, "task_input", json!({"task_id": open, "text": "x\n"})).await,
        format!("ERROR: task {open} belongs to another session")
    );
    assert_eq!(
        fx.input("bash-999", "x\n", false).await,
        "ERROR: unknown task id bash-999: no background task has this id (task_list shows your tasks)"
    );

    // After close: the program still runs, its input is gone.
    assert_eq!(fx.input(&open, "last\n", true).await, format!("sent 5 bytes to task {open} and closed its input"));
    assert_eq!(fx.read_until(&open, "end of input").await, "got last\nend of input\n");
    assert_eq!(
        fx.input(&open, "more\n", false).await,
        format!("ERROR: sending input to task {open} failed: its stdin is already closed")
    );
    assert_eq!(
        fx.call("task_input", json!({"task_id": open, "close": true})).await,
        format!("ERROR: sending input to task {open} failed: its stdin is already closed")
    );

    // A program that closed its stdin but runs on: nothing else in its tree
    // (keeper, init) holds the pipe, so the write fails at once.
    let deaf = fx.start("exec 0<&-; echo \"stdin closed\"; exec sleep 600", true).await;
    assert_eq!(fx.read_until(&deaf, "stdin closed").await, "stdin closed\n");
    assert_eq!(
        fx.input(&deaf, "anyone?\n", false).await,
        format!(
            "ERROR: sending input to task {deaf} failed: the program no longer reads its stdin (it exited or closed it)"
        )
    );

    // A finished task.
    let done = fx.start("echo bye", true).await;
    assert_eq!(fx.wait_end(&done).await, "bye\n[status: completed, exit code: 0]");
    assert_eq!(
        fx.input(&done, "late\n", false).await,
        format!("ERROR: task {done} has already finished [status: completed, exit code: 0]; it takes no more input")
    );

    // Bad arguments.
    assert_eq!(
        fx.call("task_input", json!({"task_id": open})).await,
        "ERROR: invalid arguments for task_input: text is empty and close is false: nothing to do; pass text, \
         close: true, or both"
    );
    assert_eq!(
        fx.call("bash", json!({"command": "cat", "interactive": true})).await,
        "ERROR: invalid arguments for bash: interactive needs run_in_background: true (a foreground call cannot be \
         sent input); add it, or drop interactive"
    );

    for id in [&plain, &ticker, &open, &deaf] {
        fx.call("task_kill", json!({"task_id": id})).await;
    }
    fx.mark.assert_none_within(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bash_tool_offers_interactive_and_the_ticker_does_not() {
    let fx = fixture("schemas").await;
    let definitions = fx.host.tool_definitions();
    let schema = |name: &str| definitions.iter().find(|d| d.name == name).unwrap().input_schema.clone();
    assert_eq!(schema("bash")["properties"]["interactive"]["type"], "boolean");
    assert!(schema("ticker")["properties"].get("interactive").is_none());
    let bash = definitions.iter().find(|d| d.name == "bash").unwrap();
    assert!(bash.description.contains("interactive: true, then send it lines with task_input"), "{}", bash.description);
}
