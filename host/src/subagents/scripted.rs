//! The `scripted` backend: deterministic, offline children.
//!
//! Model: the first configured reply whose `when` occurs in the prompt (or
//! that has no `when`) answers: the child makes its scripted tool calls
//! through the host's tools as its own agent, waits `delay_ms`
//! (cancellable), then answers with the templated text (default
//! `<description>: done` when completed, empty otherwise) and the scripted stop
//! reason. With no matching reply it answers `<description>: done`.
//! A cancel at any point ends the run `aborted` with the cancel reason.

use std::time::Duration;

use super::config::{ScriptedConfig, ScriptedReply};
use super::{Backend, ChildContext, RunResult, StopReason};

pub struct ScriptedBackend {
    config: ScriptedConfig,
}

impl ScriptedBackend {
    pub fn new(config: ScriptedConfig) -> Self {
        Self { config }
    }

    fn reply_for(&self, prompt: &str) -> Option<&ScriptedReply> {
        self.config.replies.iter().find(|reply| reply.when.as_deref().is_none_or(|when| prompt.contains(when)))
    }
}

#[async_trait::async_trait]
impl Backend for ScriptedBackend {
    fn kind(&self) -> &'static str {
        "scripted"
    }

    async fn run(&self, child: ChildContext) -> RunResult {
        let Some(reply) = self.reply_for(&child.prompt) else {
            return RunResult::completed(format!("{}: done", child.description));
        };
        let mut tool_results = Vec::new();
        for call in &reply.tool_calls {
            let args = if call.args.is_null() { serde_json::json!({}) } else { call.args.clone() };
            let text = tokio::select! {
                result = child.call_tool(&call.tool, args) => match result {
                    Ok(output) => output.text,
                    Err(error) => format!("ERROR: {error}"),
                },
                () = child.cancelled() => return RunResult::aborted(None),
            };
            tracing::debug!(tool = %call.tool, result = %text, "scripted child called a tool");
            tool_results.push(text);
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(reply.delay_ms)) => {}
            () = child.cancelled() => return RunResult::aborted(None),
        }
        let stop_reason = StopReason::parse(&reply.stop_reason);
        let default_text = if stop_reason == StopReason::Completed { "{description}: done" } else { "" };
        let text = reply
            .text
            .as_deref()
            .unwrap_or(default_text)
            .replace("{description}", &child.description)
            .replace("{prompt}", &child.prompt)
            .replace("{tool_results}", &tool_results.join("\n"));
        RunResult { text, stop_reason, detail: reply.detail.clone() }
    }
}
