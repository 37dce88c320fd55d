//! `taskhost serve` over stdio, end to end: the real binary, rmcp's own
//! client, real pipes.

use crate::common;

use std::time::Duration;

use crate::mcp_stdio_wire::{Raw, error};
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
