//! Calling taskhost tools the way a model does, through the `Host` facade.
//!
//! Every reply comes back as the text the model would read; an error is
//! `ERROR: <message>`, so a test compares successes and refusals alike. This
//! file is shared by path with `host/tests`, so it depends on `taskhost`,
//! `serde_json` and `std` only.
#![allow(dead_code)] // each suite that includes it uses its own subset

use serde_json::{Value, json};
use taskhost::Host;
use taskhost::tools::CallContext;

/// Prompts the suites' scripted backends answer with each stop reason (and
/// an unknown one), and what `task_output` then shows: the seed's mapping,
/// the same for the native `subagent` producer and the wasm plugin.
pub const STOP_REASON_CASES: [(&str, &str); 6] = [
    ("say hello", "answer to: say hello\n[status: completed]"),
    ("say max-tokens", "partial\n[status: failed, max-tokens]"),
    ("say error", "(no new output)\n[status: failed, error: upstream 503]"),
    ("say refusal", "(no new output)\n[status: failed, refusal]"),
    ("say aborted", "(no new output)\n[status: killed]"),
    ("say weird", "(no new output)\n[status: failed, context-overflow]"),
];

/// The scripted-backend replies behind [`STOP_REASON_CASES`]: TOML items for
/// a `replies = [...]` list, as a literal so a suite's config can `concat!`
/// it.
#[macro_export]
macro_rules! stop_reason_replies {
    () => {
        r#"  { when = "say max-tokens", text = "partial", stop_reason = "max-tokens" },
  { when = "say error", stop_reason = "error", detail = "upstream 503" },
  { when = "say refusal", stop_reason = "refusal" },
  { when = "say aborted", stop_reason = "aborted" },
  { when = "say weird", stop_reason = "context-overflow" },
"#
    };
}

/// The offline subagent backend every subagent suite runs: a `scripted`
/// backend named `offline` with the stop-reason cases and the prompts the
/// suites use ("slow", "ticker then fail", "hold a ticker", "hold a bash",
/// "ticker", anything else). A prompt takes the first reply whose `when` it
/// contains, so the longer prompts come before "ticker". "hold a bash" runs
/// `__HOLD_BASH_COMMAND__`, which a suite with a `bash` tool replaces.
#[macro_export]
macro_rules! offline_subagent_backend {
    () => {
        concat!(
            r#"
[subagents.backends.offline]
kind = "scripted"
replies = [
"#,
            $crate::stop_reason_replies!(),
            r#"  { when = "slow", text = "slow done", delay_ms = 60000 },
  { when = "ticker then fail", stop_reason = "error", detail = "gave up", delay_ms = 200, tool_calls = [
      { tool = "ticker", args = { count = 100000, interval_ms = 10, run_in_background = true } } ] },
  { when = "hold a ticker", text = "never", delay_ms = 60000, tool_calls = [
      { tool = "ticker", args = { count = 100000, interval_ms = 10, run_in_background = true } } ] },
  { when = "hold a bash", text = "never", delay_ms = 60000, tool_calls = [
      { tool = "bash", args = { command = "__HOLD_BASH_COMMAND__", run_in_background = true } } ] },
  { when = "ticker", text = "child: {tool_results}", delay_ms = 200, tool_calls = [
      { tool = "ticker", args = { count = 100000, interval_ms = 10, run_in_background = true } } ] },
  { text = "answer to: {prompt}", delay_ms = 20 },
]
"#
        )
    };
}

/// Calls `tool` with `args` as the context's agent.
pub async fn call(host: &Host, context: &CallContext, tool: &str, args: Value) -> String {
    match host.call_tool(tool, args, context).await {
        Ok(output) => output.text,
        Err(error) => format!("ERROR: {error}"),
    }
}

/// `task_output(id, wait: true)`, waiting up to 20 s.
pub async fn collect(host: &Host, context: &CallContext, id: &str) -> String {
    call(host, context, "task_output", json!({"task_id": id, "wait": true, "timeout_ms": 20000})).await
}

/// Starts the `subagent` tool in the background; returns the task id.
pub async fn start_subagent(host: &Host, context: &CallContext, description: &str, prompt: &str) -> String {
    start_background(host, context, "subagent", description, prompt).await
}

/// Starts `tool` (a subagent producer) in the background; returns the task
/// id, read from the reply's data (`ToolOutput::started`), never its text.
pub async fn start_background(
    host: &Host,
    context: &CallContext,
    tool: &str,
    description: &str,
    prompt: &str,
) -> String {
    let args = json!({"description": description, "prompt": prompt, "run_in_background": true});
    start_task(host, context, tool, args).await
}

/// Calls `tool` with `args` (which ask for a background run); returns the
/// started task's id, read from the reply's data (`ToolOutput::started`).
pub async fn start_task(host: &Host, context: &CallContext, tool: &str, args: Value) -> String {
    match host.call_tool(tool, args, context).await {
        Ok(output) => output.started.unwrap_or_else(|| panic!("not a start: {}", output.text)).to_string(),
        Err(error) => panic!("not a start: {error}"),
    }
}

/// The ids of the live child agents of subagent runs, sorted.
pub fn child_agents(host: &Host) -> Vec<String> {
    let mut ids: Vec<String> =
        host.agents().list().iter().map(|a| a.id().to_string()).filter(|id| id.starts_with("subagent-")).collect();
    ids.sort();
    ids
}
