//! The `http_wait` example plugin (`plugins/examples/http_wait`), a kind the
//! host knows nothing about, loaded by configuration alone and driven over
//! MCP through `taskhost serve --http --watch`, against a real local API:
//! a `changed:` milestone notice when the watched field changes, `completed`
//! when the condition holds, `failed` at its deadline (a server that never
//! answers included), a refused origin, and a reload while a task polls.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, Client, call, serve_command, temp_dir, texts};

const TOKEN: &str = "http-wait-secret-0123456789abcdef";

/// The built example: it lands beside the built-in plugins, which are
/// members of the same guest workspace.
fn http_wait_wasm() -> Vec<u8> {
    let built = std::path::Path::new(taskhost::builtin::TICKER_PATH).with_file_name("http_wait.wasm");
    std::fs::read(&built).unwrap_or_else(|e| panic!("the http_wait example is not built at {}: {e}", built.display()))
}

/// A local API: `/run` answers what the test set, `/hang` never answers.
/// Every request to `/run` counts, and wakes whoever waits for a count.
#[derive(Clone)]
struct Api {
    answer: Arc<Mutex<(StatusCode, Value)>>,
    hits: Arc<AtomicUsize>,
    hit: Arc<tokio::sync::Notify>,
    addr: SocketAddr,
}

impl Api {
    async fn start(status: StatusCode, body: Value) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api = Api {
            answer: Arc::new(Mutex::new((status, body))),
            hits: Arc::default(),
            hit: Arc::default(),
            addr: listener.local_addr().unwrap(),
        };
        let app = axum::Router::new()
            .route(
                "/run",
                axum::routing::get(|State(api): State<Api>| async move {
                    let (status, body) = api.answer.lock().unwrap().clone();
                    api.hits.fetch_add(1, Ordering::SeqCst);
                    api.hit.notify_waiters();
                    (status, axum::Json(body))
                }),
            )
            .route("/hang", axum::routing::get(std::future::pending::<&'static str>))
            .with_state(api.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        api
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn answer(&self, status: StatusCode, body: Value) {
        *self.answer.lock().unwrap() = (status, body);
    }

    /// Waits until `/run` has answered `count` requests in all.
    async fn wait_for_hits(&self, count: usize) {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let hit = self.hit.notified();
                if self.hits.load(Ordering::SeqCst) >= count {
                    return;
                }
                hit.await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!("/run was asked {} times, not {count}, within 30 s", self.hits.load(Ordering::SeqCst))
        });
    }
}

/// `taskhost serve --http --watch` with `http_wait` loaded from a file by
/// configuration alone, granted the API's origin.
struct Server {
    child: tokio::process::Child,
    mcp: String,
    dir: PathBuf,
    plugin: PathBuf,
}

impl Server {
    async fn start(tag: &str, api: &Api) -> Self {
        let dir = temp_dir(tag);
        // Outside the served workspace, as an installed plugin is.
        let plugins = PathBuf::from(format!("{}-plugins", dir.display()));
        std::fs::create_dir_all(&plugins).unwrap();
        let plugin = plugins.join("http_wait.wasm");
        std::fs::write(&plugin, common::rebuilt(&http_wait_wasm(), "build 1")).unwrap();
        let config = format!(
            "[[serve.http.tokens]]\nname = \"agent\"\ntoken_env = \"TASKHOST_TEST_TOKEN\"\n\n\
             [[producer]]\ntool = \"http_wait\"\nplugin = \"{}\"\n\
             [producer.grants.http]\norigins = [\"http://{}\"]\n",
            plugin.display(),
            api.addr
        );
        let mut command = serve_command(&dir, Some(&config));
        command
            .args(["--http", "127.0.0.1:0", "--watch"])
            .env("TASKHOST_TEST_TOKEN", TOKEN)
            .env("XDG_CACHE_HOME", dir.join("cache"));
        let (child, mcp) = common::spawn_http_server(command, Some(dir.join("stderr.log"))).await;
        Self { child, mcp, dir, plugin }
    }

    async fn client(&self) -> Client {
        common::connect_http(&self.mcp, TOKEN).await
    }

    async fn stop(mut self) {
        common::stop_with_sigterm(&mut self.child).await;
    }
}

/// Starts an `http_wait` task in the background and returns its id.
async fn start(client: &Client, mut arguments: Value) -> String {
    arguments["run_in_background"] = true.into();
    common::started_task(&call(client.peer(), "http_wait", arguments).await)
}

/// `task_wait` on `id` for up to `timeout_ms`: every text block of the
/// answer (a notice rides on it as a block of its own).
async fn wait(client: &Client, id: &str, timeout_ms: u64) -> Vec<String> {
    texts(&call(client.peer(), "task_wait", json!({"task_ids": [id], "timeout_ms": timeout_ms})).await)
}

/// Waits (30 s at most) until `id` finished; returns its whole output and
/// its status line, read once.
async fn finished(client: &Client, id: &str) -> (String, String) {
    let answer = wait(client, id, 30_000).await;
    assert!(answer[0].contains(&format!("{id} finished first")), "{id} did not finish within 30 s: {answer:?}");
    let read = texts(&call(client.peer(), "task_output", json!({"task_id": id})).await).remove(0);
    let (output, status) = read.rsplit_once('\n').expect("output and status line");
    (output.to_owned(), status.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_wait_tells_each_change_of_the_field_and_completes_when_it_holds() {
    let api = Api::start(StatusCode::OK, json!({"state": "queued"})).await;
    let server = Server::start("http-wait-change", &api).await;
    let client = server.client().await;

    let id = start(
        &client,
        json!({
            "url": api.url("/run"), "json_pointer": "/state", "equals": "success",
            "interval_ms": 100, "timeout_ms": 120_000,
            "notify_on": {"pattern": "^changed:"}
        }),
    )
    .await;
    api.wait_for_hits(2).await;
    api.answer(StatusCode::OK, json!({"state": "running"}));

    // The milestone rides on the next answer to its owner after the poll
    // that saw the change; a bounded task_wait is that answer.
    let notice = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let answer = wait(&client, &id, 300).await;
            assert!(answer[0].starts_with("none finished"), "{id} ended before the field changed: {answer:?}");
            if let Some(notice) = answer.iter().find(|block| block.contains("printed a line matching /^changed:/")) {
                return notice.clone();
            }
        }
    })
    .await
    .expect("a milestone notice within 30 s of the change");
    assert!(
        notice.contains(&format!("background task {id} (http_wait: wait for {})", api.url("/run")))
            && notice.contains(r#"changed: status 200, /state = "queued" -> status 200, /state = "running""#)
            && notice.contains("still running"),
        "{notice}"
    );

    api.answer(StatusCode::OK, json!({"state": "success"}));
    let (output, status) = finished(&client, &id).await;
    assert!(status.starts_with("[status: completed, condition held at poll "), "{status}\n{output}");
    let lines: Vec<&str> = output.lines().collect();
    assert!(
        lines[0].starts_with("poll 1 at ") && lines[0].ends_with(r#"/state = "queued", 18 bytes: not yet"#),
        "{output}"
    );
    let changes: Vec<&str> = lines.iter().copied().filter(|l| l.starts_with("changed:")).collect();
    assert_eq!(
        changes,
        [
            r#"changed: status 200, /state = "queued" -> status 200, /state = "running""#,
            r#"changed: status 200, /state = "running" -> status 200, /state = "success""#,
        ],
        "{output}"
    );
    assert!(lines.iter().any(|l| l.ends_with(r#"/state = "success", 19 bytes: holds"#)), "{output}");
    // One line per poll, numbered from 1 with none skipped.
    let polls: Vec<&str> = lines.iter().copied().filter(|l| l.starts_with("poll ")).collect();
    for (n, line) in polls.iter().enumerate() {
        assert!(line.starts_with(&format!("poll {} at ", n + 1)), "{output}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_wait_fails_at_its_deadline_even_when_the_server_never_answers() {
    let api = Api::start(StatusCode::SERVICE_UNAVAILABLE, json!({"state": "down"})).await;
    let server = Server::start("http-wait-deadline", &api).await;
    let client = server.client().await;

    let began = std::time::Instant::now();
    let down = start(&client, json!({"url": api.url("/run"), "interval_ms": 200, "timeout_ms": 1500})).await;
    let hang = start(&client, json!({"url": api.url("/hang"), "interval_ms": 200, "timeout_ms": 1500})).await;
    // A port of the same host the grant does not name.
    let refused =
        start(&client, json!({"url": "http://127.0.0.1:9/run", "interval_ms": 200, "timeout_ms": 1500})).await;

    let (output, status) = finished(&client, &down).await;
    assert!(
        status.starts_with("[status: failed, timed out after ") && status.ends_with("last seen: status 503]"),
        "{status}"
    );
    assert!(output.lines().next().unwrap().ends_with("status 503, 16 bytes: not yet"), "{output}");
    assert!(output.ends_with("deadline: the condition did not hold within 1500 ms"), "{output}");

    // The request in flight asked the host to give up at the deadline: the
    // grant's own bound (30 s) is not what ends it.
    let (output, status) = finished(&client, &hang).await;
    assert!(status.starts_with("[status: failed, timed out after "), "{status}\n{output}");
    assert!(began.elapsed() < Duration::from_secs(20), "the hanging poll held the task {:?}", began.elapsed());

    let (output, status) = finished(&client, &refused).await;
    assert!(status.starts_with("[status: failed, timed out after "), "{status}\n{output}");
    assert!(
        output.lines().next().unwrap().contains("error: taskhost refused the request")
            && output.contains("127.0.0.1:9"),
        "{output}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_http_wait_while_a_task_polls_keeps_that_task_on_its_version() {
    let api = Api::start(StatusCode::OK, json!({"state": "queued"})).await;
    let server = Server::start("http-wait-reload", &api).await;
    let client = server.client().await;
    let args = json!({"url": api.url("/run"), "json_pointer": "/state", "equals": "success", "interval_ms": 100, "timeout_ms": 120_000});

    let old = start(&client, args.clone()).await;
    api.wait_for_hits(1).await;
    std::fs::write(&server.plugin, common::rebuilt(&http_wait_wasm(), "build 2")).unwrap();
    common::wait_for_text(
        &server.dir.join("stderr.log"),
        "reloaded http_wait: v2 serving new starts; 1 task still on v1",
        Duration::from_secs(60),
    )
    .await;
    let new = start(&client, args).await;
    let hits = api.hits.load(Ordering::SeqCst);
    api.wait_for_hits(hits + 2).await;

    api.answer(StatusCode::OK, json!({"state": "success"}));
    for id in [&old, &new] {
        let (output, status) = finished(&client, id).await;
        assert!(status.starts_with("[status: completed, condition held at poll "), "{id}: {status}\n{output}");
    }
    server.stop().await;
}
