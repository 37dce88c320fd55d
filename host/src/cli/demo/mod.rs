//! `taskhost demo`: the whole story in a few seconds, on the built-in
//! plugins, with no network and no API key.
//!
//! An in-process host serves the embedded `ticker` and `bash` plugins as
//! tools to one agent. The script calls the same tools a model would, prints
//! their exact texts, and narrates: background starts, consuming reads, a hot
//! reload while a task runs (the old task finishes on the old version, new
//! starts use the new one), a broken build refused while the old version
//! keeps serving, a kill, a confined bash command and the kill of a bash tree
//! with an escaped daemon, a long foreground call moved to the background,
//! a milestone notice, views that consume nothing, `task_wait`, input to an
//! interactive command, completion notices, the task list, and a restart of
//! the server that keeps a stable owner's task (`restart`). Each step
//! checks what it claims, so the demo fails loudly instead of telling a
//! wrong story.

mod restart;

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde_json::{Value, json};

use crate::config::Config;
use crate::plugin::{CompileSource, ServingVersion};
use crate::reload::ReloadablePlugin;
use crate::setup::{PluginRuntime, build_wasm_producer};
use taskhost_core::Host;
use taskhost_core::agents::Agent;
use taskhost_core::settings::TasksSettings;
use taskhost_core::tools::producer_tool::ProducerToolOptions;
use taskhost_core::tools::{CallContext, ToolOutput};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

struct Demo {
    host: Host,
    agent: Agent,
    started: Instant,
}

impl Demo {
    fn say(&self, text: &str) {
        println!("\n[{:>5.1}s] {text}", self.started.elapsed().as_secs_f64());
    }

    /// Calls a tool as the agent and prints the call and its exact result.
    async fn call(&self, tool: &str, args: Value) -> anyhow::Result<String> {
        Ok(self.call_output(tool, args).await?.text)
    }

    /// A background start: the id of the task it registered.
    async fn start(&self, tool: &str, args: Value) -> anyhow::Result<String> {
        let output = self.call_output(tool, args).await?;
        output.started.map(|id| id.to_string()).with_context(|| format!("the {tool} call started no task"))
    }

    async fn call_output(&self, tool: &str, args: Value) -> anyhow::Result<ToolOutput> {
        println!("  > {tool} {args}");
        let output = self
            .host
            .call_tool(tool, args, &CallContext::for_agent(&self.agent))
            .await
            .with_context(|| format!("the demo's {tool} call failed"))?;
        for line in output.text.lines() {
            println!("  | {line}");
        }
        Ok(output)
    }

    fn version_of(&self, id: &str) -> anyhow::Result<String> {
        let snapshot = self.host.registry().get(&taskhost_core::ids::TaskId::new(id), Some(&self.agent))?;
        let info = snapshot.producer_info.context("a wasm task records its plugin version")?;
        Ok(ServingVersion::seq_of_info(&info).map_or(info.clone(), |seq| format!("v{seq} ({info})")))
    }

    fn notices(&self) {
        for message in self.agent.take_unread() {
            println!("  notice → {}", message.text);
        }
    }
}

fn compiled(source: CompileSource) -> &'static str {
    match source {
        CompileSource::Compiled => "compiled now",
        CompileSource::Cache => "compiled code from the cache",
    }
}

pub async fn run(_args: DemoArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    // The runtime `serve` builds from a configuration, with the defaults.
    let mut runtime = PluginRuntime::new(&Config::default());
    let engine = runtime.engine().await?;
    let host = Host::new(&TasksSettings::default())?;
    let agent = host.create_agent("demo-agent", "demo-session")?;
    let demo = Demo { host: host.clone(), agent, started };
    let ticker = crate::builtin::find("ticker").context("the ticker plugin is built in")?;

    println!("taskhost demo: background tasks for an AI agent, produced by sandboxed WebAssembly plugins.");
    println!("Everything below is an in-process host and one agent calling the tools a model would call;");
    println!("the lines after `|` are the exact tool results the model would read.");

    let v1 = engine.load_bytes("ticker", ticker.wasm).await?;
    let options =
        ProducerToolOptions::new("ticker").with_foreground_timeout(Duration::from_secs(60)).with_promote_after(None);
    let plugin = ReloadablePlugin::serve(&host, &engine, v1, json!({}), options).await?;
    demo.say(&format!(
        "Loaded the built-in `ticker` plugin ({} bytes of wasm, {} in {:.0} ms) as the tool `ticker`, version {}.",
        ticker.wasm.len(),
        compiled(plugin.serving().version.compile_source()),
        plugin.serving().version.load_time().as_secs_f64() * 1000.0,
        plugin.serving().tag()
    ));

    demo.say("The agent starts two background tasks; each call returns a task id at once.");
    let slow = demo.start("ticker", json!({"count": 6, "interval_ms": 400, "run_in_background": true})).await?;
    let doomed = demo
        .start("ticker", json!({"count": 100, "interval_ms": 200, "message": "long job", "run_in_background": true}))
        .await?;

    demo.say(&format!("Consuming reads: each task_output returns only what is new since the last read of {slow}."));
    tokio::time::sleep(Duration::from_millis(900)).await;
    demo.call("task_output", json!({"task_id": slow})).await?;
    tokio::time::sleep(Duration::from_millis(450)).await;
    demo.call("task_output", json!({"task_id": slow})).await?;

    demo.say(
        "Hot reload while both tasks run: the new version is compiled, checked and described first, then swapped in.",
    );
    let reloaded = plugin
        .reload_bytes("ticker", ticker.wasm)
        .await
        .map_err(|failed| anyhow::anyhow!("the demo's reload failed: {failed}"))?;
    println!("  {reloaded}");
    println!(
        "  (the same bytes as v1, so nothing was recompiled: {}, {:.0} ms from load to swap)",
        compiled(reloaded.compile),
        reloaded.took.as_secs_f64() * 1000.0
    );
    let fresh = demo.start("ticker", json!({"count": 3, "interval_ms": 150, "run_in_background": true})).await?;
    println!("  {slow} runs on {}", demo.version_of(&slow)?);
    println!("  {fresh} runs on {}", demo.version_of(&fresh)?);
    ensure!(demo.version_of(&slow)?.starts_with("v1") && demo.version_of(&fresh)?.starts_with("v2"));

    demo.say("A broken build (a half-written file) is refused; the serving version does not change.");
    let half = &ticker.wasm[..ticker.wasm.len() / 2];
    match plugin.reload_bytes("ticker", half.to_vec()).await {
        Ok(_) => anyhow::bail!("the demo's truncated build was accepted"),
        Err(failed) => println!("  {failed}"),
    }
    ensure!(plugin.serving().seq == 2, "a failed reload changed the serving version");

    demo.say(&format!("The agent no longer needs {doomed}: it kills it."));
    demo.call("task_kill", json!({"task_id": doomed, "reason": "no longer needed"})).await?;

    bash(&demo, &mut runtime).await?;
    beyond_the_three_tools(&demo).await?;

    demo.say(&format!("The agent waits for {slow}, which finishes on v1 although v2 serves new starts."));
    let text = demo.call("task_output", json!({"task_id": slow, "wait": true, "timeout_ms": 10000})).await?;
    ensure!(text.ends_with("[status: completed, ticks: 6]"), "{slow} did not complete: {text}");

    demo.say(&format!("{fresh} was never read: its completion notice arrives in the agent's session instead."));
    let deadline = Instant::now() + Duration::from_secs(10);
    while demo.agent.session_log().is_empty() {
        ensure!(Instant::now() < deadline, "no completion notice arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    demo.notices();
    println!("  (no notice for {slow} or {doomed}: their ends were already reported by the read and the kill)");

    demo.say("The task list, as the model sees it:");
    demo.call("task_list", json!({})).await?;
    println!("  and with the versions the host records:");
    for task in host.registry().list(Some(&demo.agent)) {
        println!("  {} {} on {}", task.id, task.status, task.producer_info.unwrap_or_default());
    }

    restart::scene(started).await?;

    demo.say("Done: every task ended the way its owner asked, on the version that started it.");
    host.dispose().await;
    Ok(())
}

/// What agents expect beyond reads and kills: a long foreground call moved
/// to the background, a milestone notice, views that consume nothing,
/// waiting for whichever task finishes first, and input to a running command.
async fn beyond_the_three_tools(demo: &Demo) -> anyhow::Result<()> {
    demo.say(
        "A foreground command that runs long moves to the background by itself (after 1 s here, 30 s by default).",
    );
    let text = demo
        .call("bash", json!({"command": "for i in 1 2 3 4 5 6 7 8; do echo \"build step $i\"; sleep 0.25; done"}))
        .await?;
    let promoted = text
        .rsplit("as task ")
        .next()
        .and_then(|rest| rest.split('.').next())
        .filter(|_| text.contains("[still running after 1 s: moved to the background as task "))
        .context("the long foreground call was not promoted")?
        .to_string();

    demo.say("A server started with notify_on: the agent is told when it is ready, without polling.");
    let server = demo
        .start(
            "bash",
            json!({
                "command": "echo starting; sleep 0.3; echo \"server ready on port 8080\"; sleep 600",
                "run_in_background": true,
                "notify_on": {"pattern": "ready on port \\d+"}
            }),
        )
        .await?;
    tokio::time::timeout(Duration::from_secs(10), demo.agent.message_injected())
        .await
        .context("no milestone notice arrived")?;
    demo.notices();

    demo.say(&format!("task_wait: whichever of {promoted} and {server} finishes first."));
    let text = demo.call("task_wait", json!({"task_ids": [promoted, server], "timeout_ms": 10000})).await?;
    ensure!(text.starts_with(&format!("{promoted} finished first")), "{promoted} did not finish first: {text}");

    demo.say(&format!("Views look without consuming: the last two lines of {promoted}, then a grep."));
    demo.call("task_output", json!({"task_id": promoted, "view": "tail", "lines": 2})).await?;
    demo.call("task_output", json!({"task_id": promoted, "grep": "step [2-3]"})).await?;
    let rest = demo.call("task_output", json!({"task_id": promoted})).await?;
    ensure!(rest.contains("build step 8"), "the consuming read lost output after the views: {rest}");
    demo.call("task_kill", json!({"task_id": server})).await?;

    demo.say("An interactive command: started with interactive: true, it reads what task_input sends.");
    let repl = demo
        .start(
            "bash",
            json!({
                "command": "while read -r line; do echo \"you said: $line\"; done; echo \"input closed\"",
                "run_in_background": true,
                "interactive": true
            }),
        )
        .await?;
    demo.call("task_input", json!({"task_id": repl, "text": "hello\n"})).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let peek =
            demo.host.registry().peek(&taskhost_core::ids::TaskId::new(repl.as_str()), Some(&demo.agent), 0).await?;
        if peek.text.contains("you said: hello") {
            break;
        }
        ensure!(Instant::now() < deadline, "{repl} never answered its input");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    demo.call("task_output", json!({"task_id": repl})).await?;
    demo.call("task_input", json!({"task_id": repl, "text": "bye\n", "close": true})).await?;
    let text = demo.call("task_output", json!({"task_id": repl, "wait": true, "timeout_ms": 10000})).await?;
    ensure!(text.ends_with("input closed\n[status: completed, exit code: 0]"), "{repl} did not end on close: {text}");
    Ok(())
}

/// The built-in bash plugin exactly as `taskhost serve` offers it by
/// default: a confined command, and the kill of a tree whose daemon left the
/// process group.
async fn bash(demo: &Demo, runtime: &mut PluginRuntime) -> anyhow::Result<()> {
    let entry =
        Config::default_producers().into_iter().find(|p| p.tool == "bash").context("bash is a default producer")?;
    let wasm = build_wasm_producer(&entry, std::path::Path::new("."), runtime, None)
        .await?
        .context("the default bash is a wasm plugin")?;
    // As served, but promoting a long foreground call after 1 s instead of
    // 30 s, so the demo can show it.
    let options = entry.tool_options().with_promote_after(Some(Duration::from_secs(1)));
    demo.host.add_producer(wasm.producer, options)?;
    demo.say(&format!(
        "The built-in `bash` plugin, granted only the program bash ({}): a background command.",
        taskhost_process::confine::support().describe()
    ));
    let id = demo
        .start(
            "bash",
            json!({
                "command": "echo \"my pid in my namespace: $$\"; for i in 1 2 3; do echo \"step $i\"; sleep 0.2; done",
                "run_in_background": true
            }),
        )
        .await?;
    let text = demo.call("task_output", json!({"task_id": id, "wait": true, "timeout_ms": 10000})).await?;
    ensure!(text.ends_with("step 3\n[status: completed, exit code: 0]"), "{id} did not complete: {text}");

    demo.say("A command that leaves a daemon behind (setsid) is killed, daemon and all.");
    let id = demo
        .start(
            "bash",
            json!({"command": "setsid sleep 600 & echo \"left a daemon\"; sleep 600", "run_in_background": true}),
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let read = demo.host.registry().read(&taskhost_core::ids::TaskId::new(id.as_str()), Some(&demo.agent)).await?;
        if read.text.contains("left a daemon") {
            println!("  (the command said: {})", read.text.trim());
            break;
        }
        ensure!(Instant::now() < deadline, "{id} never started its daemon");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    demo.call("task_kill", json!({"task_id": id})).await?;
    let text = demo.call("task_output", json!({"task_id": id, "wait": true, "timeout_ms": 10000})).await?;
    ensure!(text.ends_with("[status: killed, signal: SIGTERM]"), "{id} was not killed: {text}");
    println!("  (its PID namespace ended with it; process trees left: {})", taskhost_process::live_count());
    Ok(())
}
