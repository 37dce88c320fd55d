//! `taskhost serve` over stdio, end to end: the real binary, rmcp's own
//! client, real pipes.

use crate::common;

use std::time::Duration;

use common::procfs::{self, ESCAPEES, ProcessMark};
use common::{StdioServer, call, is_error, only_text, texts};
use serde_json::json;

#[tokio::test]
async fn tools_are_listed_with_their_schemas_and_the_instructions() {
    let server = StdioServer::start("list", None).await;
    let info = server.client.peer_info().expect("initialized");
    assert!(
        info.instructions.as_deref().is_some_and(|text| text.starts_with("# Background tasks")),
        "instructions: {:?}",
        info.instructions
    );
    let tools = server.client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    assert_eq!(names, ["bash", "task_input", "task_kill", "task_list", "task_output", "task_wait", "ticker"]);
    for tool in &tools {
        assert_eq!(tool.input_schema.get("type"), Some(&json!("object")), "{} schema", tool.name);
        assert!(tool.description.as_deref().is_some_and(|d| !d.is_empty()), "{} has a description", tool.name);
    }
    let schema = |name: &str| tools.iter().find(|t| t.name == name).unwrap().input_schema.clone();
    assert_eq!(schema("task_output")["required"], json!(["task_id"]));
    assert_eq!(schema("task_kill")["required"], json!(["task_id"]));
    let ticker = schema("ticker");
    assert_eq!(ticker["properties"]["run_in_background"]["type"], json!("boolean"));
    let bash = schema("bash");
    assert_eq!(bash["properties"]["command"]["type"], json!("string"));
    assert_eq!(bash["properties"]["run_in_background"]["type"], json!("boolean"));
    assert_eq!(bash["required"], json!(["command"]));
    assert_eq!(ticker["properties"]["count"]["type"], json!("integer"));
    let (status, _) = server.disconnect().await;
    assert!(status.success(), "exit status {status}");
}

#[tokio::test]
async fn background_ticker_reads_waits_kills_and_notices_once() {
    let server = StdioServer::start("scenario", None).await;
    let peer = server.client.peer().clone();

    assert_eq!(only_text(&call(&peer, "task_list", json!({})).await), "(no background tasks)");

    // Start, read a delta, then wait for the rest.
    // Slow enough that the first read comes while it runs, however loaded
    // the machine: the reads below need no sleep.
    let started =
        call(&peer, "ticker", json!({"count": 3, "interval_ms": 400, "message": "beat", "run_in_background": true}))
            .await;
    assert!(!is_error(&started));
    assert_eq!(only_text(&started), "started background ticker task ticker-1");
    assert_eq!(
        only_text(&call(&peer, "task_list", json!({})).await),
        "ticker-1 [ticker] running — 3 ticks every 400 ms"
    );
    let first = only_text(&call(&peer, "task_output", json!({"task_id": "ticker-1"})).await);
    let (first_body, first_status) = first.rsplit_once('\n').expect("body and status line");
    assert_eq!(first_status, "[status: running]");
    let rest = only_text(
        &call(&peer, "task_output", json!({"task_id": "ticker-1", "wait": true, "timeout_ms": 10_000})).await,
    );
    let (rest_body, rest_status) = rest.rsplit_once('\n').expect("body and status line");
    assert_eq!(rest_status, "[status: completed, ticks: 3]");
    // Consuming reads: every line exactly once across the two reads.
    let lines: Vec<&str> =
        [first_body, rest_body].into_iter().filter(|body| *body != "(no new output)").flat_map(str::lines).collect();
    assert_eq!(lines, ["beat 1", "beat 2", "beat 3"]);
    // A read after the end has nothing new and keeps the status.
    assert_eq!(
        only_text(&call(&peer, "task_output", json!({"task_id": "ticker-1"})).await),
        "(no new output)\n[status: completed, ticks: 3]"
    );

    // A task that finishes unreported: its notice rides on the next result, once.
    assert_eq!(
        only_text(&call(&peer, "ticker", json!({"count": 1, "interval_ms": 10, "run_in_background": true})).await),
        "started background ticker task ticker-2"
    );
    // Poll the list until ticker-2 shows as finished; a list read reports
    // nothing, so the notice must arrive exactly once, on one of these results
    // (on the first that follows its settlement).
    let notice = "background task ticker-2 (ticker: 1 ticks every 10 ms) finished [status: completed, ticks: 1]. \
                  Read its output with task_output.";
    let finished_list =
        "ticker-1 [ticker] completed — 3 ticks every 400 ms\nticker-2 [ticker] completed — 1 ticks every 10 ms";
    let mut notices_seen = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let result = texts(&call(&peer, "task_list", json!({})).await);
        notices_seen += result.iter().filter(|text| *text == notice).count();
        assert!(result.len() <= 2 && result.iter().skip(1).all(|text| text == notice), "{result:?}");
        if result[0] == finished_list {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "ticker-2 never finished: {result:?}");
        // Polling a state the server offers no event for over this surface.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if notices_seen == 0 {
        // Settled after the list was read: the notice rides on the next result.
        let next = texts(&call(&peer, "task_list", json!({})).await);
        assert_eq!(next, [finished_list, notice]);
        notices_seen = 1;
    }
    assert_eq!(notices_seen, 1, "the notice arrives exactly once");
    let after = texts(&call(&peer, "task_list", json!({})).await);
    assert_eq!(after.len(), 1, "the notice is delivered exactly once: {after:?}");

    // Kill: requested, then reported as already finished, and no notice.
    assert_eq!(
        only_text(&call(&peer, "ticker", json!({"count": 1000, "interval_ms": 1000, "run_in_background": true})).await),
        "started background ticker task ticker-3"
    );
    assert_eq!(
        only_text(&call(&peer, "task_kill", json!({"task_id": "ticker-3", "reason": "test"})).await),
        "requested cancellation of task ticker-3"
    );
    let killed = only_text(&call(&peer, "task_output", json!({"task_id": "ticker-3", "wait": true})).await);
    assert_eq!(killed, "(no new output)\n[status: killed, after 0 ticks]");
    assert_eq!(
        only_text(&call(&peer, "task_kill", json!({"task_id": "ticker-3"})).await),
        "task ticker-3 had already finished [status: killed, after 0 ticks]"
    );

    // A foreground call returns the output and the status line.
    let foreground = call(&peer, "ticker", json!({"count": 2, "interval_ms": 5})).await;
    assert!(!is_error(&foreground));
    assert_eq!(only_text(&foreground), "tick 1\ntick 2\n[status: completed, ticks: 2]");

    let (status, _) = server.disconnect().await;
    assert!(status.success(), "exit status {status}");
}

#[tokio::test]
async fn disconnect_disposes_the_owners_tasks() {
    let server = StdioServer::start("disconnect", None).await;
    let peer = server.client.peer().clone();
    for expected in ["ticker-1", "ticker-2"] {
        let started =
            call(&peer, "ticker", json!({"count": 100000, "interval_ms": 1000, "run_in_background": true})).await;
        assert_eq!(only_text(&started), format!("started background ticker task {expected}"));
    }
    let (status, log) = server.disconnect().await;
    assert!(status.success(), "exit status {status}; log:\n{log}");
    let disposed = log.find("owner disposed").unwrap_or_else(|| panic!("no disposal in the log:\n{log}"));
    for task in ["ticker-1", "ticker-2"] {
        let settled = log
            .find(&format!("task settled task={task} status=killed"))
            .unwrap_or_else(|| panic!("{task} was not killed at disconnect; log:\n{log}"));
        assert!(settled < disposed, "{task} settled before the owner's disposal finished");
    }
}

/// The default bash tool over the wire: consuming reads that lose and repeat
/// nothing, the stderr section and exit code, a kill that takes the whole
/// tree (escapees included), and a disconnect that leaves no process behind
/// (checked in /proc).
#[tokio::test]
async fn background_bash_over_stdio_and_no_process_outlives_the_connection() {
    let server = StdioServer::start("stdio-bash", None).await;
    let peer = server.client.peer().clone();

    let script = "for i in $(seq 1 400); do echo \"line $i\"; if (( i % 100 == 0 )); then sleep 0.1; fi; done; \
                  echo warn >&2; exit 3";
    let started = call(&peer, "bash", json!({"command": script, "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    let (mut bodies, mut notices) = (Vec::new(), Vec::new());
    let status = loop {
        // The task may settle between two reads; its notice then rides on
        // the next result as a second block.
        let mut blocks = texts(&call(&peer, "task_output", json!({"task_id": "bash-1"})).await).into_iter();
        let read = blocks.next().expect("the read");
        notices.extend(blocks);
        let (body, status) = read.rsplit_once('\n').expect("body and status line");
        if body != "(no new output)" {
            bodies.push(body.to_string());
        }
        if status != "[status: running]" {
            break status.to_string();
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    };
    assert_eq!(status, "[status: completed, exit code: 3]");
    assert!(bodies.len() > 1, "the output arrived in several deltas: {bodies:?}");
    let expected: Vec<String> =
        (1..=400).map(|i| format!("line {i}")).chain(["[stderr]".into(), "warn".into()]).collect();
    assert_eq!(bodies.join("\n"), expected.join("\n"), "every line exactly once, in order");
    assert!(
        notices.len() <= 1 && notices.iter().all(|n| n.starts_with("background task bash-1 (bash: ")),
        "{notices:?}"
    );

    // A kill ends the tree, including what left the process group.
    let kill_mark = ProcessMark::new("mcp-stdio-kill");
    let escapees = format!("{}{}", kill_mark.export(), ESCAPEES);
    assert_eq!(
        only_text(&call(&peer, "bash", json!({"command": escapees, "run_in_background": true})).await),
        "started background bash task bash-2"
    );
    kill_mark.await_at_least(4, Duration::from_secs(20)).await;
    // The tree was started by the server binary run again (a warm keeper
    // spawned ahead of need, or one exec'd on demand), not forked from the
    // server: its keeper is the server's child.
    let server_pid = server.child.id().expect("running");
    let is_keeper = |pid: &u32| {
        let cmdline = procfs::cmdline(*pid);
        cmdline == "taskhost-zygote --taskhost-process-zygote"
            || cmdline.starts_with("taskhost-keeper --taskhost-process-keeper ")
    };
    for pid in kill_mark.pids() {
        let chain = procfs::ancestors(pid);
        // I (the namespace's init) is forked from K and shares its command
        // line: the keeper is the topmost one.
        let keeper = chain.iter().rposition(is_keeper).unwrap_or_else(|| {
            let named: Vec<_> = chain.iter().map(|p| (*p, procfs::cmdline(*p))).collect();
            panic!("no keeper above {pid}: {named:?}")
        });
        assert_eq!(chain.get(keeper + 1), Some(&server_pid), "the keeper's parent is the server");
    }
    assert_eq!(
        only_text(&call(&peer, "task_kill", json!({"task_id": "bash-2"})).await),
        "requested cancellation of task bash-2"
    );
    assert_eq!(
        only_text(&call(&peer, "task_output", json!({"task_id": "bash-2", "wait": true})).await),
        "started\n[status: killed, signal: SIGTERM]"
    );
    kill_mark.assert_none_within(Duration::from_secs(5)).await;

    // A foreground call answers with the output.
    assert_eq!(
        only_text(&call(&peer, "bash", json!({"command": "echo hi; echo oops >&2"})).await),
        "hi\n[stderr]\noops\n[status: completed, exit code: 0]"
    );

    // Left running, then the client goes: nothing it started survives.
    let left_mark = ProcessMark::new("mcp-stdio-disconnect");
    let escapees = format!("{}{}", left_mark.export(), ESCAPEES);
    call(&peer, "bash", json!({"command": escapees, "run_in_background": true})).await;
    left_mark.await_at_least(4, Duration::from_secs(20)).await;
    let (status, log) = server.disconnect().await;
    assert!(status.success(), "exit status {status}; log:\n{log}");
    assert!(log.contains("task settled task=bash-3 status=killed"), "not killed:\n{log}");
    left_mark.assert_none_within(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn sigterm_disposes_every_task_before_exit() {
    let server = StdioServer::start("sigterm", None).await;
    let peer = server.client.peer().clone();
    call(&peer, "ticker", json!({"count": 100000, "interval_ms": 1000, "run_in_background": true})).await;
    let pid = server.child.id().expect("running");
    let kill = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
    assert!(kill.success());
    let StdioServer { mut child, dir, client } = server;
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("exits on SIGTERM").unwrap();
    drop(client);
    let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap();
    assert!(status.success(), "exit status {status}; log:\n{log}");
    let signalled = log.find("signal=SIGTERM").unwrap_or_else(|| panic!("signal not logged:\n{log}"));
    let settled = log.find("task settled task=ticker-1 status=killed").unwrap_or_else(|| panic!("not killed:\n{log}"));
    let exiting = log.find("host disposed; exiting").unwrap_or_else(|| panic!("no disposal:\n{log}"));
    assert!(signalled < settled && settled < exiting, "order: signal, task killed, exit\n{log}");
}

/// Raw JSON-RPC lines, as a broken client would send them.
#[tokio::test]
async fn bad_input_on_stdio_gets_clear_errors_and_the_server_keeps_serving() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let dir = common::temp_dir("stdio-bad");
    let mut child = common::spawn_stdio_server(&dir, None);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = async |line: String| {
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    };
    let call_line = |id: u64, tool: &str, arguments: serde_json::Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}})
            .to_string()
    };

    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        .to_string(),
    )
    .await;
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string()).await;
    send("this is { not json".to_string()).await;
    send(json!({"hello": "not json-rpc"}).to_string()).await;
    send(call_line(2, "no_such_tool", json!({}))).await;
    send(call_line(3, "ticker", json!({"count": -1}))).await;
    send(call_line(4, "task_kill", json!({"task_id": "ticker-9"}))).await;
    send(call_line(5, "task_output", json!({"task_id": "ticker-1", "bogus": true}))).await;
    send(call_line(6, "ticker", json!({"message": "y".repeat(10 * 1024 * 1024)}))).await;
    send(call_line(7, "task_list", json!({}))).await;

    let mut answers = Vec::new();
    while answers.len() < 9 {
        let line = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
            .await
            .expect("an answer within 20 s")
            .unwrap()
            .expect("the server keeps its stdout open");
        answers.push(serde_json::from_str::<serde_json::Value>(&line).unwrap());
    }
    let by_id = |id: u64| answers.iter().find(|a| a["id"] == json!(id)).unwrap_or_else(|| panic!("no answer {id}"));
    let tool_error = |id: u64| {
        let answer = by_id(id);
        assert_eq!(answer["result"]["isError"], json!(true), "answer {id}: {answer}");
        answer["result"]["content"][0]["text"].as_str().unwrap().to_string()
    };
    assert_eq!(by_id(1)["result"]["serverInfo"]["name"], json!("taskhost"));
    let nulls: Vec<&serde_json::Value> = answers.iter().filter(|a| a["id"].is_null()).collect();
    assert_eq!(nulls.len(), 2, "one error for the non-JSON line, one for the non-JSON-RPC object: {answers:?}");
    assert!(nulls.iter().any(|a| a["error"]["code"] == json!(-32700)
        && a["error"]["message"].as_str().unwrap().starts_with("Parse error: the message is not valid JSON")));
    assert!(nulls.iter().any(|a| a["error"]["code"] == json!(-32600)));
    assert_eq!(
        tool_error(2),
        "unknown tool \"no_such_tool\"; available tools: bash, task_input, task_kill, task_list, task_output, task_wait, ticker"
    );
    assert!(tool_error(3).starts_with("invalid arguments for ticker: at /count: -1 is less than the minimum of 0"));
    assert_eq!(tool_error(4), "unknown task id ticker-9: no background task has this id (task_list shows your tasks)");
    assert!(tool_error(5).starts_with("invalid arguments for task_output: unknown field `bogus`"));
    assert!(tool_error(6).starts_with("arguments for ticker are 10485774 bytes, over this server's limit"));
    assert_eq!(by_id(7)["result"]["content"][0]["text"], json!("(no background tasks)"));
    assert_eq!(by_id(7)["result"].get("isError"), Some(&json!(false)));

    // Closing stdin is the client leaving.
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.unwrap().unwrap();
    assert!(status.success());
}

/// A client handler that forwards progress notifications to the test.
struct ProgressProbe(tokio::sync::mpsc::UnboundedSender<rmcp::model::ProgressNotificationParam>);

impl rmcp::ClientHandler for ProgressProbe {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        let _ = self.0.send(params);
    }
}

#[tokio::test]
async fn a_long_foreground_call_reports_progress_and_dies_with_its_request() {
    use rmcp::ServiceExt;
    use rmcp::model::{CallToolRequestParams, ClientRequest, Request};

    let dir = common::temp_dir("stdio-progress");
    let mut child = common::spawn_stdio_server(&dir, Some("[serve]\nprogress_interval_ms = 100\n"));
    let (tx, mut progress) = tokio::sync::mpsc::unbounded_channel();
    let client = ProgressProbe(tx).serve((child.stdout.take().unwrap(), child.stdin.take().unwrap())).await.unwrap();

    let request =
        CallToolRequestParams::new("ticker").with_arguments(common::args(json!({"count": 1000, "interval_ms": 50})));
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(request)),
            rmcp::service::PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    let token = handle.progress_token.clone();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let notification = tokio::time::timeout(Duration::from_secs(10), progress.recv()).await.unwrap().unwrap();
        assert_eq!(notification.progress_token, token);
        seen.push(notification.progress);
    }
    assert!(seen.windows(2).all(|pair| pair[1] > pair[0]), "progress grows: {seen:?}");

    handle.cancel(Some("the user changed their mind".to_string())).await.unwrap();
    let log = dir.join("stderr.log");
    common::wait_for_text(
        &log,
        "stopping a foreground task tool=ticker reason=the call was cancelled",
        Duration::from_secs(10),
    )
    .await;
    // The connection is unharmed.
    assert_eq!(only_text(&call(client.peer(), "task_list", json!({})).await), "(no background tasks)");
    let _ = client.cancel().await;
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.unwrap().unwrap();
    assert!(status.success());
}

/// A WebAssembly producer (the built-in ticker plugin) served over MCP next
/// to the native one, and disposed with its owner.
#[tokio::test]
async fn a_builtin_wasm_plugin_is_served_like_a_native_producer() {
    let config = "[[producer]]\ntool = \"wasm_ticker\"\nplugin = \"builtin:ticker\"\n\n\
                  [[producer]]\ntool = \"ticker\"\nplugin = \"native:ticker\"\n";
    let server = StdioServer::start("stdio-wasm", Some(config)).await;
    let peer = server.client.peer().clone();
    let tools = server.client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    assert_eq!(names, ["task_input", "task_kill", "task_list", "task_output", "task_wait", "ticker", "wasm_ticker"]);
    let id = common::started_task(
        &call(&peer, "wasm_ticker", json!({"count": 2, "interval_ms": 10, "run_in_background": true})).await,
    );
    let output = only_text(&call(&peer, "task_output", json!({"task_id": id, "wait": true})).await);
    assert!(output.ends_with("[status: completed, ticks: 2]"), "{output}");
    assert!(output.contains("tick 1\ntick 2"), "{output}");
    // A long one dies with the connection.
    let long_id = common::started_task(
        &call(&peer, "wasm_ticker", json!({"count": 100000, "interval_ms": 1000, "run_in_background": true})).await,
    );
    let (status, log) = server.disconnect().await;
    assert!(status.success(), "exit status {status}; log:\n{log}");
    assert!(log.contains(&format!("task settled task={long_id} status=killed")), "not killed:\n{log}");
}

/// A raw line client of a real `taskhost serve` child, as a buggy or hostile
/// client would drive it.
struct Raw {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Raw {
    fn start(tag: &str) -> Self {
        use tokio::io::AsyncBufReadExt;
        let dir = common::temp_dir(tag);
        let mut child = common::spawn_stdio_server(&dir, None);
        let stdin = child.stdin.take().unwrap();
        let stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, stdin: Some(stdin), stdout }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    async fn send(&mut self, line: impl AsRef<[u8]>) {
        use tokio::io::AsyncWriteExt;
        let stdin = self.stdin.as_mut().expect("stdin is back");
        stdin.write_all(line.as_ref()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    async fn answer(&mut self) -> serde_json::Value {
        let line = tokio::time::timeout(Duration::from_secs(30), self.stdout.next_line())
            .await
            .expect("an answer within 30 s")
            .unwrap()
            .expect("the server keeps its stdout open");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("answer {line:?} is not JSON: {e}"))
    }

    async fn initialize(&mut self, id: u64, version: &str) {
        self.send(
            json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
                "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
            .to_string(),
        )
        .await;
        let answer = self.answer().await;
        assert_eq!(answer["id"], json!(id), "{answer}");
        assert_eq!(answer["result"]["serverInfo"]["name"], json!("taskhost"), "{answer}");
        assert_eq!(answer["result"]["protocolVersion"], json!(version), "{answer}");
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string()).await;
    }

    /// The same connection still serves: `tools/list` is answered, next.
    async fn tools_list_works(&mut self, id: u64) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}).to_string()).await;
        let answer = self.answer().await;
        assert_eq!(answer["id"], json!(id), "the next answer is tools/list's: {answer}");
        let names: Vec<&str> =
            answer["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["bash", "task_input", "task_kill", "task_list", "task_output", "task_wait", "ticker"]);
    }

    async fn close(mut self) {
        drop(self.stdin);
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.unwrap().unwrap();
        assert!(status.success(), "exit status {status}");
    }
}

fn error(id: serde_json::Value, code: i64, message: &str) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Issue 12 item 1: notifications and stray responses before `initialize`
/// are ignored (as the official Python SDK does); requests get answers.
#[tokio::test]
async fn early_notifications_and_stray_responses_do_not_end_the_connection() {
    let mut raw = Raw::start("stdio-early");
    raw.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string()).await;
    raw.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}).to_string())
        .await;
    raw.send(json!({"jsonrpc": "2.0", "method": "notifications/whatever", "params": {"x": 1}}).to_string()).await;
    raw.send(json!({"jsonrpc": "2.0", "id": 99, "result": {}}).to_string()).await;
    raw.send(json!({"jsonrpc": "2.0", "id": 98, "error": {"code": -1, "message": "stray"}}).to_string()).await;
    raw.send(json!({"jsonrpc": "2.0", "id": "p1", "method": "ping"}).to_string()).await;
    assert_eq!(raw.answer().await, json!({"jsonrpc": "2.0", "id": "p1", "result": {}}));
    raw.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string()).await;
    assert_eq!(
        raw.answer().await,
        error(
            json!(2),
            -32600,
            "Invalid request: this connection is not initialized. Send initialize first (or, on protocol \
             2026-07-28, put io.modelcontextprotocol/protocolVersion and io.modelcontextprotocol/clientCapabilities \
             in params._meta of every request)"
        )
    );
    raw.initialize(3, "2025-06-18").await;
    raw.tools_list_works(4).await;
    // A second initialize is refused; the connection keeps serving.
    raw.send(
        json!({"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        .to_string(),
    )
    .await;
    assert_eq!(
        raw.answer().await,
        error(json!(5), -32600, "Invalid request: this connection is already initialized; initialize is accepted once")
    );
    raw.tools_list_works(6).await;
    raw.close().await;
}

/// Issue 12 items 4, 6 and 7: every bad line gets exactly one answer, with
/// its id when readable and the right code; the connection keeps serving.
#[tokio::test]
async fn every_bad_line_gets_exactly_one_answer_with_its_id() {
    let mut raw = Raw::start("stdio-lines");
    raw.initialize(1, "2025-11-25").await;
    let call = |id: u64, params: serde_json::Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
    };
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let lines: Vec<Vec<u8>> = vec![
        b"{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"ping\",\"params\":{\"x\":\"\xff\xfe\"}}".to_vec(),
        br#"{"jsonrpc":"2.0","id":11,"method":"ping","params":{"x":"\ud800"}}"#.to_vec(),
        deep.into_bytes(),
        br#"[{"jsonrpc":"2.0","id":12,"method":"ping"}]"#.to_vec(),
        br#"{"jsonrpc":"1.0","id":13,"method":"ping"}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":14,"method":7}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":15,"method":"no/such"}"#.to_vec(),
        call(16, json!({"name": "bash", "arguments": [1, 2]})).into_bytes(),
        call(17, json!({"name": "bash", "arguments": "echo hi"})).into_bytes(),
        call(18, json!({"name": 5, "arguments": {}})).into_bytes(),
        br#"{"jsonrpc":"2.0","id":19,"method":"tools/call"}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":20}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":21,"method":"tasks/get","params":{"taskId":4}}"#.to_vec(),
    ];
    for line in &lines {
        raw.send(line).await;
    }
    let mut answers = Vec::new();
    for _ in &lines {
        answers.push(raw.answer().await);
    }
    // Parse errors: id null, -32700, serde's reason after a fixed prefix.
    for (answer, reason) in answers[..2].iter().zip(["invalid unicode code point", "hex escape"]) {
        assert_eq!((answer["id"].clone(), answer["error"]["code"].clone()), (json!(null), json!(-32700)), "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("Parse error: the message is not valid JSON ("), "{message}");
        assert!(message.contains(reason), "{message}");
    }
    let rest = &answers[2..];
    let expected = [
        error(json!(null), -32700, "Parse error: the message nests arrays/objects deeper than 64 levels; flatten it"),
        error(
            json!(null),
            -32600,
            "Invalid request: the message is a batch (JSON array); batches are not supported, send one message at a time",
        ),
        error(json!(13), -32600, "Invalid request: \"jsonrpc\" must be \"2.0\""),
        error(json!(14), -32600, "Invalid request: \"method\" must be a string, got a number"),
        error(
            json!(15),
            -32601,
            "Method not found: \"no/such\"; this server implements initialize, ping, tools/list, tools/call and tasks/*",
        ),
        error(
            json!(16),
            -32602,
            "Invalid params for tools/call: params.arguments must be an object (the tool's arguments by name), got an array",
        ),
        error(
            json!(17),
            -32602,
            "Invalid params for tools/call: params.arguments must be an object (the tool's arguments by name), got a string",
        ),
        error(
            json!(18),
            -32602,
            "Invalid params for tools/call: params.name must be a string (the tool's name as a string), got a number",
        ),
        error(
            json!(19),
            -32602,
            "Invalid params for tools/call: params is missing; send params.name (the tool's name as a string)",
        ),
        error(
            json!(20),
            -32600,
            "Invalid request: a message needs a \"method\" (request or notification) or a \"result\"/\"error\" (response)",
        ),
        error(
            json!(21),
            -32602,
            "Invalid params for tasks/get: params.taskId must be a string (the task's id as a string), got a number",
        ),
    ];
    for (answer, expected) in rest.iter().zip(expected) {
        assert_eq!(*answer, expected);
    }
    raw.tools_list_works(22).await;
    raw.close().await;
}

/// Issue 12 item 5: a request reusing the id of one still in flight is
/// refused with that id; the first keeps its (single) answer.
#[tokio::test]
async fn a_duplicate_id_in_flight_is_refused_and_the_first_is_answered() {
    let mut raw = Raw::start("stdio-dup");
    raw.initialize(1, "2025-06-18").await;
    // At least 3 × 400 ms: in flight when the duplicate arrives right after.
    let slow = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "ticker", "arguments": {"count": 3, "interval_ms": 400}}});
    raw.send(slow.to_string()).await;
    raw.send(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}).to_string()).await;
    assert_eq!(
        raw.answer().await,
        error(
            json!(7),
            -32600,
            "Invalid request: request id 7 is already in flight on this connection; the first request keeps it. \
             Use a fresh id for every request"
        )
    );
    let first = raw.answer().await;
    assert_eq!(first["id"], json!(7));
    assert_eq!(first["result"]["content"][0]["text"], json!("tick 1\ntick 2\ntick 3\n[status: completed, ticks: 3]"));
    // Once answered, the id is free again.
    raw.tools_list_works(7).await;
    raw.close().await;
}

/// Issue 12 item 10 on stdio: the first request chooses the protocol for
/// the connection; the other generation's handshake is refused.
#[tokio::test]
async fn the_first_request_chooses_the_protocol_of_the_connection() {
    let mut raw = Raw::start("stdio-modes");
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    });
    let list = |id: u64| json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {"_meta": meta}});
    raw.send(list(1).to_string()).await;
    let answer = raw.answer().await;
    assert_eq!(answer["id"], json!(1));
    assert_eq!(answer["result"]["tools"].as_array().map(Vec::len), Some(7), "{answer}");
    raw.send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        .to_string(),
    )
    .await;
    assert_eq!(
        raw.answer().await,
        error(
            json!(2),
            -32600,
            "Invalid request: this connection uses protocol 2026-07-28 (per-request _meta), chosen by its first \
             request; initialize is not accepted on it. Open a new connection to use initialize"
        )
    );
    // On this protocol every request carries the context.
    raw.send(json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}).to_string()).await;
    assert_eq!(
        raw.answer().await,
        error(
            json!(5),
            -32602,
            "request _meta is missing or has malformed required fields: io.modelcontextprotocol/protocolVersion, \
             io.modelcontextprotocol/clientCapabilities"
        )
    );
    raw.send(list(4).to_string()).await;
    let answer = raw.answer().await;
    assert_eq!((answer["id"].clone(), answer["result"]["tools"].as_array().map(Vec::len)), (json!(4), Some(7)));
    raw.close().await;
}

/// VmRSS / VmHWM of a process, in KiB.
fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The bound the flood tests hold the server to: its peak RSS stays within
/// this much of its RSS before the flood.
const FLOOD_RSS_BOUND_KIB: u64 = 24 * 1024;

/// Floods `raw` with `lines` while the test reads nothing, until the server
/// stops reading (its queue and the pipes are full) or everything is
/// written; then checks the peak RSS and reads every answer.
async fn flood_without_reading(raw: &mut Raw, flood: Vec<u8>) -> Vec<serde_json::Value> {
    use tokio::io::AsyncWriteExt;
    let pid = raw.pid();
    let before = memory_kib(pid, "VmRSS:");
    // The startup's own peak may be higher than the flood may go.
    let ceiling = (before + FLOOD_RSS_BOUND_KIB).max(memory_kib(pid, "VmHWM:"));
    let total_lines = flood.iter().filter(|&&b| b == b'\n').count();
    // Write from a task: once the server stops reading, the write blocks.
    let mut stdin = raw.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        stdin.write_all(&flood).await.unwrap();
        stdin.flush().await.unwrap();
        stdin
    });
    // The server must stop reading: the write cannot finish while the test
    // reads nothing (a server that reads without bound would let it finish).
    let mut writer = writer;
    let stalled = tokio::time::timeout(Duration::from_secs(3), &mut writer).await.is_err();
    assert!(stalled, "the server read the whole flood although its answers were not read");
    let (now, peak) = (memory_kib(pid, "VmRSS:"), memory_kib(pid, "VmHWM:"));
    eprintln!("flood stalled: RSS {before} KiB before, {now} KiB now, peak {peak} KiB");
    assert!(
        now < before + FLOOD_RSS_BOUND_KIB && peak <= ceiling,
        "RSS {now} KiB (peak {peak} KiB) with RSS {before} KiB before the flood: over the bound of \
         {FLOOD_RSS_BOUND_KIB} KiB"
    );
    // Now read: every line gets its one answer.
    let mut answers = Vec::with_capacity(total_lines);
    while answers.len() < total_lines {
        answers.push(raw.answer().await);
    }
    raw.stdin = Some(writer.await.unwrap());
    let (now, peak) = (memory_kib(pid, "VmRSS:"), memory_kib(pid, "VmHWM:"));
    eprintln!("flood answered: RSS {now} KiB, peak {peak} KiB");
    assert!(peak <= ceiling, "peak RSS {peak} KiB after the flood (RSS before: {before} KiB)");
    answers
}

/// Issue 12 item 2: junk lines from a client that never reads do not grow
/// the server; once it reads, every line has its one answer.
#[tokio::test]
async fn a_junk_flood_from_a_client_that_does_not_read_stays_bounded() {
    let mut raw = Raw::start("stdio-junk");
    raw.initialize(1, "2025-06-18").await;
    // 16 MiB of junk lines, 1 KiB each.
    let line = format!("{}\n", "x".repeat(1023));
    let flood = line.repeat(16 * 1024).into_bytes();
    let answers = flood_without_reading(&mut raw, flood).await;
    assert_eq!(answers.len(), 16 * 1024);
    for answer in &answers {
        assert_eq!((answer["id"].clone(), answer["error"]["code"].clone()), (json!(null), json!(-32700)), "{answer}");
    }
    raw.tools_list_works(2).await;
    raw.close().await;
}

/// Issue 12 item 2: 200 000 pings from a client that never reads: bounded
/// memory, at most 64 requests in flight (the rest refused, naming the
/// bound), and exactly one answer per ping.
#[tokio::test]
async fn a_ping_flood_from_a_client_that_does_not_read_stays_bounded() {
    let mut raw = Raw::start("stdio-pings");
    raw.initialize(1, "2025-06-18").await;
    let count = 200_000u64;
    let mut flood = Vec::new();
    for id in 0..count {
        flood.extend_from_slice(json!({"jsonrpc": "2.0", "id": 1000 + id, "method": "ping"}).to_string().as_bytes());
        flood.push(b'\n');
    }
    let answers = flood_without_reading(&mut raw, flood).await;
    let mut seen = vec![false; count as usize];
    let (mut pongs, mut refused) = (0, 0);
    for answer in &answers {
        let id = answer["id"].as_u64().unwrap_or_else(|| panic!("an id: {answer}")) - 1000;
        assert!(!std::mem::replace(&mut seen[id as usize], true), "two answers for ping {id}");
        if answer.get("result") == Some(&json!({})) {
            pongs += 1;
        } else {
            assert_eq!(
                answer["error"],
                json!({"code": -32000, "message": "Too many requests in flight: this connection already has 64 \
                    unanswered requests (the per-connection limit); wait for answers, and read them, before sending more"}),
            );
            refused += 1;
        }
    }
    assert_eq!(pongs + refused, count);
    assert!(refused > 0, "the flood hit the in-flight bound");
    raw.tools_list_works(2).await;
    raw.close().await;
}

/// Issue 12 item 11 on the wire: a 2025-11-25 connection sees the tasks
/// capability and `taskSupport` on producer tools, gets a task for a
/// `tools/call` with `params.task`, and can list, get, cancel and read it.
#[tokio::test]
async fn a_2025_11_25_client_gets_tasks_it_can_list_cancel_and_read() {
    let mut raw = Raw::start("stdio-v1-tasks");
    raw.send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        .to_string(),
    )
    .await;
    let answer = raw.answer().await;
    assert_eq!(
        answer["result"]["capabilities"]["tasks"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
    );
    raw.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string()).await;
    let answer = raw.answer().await;
    let support: Vec<(String, serde_json::Value)> = answer["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| (tool["name"].as_str().unwrap().to_string(), tool["execution"]["taskSupport"].clone()))
        .collect();
    assert_eq!(
        support,
        [
            ("bash".to_string(), json!("optional")),
            ("task_input".to_string(), json!(null)),
            ("task_kill".to_string(), json!(null)),
            ("task_list".to_string(), json!(null)),
            ("task_output".to_string(), json!(null)),
            ("task_wait".to_string(), json!(null)),
            ("ticker".to_string(), json!("optional")),
        ]
    );
    let request = |id: u64, method: &str, params: serde_json::Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
    };
    raw.send(request(
        3,
        "tools/call",
        json!({"name": "ticker", "arguments": {"count": 1000, "interval_ms": 50}, "task": {}}),
    ))
    .await;
    let created = raw.answer().await;
    assert_eq!(created["id"], json!(3));
    assert_eq!(created["result"]["task"]["taskId"], json!("ticker-1"), "{created}");
    assert_eq!(created["result"]["task"]["status"], json!("working"));
    assert_eq!(created["result"]["task"]["ttl"], json!(null));
    raw.send(request(4, "tasks/list", json!({}))).await;
    let listed = raw.answer().await;
    let tasks = listed["result"]["tasks"].as_array().unwrap();
    assert_eq!(
        (tasks.len(), tasks[0]["taskId"].clone(), tasks[0]["status"].clone()),
        (1, json!("ticker-1"), json!("working"))
    );
    raw.send(request(5, "tasks/get", json!({"taskId": "ticker-1"}))).await;
    assert_eq!(raw.answer().await["result"]["status"], json!("working"));
    raw.send(request(6, "tasks/cancel", json!({"taskId": "ticker-1"}))).await;
    let cancelled = raw.answer().await;
    assert_eq!(
        (cancelled["id"].clone(), cancelled["result"]["status"].clone()),
        (json!(6), json!("cancelled")),
        "{cancelled}"
    );
    raw.send(request(7, "tasks/result", json!({"taskId": "ticker-1"}))).await;
    let result = raw.answer().await;
    assert_eq!(result["result"]["isError"], json!(true), "{result}");
    assert_eq!(result["result"]["_meta"], json!({"io.modelcontextprotocol/related-task": {"taskId": "ticker-1"}}));
    let text = result["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.lines().last().unwrap().starts_with("[status: killed, after "), "{text}");
    raw.send(request(8, "tools/call", json!({"name": "task_list", "arguments": {}, "task": {}}))).await;
    assert_eq!(
        raw.answer().await,
        error(
            json!(8),
            -32602,
            "Invalid params for tools/call: tool \"task_list\" does not run as a task (its execution.taskSupport is \
             not \"optional\"); call it without params.task"
        )
    );
    raw.send(request(9, "tasks/get", json!({"taskId": "ticker-99"}))).await;
    let unknown = raw.answer().await;
    assert_eq!((unknown["id"].clone(), unknown["error"]["code"].clone()), (json!(9), json!(-32602)), "{unknown}");
    raw.tools_list_works(10).await;
    raw.close().await;
}

/// Issue 15, item 1 over MCP: a foreground call still running after
/// `promote_after_ms` answers its output so far and the promotion line; the
/// rest is read from the background task it became, nothing lost or doubled.
#[tokio::test]
async fn a_long_foreground_call_is_promoted_over_mcp() {
    let config = "[[producer]]\ntool = \"ticker\"\nplugin = \"native:ticker\"\npromote_after_ms = 300\n";
    let server = StdioServer::start("stdio-promote", Some(config)).await;
    let peer = server.client.peer().clone();
    let result = call(&peer, "ticker", json!({"count": 4, "interval_ms": 200})).await;
    assert_eq!(common::started_task(&result), "ticker-1", "the promoted task's id, as data");
    let answer = only_text(&result);
    let line = "[still running after 0.3 s: moved to the background as task ticker-1. Read the rest with task_output.]";
    assert!(answer.ends_with(line), "{answer}");
    let before = answer.strip_suffix(line).unwrap();
    let rest = only_text(&call(&peer, "task_output", json!({"task_id": "ticker-1", "wait": true})).await);
    let rest = rest.strip_suffix("[status: completed, ticks: 4]").expect("the promoted task completes");
    assert_eq!(format!("{before}{rest}"), "tick 1\ntick 2\ntick 3\ntick 4\n");
    let listed = only_text(&call(&peer, "task_list", json!({})).await);
    assert_eq!(listed, "ticker-1 [ticker] completed — 4 ticks every 200 ms");
    let (status, _) = server.disconnect().await;
    assert!(status.success());
}

/// Issue 30, item 5 over MCP: a client drops the answer to a request it
/// cancelled, so a cancelled `task_output` wait reports nothing: the task's
/// completion notice stays due and rides on a later answer, once.
#[tokio::test]
async fn a_cancelled_wait_reports_nothing_and_the_notice_comes_later() {
    let mut raw = Raw::start("stdio-cancelled-wait");
    raw.initialize(1, "2025-06-18").await;
    let call = |id: u64, name: &str, arguments: serde_json::Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
            .to_string()
    };
    let text = |answer: &serde_json::Value| -> Vec<String> {
        answer["result"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect()
    };
    // ticker-1 ends first (after 2 s: the cancel lands long before, however
    // loaded the machine); ticker-2 a second later, and its wait is the clock.
    raw.send(call(2, "ticker", json!({"count": 2, "interval_ms": 1000, "run_in_background": true}))).await;
    let started = raw.answer().await;
    assert_eq!(text(&started), ["started background ticker task ticker-1"]);
    assert_eq!(started["result"]["_meta"], json!({"taskhost/started-task": "ticker-1"}), "the id on the wire, as data");
    raw.send(call(3, "ticker", json!({"count": 3, "interval_ms": 1000, "run_in_background": true}))).await;
    assert_eq!(text(&raw.answer().await), ["started background ticker task ticker-2"]);
    raw.send(call(4, "task_output", json!({"task_id": "ticker-1", "wait": true, "timeout_ms": 30_000}))).await;
    raw.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 4}}).to_string())
        .await;
    // Waiting for ticker-2 (which ends after ticker-1) reports ticker-2; the
    // answer carries ticker-1's notice: the cancelled wait reported nothing.
    raw.send(call(5, "task_wait", json!({"task_ids": ["ticker-2"], "timeout_ms": 30_000}))).await;
    let answer = raw.answer().await;
    assert_eq!(answer["id"], json!(5), "the cancelled request is not answered: {answer}");
    let texts = text(&answer);
    assert_eq!(texts[0].lines().next(), Some("ticker-2 finished first"), "{texts:?}");
    assert_eq!(
        texts[1..],
        ["background task ticker-1 (ticker: 2 ticks every 1000 ms) finished [status: completed, ticks: 2]. \
          Read its output with task_output."],
        "one notice, for the end nobody received"
    );
    raw.send(call(6, "task_list", json!({}))).await;
    assert_eq!(text(&raw.answer().await).len(), 1, "told once");
    raw.close().await;
}
