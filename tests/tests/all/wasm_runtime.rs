//! The wasm plugin runtime end to end: the real `ticker` plugin through the
//! task registry, the compile cache, and the fault matrix over the
//! `misbehave` fixture and the malformed artifacts. Every fault must end in a
//! force-failed task or a refused load/call with a specific message, within a
//! bounded time, while another ticker task in the same registry keeps going.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use taskhost::agents::{Agent, AgentRegistry};
use taskhost::plugin::{CompileSource, PluginEngine, PluginVersion, WasmProducer};
use taskhost::producer::{Producer, RunMode};
use taskhost::tasks::{
    RegistryConfig, SurfaceGuard, TaskEvent, TaskRegistry, TaskSnapshot, TaskStart, TaskStatus, TerminalStatus,
};
use taskhost_tests::{TICKER_PATH, fixtures, truncated};

/// Short enough to keep the loop cases fast, long enough for a debug host
/// on a loaded machine to reach the 64 MiB memory limit in the `oom` cases
/// (at 300 ms a busy CI machine sometimes hit the deadline first).
const CALL_DEADLINE_MS: u64 = 1000;
/// Every fault case must settle within this.
const BOUND: Duration = Duration::from_secs(10);

fn engine() -> PluginEngine {
    taskhost_tests::engine(|config| {
        config.call_deadline_ms = CALL_DEADLINE_MS;
        config.max_live_stores = 64;
    })
}

struct Fixture {
    registry: TaskRegistry,
    _surface: SurfaceGuard,
    agent: Agent,
}

fn registry() -> Fixture {
    let agents = AgentRegistry::new();
    let agent = agents.create("agent", "session-1").expect("agent");
    let registry = TaskRegistry::new(
        agents,
        RegistryConfig {
            max_live_tasks_per_owner: 100,
            teardown_timeout: Some(Duration::from_secs(2)),
            ..RegistryConfig::default()
        },
    );
    let surface = registry.attach_surface("test");
    Fixture { registry, _surface: surface, agent }
}

async fn load(engine: &PluginEngine, path: &str) -> Arc<PluginVersion> {
    engine.load_file(path).await.unwrap_or_else(|e| panic!("cannot load {path}: {e:#}"))
}

/// Prepares and starts a background task; a refusal is its message.
async fn start(fx: &Fixture, producer: &WasmProducer, args: Value) -> Result<taskhost::ids::TaskId, String> {
    let prepared = producer.prepare(args, RunMode::Background).await.map_err(|e| format!("{e:#}"))?;
    fx.registry
        .start(
            TaskStart::new(producer.descriptor().kind.clone(), prepared.label, prepared.run)
                .with_owner(Some(fx.agent.clone()))
                .with_producer_info(prepared.producer_info),
        )
        .await
        .map_err(|e| e.to_string())
}

/// Waits for the task to settle, then reads what is left; returns the text
/// and the final snapshot.
async fn read_to_end(fx: &Fixture, id: &taskhost::ids::TaskId) -> (String, TaskSnapshot) {
    wait_terminal(fx, id).await;
    let read = fx.registry.read(id, Some(&fx.agent)).await.expect("read");
    assert!(read.snapshot.status.is_terminal(), "{:?}", read.snapshot);
    (read.text, read.snapshot)
}

/// Awaits the first `Output` event of `id` on a stream subscribed before it
/// started: the task has written something.
async fn first_output(events: &mut tokio::sync::broadcast::Receiver<TaskEvent>, id: &taskhost::ids::TaskId) {
    let wait = async {
        loop {
            match events.recv().await.expect("event stream open") {
                TaskEvent::Output { id: of, .. } if &of == id => return,
                _ => {}
            }
        }
    };
    tokio::time::timeout(BOUND, wait).await.unwrap_or_else(|_| panic!("task {id} wrote nothing within {BOUND:?}"));
}

async fn wait_terminal(fx: &Fixture, id: &taskhost::ids::TaskId) -> TaskSnapshot {
    let snapshot = fx.registry.wait(id, BOUND, Some(&fx.agent), None).await.expect("wait");
    assert!(snapshot.status.is_terminal(), "task {id} did not settle within {BOUND:?}: {snapshot:?}");
    snapshot
}

fn ticks(count: u32) -> String {
    (1..=count).map(|i| format!("tick {i}\n")).collect()
}

/// The ticker's schema as the model has always seen it (it was hand-written
/// before the plugin moved to the SDK's typed API, which derives it), with
/// the instance's default message.
fn ticker_schema(default_message: &str) -> Value {
    json!({
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
                "type": "string", "default": default_message,
                "description": "The text of each line, followed by its number."
            }
        },
        "additionalProperties": false
    })
}

/// The typed SDK keeps the ticker's model-facing behaviour: the same
/// descriptor, labels and argument errors, and config errors that name the
/// field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticker_describes_itself_exactly_as_before_the_typed_sdk() {
    let engine = engine();
    let version = load(&engine, TICKER_PATH).await;
    let ticker = WasmProducer::new(version.clone(), json!({})).await.expect("describe");
    let descriptor = ticker.descriptor();
    assert_eq!(descriptor.kind, "ticker");
    assert_eq!(
        descriptor.description,
        "Emits a numbered line every interval_ms milliseconds, count times. A reference producer for taskhost \
         plugin authors."
    );
    assert!(descriptor.streams_output && !descriptor.takes_input);
    assert_eq!(descriptor.parameters, ticker_schema("tick"));

    let beat = WasmProducer::new(version.clone(), json!({"default_message": "beat"})).await.expect("describe");
    assert_eq!(beat.descriptor().parameters, ticker_schema("beat"));
    let prepared = beat.prepare(json!({"count": 2, "interval_ms": 0}), RunMode::Background).await.expect("prepare");
    assert_eq!(prepared.label, "2 ticks every 0 ms");

    let Err(refused) = WasmProducer::new(version.clone(), json!({"default_message": 7})).await else {
        panic!("a config of the wrong type is refused")
    };
    let refused = format!("{refused:#}");
    assert!(refused.contains("invalid config: at `default_message`: invalid type: integer `7`"), "{refused}");
    let Err(refused) = WasmProducer::new(version, json!({"nope": 1})).await else {
        panic!("an unknown config field is refused")
    };
    let refused = format!("{refused:#}");
    assert!(refused.contains("invalid config: unknown field `nope`, expected `default_message`"), "{refused}");

    // The host validates arguments against the schema first; what gets past
    // it is refused by the plugin as before.
    let Err(refused) = ticker.prepare(json!({"count": 100001}), RunMode::Background).await else {
        panic!("a count out of range is refused")
    };
    assert!(format!("{refused:#}").contains("count"), "{refused:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticker_streams_every_tick_exactly_once_and_completes() {
    let engine = engine();
    let ticker = WasmProducer::new(load(&engine, TICKER_PATH).await, json!({})).await.expect("describe");
    let descriptor = ticker.descriptor();
    assert_eq!(descriptor.kind, "ticker");
    assert!(descriptor.streams_output);
    assert_eq!(descriptor.parameters["type"], "object");

    let fx = registry();
    let id = start(&fx, &ticker, json!({"count": 8, "interval_ms": 15})).await.expect("start");
    assert!(id.as_str().starts_with("ticker-"), "{id}");
    let snapshot = fx.registry.get(&id, Some(&fx.agent)).expect("get");
    let info = snapshot.producer_info.clone().expect("producer_info");
    assert!(info.starts_with("ticker@") && info.len() == "ticker@".len() + 12 + " v1".len(), "{info}");
    assert!(info.ends_with(" v1"), "{info}");

    let (text, snapshot) = read_to_end(&fx, &id).await;
    assert_eq!(text, ticks(8));
    assert_eq!(snapshot.status, TaskStatus::Completed);
    assert_eq!(snapshot.detail.as_deref(), Some("ticks: 8"));
    // Consuming reads: nothing is delivered twice.
    let again = fx.registry.read(&id, Some(&fx.agent)).await.expect("read");
    assert_eq!(again.text, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_left_at_settlement_is_read_after_it() {
    let engine = engine();
    let ticker = WasmProducer::new(load(&engine, TICKER_PATH).await, json!({"default_message": "beat"}))
        .await
        .expect("describe");
    let fx = registry();
    let id = start(&fx, &ticker, json!({"count": 5, "interval_ms": 0})).await.expect("start");
    let snapshot = wait_terminal(&fx, &id).await;
    assert_eq!(snapshot.status, TaskStatus::Completed);
    let read = fx.registry.read(&id, Some(&fx.agent)).await.expect("read");
    assert_eq!(read.text, "beat 1\nbeat 2\nbeat 3\nbeat 4\nbeat 5\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_cancels_the_guest_and_the_task_ends_killed() {
    let engine = engine();
    let ticker = WasmProducer::new(load(&engine, TICKER_PATH).await, json!({})).await.expect("describe");
    let fx = registry();
    let mut events = fx.registry.subscribe();
    let id = start(&fx, &ticker, json!({"count": 1000, "interval_ms": 20})).await.expect("start");
    first_output(&mut events, &id).await;
    let first = fx.registry.read(&id, Some(&fx.agent)).await.expect("read").text;
    fx.registry.kill(&id, Some(&fx.agent), Some("test")).await.expect("kill");
    let (rest, snapshot) = read_to_end(&fx, &id).await;
    assert_eq!(snapshot.status, TaskStatus::Killed);
    let detail = snapshot.detail.expect("detail");
    let n: u32 = detail.strip_prefix("after ").and_then(|d| d.strip_suffix(" ticks")).expect(&detail).parse().unwrap();
    assert!((1..1000).contains(&n), "{detail}");
    assert_eq!(format!("{first}{rest}"), ticks(n));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_load_does_not_recompile_and_has_the_same_version() {
    let engine = engine();
    let bytes = std::fs::read(TICKER_PATH).unwrap();
    // An engine with a fresh cache of its own: the first load compiles.
    let fresh = taskhost_tests::engine(|config| config.pooling = false);
    let cold = fresh.load_bytes("ticker", bytes.clone()).await.unwrap();
    assert_eq!(cold.compile_source(), CompileSource::Compiled);
    let warm = fresh.load_bytes("ticker", bytes.clone()).await.unwrap();
    assert_eq!(warm.compile_source(), CompileSource::Cache);
    assert_eq!(cold.version(), warm.version());
    let from_file = engine.load_file(TICKER_PATH).await.unwrap();
    assert_eq!(from_file.content_hash(), warm.content_hash());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_swaps_new_starts_and_keeps_running_tasks_on_their_version() {
    let engine = engine();
    let v1 = load(&engine, TICKER_PATH).await;
    let ticker = WasmProducer::new(v1.clone(), json!({})).await.expect("describe");
    let fx = registry();
    let old = start(&fx, &ticker, json!({"count": 4, "interval_ms": 30})).await.unwrap();
    // The same bytes under another name give another version string.
    let v2 = engine.load_bytes("ticker2", std::fs::read(TICKER_PATH).unwrap()).await.unwrap();
    ticker.reload(v2.clone()).await.expect("reload");
    let new = start(&fx, &ticker, json!({"count": 2, "interval_ms": 1})).await.unwrap();
    let info = |id| fx.registry.get(id, Some(&fx.agent)).unwrap().producer_info.unwrap();
    assert_eq!(info(&old), format!("{} v1", v1.version()));
    assert_eq!(info(&new), format!("{} v2", v2.version()));
    assert_eq!(read_to_end(&fx, &old).await.0, ticks(4));
    assert_eq!(read_to_end(&fx, &new).await.0, ticks(2));

    // A version that cannot describe itself leaves the old one serving.
    let broken = load(&engine, fixtures::MISBEHAVE_PATH).await;
    let bad = WasmProducer::new(broken.clone(), json!({"describe": "garbage"})).await;
    assert!(bad.is_err());
    let err = ticker.reload(broken).await.expect_err("kind change refused");
    assert!(format!("{err:#}").contains("cannot change the kind"), "{err:#}");
    assert_eq!(ticker.version().version(), v2.version());
}

/// What a fault case must produce.
enum Expect {
    /// `prepare` or `start` refused, with this in the message.
    Refused(String),
    /// The task started and settled failed, with this in its detail.
    Failed(String),
}

fn cause_text(fault: &str, export: &str) -> String {
    match fault {
        "trap" => format!("plugin misbehave trapped in {export}: wasm trap"),
        "loop" => format!("plugin misbehave exceeded its {CALL_DEADLINE_MS} ms call deadline in {export}"),
        "oom" => format!("plugin misbehave hit its 64 MiB memory limit in {export}"),
        other => unreachable!("{other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_every_export_and_fault_fails_alone() {
    let engine = engine();
    let ticker = WasmProducer::new(load(&engine, TICKER_PATH).await, json!({})).await.expect("describe");
    let misbehave =
        WasmProducer::new(load(&engine, fixtures::MISBEHAVE_PATH).await, json!({})).await.expect("describe");
    let fx = registry();
    // A ticker that runs through the whole matrix.
    let bystander = start(&fx, &ticker, json!({"count": 100_000, "interval_ms": 5})).await.unwrap();

    let mut failures = Vec::new();
    for fault in ["trap", "loop", "oom"] {
        for export in ["label", "run", "cancel", "subscribe", "done", "read-output"] {
            let expect = match export {
                "label" | "run" => Expect::Refused(cause_text(fault, export)),
                other => Expect::Failed(cause_text(fault, &format!("task.{other}"))),
            };
            let began = Instant::now();
            let outcome = start(&fx, &misbehave, json!({"fault": fault, "in": export})).await;
            let result: Result<(), String> = match (expect, outcome) {
                (Expect::Refused(want), Err(message)) if message.contains(&want) => Ok(()),
                (Expect::Refused(want), other) => Err(format!("wanted a refusal with {want:?}, got {other:?}")),
                (Expect::Failed(want), Ok(id)) => {
                    // Reach the export that holds the fault.
                    match export {
                        "cancel" => {
                            fx.registry.kill(&id, Some(&fx.agent), None).await.expect("kill");
                        }
                        "read-output" => {
                            let _ = fx.registry.read(&id, Some(&fx.agent)).await.expect("read");
                        }
                        _ => {}
                    }
                    let snapshot = wait_terminal(&fx, &id).await;
                    let detail = snapshot.detail.clone().unwrap_or_default();
                    if snapshot.status == TaskStatus::Failed && detail.contains(&want) {
                        Ok(())
                    } else {
                        Err(format!("wanted failed with {want:?}, got {:?} {detail:?}", snapshot.status))
                    }
                }
                (Expect::Failed(want), Err(message)) => {
                    Err(format!("wanted a failed task with {want:?}, start refused: {message}"))
                }
            };
            assert!(began.elapsed() < BOUND, "{fault} in {export} took {:?}", began.elapsed());
            if let Err(problem) = result {
                failures.push(format!("{fault} in {export}: {problem}"));
            }
            // The bystander is unharmed after every case.
            let snapshot = fx.registry.get(&bystander, Some(&fx.agent)).unwrap();
            assert_eq!(snapshot.status, TaskStatus::Running, "after {fault} in {export}: {snapshot:?}");
        }
    }
    assert!(failures.is_empty(), "fault matrix failures:\n{}", failures.join("\n"));

    // A panic's message reaches the detail through the guest's stderr.
    let id = start(&fx, &misbehave, json!({"fault": "trap", "in": "done"})).await.unwrap();
    let detail = wait_terminal(&fx, &id).await.detail.unwrap();
    assert!(detail.contains("misbehave: trap in done"), "{detail}");
    assert!(
        detail.starts_with("plugin misbehave trapped in task.done: wasm trap: wasm `unreachable` instruction executed"),
        "{detail}"
    );

    // run-error refuses the call with the guest's message; nothing registered.
    let before = fx.registry.list(Some(&fx.agent)).len();
    let refused = start(&fx, &misbehave, json!({"fault": "run-error"})).await.expect_err("refused");
    assert!(refused.contains("refusing: the arguments asked for run-error"), "{refused}");
    assert_eq!(fx.registry.list(Some(&fx.agent)).len(), before);

    // The bystander kept ticking and still reads in order.
    let read = fx.registry.read(&bystander, Some(&fx.agent)).await.unwrap();
    assert!(read.text.starts_with("tick 1\ntick 2\n"), "{:?}", &read.text[..read.text.len().min(40)]);
    fx.registry.kill(&bystander, Some(&fx.agent), None).await.unwrap();
    assert_eq!(wait_terminal(&fx, &bystander).await.status, TaskStatus::Killed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_done_task_ignores_cancel_until_abandoned() {
    let engine = engine();
    let misbehave =
        WasmProducer::new(load(&engine, fixtures::MISBEHAVE_PATH).await, json!({})).await.expect("describe");
    let prepared = misbehave.prepare(json!({"fault": "never-done"}), RunMode::Background).await.unwrap();
    assert_eq!(prepared.label, "never-done");
    let mut hooks = (prepared.run)().await.expect("run");
    hooks.control.cancel(Some("stop")).await.expect("cancel is accepted");
    let still_live = tokio::time::timeout(Duration::from_millis(200), &mut hooks.done).await;
    assert!(still_live.is_err(), "a never-done task settled by itself: {still_live:?}");
    hooks.control.abandon();
    let outcome = tokio::time::timeout(BOUND, hooks.done).await.expect("settles once abandoned").unwrap();
    assert_eq!(outcome.status, TerminalStatus::Failed);
    assert!(outcome.detail.unwrap().contains("abandoned"));
    // Reads after abandonment do not hang.
    assert_eq!(hooks.control.read_output().await.unwrap(), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_faults_and_garbage_refuse_the_instance() {
    let engine = engine();
    let misbehave = load(&engine, fixtures::MISBEHAVE_PATH).await;
    let cases = [
        ("trap", "plugin misbehave trapped in describe: wasm trap".to_string()),
        ("loop", format!("plugin misbehave exceeded its {CALL_DEADLINE_MS} ms call deadline in describe")),
        ("oom", "plugin misbehave hit its 64 MiB memory limit in describe".to_string()),
        ("garbage", "plugin misbehave returned a bad descriptor from describe: kind \"Not A Kind!\"".to_string()),
    ];
    for (fault, want) in cases {
        let began = Instant::now();
        let err = WasmProducer::new(misbehave.clone(), json!({"describe": fault})).await.expect_err(fault);
        let text = format!("{err:#}");
        assert!(text.contains(&want), "describe {fault}: wanted {want:?} in {text:?}");
        assert!(began.elapsed() < BOUND);
    }
    // Refused config: the guest's own message.
    let err = WasmProducer::new(misbehave, json!({"nope": 1})).await.expect_err("bad config");
    assert!(format!("{err:#}").contains("refused its config in describe"), "{err:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_artifacts_are_refused_with_what_is_wrong() {
    let engine = engine();

    let err = engine.load_file(fixtures::WRONG_WORLD_PATH).await.expect_err("wrong world");
    let text = format!("{err:#}");
    assert!(text.contains("does not export `taskhost:producer/producer@0.2.2`"), "{text}");

    let core = wat::parse_file(fixtures::NOT_A_COMPONENT_WAT_PATH).unwrap();
    let text = format!("{:#}", engine.load_bytes("core", core).await.expect_err("core module"));
    assert!(text.contains("core WebAssembly module, not a component"), "{text}");

    let ticker = std::fs::read(TICKER_PATH).unwrap();
    let text = format!("{:#}", engine.load_bytes("half", truncated(&ticker)).await.expect_err("truncated"));
    assert!(text.contains("truncated"), "{text}");

    let text = format!("{:#}", engine.load_bytes("text", b"hello world".to_vec()).await.expect_err("text"));
    assert!(text.contains("not a WebAssembly file"), "{text}");

    let text = format!("{:#}", engine.load_file("/nonexistent/plugin.wasm").await.expect_err("missing"));
    assert!(text.contains("cannot read plugin /nonexistent/plugin.wasm"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_prints_the_tool_definition() {
    let report = taskhost::plugin::check_plugin(TICKER_PATH, "{}").await.expect("check");
    let text = report.to_string();
    assert!(text.contains("tool kind: ticker"), "{text}");
    assert!(text.contains("output: streamed"), "{text}");
    assert!(text.contains("\"interval_ms\""), "{text}");
    let err = taskhost::plugin::check_plugin(fixtures::WRONG_WORLD_PATH, "{}").await.expect_err("wrong world");
    assert!(format!("{err:#}").contains("does not export"), "{err:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_instance_pool_refuses_starts_until_a_task_settles() {
    let engine = taskhost_tests::engine(|config| config.max_live_stores = 3);
    assert!(engine.is_pooling());
    let ticker = WasmProducer::new(load(&engine, TICKER_PATH).await, json!({})).await.expect("describe");
    let fx = registry();
    let long = json!({"count": 1000, "interval_ms": 1000});
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(start(&fx, &ticker, long.clone()).await.expect("start within the pool"));
    }
    let refused = start(&fx, &ticker, long.clone()).await.expect_err("pool full");
    assert!(refused.contains("the wasm instance pool is full"), "{refused}");
    fx.registry.kill(&ids[0], Some(&fx.agent), None).await.unwrap();
    assert_eq!(wait_terminal(&fx, &ids[0]).await.status, TaskStatus::Killed);
    // The settled task's store was dropped, so its slot is free again.
    let id = start(&fx, &ticker, long).await.expect("start after a slot freed");
    for id in ids.iter().skip(1).chain([&id]) {
        fx.registry.kill(id, Some(&fx.agent), None).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_imports_and_missing_functions_are_named() {
    let engine = engine();
    let unknown_import = wat::parse_str(
        r#"(component
             (import "acme:secret/vault@1.0.0" (instance (export "open" (func))))
           )"#,
    )
    .unwrap();
    let text = format!("{:#}", engine.load_bytes("importer", unknown_import).await.expect_err("unknown import"));
    // Refused before compiling, by name.
    assert!(
        text.contains("the component imports `acme:secret/vault@1.0.0`, which taskhost does not provide"),
        "{text}"
    );

    let only_describe = wat::parse_str(
        r#"(component
             (core module $m (func (export "f")))
             (core instance $i (instantiate $m))
             (func $f (canon lift (core func $i "f")))
             (instance $p (export "describe" (func $f)))
             (export "taskhost:producer/producer@0.1.0" (instance $p))
           )"#,
    )
    .unwrap();
    let text = format!("{:#}", engine.load_bytes("partial", only_describe).await.expect_err("missing functions"));
    assert!(
        text.contains("the export `taskhost:producer/producer@0.1.0` lacks `label`, `run`, `[method]task.cancel`"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreground_run_settles_and_leaves_its_output_readable() {
    let engine = engine();
    let ticker = WasmProducer::new(load(&engine, TICKER_PATH).await, json!({})).await.expect("describe");
    let prepared =
        ticker.prepare(json!({"count": 3, "interval_ms": 5, "message": "fg"}), RunMode::Foreground).await.unwrap();
    assert_eq!(prepared.producer_info, Some(ticker.serving().info()));
    let hooks = (prepared.run)().await.expect("run");
    assert!(hooks.control.streams_output());
    let outcome = tokio::time::timeout(BOUND, hooks.done).await.expect("settles").expect("outcome");
    assert_eq!(outcome.status, TerminalStatus::Completed);
    assert_eq!(outcome.detail.as_deref(), Some("ticks: 3"));
    // Nothing was read while it ran: the drained remainder holds it all, once.
    assert_eq!(hooks.control.read_output().await.unwrap(), "fg 1\nfg 2\nfg 3\n");
    assert_eq!(hooks.control.read_output().await.unwrap(), "");
    // A cancel after settlement is accepted and changes nothing.
    hooks.control.cancel(None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_tickers_each_deliver_exactly_their_ticks() {
    let engine = engine();
    let ticker = Arc::new(WasmProducer::new(load(&engine, TICKER_PATH).await, json!({})).await.expect("describe"));
    let fx = Arc::new(registry());
    let mut ids = Vec::new();
    for i in 0..40u32 {
        let message = format!("t{i}");
        let id = start(&fx, &ticker, json!({"count": 15, "interval_ms": 2 + i % 3, "message": message}))
            .await
            .expect("start");
        ids.push((id, message));
    }
    let readers = ids.into_iter().map(|(id, message)| {
        let fx = fx.clone();
        tokio::spawn(async move {
            let (text, snapshot) = read_to_end(&fx, &id).await;
            let want: String = (1..=15).map(|n| format!("{message} {n}\n")).collect();
            assert_eq!(text, want, "task {id}");
            assert_eq!(snapshot.status, TaskStatus::Completed, "task {id}");
        })
    });
    for reader in readers.collect::<Vec<_>>() {
        reader.await.expect("reader");
    }
}
