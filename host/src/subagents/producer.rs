//! The `subagent` kind served natively, and the seed's stop-reason mapping.
//! (How a `[[producer]]` entry becomes a subagent tool is `crate::setup`'s.)
//!
//! Model (the background-subagent RFC): kind `subagent`, label = the
//! `description` argument, final-output-only. `cancel` forwards to
//! [`SubagentRun::cancel`]; `done` awaits the result, THEN awaits
//! [`SubagentRun::dispose`] (child quiescence: the child agent, its session
//! and its own tasks are gone), and only then reports [`outcome_of`] the
//! result. [`SubagentProducer`] is the in-process twin of the
//! `plugins/subagent` guest (same config, schema, texts and mapping), for
//! embedders without the wasm runtime and for native/wasm comparisons.
//!
//! Instance config (JSON, shared with the guest; unknown keys are errors):
//! - `profile`: the `[subagents.backends.<name>]` to run children on;
//! - `description`: replaces the tool description's first paragraph;
//! - `background`: whether the instance offers `run_in_background`. The host
//!   sets it from the `[[producer]] background` flag (a conflicting value is
//!   a configuration error), so the background wording appears in the tool
//!   description exactly when the parameter appears in the schema.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;

use super::{RunGuard, RunResult, StartRequest, StopReason, Subagents};
use taskhost_core::producer::{Descriptor, PreparedRun, Producer, RunMode, runner};
use taskhost_core::tasks::{TaskControl, TaskHooks, TaskOutcome};

/// The seed's `runOutcome`: completed → `completed` with the final text as
/// output; aborted → `killed`; error, max-tokens, refusal and any unknown
/// reason → `failed` with the reason (and its detail) as detail.
pub fn outcome_of(result: &RunResult) -> TaskOutcome {
    match &result.stop_reason {
        StopReason::Completed => TaskOutcome::completed(None).with_output(result.text.clone()),
        StopReason::Aborted => {
            let outcome = TaskOutcome::killed(result.detail.clone());
            if result.text.is_empty() { outcome } else { outcome.with_output(result.text.clone()) }
        }
        _ => {
            let outcome = TaskOutcome::failed(result.reason_text());
            if result.text.is_empty() { outcome } else { outcome.with_output(result.text.clone()) }
        }
    }
}

/// The instance config of a subagent tool (native or wasm).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SubagentInstanceConfig {
    #[serde(default)]
    pub profile: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default = "yes")]
    pub background: bool,
}

fn yes() -> bool {
    true
}

/// The tool description of a subagent instance.
pub fn tool_description(config: &SubagentInstanceConfig) -> String {
    let mut text = config.description.clone().unwrap_or_else(|| {
        "Delegate a self-contained task to a subagent: a separate agent with its own session that works on \
         `prompt` and answers with a final message. Give a short `description` (3-7 words) and a complete \
         `prompt`: the subagent sees nothing else of this conversation."
            .to_string()
    });
    if config.background {
        text.push_str(
            "\n\nWith run_in_background: true the call returns a task id immediately and the subagent keeps \
             working; collect its final answer later with task_output (wait: true only when you are blocked on \
             it), and stop it with task_kill when it stopped mattering.",
        );
    }
    text
}

/// The argument schema (without `run_in_background`, which is the host's).
pub fn parameters() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "description": {"type": "string", "minLength": 1, "description": "A short (3-7 words) description of the task; it labels the task."},
            "prompt": {"type": "string", "minLength": 1, "description": "The complete instructions for the subagent."}
        },
        "required": ["description", "prompt"],
        "additionalProperties": false
    })
}

#[derive(Deserialize)]
struct Args {
    description: String,
    prompt: String,
}

/// The subagent kind, in process.
pub struct SubagentProducer {
    subagents: Subagents,
    config: SubagentInstanceConfig,
    descriptor: Arc<Descriptor>,
}

impl SubagentProducer {
    /// An instance from its JSON config; unknown profiles are refused here.
    pub fn new(subagents: Subagents, config: &serde_json::Value) -> anyhow::Result<Self> {
        let config: SubagentInstanceConfig =
            serde_json::from_value(config.clone()).map_err(|e| anyhow::anyhow!("invalid subagent config: {e}"))?;
        if let Some(profile) = &config.profile {
            anyhow::ensure!(
                subagents.profiles().contains(profile),
                "invalid subagent config: no backend named {profile:?}; configured: {}",
                subagents.profiles().join(", ")
            );
        }
        let descriptor = Arc::new(Descriptor::new("subagent", tool_description(&config), parameters()));
        Ok(Self { subagents, config, descriptor })
    }
}

#[async_trait::async_trait]
impl Producer for SubagentProducer {
    fn descriptor(&self) -> Arc<Descriptor> {
        self.descriptor.clone()
    }

    async fn prepare(&self, args: serde_json::Value, _mode: RunMode) -> anyhow::Result<PreparedRun> {
        let args: Args = serde_json::from_value(args).map_err(|e| anyhow::anyhow!("invalid arguments: {e}"))?;
        let label = args.description.split_whitespace().collect::<Vec<_>>().join(" ");
        let subagents = self.subagents.clone();
        let profile = self.config.profile.clone();
        Ok(PreparedRun::new(
            label,
            runner(async move {
                let run =
                    subagents.start(StartRequest { description: args.description, prompt: args.prompt, profile })?;
                let control = Arc::new(NativeSubagentTask { run: RunGuard(run.clone()) });
                let done = async move {
                    let result = run.wait_result().await;
                    run.dispose().await;
                    Ok(outcome_of(&result))
                };
                Ok(TaskHooks::new(control, Box::pin(done)))
            }),
        ))
    }
}

struct NativeSubagentTask {
    run: RunGuard,
}

#[async_trait::async_trait]
impl TaskControl for NativeSubagentTask {
    async fn cancel(&self, reason: Option<&str>) -> anyhow::Result<()> {
        self.run.cancel(reason.map(str::to_string));
        Ok(())
    }

    fn streams_output(&self) -> bool {
        false
    }

    fn abandon(&self) {
        self.run.start_dispose();
    }
}
