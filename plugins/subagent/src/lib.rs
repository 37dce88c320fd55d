//! `subagent`: delegate a self-contained task to a child agent.
//!
//! The producer side of the background-subagent RFC, on the host's
//! `subagents` capability (which it must be granted). Kind `subagent`,
//! label = the `description` argument, final-output-only.
//!
//! A task moves through three phases, each driven by the host's
//! `subscribe` → `done` loop and never blocking an export:
//! 1. running: `subscribe` is the run's pollable (ready when the result is
//!    in); `cancel` forwards to `run.cancel`;
//! 2. disposing: once the result is in, `done` keeps it and calls
//!    `run.dispose`; `subscribe` is again the run's pollable, now ready when
//!    the child agent, its session and its tasks are released;
//! 3. done: only when `run.released` is true does `done` report — child
//!    quiescence before the report, on every path.
//!
//! The outcome is the RFC's `runOutcome`: completed → `completed` with the
//! final text as output; aborted → `killed` (detail: the cancel reason);
//! error, max-tokens, refusal and any other reason → `failed` with the
//! reason (and its detail) as detail, and any text as output.
//!
//! Instance config: `profile` (the host backend to use), `description`
//! (replaces the first paragraph of the tool description), `background`
//! (set by the host from the instance's background switch: the description
//! mentions background collection with task_output only when it is on).
//! The host's in-process twin of this plugin
//! (`taskhost::subagents::SubagentProducer`) keeps the same
//! config, schema, texts and mapping.

use core::cell::{Cell, RefCell};

use serde::Deserialize;
use taskhost_plugin_sdk::log;
use taskhost_plugin_sdk::prelude::*;
use taskhost_plugin_sdk::serde_json::json;
use taskhost_plugin_sdk::subagents::{self, Run, RunResult, StopReason};

const KIND: &str = "subagent";
const DESCRIPTION: &str = "Delegate a self-contained task to a subagent: a separate agent with its own session that \
                           works on `prompt` and answers with a final message. Give a short `description` (3-7 \
                           words) and a complete `prompt`: the subagent sees nothing else of this conversation.";
const BACKGROUND_WORDING: &str = "\n\nWith run_in_background: true the call returns a task id immediately and the \
                                  subagent keeps working; collect its final answer later with task_output (wait: \
                                  true only when you are blocked on it), and stop it with task_kill when it stopped \
                                  mattering.";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    profile: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default = "yes")]
    background: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    description: String,
    prompt: String,
}

struct SubagentPlugin;

impl Guest for SubagentPlugin {
    type Task = SubagentTask;

    fn describe(config: String) -> Result<Descriptor, String> {
        let config: Config = parse_config(&config)?;
        let mut description = config.description.unwrap_or_else(|| DESCRIPTION.to_string());
        if config.background {
            description.push_str(BACKGROUND_WORDING);
        }
        let schema = json!({
            "type": "object",
            "properties": {
                "description": {"type": "string", "minLength": 1, "description": "A short (3-7 words) description of the task; it labels the task."},
                "prompt": {"type": "string", "minLength": 1, "description": "The complete instructions for the subagent."}
            },
            "required": ["description", "prompt"],
            "additionalProperties": false
        });
        Ok(Descriptor::new(KIND, description, &schema, false))
    }

    fn label(_config: String, args: String) -> Result<String, String> {
        let args: Args = parse_args(&args)?;
        Ok(args.description.split_whitespace().collect::<Vec<_>>().join(" "))
    }

    fn run(config: String, args: String, mode: RunMode) -> Result<Task, String> {
        let config: Config = parse_config(&config)?;
        let args: Args = parse_args(&args)?;
        let run = subagents::start(&args.description, &args.prompt, config.profile.as_deref())?;
        log::debug!("subagent run started ({mode:?}): {}", args.description);
        Ok(Task::new(SubagentTask { run, phase: Cell::new(Phase::Running), result: RefCell::new(None) }))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Running,
    Disposing,
    Released,
}

struct SubagentTask {
    run: Run,
    phase: Cell<Phase>,
    result: RefCell<Option<RunResult>>,
}

impl GuestTask for SubagentTask {
    fn write_input(&self, _data: Vec<u8>, _close: bool) -> Result<(), String> {
        Err(taskhost_plugin_sdk::no_input(KIND))
    }

    fn cancel(&self, reason: Option<String>) {
        if self.phase.get() == Phase::Running {
            self.run.cancel(reason.as_deref());
        }
    }

    fn subscribe(&self) -> Pollable {
        match self.phase.get() {
            Phase::Running | Phase::Disposing => self.run.subscribe(),
            Phase::Released => time::ready_now(),
        }
    }

    fn done(&self) -> Option<Outcome> {
        if self.phase.get() == Phase::Running {
            let result = self.run.result()?;
            log::debug!("subagent result in ({}); disposing the child", reason_name(&result.stop_reason));
            *self.result.borrow_mut() = Some(result);
            self.run.dispose();
            self.phase.set(Phase::Disposing);
        }
        if self.phase.get() == Phase::Disposing {
            if !self.run.released() {
                return None;
            }
            self.phase.set(Phase::Released);
        }
        self.result.borrow().as_ref().map(outcome_of)
    }

    fn read_output(&self) -> String {
        String::new()
    }
}

fn reason_name(reason: &StopReason) -> &str {
    match reason {
        StopReason::Completed => "completed",
        StopReason::Aborted => "aborted",
        StopReason::Error => "error",
        StopReason::MaxTokens => "max-tokens",
        StopReason::Refusal => "refusal",
        StopReason::Other(other) => other,
    }
}

/// The RFC's `runOutcome` (see the crate docs).
fn outcome_of(result: &RunResult) -> Outcome {
    let with_text = |outcome: Outcome| {
        if result.text.is_empty() { outcome } else { outcome.with_output(result.text.clone()) }
    };
    match &result.stop_reason {
        StopReason::Completed => Outcome::completed().with_output(result.text.clone()),
        StopReason::Aborted => {
            let outcome = with_text(Outcome::killed());
            match &result.detail {
                Some(detail) => outcome.with_detail(detail.clone()),
                None => outcome,
            }
        }
        reason => {
            let name = reason_name(reason);
            let detail = match &result.detail {
                Some(detail) if !detail.is_empty() => format!("{name}: {detail}"),
                _ => name.to_string(),
            };
            with_text(Outcome::failed().with_detail(detail))
        }
    }
}

taskhost_plugin_sdk::export!(SubagentPlugin);

#[cfg(test)]
mod tests {
    use taskhost_plugin_sdk::TerminalStatus;

    use super::*;

    fn result(text: &str, stop_reason: StopReason, detail: Option<&str>) -> RunResult {
        RunResult { text: text.into(), stop_reason, detail: detail.map(str::to_string) }
    }

    fn parts(outcome: Outcome) -> (TerminalStatus, Option<String>, Option<String>) {
        (outcome.status, outcome.detail, outcome.output)
    }

    #[test]
    fn outcome_mapping_follows_the_rfc() {
        let completed = parts(outcome_of(&result("answer", StopReason::Completed, None)));
        assert_eq!(completed, (TerminalStatus::Completed, None, Some("answer".into())));
        let killed = parts(outcome_of(&result("", StopReason::Aborted, Some("task_kill"))));
        assert_eq!(killed, (TerminalStatus::Killed, Some("task_kill".into()), None));
        let error = parts(outcome_of(&result("", StopReason::Error, Some("HTTP 503"))));
        assert_eq!(error, (TerminalStatus::Failed, Some("error: HTTP 503".into()), None));
        let max = parts(outcome_of(&result("partial", StopReason::MaxTokens, None)));
        assert_eq!(max, (TerminalStatus::Failed, Some("max-tokens".into()), Some("partial".into())));
        let refusal = parts(outcome_of(&result("", StopReason::Refusal, None)));
        assert_eq!(refusal, (TerminalStatus::Failed, Some("refusal".into()), None));
        let unknown = parts(outcome_of(&result("", StopReason::Other("context-overflow".into()), None)));
        assert_eq!(unknown, (TerminalStatus::Failed, Some("context-overflow".into()), None));
    }
}
