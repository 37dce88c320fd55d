//! `taskhost serve` over stdio at the wire: a raw line client sends what a
//! buggy or hostile client would (early notifications, stray responses, bad
//! lines, duplicate ids, floods it never reads) and gets one clear answer
//! each, within bounded memory.

use crate::common;

use std::time::Duration;

use serde_json::json;

/// A raw line client of a real `taskhost serve` child, as a buggy or hostile
/// client would drive it.
pub(crate) struct Raw {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Raw {
    pub(crate) fn start(tag: &str) -> Self {
        use tokio::io::AsyncBufReadExt;
        let dir = common::temp_dir(tag);
        let mut child = common::spawn_stdio_server(&dir, None);
        let stdin = child.stdin.take().unwrap();
        let stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, stdin: Some(stdin), stdout }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    pub(crate) async fn send(&mut self, line: impl AsRef<[u8]>) {
        use tokio::io::AsyncWriteExt;
        let stdin = self.stdin.as_mut().expect("stdin is back");
        stdin.write_all(line.as_ref()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    pub(crate) async fn answer(&mut self) -> serde_json::Value {
        let line = tokio::time::timeout(Duration::from_secs(30), self.stdout.next_line())
            .await
            .expect("an answer within 30 s")
            .unwrap()
            .expect("the server keeps its stdout open");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("answer {line:?} is not JSON: {e}"))
    }

    pub(crate) async fn initialize(&mut self, id: u64, version: &str) {
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
    pub(crate) async fn tools_list_works(&mut self, id: u64) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}).to_string()).await;
        let answer = self.answer().await;
        assert_eq!(answer["id"], json!(id), "the next answer is tools/list's: {answer}");
        let names: Vec<&str> =
            answer["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["bash", "task_input", "task_kill", "task_list", "task_output", "task_wait", "ticker"]);
    }

    pub(crate) async fn close(mut self) {
        drop(self.stdin);
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.unwrap().unwrap();
        assert!(status.success(), "exit status {status}");
    }
}

pub(crate) fn error(id: serde_json::Value, code: i64, message: &str) -> serde_json::Value {
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
