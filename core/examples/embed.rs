//! The README's library example, compiled (and run by `cargo run --example
//! embed`) so the README cannot drift from the API: a host with a native
//! producer, an owner session, a background task, its output, the event
//! stream an embedder's UI would follow, and disposal.

// Everything comes through `taskhost_core`, the crate without the plugin
// runtime (`taskhost` re-exports the same paths): an embedder needs no other
// crate at a matching version.
use taskhost_core::prelude::*;
use taskhost_core::serde_json::{self, json};

#[taskhost_core::tokio::main(crate = "taskhost_core::tokio", flavor = "current_thread")]
async fn main() -> taskhost_core::anyhow::Result<()> {
    let host = Host::new(&TasksSettings::default())?;
    host.add_producer_named("ticker", std::sync::Arc::new(TickerProducer::new(&json!({}))?))?;
    let mut events = host.registry().subscribe(); // started / output / settled / released
    let agent = host.create_agent("agent-1", "session-1")?; // an owner session
    let context = CallContext::for_agent(&agent);
    let started =
        host.call_tool("ticker", json!({"count": 3, "interval_ms": 100, "run_in_background": true}), &context).await?;
    assert_eq!(started.text, "started background ticker task ticker-1");
    let output = host.call_tool("task_output", json!({"task_id": "ticker-1", "wait": true}), &context).await?;
    assert_eq!(output.text, "tick 1\ntick 2\ntick 3\n[status: completed, ticks: 3]");
    while let Ok(event) = events.try_recv() {
        println!("{}", serde_json::to_string(&event)?); // {"event":"started","task":{...}}, ...
    }
    agent.dispose().await; // cancels and awaits the agent's tasks
    host.dispose().await;
    Ok(())
}
