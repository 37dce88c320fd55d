//! The web dashboard of `taskhost serve --http`, end to end: the real binary
//! with three tokens (alice, bob, and an admin) and a wasm plugin served from
//! a file with `--watch`; tasks started over MCP; the JSON API checked with
//! raw HTTP (tokens, owner fence, origin, headers); then the page driven in
//! headless Chromium (tests/python/dashboard_browser.py, Selenium): rows
//! appear and settle, output streams in, a kill from the page, bob sees none
//! of alice's tasks, the admin sees both, a plugin reload shows the new
//! version. Afterwards MCP confirms the kill and that the page's reads
//! consumed nothing. Screenshots land in the target directory.
//!
//! Needs `chromium`, `chromium-driver` and Selenium: `.ci/setup` installs
//! them. Without them the test fails and says so.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{Client, call, serve_command, temp_dir};
use serde_json::{Value, json};

const ALICE: &str = "alice-secret-0123456789abcdef";
const BOB: &str = "bob-secret-0123456789abcdef0123";
const ADMIN: &str = "admin-secret-0123456789abcdef0123";

struct Server {
    child: tokio::process::Child,
    /// `http://127.0.0.1:<port>`
    origin: String,
    mcp: String,
    dir: std::path::PathBuf,
    /// Where the ticker plugin's file is (outside the workspace).
    plugins: std::path::PathBuf,
}

impl Server {
    async fn start(tag: &str) -> Self {
        let dir = temp_dir(tag);
        // The plugin lives outside the server's working directory (which its
        // trees write), as an installed plugin does: a rebuild there reloads
        // without `taskhost trust` (state_trust.rs tests the other case).
        let plugins = std::path::PathBuf::from(format!("{}-plugins", dir.display()));
        std::fs::create_dir_all(&plugins).unwrap();
        std::fs::write(plugins.join("ticker.wasm"), common::rebuilt(taskhost::builtin::TICKER_WASM, "build 1"))
            .unwrap();
        let config = format!(
            "[[serve.http.tokens]]\nname = \"alice\"\ntoken_env = \"TASKHOST_TEST_ALICE\"\n\n\
             [[serve.http.tokens]]\nname = \"bob\"\ntoken_env = \"TASKHOST_TEST_BOB\"\n\n\
             [[serve.http.tokens]]\nname = \"ops\"\ntoken_env = \"TASKHOST_TEST_ADMIN\"\nadmin = true\n\n\
             [[producer]]\ntool = \"bash\"\nplugin = \"builtin:bash\"\n\
             [producer.grants.process]\nprograms = [\"bash\"]\n\n\
             [[producer]]\ntool = \"ticker\"\nplugin = \"{}\"\n",
            plugins.join("ticker.wasm").display()
        );
        let mut command = serve_command(&dir, Some(&config));
        command
            .args(["--http", "127.0.0.1:0", "--watch"])
            .env("TASKHOST_TEST_ALICE", ALICE)
            .env("TASKHOST_TEST_BOB", BOB)
            .env("TASKHOST_TEST_ADMIN", ADMIN)
            .env("XDG_CACHE_HOME", dir.join("cache"));
        let (child, mcp) = common::spawn_http_server(command, Some(dir.join("stderr.log"))).await;
        let origin = mcp.trim_end_matches("/mcp").to_string();
        Self { child, origin, mcp, dir, plugins }
    }

    async fn client(&self, token: &str) -> Client {
        common::connect_http(&self.mcp, token).await
    }

    async fn stop(mut self) {
        common::stop_with_sigterm(&mut self.child).await;
    }
}

/// Starts a background task and returns its id.
async fn start(client: &Client, tool: &str, arguments: Value) -> String {
    let mut arguments = arguments;
    arguments["run_in_background"] = true.into();
    common::started_task(&call(client.peer(), tool, arguments).await)
}

async fn get(http: &reqwest::Client, url: &str, token: Option<&str>) -> (u16, reqwest::header::HeaderMap, String) {
    let mut request = http.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("request");
    (response.status().as_u16(), response.headers().clone(), response.text().await.unwrap())
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The browser and its driver, or a failure that says how to get them.
fn require_browser() {
    let missing: Vec<&str> =
        ["/usr/bin/chromium", "/usr/bin/chromedriver"].into_iter().filter(|p| !Path::new(p).exists()).collect();
    let selenium = std::process::Command::new("python3")
        .env("PATH", common::tool_path())
        .args(["-c", "import selenium"])
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        missing.is_empty() && selenium,
        "the dashboard browser test needs chromium, chromium-driver (Debian packages) and Selenium (PyPI); \
         missing: {missing:?}{}. Run `bash .ci/setup` to install them (the Debian packages need root: `apt-get install chromium chromium-driver`).",
        if selenium { "" } else { ", python3 module selenium" }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_tails_and_kills_tasks_per_owner_in_a_real_browser() {
    require_browser();
    let server = Server::start("dashboard").await;
    let alice = server.client(ALICE).await;
    let bob = server.client(BOB).await;

    let go_file = server.dir.join("go");
    let stream = start(
        &alice,
        "bash",
        json!({"command": "echo first-line; while [ ! -e go ]; do sleep 0.05; done; echo second-line",
               "description": "streams two lines"}),
    )
    .await;
    let victim = start(&alice, "bash", json!({"command": "echo victim-up; sleep 600", "description": "to kill"})).await;
    let quick = start(&alice, "bash", json!({"command": "echo quick", "description": "done at once"})).await;
    let ticker = start(&alice, "ticker", json!({"count": 600, "interval_ms": 1000})).await;
    let bob_task = start(&bob, "bash", json!({"command": "sleep 600", "description": "bob's own"})).await;

    // The JSON API: tokens, the owner fence, origins, headers.
    let http = reqwest::Client::new();
    let api = format!("{}/dashboard/api", server.origin);
    let (status, headers, shell) = get(&http, &format!("{}/", server.origin), None).await;
    assert_eq!(status, 200, "the shell needs no token");
    assert!(shell.contains("/dashboard/app.js") && !shell.contains("<script>"), "no inline script: {shell}");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'self'") && csp.contains("script-src 'self'"), "{csp}");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert!(headers.contains_key("cache-control"));
    let (status, _, body) = get(&http, &format!("{api}/tasks"), None).await;
    assert_eq!(status, 401, "{body}");
    assert!(json_of(&body)["error"].as_str().unwrap().contains("Authorization: Bearer"), "{body}");
    let (status, _, body) = get(&http, &format!("{api}/tasks"), Some("not-a-token-at-all-0123456789")).await;
    assert_eq!((status, json_of(&body)["error"].as_str().unwrap()), (401, "Unauthorized: invalid bearer token"));

    let (status, _, body) = get(&http, &format!("{api}/tasks"), Some(BOB)).await;
    assert_eq!(status, 200);
    let ids: Vec<String> =
        json_of(&body)["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, std::slice::from_ref(&bob_task), "bob sees only his own task");
    let (status, _, body) = get(&http, &format!("{api}/tasks/{victim}/output"), Some(BOB)).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        json_of(&body)["error"],
        format!("no task {victim} among the tasks this token may see (bob's); GET /dashboard/api/tasks lists them")
    );
    let refused = http.post(format!("{api}/tasks/{victim}/kill")).bearer_auth(BOB).send().await.unwrap();
    assert_eq!(refused.status().as_u16(), 404, "bob cannot kill alice's task");
    let foreign = http.get(format!("{api}/tasks")).bearer_auth(ALICE).header("Origin", "http://evil.example").send();
    let foreign = foreign.await.unwrap();
    assert_eq!(foreign.status().as_u16(), 403);
    assert!(foreign.text().await.unwrap().contains("neither this server's own origin"));
    let same_origin = http.get(format!("{api}/tasks")).bearer_auth(ALICE).header("Origin", &server.origin).send();
    assert_eq!(same_origin.await.unwrap().status().as_u16(), 200);
    let (status, _, body) = get(&http, &format!("{api}/tasks"), Some(ADMIN)).await;
    assert_eq!(status, 200);
    let owners: std::collections::BTreeSet<String> =
        json_of(&body)["tasks"].as_array().unwrap().iter().map(|t| t["owner"].as_str().unwrap().into()).collect();
    assert_eq!(owners, ["alice".to_string(), "bob".to_string()].into(), "the admin sees every owner");

    // The browser.
    let screenshots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&screenshots).unwrap();
    std::fs::write(server.plugins.join("ticker.v2.wasm"), common::rebuilt(taskhost::builtin::TICKER_WASM, "build 2"))
        .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/dashboard_browser.py");
    let arguments = json!({
        "url": format!("{}/", server.origin),
        "tokens": {"alice": ALICE, "bob": BOB, "admin": ADMIN},
        "stream": stream, "go_file": go_file, "victim": victim, "quick": quick, "ticker": ticker,
        "bob_task": bob_task,
        "plugin": server.plugins.join("ticker.wasm"), "plugin_v2": server.plugins.join("ticker.v2.wasm"),
        "screenshots": screenshots,
    });
    let browser = tokio::process::Command::new("python3")
        .env("PATH", common::tool_path())
        .arg(&script)
        .arg(arguments.to_string())
        .env("SE_OFFLINE", "true")
        .kill_on_drop(true)
        .output();
    let browser = tokio::time::timeout(Duration::from_secs(300), browser).await.expect("the browser run ends").unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&browser.stdout), String::from_utf8_lossy(&browser.stderr));
    println!("{printed}");
    assert!(browser.status.success(), "the browser checks failed:\n{printed}");
    for name in ["dashboard-alice.png", "dashboard-admin.png"] {
        let path = screenshots.join(name);
        let png = std::fs::read(&path).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{} is a PNG", path.display());
        println!("screenshot: {}", path.display());
    }

    // Over MCP: the kill from the page is alice's `killed`, and the page's
    // reads consumed nothing: alice still reads every line.
    let list = common::texts(&call(alice.peer(), "task_list", json!({})).await).remove(0);
    assert!(list.contains(&format!("{victim} [bash] killed")), "{list}");
    let read = common::texts(&call(alice.peer(), "task_output", json!({"task_id": stream})).await).join("\n");
    assert!(read.contains("first-line\nsecond-line"), "the page's reads consumed nothing: {read}");
    assert!(read.contains("[status: completed, exit code: 0]"), "{read}");
    let read = common::texts(&call(alice.peer(), "task_output", json!({"task_id": victim})).await).join("\n");
    assert!(read.contains("victim-up") && read.contains("killed"), "{read}");

    // An open event stream starts with a snapshot and ends when the server
    // shuts down (it does not hold the shutdown until the drain timeout).
    let mut events = http.get(format!("{api}/events")).bearer_auth(ALICE).send().await.unwrap();
    assert_eq!(events.status().as_u16(), 200);
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let first = events.chunk().await.unwrap().expect("a first event");
    assert!(first.starts_with(b"event: snapshot\ndata: {\"tasks\":["), "{}", String::from_utf8_lossy(&first));
    let _ = alice.cancel().await;
    let _ = bob.cancel().await;
    let log = server.dir.join("stderr.log");
    server.stop().await;
    let ended =
        tokio::time::timeout(Duration::from_secs(10), async { while let Ok(Some(_)) = events.chunk().await {} });
    ended.await.expect("the event stream ended with the server");
    let log = common::wait_for_text(&log, "host disposed; exiting", Duration::from_secs(5)).await;
    assert!(!log.contains("connections still open"), "a stream held the shutdown:\n{log}");
}

/// Issue 30, item 2: a kill from the dashboard is an end the model did not
/// ask for, so its owner is told, exactly once, with the next answer over
/// MCP; the kill's reply is `task_kill`'s, and the task records who stopped
/// it. Needs no browser: the page's kill is one POST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_from_the_dashboard_is_told_to_the_owner_once() {
    let server = Server::start("dashboard-notice").await;
    let alice = server.client(ALICE).await;
    let victim = start(&alice, "bash", json!({"command": "echo victim-up; sleep 600", "description": "to kill"})).await;
    let http = reqwest::Client::new();
    let api = format!("{}/dashboard/api", server.origin);
    // Subscribed before the kill: its settlement is an event on this stream,
    // sent once the listeners (the notice) ran.
    let mut events = http.get(format!("{api}/events")).bearer_auth(ALICE).send().await.unwrap();
    assert_eq!(events.status().as_u16(), 200);
    let killed = http.post(format!("{api}/tasks/{victim}/kill")).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(killed.status().as_u16(), 200);
    let reply = json_of(&killed.text().await.unwrap());
    assert_eq!(reply["text"], format!("requested cancellation of task {victim}"), "{reply}");
    let mut seen = String::new();
    let settled = loop {
        let chunk = tokio::time::timeout(Duration::from_secs(30), events.chunk())
            .await
            .expect("the kill settles within 30 s")
            .unwrap()
            .expect("the stream stays open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
        let found = seen.split("\n\n").filter_map(|event| event.strip_prefix("event: task\ndata: ")).find_map(|data| {
            let task = json_of(data);
            (task["id"] == victim.as_str() && task["status"] == "killed").then_some(task)
        });
        if let Some(task) = found {
            break task;
        }
    };
    assert_eq!(settled["stop_cause"], json!({"by": "dashboard", "viewer": "ops"}), "{settled}");
    assert_eq!(settled["reported"], json!(false), "the dashboard's kill reports nothing to the model");
    let answer = common::texts(&call(alice.peer(), "task_list", json!({})).await);
    assert_eq!(answer.len(), 2, "the list, then the notice: {answer:?}");
    assert_eq!(
        answer[1],
        format!(
            "background task {victim} (bash: echo victim-up; sleep 600) was killed from the dashboard \
             [status: killed, signal: SIGTERM]. Read its output with task_output."
        )
    );
    let again = common::texts(&call(alice.peer(), "task_list", json!({})).await);
    assert_eq!(again.len(), 1, "told once: {again:?}");
    let _ = alice.cancel().await;
    server.stop().await;
}
