//! `taskhost dev <plugin.wasm|taskhost.toml> [--watch]`: the producer developer's console.
//! Serves the plugin (or every wasm producer of a configuration) on an in-process host with
//! one agent, the console's session, and reads commands.
//!
//! - Commands: call the tool in the foreground or background with JSON arguments, list tasks
//!   with the plugin version each runs on, read output (consuming, or waiting for the end),
//!   kill, show the tool definitions. Completion notices and reload events print as they come.
//! - Tasks: the console records them in its own SQLite file in the state directory,
//!   `dev-tasks.sqlite3` (`[state] store`; [`super::target::Records::DevStore`]), so its ids go
//!   on across runs and it never opens `serve`'s store; a script runs in memory (its lines name
//!   the ids it gets, the same at every run).
//! - `--watch`: a plugin file that changes is reloaded make-before-break ([`crate::reload`]);
//!   a build that fails is reported and the previous version keeps serving.
//! - On a terminal: line editing and history (rustyline), asynchronous lines printed above the
//!   prompt. Otherwise plain lines, with no prompt and no escape codes. Logs go to stderr; the
//!   console writes to stdout.
//! - Script mode (`--script FILE`, `-` for stdin): each command is echoed as `> <command>`, run
//!   to its end and printed with the completion notices that arrived meanwhile before the next
//!   is read (nothing is read ahead, so a piped script may depend on earlier answers); a
//!   `reload` prints its outcome. The first command that fails (a console error, a tool answer
//!   that is an error, a failed reload) stops the script: every task is disposed and `dev`
//!   exits 1 with `script <file> line <n>: <command>: <why>` on stderr. A script that ends (or
//!   `quit`) exits 0. `wait <id>...` waits for a task's end (the model's `task_wait`), so a
//!   script never needs a sleep.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::target::{PluginTarget, Records, Served, Session, usage};
use crate::plugin::ServingVersion;
use crate::reload::{ReloadEvent, ReloadablePlugin, WatchHandle, WatchOptions};
use taskhost_core::Host;
use taskhost_core::agents::Agent;
use taskhost_core::tools::producer_tool::RUN_IN_BACKGROUND;
use taskhost_core::tools::{CallContext, ToolOutput};

#[derive(Debug, clap::Args)]
#[command(after_help = "\
With --script: exit 0 when every command succeeded, 1 at the first that failed (a console error, a tool \
answer that is an error, a failed reload; the line on stderr), 2 a usage mistake (a missing script file).")]
pub struct DevArgs {
    #[command(flatten)]
    pub target: PluginTarget,
    /// Reload a plugin file whenever it changes.
    #[arg(long)]
    pub watch: bool,
    /// Run the console commands in FILE (`-`: stdin) in order, each to its
    /// end before the next is read, and leave; stop at the first that fails.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
}

/// The longest a console `wait` waits unless told (the `task_wait` cap).
const WAIT_MS: u64 = 600_000;

const HELP: &str = "\
commands:
  call [<tool>] <json>      run the tool in the foreground and print its result
  bg [<tool>] <json>        start it in the background (prints the task id)
  list                      your tasks, with the plugin version each runs on
  output <id> [--wait]      consuming read (--wait: until it finishes)
  wait <id>... [--timeout-ms N]  until one of the tasks ends (task_wait; default 600000 ms)
  kill <id> [reason]        stop a task
  tools                     the tool definitions (name, version, schema)
  reload [<tool>]           reload a plugin from its file now
  help                      this text
  quit                      dispose every task and leave (also end of input)";

/// Where console lines go: stdout, or above the prompt on a terminal.
#[derive(Clone)]
struct Console {
    printer: Arc<Mutex<Option<Box<dyn rustyline::ExternalPrinter + Send>>>>,
}

impl Console {
    fn say(&self, text: impl AsRef<str>) {
        let text = text.as_ref().trim_end_matches('\n');
        let mut printer = self.printer.lock().unwrap_or_else(|e| e.into_inner());
        match printer.as_mut() {
            Some(printer) => {
                let _ = printer.print(format!("{text}\n"));
            }
            // A closed stdout must not panic the console; the commands go on.
            None => {
                use std::io::Write as _;
                let _ = writeln!(std::io::stdout().lock(), "{text}");
            }
        }
    }
}

/// How the console runs its commands.
#[derive(Clone, Copy)]
struct Mode {
    /// Script mode (see the module docs).
    script: bool,
    /// A reload printer reports reloads (the console's own `reload` then
    /// need not).
    reload_printer: bool,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    // A script that cannot be read is a usage mistake, said before loading.
    let script = match &args.script {
        Some(path) => Some(Script::open(path).await?),
        None => None,
    };
    // The console records its tasks in its own store (ids go on across
    // runs); a script runs in memory, so the ids its lines name are the
    // same at every run.
    let records = if script.is_some() { Records::Memory } else { Records::DevStore };
    let Session { host, agent, served } = super::target::open(&args.target, "dev-console", records).await?;

    let mode = Mode { script: script.is_some(), reload_printer: script.is_none() || args.watch };
    let (mut lines, console) = match script {
        Some(script) => (Lines::Script(script), Console { printer: Arc::new(Mutex::new(None)) }),
        None => {
            let (lines, console) = input(std::io::stdin().is_terminal())?;
            (Lines::Console(lines), console)
        }
    };
    let mut watches: Vec<WatchHandle> = Vec::new();
    for s in &served {
        let serving = s.plugin.serving();
        console.say(format!(
            "serving {} from {}: {} ({})",
            s.plugin.tool(),
            s.file.as_deref().map_or("the built-in plugin".to_string(), |f| f.display().to_string()),
            serving.tag(),
            serving.version.version()
        ));
        if mode.reload_printer {
            spawn_reload_printer(&s.plugin, console.clone());
        }
        if args.watch {
            match &s.file {
                Some(file) => watches.push(crate::reload::watch(s.plugin.clone(), file, WatchOptions::default())?),
                None => console.say(format!("{} is built in: nothing to watch", s.plugin.tool())),
            }
        }
    }
    if args.watch && !watches.is_empty() {
        console.say("watching for rebuilds");
    }
    if mode.script {
        // Notices are printed after each command instead, so a script's
        // transcript is in the order things happened.
    } else {
        spawn_notice_printer(&agent, console.clone());
        console.say("type `help` for the commands");
    }

    let mut failure = None;
    while let Some(line) = lines.next().await {
        let (number, line) = line?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if mode.script {
            console.say(format!("> {line}"));
        }
        let result = command(&host, &agent, &served, line, &console, mode).await;
        if mode.script {
            say_notices(&agent, &console);
        }
        match result {
            Ok(Flow::Continue) => {}
            Ok(Flow::Quit) => break,
            Err(error) if mode.script => {
                failure = Some(anyhow!("script {} line {number}: {line}: {error:#}", lines.name()));
                break;
            }
            Err(error) => console.say(format!("error: {error:#}")),
        }
    }
    drop(watches);
    let live = host.registry().list(Some(&agent)).iter().filter(|t| !t.status.is_terminal()).count();
    if live > 0 {
        console.say(format!("stopping {live} running task{}", if live == 1 { "" } else { "s" }));
    }
    host.dispose().await;
    console.say("bye");
    match failure {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// A script: a file, or stdin (`-`), read one line at a time.
struct Script {
    name: String,
    lines: tokio::io::Lines<tokio::io::BufReader<Box<dyn tokio::io::AsyncRead + Unpin + Send>>>,
    number: usize,
}

impl Script {
    async fn open(path: &std::path::Path) -> anyhow::Result<Self> {
        use tokio::io::AsyncBufReadExt as _;
        let (name, reader): (String, Box<dyn tokio::io::AsyncRead + Unpin + Send>) = if path.as_os_str() == "-" {
            ("stdin".to_string(), Box::new(tokio::io::stdin()))
        } else {
            match tokio::fs::File::open(path).await {
                Ok(file) => (path.display().to_string(), Box::new(file)),
                Err(err) => usage!("cannot read the script {}: {err}", path.display()),
            }
        };
        Ok(Self { name, lines: tokio::io::BufReader::new(reader).lines(), number: 0 })
    }
}

/// Where commands come from.
enum Lines {
    /// The console's input (read ahead by its reader).
    Console(mpsc::UnboundedReceiver<String>),
    /// A script, read only when the previous command has ended.
    Script(Script),
}

impl Lines {
    /// The next line and its number; `None` at the end of the input.
    async fn next(&mut self) -> Option<anyhow::Result<(usize, String)>> {
        match self {
            Lines::Console(lines) => lines.recv().await.map(|line| Ok((0, line))),
            Lines::Script(script) => match script.lines.next_line().await {
                Ok(Some(line)) => {
                    script.number += 1;
                    Some(Ok((script.number, line)))
                }
                Ok(None) => None,
                Err(err) => Some(Err(anyhow!("cannot read the script {}: {err}", script.name))),
            },
        }
    }

    fn name(&self) -> &str {
        match self {
            Lines::Console(_) => "console",
            Lines::Script(script) => &script.name,
        }
    }
}

/// Prints the completion notices injected since the last call.
fn say_notices(agent: &Agent, console: &Console) {
    for message in agent.take_unread() {
        console.say(format!("[notice] {}", message.text));
    }
}

/// Lines from stdin: rustyline on a terminal (in its own thread, since it
/// blocks), plain lines otherwise.
fn input(interactive: bool) -> anyhow::Result<(mpsc::UnboundedReceiver<String>, Console)> {
    let (tx, rx) = mpsc::unbounded_channel();
    if !interactive {
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt as _;
            let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        return Ok((rx, Console { printer: Arc::new(Mutex::new(None)) }));
    }
    let mut editor = rustyline::DefaultEditor::new().context("cannot set up line editing")?;
    let printer = editor.create_external_printer().context("cannot set up line editing")?;
    std::thread::Builder::new()
        .name("taskhost-dev-input".into())
        .spawn(move || {
            // Ctrl-C and Ctrl-D end the input like `quit`.
            while let Ok(line) = editor.readline("taskhost> ") {
                let _ = editor.add_history_entry(line.as_str());
                if tx.send(line).is_err() {
                    break;
                }
            }
        })
        .context("cannot start the input thread")?;
    Ok((rx, Console { printer: Arc::new(Mutex::new(Some(Box::new(printer)))) }))
}

fn spawn_reload_printer(plugin: &Arc<ReloadablePlugin>, console: Console) {
    let mut events = plugin.subscribe();
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(event @ ReloadEvent::Reloaded(_)) => console.say(format!("[reload] {event}")),
                Ok(event @ ReloadEvent::Failed(_)) => console.say(format!("[reload failed] {event}")),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    console.say(format!("[reload] ({n} reload events not shown)"))
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    });
}

/// Prints each completion notice once, as it is injected into the console's
/// session. The periodic check covers a notice injected between a take and
/// the next wait.
fn spawn_notice_printer(agent: &Agent, console: Console) {
    let agent = agent.clone();
    tokio::spawn(async move {
        while agent.is_live() {
            for message in agent.take_unread() {
                console.say(format!("[notice] {}", message.text));
            }
            tokio::select! {
                _ = agent.message_injected() => {}
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    });
}

enum Flow {
    Continue,
    Quit,
}

async fn command(
    host: &Host,
    agent: &Agent,
    served: &[Served],
    line: &str,
    console: &Console,
    mode: Mode,
) -> anyhow::Result<Flow> {
    let (word, rest) = line.split_once(char::is_whitespace).map_or((line, ""), |(w, r)| (w, r.trim()));
    let context = CallContext::for_agent(agent);
    match word {
        "quit" | "exit" => return Ok(Flow::Quit),
        "help" | "?" => console.say(HELP),
        "call" | "bg" => {
            let (plugin, args) = tool_and_args(served, rest)?;
            let mut args: Value = serde_json::from_str(args).context("the arguments are not JSON")?;
            let Some(object) = args.as_object_mut() else { bail!("the arguments must be a JSON object") };
            if word == "bg" {
                object.insert(RUN_IN_BACKGROUND.into(), json!(true));
            }
            let output = host.call_tool(plugin.tool(), args, &context).await?;
            say_output(console, &output, mode)?;
        }
        "list" => {
            let tasks = host.registry().list(Some(agent));
            if tasks.is_empty() {
                console.say("(no background tasks)");
            }
            for task in tasks {
                let version = task.producer_info.as_deref().map_or(String::new(), |info| {
                    let tag = ServingVersion::seq_of_info(info).map_or(String::new(), |s| format!("v{s} "));
                    let hash = info.split(' ').next().unwrap_or(info);
                    format!("  ({tag}{hash})")
                });
                console.say(format!("{} [{}] {} — {}{version}", task.id, task.kind, task.status, task.label));
            }
        }
        "output" => {
            let mut id = None;
            let mut wait = false;
            for part in rest.split_whitespace() {
                match part {
                    "--wait" => wait = true,
                    other if id.is_none() => id = Some(other),
                    other => bail!("unexpected {other:?}; usage: output <id> [--wait]"),
                }
            }
            let id = id.context("usage: output <id> [--wait]")?;
            let output = host.call_tool("task_output", json!({"task_id": id, "wait": wait}), &context).await?;
            say_output(console, &output, mode)?;
        }
        "wait" => {
            let mut ids = Vec::new();
            let mut timeout_ms = WAIT_MS;
            let mut parts = rest.split_whitespace();
            while let Some(part) = parts.next() {
                if part == "--timeout-ms" {
                    let value = parts.next().context("usage: wait <id>... [--timeout-ms N]")?;
                    timeout_ms = value.parse().with_context(|| format!("--timeout-ms {value:?} is not a number"))?;
                } else {
                    ids.push(part);
                }
            }
            if ids.is_empty() {
                bail!("usage: wait <id>... [--timeout-ms N]");
            }
            let output =
                host.call_tool("task_wait", json!({"task_ids": ids, "timeout_ms": timeout_ms}), &context).await?;
            say_output(console, &output, mode)?;
        }
        "kill" => {
            let (id, reason) = rest.split_once(char::is_whitespace).map_or((rest, None), |(i, r)| (i, Some(r.trim())));
            if id.is_empty() {
                bail!("usage: kill <id> [reason]");
            }
            let output = host.call_tool("task_kill", json!({"task_id": id, "reason": reason}), &context).await?;
            say_output(console, &output, mode)?;
        }
        "tools" => {
            for definition in host.tool_definitions() {
                let version = served
                    .iter()
                    .find(|s| s.plugin.tool() == definition.name)
                    .map(|s| {
                        let serving = s.plugin.serving();
                        let live = s.plugin.live_tasks_by_version();
                        let live = if live.is_empty() {
                            String::new()
                        } else {
                            let parts: Vec<String> = live.iter().map(|(v, n)| format!("v{v}: {n}")).collect();
                            format!(", live tasks {}", parts.join(", "))
                        };
                        format!(" ({} {}{live})", serving.tag(), serving.version.version())
                    })
                    .unwrap_or_default();
                console.say(format!("{}{version}: {}", definition.name, definition.description));
                console.say(format!("  schema: {}", definition.input_schema));
            }
        }
        "reload" => {
            let plugin = match rest {
                "" => served.first().context("no plugin")?,
                name => served.iter().find(|s| s.plugin.tool() == name).with_context(|| format!("no tool {name:?}"))?,
            };
            let Some(file) = &plugin.file else {
                bail!("{} is built in: there is no file to reload", plugin.plugin.tool())
            };
            // The reload printer reports it, like a watched reload; without
            // one (a script), the console does, and a failure fails it.
            let reloaded = plugin.plugin.reload_file(file).await;
            if !mode.reload_printer {
                match reloaded {
                    Ok(reloaded) => console.say(format!("[reload] {reloaded}")),
                    Err(failed) => bail!("[reload failed] {failed}"),
                }
            }
        }
        other => bail!("unknown command {other:?}; type `help`"),
    }
    Ok(Flow::Continue)
}

/// `[<tool>] <json>`: the tool may be left out when one plugin is served.
fn tool_and_args<'a>(served: &'a [Served], rest: &'a str) -> anyhow::Result<(&'a ReloadablePlugin, &'a str)> {
    if rest.starts_with('{') || rest.is_empty() {
        let [only] = served else {
            bail!("several tools are served; name one: call <tool> <json>");
        };
        return Ok((&only.plugin, if rest.is_empty() { "{}" } else { rest }));
    }
    let (name, args) = rest.split_once(char::is_whitespace).map_or((rest, "{}"), |(n, a)| (n, a.trim()));
    let plugin = served.iter().find(|s| s.plugin.tool() == name).with_context(|| {
        let names: Vec<&str> = served.iter().map(|s| s.plugin.tool()).collect();
        format!("no plugin tool {name:?}; served: {}", names.join(", "))
    })?;
    Ok((&plugin.plugin, args))
}

/// Prints a tool's answer; in a script, an error answer fails the command.
fn say_output(console: &Console, output: &ToolOutput, mode: Mode) -> anyhow::Result<()> {
    if output.is_error {
        console.say(format!("(error result)\n{}", output.text));
        if mode.script {
            bail!("the tool answered with an error");
        }
    } else {
        console.say(&output.text);
    }
    Ok(())
}
