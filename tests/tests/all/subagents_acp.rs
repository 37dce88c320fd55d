//! The `acp` subagent backend against a real ACP agent process: the
//! scripted agent built from `src/bin/scripted-acp-agent.rs`. Covers the
//! prompt round trip and final-text collection, the stop-reason mapping,
//! `session/cancel`, an agent that ignores cancel (killed after the grace),
//! a crashing agent, the scrubbed environment, and that no agent process
//! is left once a run is disposed.

use std::sync::Once;
use std::time::{Duration, Instant};

use taskhost::Host;
use taskhost::settings::TasksSettings;
use taskhost::subagents::config::SubagentsConfig;
use taskhost::subagents::{RunResult, StartRequest, StopReason, SubagentRun, Subagents};

const AGENT: &str = env!("CARGO_BIN_EXE_scripted-acp-agent");

fn setup() -> (Host, Subagents) {
    static ENV: Once = Once::new();
    // SAFETY: set once, before this binary spawns anything that reads the environment.
    ENV.call_once(|| unsafe {
        std::env::set_var("TASKHOST_TEST_API_KEY", "scrub me");
        std::env::set_var("TASKHOST_TEST_PASSED_TOKEN", "pass me");
    });
    let host = Host::new(&TasksSettings::default()).unwrap();
    let config: SubagentsConfig = toml::from_str(&format!(
        r#"
        [backends.acp]
        kind = "acp"
        command = ["{AGENT}"]
        pass_env = ["TASKHOST_TEST_PASSED_TOKEN"]
        env = {{ TASKHOST_EXPLICIT_SECRET = "set by config" }}
        cancel_grace_ms = 400
        "#
    ))
    .unwrap();
    let subagents = Subagents::for_host(&host, &config).unwrap();
    (host, subagents)
}

fn start(subagents: &Subagents, prompt: &str) -> SubagentRun {
    subagents.start(StartRequest { description: "acp child".into(), prompt: prompt.into(), profile: None }).unwrap()
}

/// Starts a run of `prompt` and returns once the agent has handled it (it
/// connects to a socket the test listens on: an event, not a guess at how
/// long the agent takes).
async fn start_handled(subagents: &Subagents, prompt: &str) -> SubagentRun {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ready.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let run = start(subagents, &format!("{prompt}; ready {}", socket.display()));
    tokio::time::timeout(Duration::from_secs(30), listener.accept())
        .await
        .unwrap_or_else(|_| panic!("the agent did not handle {prompt:?} within 30 s"))
        .unwrap();
    run
}

async fn result_of(run: &SubagentRun) -> RunResult {
    tokio::time::timeout(Duration::from_secs(30), run.wait_result()).await.expect("the run finished")
}

/// True once /proc no longer shows a live (non-zombie) process `pid`.
async fn process_gone(pid: u32) -> bool {
    for _ in 0..300 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat) if stat.split(") ").nth(1).is_some_and(|rest| rest.starts_with('Z')) => return true,
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    false
}

#[tokio::test]
async fn prompt_round_trip_collects_the_final_message() {
    let (host, subagents) = setup();
    let run = start(&subagents, "say hello");
    let child = run.child().clone();
    assert_eq!(result_of(&run).await, RunResult::completed("Hello, world."));
    run.dispose().await;
    assert!(host.agents().get(child.id()).is_none());
    host.dispose().await;
}

#[tokio::test]
async fn acp_stop_reasons_map_to_run_stop_reasons() {
    let (host, subagents) = setup();
    let max = start(&subagents, "hit max");
    let refuse = start(&subagents, "refuse it");
    assert_eq!(result_of(&max).await, RunResult::stopped("trunc", StopReason::MaxTokens));
    assert_eq!(result_of(&refuse).await, RunResult::stopped("", StopReason::Refusal));
    max.dispose().await;
    refuse.dispose().await;
    host.dispose().await;
}

#[tokio::test]
async fn cancel_sends_session_cancel_and_dispose_leaves_no_process() {
    let (host, subagents) = setup();
    let run = start_handled(&subagents, "tell your pid").await;
    run.cancel(Some("parent moved on".into()));
    let result = result_of(&run).await;
    // The agent answered `cancelled` itself: its own text (the pid) and our
    // reason. A run dropped after the grace would be `aborted("cancelled")`
    // with no text (see the next test).
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert_eq!(result.detail.as_deref(), Some("parent moved on"));
    let pid: u32 = result.text.parse().expect("the agent sent its pid");
    run.dispose().await;
    assert!(process_gone(pid).await, "agent process {pid} survived disposal");
    host.dispose().await;
}

#[tokio::test]
async fn an_agent_that_ignores_cancel_is_dropped_after_the_grace() {
    let (host, subagents) = setup();
    let run = start_handled(&subagents, "play deaf").await;
    let started = Instant::now();
    run.cancel(None);
    let result = result_of(&run).await;
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(380) && waited < Duration::from_secs(3), "{waited:?}");
    assert_eq!(result, RunResult::aborted(Some("cancelled".into())));
    run.dispose().await;
    host.dispose().await;
}

#[tokio::test]
async fn a_crashing_agent_ends_the_run_as_error_with_its_stderr() {
    let (host, subagents) = setup();
    let run = start(&subagents, "crash now");
    let result = result_of(&run).await;
    assert_eq!(result.stop_reason, StopReason::Error, "{result:?}");
    let detail = result.detail.unwrap();
    assert!(detail.contains("scripted agent got prompt: crash now"), "{detail}");
    run.dispose().await;

    let config: SubagentsConfig =
        toml::from_str("[backends.x]\nkind = \"acp\"\ncommand = [\"/nonexistent/agent\"]").unwrap();
    let missing = Subagents::for_host(&host, &config).unwrap();
    let result = result_of(&start(&missing, "hi")).await;
    assert_eq!(result.stop_reason, StopReason::Error);
    assert!(result.detail.unwrap().contains("cannot start the ACP agent \"/nonexistent/agent\""));
    host.dispose().await;
}

#[tokio::test]
async fn the_agent_environment_is_scrubbed() {
    let (host, subagents) = setup();
    let run = start(&subagents, "print env");
    let result = result_of(&run).await;
    let names: Vec<&str> = result.text.split(',').collect();
    assert!(names.contains(&"PATH"), "{names:?}");
    assert!(!names.contains(&"TASKHOST_TEST_API_KEY"), "a credential leaked: {names:?}");
    assert!(names.contains(&"TASKHOST_TEST_PASSED_TOKEN"), "pass_env lets it through: {names:?}");
    assert!(names.contains(&"TASKHOST_EXPLICIT_SECRET"), "config env wins: {names:?}");
    assert!(names.iter().all(|n| !n.contains("KEY") || n.is_empty()), "{names:?}");
    run.dispose().await;
    host.dispose().await;
}
