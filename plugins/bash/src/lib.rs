//! `bash`: runs shell commands as tasks, in the foreground or in the background. Each call
//! starts `<shell> -c <command>` through the host's `process` capability, which enforces the
//! grant, confines the process tree, bounds its output and kills it when the store goes away.
//!
//! - Background: the command is handed over to the host (`process.spawn-handed-over`): its
//!   output is forwarded from the start, and for a stable owner the tree outlives a restart of
//!   the server, which then ends the task from the exit status in the words below. The host
//!   appends the output to the task's log as it is read, stdout as it comes and stderr under a `[stderr]`
//!   header (a header marks every change of stream, `[stdout]` included, and a read that
//!   begins inside stderr starts with one). The log keeps its own bounds (memory, then a log
//!   file the owner's commands can read), so `memory_cap_bytes` applies to foreground runs
//!   only (`spill_cap_bytes` bounds a durable tree's unread output) and `read-output` adds nothing.
//! - Interactive (background with `interactive: true`): as background, with a stdin pipe;
//!   `write-input` writes to it (never blocking: the host queues what the pipe cannot take)
//!   and `close` closes it. Every other run's stdin is `/dev/null` (end-of-file at once).
//! - Foreground: the host waits for `done` and reads once: the output, with
//!   `[output truncated; full output: <path>]` when a stream outgrew the memory cap (the tail
//!   is kept). `timeout_ms` (default 120 000, at most 600 000) kills the process group, and
//!   the output says so.
//! - Outcomes: `completed` + `exit code: N`; after a kill or a timeout, `killed` + `signal:
//!   SIGTERM` (or the code the command exited with).
//!
//! Invariants: `subscribe` is ready, and `done` is `some`, only once the process tree is gone
//! (output alone must not wake the host: nobody may be reading); one last `read-output` then
//! drains both streams; no byte is returned twice.
//!
//! Instance config: `shell` (default `bash`), `cwd`, `env` (wins over the host's scrub; the grant's
//! `env.plugin_may_set` must list each name),
//! `memory_cap_bytes`, `spill_cap_bytes`, `kill_grace_ms` (each at most what the grant
//! allows), `default_timeout_ms`, `max_timeout_ms`.

pub mod format;

use core::cell::RefCell;
use std::collections::BTreeMap;

use format::{Chunk, Mode, Utf8Carry, format_delta};
use serde::Deserialize;
use taskhost_plugin_sdk::log;
use taskhost_plugin_sdk::prelude::*;
use taskhost_plugin_sdk::process::{self, ExitStatus, OutputChunk, Process, SpawnRequest, StdinMode};
use taskhost_plugin_sdk::serde_json::json;

const KIND: &str = "bash";
const DEFAULT_TIMEOUT_MS: u64 = 120_000;
const MAX_TIMEOUT_MS: u64 = 600_000;

/// The instance config.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BashConfig {
    #[serde(default = "default_shell")]
    shell: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    memory_cap_bytes: Option<u64>,
    #[serde(default)]
    spill_cap_bytes: Option<u64>,
    #[serde(default)]
    kill_grace_ms: Option<u64>,
    #[serde(default = "default_timeout_ms")]
    default_timeout_ms: u64,
    #[serde(default = "max_timeout_ms")]
    max_timeout_ms: u64,
}

fn default_shell() -> String {
    "bash".into()
}

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

fn max_timeout_ms() -> u64 {
    MAX_TIMEOUT_MS
}

impl BashConfig {
    fn parse(config: &str) -> Result<Self, String> {
        let config: Self = parse_config(config)?;
        if config.shell.trim().is_empty() {
            return Err("invalid config: shell is empty".into());
        }
        if config.max_timeout_ms == 0 || config.default_timeout_ms == 0 {
            return Err("invalid config: timeouts must be at least 1 ms".into());
        }
        if config.default_timeout_ms > config.max_timeout_ms {
            return Err(format!(
                "invalid config: default_timeout_ms ({}) is above max_timeout_ms ({})",
                config.default_timeout_ms, config.max_timeout_ms
            ));
        }
        Ok(config)
    }
}

/// The tool arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BashArgs {
    command: String,
    #[serde(default)]
    timeout_ms: Option<u64>,
    /// For the model's own bookkeeping and the logs; the label is the command.
    #[serde(default)]
    description: Option<String>,
}

impl BashArgs {
    fn parse(args: &str, config: &BashConfig) -> Result<Self, String> {
        let args: Self = parse_args(args)?;
        if args.command.trim().is_empty() {
            return Err("invalid arguments: command is empty".into());
        }
        if let Some(timeout) = args.timeout_ms
            && !(1..=config.max_timeout_ms).contains(&timeout)
        {
            return Err(format!(
                "invalid arguments: timeout_ms must be between 1 and {}, got {timeout}",
                config.max_timeout_ms
            ));
        }
        Ok(args)
    }
}

struct Bash;

impl Guest for Bash {
    type Task = BashTask;

    fn describe(config: String) -> Result<Descriptor, String> {
        let config = BashConfig::parse(&config)?;
        let description = format!(
            "Runs a bash command and returns its output: stdout, then stderr under a [stderr] header \
             (in background output a [stdout] header marks stdout again after stderr), and the exit code. stdin is /dev/null (unless started in the background with interactive: true, \
             then send it lines with task_input), so use non-interactive flags; NO_COLOR=1, TERM=dumb \
             and PAGER=cat are set. A foreground call waits up to timeout_ms (default {}, at most {}) \
             and then kills the command and everything it started. Run long or endless commands \
             (servers, watchers, long builds) in the background when that is offered: you get a task \
             id at once, read new output with task_output, stop it with task_kill; everything the \
             command started ends with it. Output is never lost silently: a foreground call's output \
             beyond {} bytes per stream is cut, and the output names the file that holds all of it \
             ([output truncated; full output: <path>]); a background task's output is kept by the host, \
             and a read that skips some names the lines and the file that hold it. Your later commands \
             can read these files (read-only).",
            config.default_timeout_ms,
            config.max_timeout_ms,
            config.memory_cap_bytes.unwrap_or(64_000)
        );
        let schema = json!({
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The bash command to run."
                },
                "timeout_ms": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": config.max_timeout_ms,
                    "description": format!(
                        "Foreground only: kill the command after this many milliseconds (default {}).",
                        config.default_timeout_ms
                    )
                },
                "description": {
                    "type": "string",
                    "description": "What the command does, in a few words."
                }
            },
            "required": ["command"],
            "additionalProperties": false
        });
        Ok(Descriptor::new(KIND, &description, &schema, true).taking_input())
    }

    fn label(config: String, args: String) -> Result<String, String> {
        let config = BashConfig::parse(&config)?;
        Ok(BashArgs::parse(&args, &config)?.command)
    }

    fn run(config: String, args: String, mode: RunMode) -> Result<Task, String> {
        let config = BashConfig::parse(&config)?;
        let args = BashArgs::parse(&args, &config)?;
        let timeout_ms = match mode {
            RunMode::Foreground => Some(args.timeout_ms.unwrap_or(config.default_timeout_ms)),
            RunMode::Background | RunMode::Interactive => None,
        };
        let interactive = mode == RunMode::Interactive;
        let request = SpawnRequest {
            argv: vec![config.shell.clone(), "-c".into(), args.command.clone()],
            cwd: config.cwd.clone(),
            env: config.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            memory_cap: config.memory_cap_bytes,
            spill_cap: config.spill_cap_bytes,
            kill_grace_ms: config.kill_grace_ms,
            timeout_ms,
            stdin: if interactive { StdinMode::Pipe } else { StdinMode::Empty },
        };
        let mode = match mode {
            RunMode::Foreground => Mode::Foreground,
            RunMode::Background | RunMode::Interactive => Mode::Background,
        };
        // In the background the command's outcome is the task's and the task
        // keeps no other state: hand it over (the host may keep it across a
        // restart of the server, and then ends the task itself).
        let process = match mode {
            Mode::Background => process::spawn_handed_over(&request)?,
            Mode::Foreground => process::spawn(&request)?,
        };
        log::debug!(
            "started pid {} ({}): {}",
            process.pid(),
            args.description.as_deref().unwrap_or("no description"),
            args.command
        );
        Ok(Task::new(BashTask { process, mode, interactive, timeout_ms, state: RefCell::new(State::default()) }))
    }
}

/// One command.
struct BashTask {
    process: Process,
    mode: Mode,
    /// Started with a stdin pipe (`run-mode::interactive`).
    interactive: bool,
    /// The foreground timeout the host enforces.
    timeout_ms: Option<u64>,
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    cancelled: bool,
    stdout: Utf8Carry,
    stderr: Utf8Carry,
    /// The output last showed stderr (the next stdout text gets `[stdout]`).
    in_stderr: bool,
    /// The timeout line was added to the output.
    timeout_reported: bool,
}

fn chunk(c: OutputChunk) -> Chunk {
    Chunk { data: c.data, dropped: c.dropped, spill_path: c.spill_path, closed: c.closed }
}

impl BashTask {
    fn timeout_suffix(&self) -> String {
        match self.timeout_ms {
            Some(ms) if self.process.timed_out() => format!(" (timed out after {ms} ms)"),
            _ => String::new(),
        }
    }
}

impl GuestTask for BashTask {
    fn cancel(&self, reason: Option<String>) {
        let mut state = self.state.borrow_mut();
        if self.process.exit_status().is_some() {
            return; // finished already: nothing to stop
        }
        state.cancelled = true;
        log::debug!("cancelled: {}", reason.as_deref().unwrap_or("no reason given"));
        // SIGTERM to the group now, SIGKILL after the grace (the host's doing).
        self.process.kill();
    }

    /// In the background: ready on output as well as on exit, so the host
    /// drains output as it appears (views, milestone notices). In the
    /// foreground the output is read once, at the end: only the exit counts.
    fn subscribe(&self) -> Pollable {
        match self.mode {
            Mode::Background => self.process.subscribe(),
            Mode::Foreground => self.process.subscribe_exit(),
        }
    }

    fn write_input(&self, data: Vec<u8>, close: bool) -> Result<(), String> {
        if !self.interactive {
            return Err("the command was started without interactive: true; its stdin is empty".into());
        }
        if !data.is_empty() {
            self.process.write_stdin(&data)?;
        }
        if close {
            self.process.close_stdin()?;
        }
        Ok(())
    }

    fn done(&self) -> Option<Outcome> {
        let status = self.process.exit_status()?;
        let state = self.state.borrow();
        let stopped = state.cancelled || self.process.timed_out();
        let suffix = self.timeout_suffix();
        Some(match status {
            ExitStatus::Signal(signal) => {
                Outcome::killed().with_detail(format!("signal: {}{suffix}", process::signal_name(signal)))
            }
            ExitStatus::Code(code) if stopped => {
                Outcome::killed().with_detail(format!("{}{suffix}", format::exit_code_detail(code)))
            }
            ExitStatus::Code(code) => Outcome::completed().with_detail(format::exit_code_detail(code)),
        })
    }

    fn read_output(&self) -> String {
        let mut state = self.state.borrow_mut();
        let state = &mut *state;
        let finished = self.process.exit_status().is_some();
        let stdout = chunk(self.process.read_stdout());
        let stderr = chunk(self.process.read_stderr());
        let mut text =
            format_delta(self.mode, &stdout, &mut state.stdout, &stderr, &mut state.stderr, &mut state.in_stderr);
        if finished
            && !state.timeout_reported
            && let Some(ms) = self.timeout_ms
            && self.process.timed_out()
        {
            state.timeout_reported = true;
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!("[command timed out after {ms} ms and was killed]\n"));
        }
        text
    }
}

taskhost_plugin_sdk::export!(Bash);
