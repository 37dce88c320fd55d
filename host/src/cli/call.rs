//! `taskhost call <plugin.wasm|taskhost.toml> [--tool NAME] '<json args>'
//! [--background [--wait]]`: one non-interactive run of a plugin's tool.
//!
//! Model: the target is served exactly as `dev` and `serve` serve it
//! ([`super::target::open`], same grants), the tool is called once as one
//! agent would call it, and the answer the model would get is printed on
//! stdout. In the foreground that is the tool's result. With
//! `--background` it is the start answer (the task id), then the task's
//! output streamed as it arrives (consuming reads, woken by the registry's
//! output events, never by polling) until the task ends, then its status
//! line; with `--wait` as well, one `task_output` call that waits for the
//! end is printed instead, verbatim as the model reads it. Ctrl-C kills the
//! task and leaves. Logs go to stderr.
//!
//! Exit codes: 0 the call succeeded (a background task completed), 1 the
//! tool refused the call, or the task failed or was killed, or the plugin
//! does not load, 2 a usage mistake, 141 stdout was closed by its reader
//! (`| head -1`): the call stops at once, a background task is killed with
//! the host, and nothing more is said ([`super::out`]).

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::target::{PluginTarget, Session, usage};
use taskhost_core::tasks::{TaskEvent, TaskStatus};
use taskhost_core::tools::CallContext;
use taskhost_core::tools::producer_tool::RUN_IN_BACKGROUND;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Exit codes: 0 the call succeeded (in the background: the task completed); 1 the tool refused the \
call, the task failed or was killed, or the plugin does not load; 2 a usage mistake; 141 stdout was \
closed by its reader (e.g. `| head -1`): the task is killed, quietly.")]
pub struct CallArgs {
    #[command(flatten)]
    pub target: PluginTarget,
    /// The tool's arguments, a JSON object (without `run_in_background`).
    #[arg(default_value = "{}")]
    pub args: String,
    /// Start the task in the background and stream its output until it ends.
    #[arg(long)]
    pub background: bool,
    /// With --background: print one `task_output` that waits for the end,
    /// as the model reads it, instead of streaming.
    #[arg(long, requires = "background")]
    pub wait: bool,
}

/// The longest a `--wait` read waits for the end (the `task_output` cap).
const WAIT_MS: u64 = 600_000;

/// Whether the call succeeded, for the exit code.
pub struct Called {
    pub ok: bool,
}

pub async fn run(args: CallArgs) -> anyhow::Result<Called> {
    let mut call_args: Value = match serde_json::from_str(&args.args) {
        Ok(value) => value,
        Err(err) => usage!("the arguments are not JSON ({err}): pass one JSON object, like '{{\"count\": 3}}'"),
    };
    let Some(object) = call_args.as_object_mut() else {
        usage!("the arguments must be a JSON object, like '{{\"count\": 3}}'")
    };
    if object.contains_key(RUN_IN_BACKGROUND) {
        usage!("pass --background instead of `{RUN_IN_BACKGROUND}` in the arguments");
    }
    if args.background {
        object.insert(RUN_IN_BACKGROUND.into(), json!(true));
    }

    let session = super::target::open(&args.target, "call", super::target::Records::Memory).await?;
    let result = call(&session, &args, call_args).await;
    session.host.dispose().await;
    result
}

async fn call(session: &Session, args: &CallArgs, call_args: Value) -> anyhow::Result<Called> {
    let Session { host, agent, served } = session;
    let tool = match (&args.target.tool, served.as_slice()) {
        (Some(name), _) => {
            if !served.iter().any(|s| s.plugin.tool() == name) {
                let names: Vec<&str> = served.iter().map(|s| s.plugin.tool()).collect();
                usage!("no plugin tool {name:?}; served: {}", names.join(", "));
            }
            name.clone()
        }
        (None, [only]) => only.plugin.tool().to_string(),
        (None, _) => {
            let names: Vec<&str> = served.iter().map(|s| s.plugin.tool()).collect();
            usage!("several tools are served ({}); choose one with --tool", names.join(", "));
        }
    };
    let context = CallContext::for_agent(agent);
    // Subscribed before the start, so no output event is missed.
    let mut events = host.registry().subscribe();
    let answer = host.call_tool(&tool, call_args, &context).await?;
    say(&answer.text)?;
    if !args.background || answer.is_error {
        return Ok(Called { ok: !answer.is_error });
    }
    let id = host
        .registry()
        .list(Some(agent))
        .into_iter()
        .next()
        .map(|task| task.id)
        .context("the tool answered but registered no background task")?;

    if args.wait {
        let read = tokio::select! {
            read = host.call_tool("task_output", json!({"task_id": id, "wait": true, "timeout_ms": WAIT_MS}), &context) => read?,
            _ = tokio::signal::ctrl_c() => return interrupted(session, &id).await,
        };
        say(&read.text)?;
        let status = host.registry().get(&id, Some(agent))?.status;
        return Ok(Called { ok: status == TaskStatus::Completed });
    }

    loop {
        let read = host.registry().read(&id, Some(agent)).await?;
        if !read.text.is_empty() {
            super::out::write(&read.text)?;
        }
        if read.snapshot.status.is_terminal() {
            if !read.text.is_empty() && !read.text.ends_with('\n') {
                super::out::write("\n")?;
            }
            say(&read.snapshot.status_line())?;
            return Ok(Called { ok: read.snapshot.status == TaskStatus::Completed });
        }
        // Sleep until this task has new output or ends.
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                _ = tokio::signal::ctrl_c() => return interrupted(session, &id).await,
            };
            match event {
                Ok(TaskEvent::Output { id: ref of, .. })
                | Ok(TaskEvent::Settled { task: taskhost_core::tasks::TaskSnapshot { id: ref of, .. } })
                    if *of == id =>
                {
                    break;
                }
                Ok(_) => {}
                // Fell behind: read again, which is always correct.
                Err(RecvError::Lagged(_)) => break,
                Err(RecvError::Closed) => bail!("the task registry closed while {id} ran"),
            }
        }
    }
}

async fn interrupted(session: &Session, id: &taskhost_core::ids::TaskId) -> anyhow::Result<Called> {
    let _ = session.host.registry().kill(id, Some(&session.agent), Some("interrupted (Ctrl-C)")).await;
    eprintln!("taskhost: interrupted; killed {id}");
    Ok(Called { ok: false })
}

fn say(text: &str) -> anyhow::Result<()> {
    super::out::outln!("{}", text.trim_end_matches('\n'))
}
