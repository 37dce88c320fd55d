//! The demo's restart scene: a stable owner's background command outlives a
//! stop of its server and is read to the end, under the same id, from the
//! next one.
//!
//! Both servers are built exactly as `taskhost serve` builds its host
//! ([`served_on_state`]: the SQLite store in the state directory, the
//! default tools), on a fresh temporary state directory (and compile cache)
//! removed at the end, so the user's own state is never read or written.
//! The first is stopped as `serve` stops on SIGTERM ([`taskhost_core::Host::dispose`], then
//! dropped with its store's lock); the second re-adopts the tree at start-up.
//!
//! Invariants (each checked, so a wrong story fails the demo): the task has
//! the same id on both servers; the numbered lines read before and after the
//! restart are every line exactly once, in order (a re-run would repeat
//! `line 1`); its end is told once, by one completion notice.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde_json::json;

use super::Demo;
use crate::config::Config;
use crate::plugin::producer::LoadGate;
use crate::setup::served_on_state;
use taskhost_core::ids::TaskId;

/// How many numbered lines the command prints, one every [`EVERY_MS`].
const LINES: usize = 15;
const EVERY_MS: u64 = 200;
/// The stable owner, as `taskhost serve --owner demo` names it.
const OWNER: &str = "owner:demo";

/// A server as `serve` runs it on `config`, and the stable owner's agent on it.
async fn server(config: &Config, started: Instant) -> anyhow::Result<Demo> {
    let served = served_on_state(config, Path::new("."), LoadGate::open_now(), None).await?;
    let (host, plugins) = (served.host, served.plugins);
    for served in plugins {
        served.plugin.await.map_err(|err| anyhow::anyhow!("{err}")).context("loading the bash plugin")?;
    }
    let agent = host.create_durable_agent(OWNER, OWNER)?;
    Ok(Demo { host, agent, started })
}

/// Process trees still running under their keepers in the state directory:
/// a tree's directory has its `status` file once the tree ended.
fn trees_running(state: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(state.join("trees")) else { return 0 };
    entries.flatten().filter(|entry| entry.path().is_dir() && !entry.path().join("status").exists()).count()
}

/// Waits until no server lock of the store in `state` is held (at most
/// 5 s; paced: a lock gives no event when released). The stopped server's
/// lock goes with its store, and a child it was spawning holds a copy until
/// its `exec`: in this one process the next server would take the lock's
/// pid, which is alive, for a live server's and not claim its records.
async fn locks_released(state: &Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd as _;
    let servers = state.join("tasks.servers");
    let deadline = Instant::now() + Duration::from_secs(5);
    'wait: loop {
        for entry in std::fs::read_dir(&servers).with_context(|| format!("reading {}", servers.display()))? {
            let file = std::fs::File::open(entry?.path())?;
            // SAFETY: flock on a descriptor this function owns (closed, and so
            // unlocked, when `file` drops).
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                ensure!(Instant::now() < deadline, "the stopped server's lock {} is still held", servers.display());
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue 'wait;
            }
        }
        return Ok(());
    }
}

/// The numbers of the `line N` lines of a read, checked to be nothing else.
fn numbered(text: &str) -> anyhow::Result<Vec<usize>> {
    let body = text.rsplit_once("\n[status:").map_or(text, |(body, _)| body);
    body.lines()
        .filter(|line| *line != "(no new output)")
        .map(|line| {
            line.strip_prefix("line ")
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("unexpected output {line:?}"))
        })
        .collect()
}

pub(super) async fn scene(started: Instant) -> anyhow::Result<()> {
    let temp = tempfile::Builder::new().prefix("taskhost-demo-").tempdir().context("a temporary state directory")?;
    let state = temp.path().join("state");
    let mut config = Config::default();
    config.state.dir = Some(state.clone());
    config.plugins.cache_dir = Some(temp.path().join("cache"));

    let first = server(&config, started).await?;
    first.say(&format!(
        "A restart that keeps a task. A server as `taskhost serve --owner demo` runs it, on a SQLite store in a \
         fresh state directory ({}); its owner is stable, so its background commands outlive the server.",
        state.display()
    ));
    let command = format!("for i in $(seq 1 {LINES}); do echo \"line $i\"; sleep {}; done", EVERY_MS as f64 / 1000.0);
    let id = first.start("bash", json!({"command": command, "run_in_background": true})).await?;
    let task = TaskId::new(id.as_str());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !first.host.registry().peek(&task, Some(&first.agent), 0).await?.text.contains("line 3\n") {
        ensure!(Instant::now() < deadline, "{id} printed no third line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = numbered(&first.call("task_output", json!({"task_id": id})).await?)?;

    first.say("The server stops (as on SIGTERM or `systemctl restart`): every owner and task is disposed.");
    first.host.dispose().await;
    let Demo { host, agent, .. } = first;
    drop((host, agent));
    locks_released(&state).await?;
    let running = trees_running(&state);
    println!("  (process trees still running under their keepers: {running})");
    ensure!(running == 1, "the stable owner's tree did not outlive its server ({running} running)");

    let second = server(&config, started).await?;
    second.say(&format!("A new server on the same store re-adopts the tree at start-up, still as {id}."));
    let list = second.call("task_list", json!({})).await?;
    ensure!(list.starts_with(&format!("{id} [bash] running")), "{id} was not re-adopted as running: {list}");
    second
        .say(&format!("The owner leaves {id} unread: its end arrives as a completion notice, then it reads the rest."));
    let deadline = Instant::now() + Duration::from_secs(30);
    let notices =
        |demo: &Demo| demo.agent.session_log().into_iter().filter(|m| m.about.as_ref() == Some(&task)).count();
    while notices(&second) == 0 {
        ensure!(Instant::now() < deadline, "no completion notice of {id} arrived");
        // Paced as well as woken: a notice injected just before the wait
        // began wakes nobody.
        let _ = tokio::time::timeout(Duration::from_millis(200), second.agent.message_injected()).await;
    }
    second.notices();
    let text = second.call("task_output", json!({"task_id": id})).await?;
    ensure!(text.ends_with("[status: completed, exit code: 0]"), "{id} did not complete: {text}");
    let after = numbered(&text)?;
    second.call("task_list", json!({})).await?;
    ensure!(notices(&second) == 1, "{id}'s end was told {} times", notices(&second));
    let all: Vec<usize> = before.iter().chain(&after).copied().collect();
    ensure!(
        all == (1..=LINES).collect::<Vec<_>>(),
        "lines read before the restart {before:?} and after it {after:?} are not each line once"
    );
    println!(
        "  (the same id {id}; lines 1-{} before the stop and {}-{LINES} after it, none lost or repeated; one notice)",
        before.len(),
        before.len() + 1
    );
    second.host.dispose().await;
    drop(second);
    temp.close().context("removing the demo's temporary state directory")?;
    Ok(())
}
