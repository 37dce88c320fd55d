//! The Python and JavaScript example producers (`plugins/examples/python-ticker`,
//! built with componentize-py, and `plugins/examples/js-ticker`, built with
//! ComponentizeJS) end to end: each is built by its own `build.sh`, checked
//! by `taskhost check` (the exact tool definition the model sees), called
//! through the real binary (`taskhost call … --background`, streamed and
//! with `--wait`), and killed in-process through the task registry (the
//! guest's `cancel` must end the task `killed` after the lines it emitted).
//! And the Python twin of `http_wait` (`plugins/examples/python-http-wait`,
//! the `http-plugin` world): granted a local server's origin by
//! configuration, it polls through `wasi:http` until a JSON field holds.
//!
//! Invariants:
//! - A missing toolchain FAILS every test here with a message that says to
//!   run `.ci/setup` (which installs both); nothing passes silently.
//! - Builds are cached in `target/tmp/polyglot/`: each `build.sh` keeps its
//!   output while the hash of its sources, the WIT and the toolchain version
//!   (stored next to it as `<name>.wasm.source`) is unchanged, so repeated
//!   runs neither rebuild nor (the `.wasm` being the same file) recompile:
//!   the binary's compile cache (`XDG_CACHE_HOME`) and the in-process
//!   engine's share one directory there. In one run, an example is built
//!   and first compiled once, before any test uses it: once per process (a
//!   `OnceLock`), and one process at a time (an exclusive lock on
//!   `<name>.lock` beside the output), so a runner that gives every test its
//!   own process (cargo-nextest) builds each example once and never reads a
//!   half-written component.
//! - Synchronization is on signals only: process exit, registry output
//!   events and `wait`; never on sleeps.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use taskhost::agents::AgentRegistry;
use taskhost::plugin::WasmProducer;
use taskhost::producer::{Producer as _, RunMode};
use taskhost::tasks::{RegistryConfig, TaskEvent, TaskRegistry, TaskStart, TaskStatus};

const BIN: &str = env!("CARGO_BIN_EXE_taskhost-cli");

/// Every wait for a task is bounded by this (a debug host on a loaded machine).
const BOUND: Duration = Duration::from_secs(60);

/// One example plugin and how to build it.
struct Example {
    /// Its directory under `plugins/examples/` and its task kind.
    name: &'static str,
    /// The toolchain it needs, for the failure message.
    toolchain: &'static str,
    /// It imports `wasi:http`, so it loads only with `[producer.grants.http]`.
    http: bool,
    built: OnceLock<PathBuf>,
}

static PYTHON: Example =
    Example { name: "python-ticker", toolchain: "componentize-py", http: false, built: OnceLock::new() };
static JS: Example = Example { name: "js-ticker", toolchain: "ComponentizeJS", http: false, built: OnceLock::new() };
static PYTHON_HTTP: Example =
    Example { name: "python-http-wait", toolchain: "componentize-py", http: true, built: OnceLock::new() };

/// `target/tmp/polyglot`: the build outputs and the compile cache.
fn work_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("polyglot")
}

/// The compile cache directory of the binary (under `XDG_CACHE_HOME`) and of
/// the in-process engine.
fn components_dir() -> PathBuf {
    work_dir().join("xdg-cache/taskhost/components")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the real binary with the shared compile cache.
fn taskhost(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("XDG_CACHE_HOME", work_dir().join("xdg-cache"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("run taskhost")
}

impl Example {
    /// The built component: built (or found up to date) by `build.sh` and
    /// compiled into the cache by one `taskhost check`, once per run.
    fn wasm(&self) -> &Path {
        self.built.get_or_init(|| {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/examples").join(self.name).join("build.sh");
            std::fs::create_dir_all(work_dir()).expect("create the polyglot work directory");
            let out = work_dir().join(format!("{}.wasm", self.name));
            // Held until the build and the first compile are done; the
            // next process then finds both up to date.
            let lock = std::fs::File::create(work_dir().join(format!("{}.lock", self.name))).expect("lock file");
            lock.lock().expect("lock the example's build");
            let build = Command::new(&script)
                .env("PATH", taskhost_tests::tool_path())
                .arg(&out)
                .output()
                .expect("run build.sh");
            match build.status.code() {
                Some(0) => {}
                Some(127) => panic!(
                    "{} is not installed, so the {} example cannot be built: run .ci/setup\n{}",
                    self.toolchain,
                    self.name,
                    text(&build.stderr)
                ),
                _ => panic!("{} does not build: {build:?}\n{}", script.display(), text(&build.stderr)),
            }
            let target = if self.http { granted_config(&out, "http://127.0.0.1:1") } else { out.clone() };
            let warm = taskhost(&["check", target.to_str().unwrap()]);
            assert_eq!(warm.status.code(), Some(0), "{warm:?}");
            out
        })
    }

    fn path(&self) -> &str {
        self.wasm().to_str().unwrap()
    }
}

/// A configuration beside `wasm` serving it as the tool `wait`, granted HTTP
/// to `origin` (outside the working directory of the `taskhost` runs, so it
/// needs no `taskhost trust`).
fn granted_config(wasm: &Path, origin: &str) -> PathBuf {
    let config = wasm.with_extension(format!("{}.toml", origin.rsplit(':').next().unwrap()));
    let text = format!(
        "[[producer]]\ntool = \"wait\"\nplugin = {:?}\n[producer.grants.http]\norigins = [\"{origin}\"]\n",
        wasm.file_name().unwrap().to_str().unwrap()
    );
    std::fs::write(&config, text).expect("write the configuration");
    config
}

/// The tool definition both examples give, with their kind and language.
fn expected_definition(kind: &str, language: &str) -> Value {
    json!({
        "name": kind,
        "description": format!("Emits a numbered line every interval_ms milliseconds, count times (a {language} plugin)."),
        "inputSchema": {
            "type": "object",
            "properties": {
                "count": {
                    "type": "integer", "minimum": 0, "maximum": 100000, "default": 3,
                    "description": "How many lines to emit."
                },
                "interval_ms": {
                    "type": "integer", "minimum": 0, "maximum": 3600000, "default": 1000,
                    "description": "Milliseconds between two lines."
                },
                "message": {
                    "type": "string", "default": "tick",
                    "description": "The text of each line, followed by its number."
                },
                "run_in_background": {
                    "type": "boolean",
                    "description": "Run in the background: the call returns a task id at once. Collect the output \
                                    later with task_output and stop the task with task_kill. Default false."
                }
            },
            "additionalProperties": false
        }
    })
}

/// `check` succeeds and prints exactly `expected` as the tool definition.
fn assert_check(example: &Example, expected: Value) {
    let output = taskhost(&["check", example.path()]);
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(stdout.contains("fits taskhost:producer@0.2.2"), "{stdout}");
    assert!(stdout.contains(&format!("tool {} — plugin {}", example.name, example.name)), "{stdout}");
    let definition = stdout
        .split_once("as the model sees it:\n")
        .and_then(|(_, rest)| rest.split_once("\n\nok: "))
        .unwrap_or_else(|| panic!("no tool definition in:\n{stdout}"))
        .0;
    let mut definition: Value = serde_json::from_str(definition).expect("the definition is JSON");
    // The host adds `notify_on` to every stream kind and `ttl_ms` to every
    // background tool (their texts are the host's, tested with the control
    // tools); no `interactive`: the kind takes no input.
    let notify_on = definition["inputSchema"]["properties"].as_object_mut().and_then(|p| p.remove("notify_on"));
    assert_eq!(notify_on.as_ref().map(|n| &n["type"]), Some(&json!("object")), "{stdout}");
    let ttl_ms = definition["inputSchema"]["properties"].as_object_mut().and_then(|p| p.remove("ttl_ms"));
    assert_eq!(ttl_ms.as_ref().map(|n| &n["type"]), Some(&json!("integer")), "{stdout}");
    assert_eq!(definition, expected);
    assert!(stdout.ends_with(&format!("ok: {} is a valid taskhost producer plugin\n", example.path())), "{stdout}");
}

/// `call --background` streams the lines and the status; with `--wait` the
/// one `task_output` read has them all. Exit code 0: the task completed.
fn assert_call(example: &Example) {
    let kind = example.name;
    let args = r#"{"count": 3, "interval_ms": 20, "message": "beat"}"#;
    for wait in [false, true] {
        let mut argv = vec!["call", example.path(), args, "--background"];
        if wait {
            argv.push("--wait");
        }
        let output = taskhost(&argv);
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        let stdout = text(&output.stdout);
        let (start, rest) = stdout.split_once('\n').unwrap();
        assert_eq!(start, format!("started background {kind} task {kind}-1"), "{stdout}");
        assert!(rest.contains("beat 1\nbeat 2\nbeat 3\n[status: completed, ticks: 3]"), "wait: {wait}: {stdout}");
        assert!(!rest.contains("beat 4"), "{stdout}");
    }

    // The instance config reaches `describe` and `run`; a wrong one is
    // refused with the plugin's message.
    let output = taskhost(&[
        "call",
        example.path(),
        "--config",
        r#"{"default_message": "hi"}"#,
        r#"{"count": 1, "interval_ms": 0}"#,
    ]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(text(&output.stdout).contains("hi 1\n"), "{output:?}");
    let output = taskhost(&["check", example.path(), "--config", r#"{"colour": 1}"#]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(text(&output.stderr).contains("invalid config: unknown field"), "{output:?}");
}

/// A long task killed through the registry after its second line: the
/// guest's `cancel` ends it `killed`, `after <n> ticks`, and exactly the
/// lines 1..=n were streamed.
async fn assert_kill(example: &Example) {
    // The binary's compile cache, shared with the examples' `taskhost` runs.
    let engine = taskhost_tests::engine(|config| config.cache_dir = Some(components_dir()));
    let version = engine.load_file(example.wasm()).await.expect("the example loads");
    let producer = WasmProducer::new(version, json!({})).await.expect("describe");

    let agents = AgentRegistry::new();
    let agent = agents.create("agent", "session-1").expect("agent");
    let registry = TaskRegistry::new(agents, RegistryConfig::default());
    let _surface = registry.attach_surface("test");
    let mut events = registry.subscribe();
    let prepared =
        producer.prepare(json!({"count": 100000, "interval_ms": 10}), RunMode::Background).await.expect("prepare");
    let id = registry
        .start(
            TaskStart::new(producer.descriptor().kind.clone(), prepared.label, prepared.run)
                .with_owner(Some(agent.clone()))
                .with_producer_info(prepared.producer_info),
        )
        .await
        .expect("start");

    // Read as output events arrive until two lines are in.
    let mut streamed = String::new();
    tokio::time::timeout(BOUND, async {
        while streamed.lines().count() < 2 {
            match events.recv().await {
                Ok(TaskEvent::Output { id: ref of, .. }) if *of == id => {
                    streamed.push_str(&registry.read(&id, Some(&agent)).await.expect("read").text);
                }
                Ok(TaskEvent::Settled { .. }) => panic!("the task ended before it was killed"),
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(err) => panic!("{err}"),
            }
        }
    })
    .await
    .expect("two lines within the bound");

    registry.kill(&id, Some(&agent), Some("test")).await.expect("kill");
    let snapshot = registry.wait(&id, BOUND, Some(&agent), None).await.expect("wait");
    assert_eq!(snapshot.status, TaskStatus::Killed, "{snapshot:?}");
    streamed.push_str(&registry.read(&id, Some(&agent)).await.expect("read").text);
    let detail = snapshot.detail.expect("a detail");
    let n: usize = detail
        .strip_prefix("after ")
        .and_then(|d| d.strip_suffix(" ticks"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("detail {detail:?}"));
    assert!((2..100000).contains(&n), "{detail}");
    let expected: String = (1..=n).map(|i| format!("tick {i}\n")).collect();
    assert_eq!(streamed, expected);
}

#[test]
fn python_check_prints_the_exact_tool_definition() {
    assert_check(&PYTHON, expected_definition("python-ticker", "Python"));
}

#[test]
fn python_call_streams_lines_and_completes() {
    assert_call(&PYTHON);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_kill_cancels_the_task() {
    assert_kill(&PYTHON).await;
}

#[test]
fn js_check_prints_the_exact_tool_definition() {
    assert_check(&JS, expected_definition("js-ticker", "JavaScript"));
}

#[test]
fn js_call_streams_lines_and_completes() {
    assert_call(&JS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_kill_cancels_the_task() {
    assert_kill(&JS).await;
}

/// The Python `http_wait` twin, granted a local API's origin, polls it
/// through `wasi:http` until the JSON field holds: one line per poll, a
/// `changed:` line when the field changes, `completed`. Without the grant it
/// does not load, and `check` names the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_http_wait_polls_a_granted_url_until_the_field_holds() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    // The field is "running" for the first two requests, then "success":
    // the server's own count decides, so no timing is involved.
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = axum::Router::new().route(
        "/run",
        axum::routing::get(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move { axum::Json(json!({"state": if n < 2 { "running" } else { "success" }})) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let wasm = PYTHON_HTTP.wasm().to_path_buf();
    let config = granted_config(&wasm, &format!("http://{addr}"));
    let args = json!({
        "url": format!("http://{addr}/run"), "json_pointer": "/state", "equals": "success",
        "interval_ms": 100, "timeout_ms": 60000
    })
    .to_string();
    let output = tokio::process::Command::new(BIN)
        .args(["call", config.to_str().unwrap(), &args, "--background"])
        .env("XDG_CACHE_HOME", work_dir().join("xdg-cache"))
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run taskhost call");
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "started background python_http_wait task python_http_wait-1", "{stdout}");
    assert!(
        lines[1].starts_with("poll 1 at ") && lines[1].ends_with(r#"/state = "running", 19 bytes: not yet"#),
        "{stdout}"
    );
    assert!(lines[2].starts_with("poll 2 at ") && lines[2].ends_with("not yet"), "{stdout}");
    assert!(
        lines[3].starts_with("poll 3 at ") && lines[3].ends_with(r#"/state = "success", 19 bytes: holds"#),
        "{stdout}"
    );
    assert_eq!(lines[4], r#"changed: status 200, /state = "running" -> status 200, /state = "success""#, "{stdout}");
    assert_eq!(lines[5..], ["[status: completed, condition held at poll 3]"], "{stdout}");
    assert_eq!(hits.load(Ordering::SeqCst), 3);

    // Not granted: refused at load, naming the grant.
    let output = taskhost(&["check", wasm.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(text(&output.stderr).contains("add [producer.grants.http] to its [[producer]] entry"), "{output:?}");
}
