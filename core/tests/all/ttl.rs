//! Time to live: a background task nobody reads for its TTL is warned about
//! once, then stopped with the reason in its status line; each read renews
//! it; `task_list` shows the time left; the arguments are checked.
//! Time is paused: the tests wait on notices, never on the wall clock.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use taskhost_core::Host;
use taskhost_core::agents::Agent;
use taskhost_core::native::scripted::{ScriptedProducer, ScriptedTask};
use taskhost_core::settings::TasksSettings;
use taskhost_core::tools::CallContext;
use taskhost_core::tools::producer_tool::ProducerToolOptions;
use tokio::time::Instant;

struct Fixture {
    host: Host,
    agent: Agent,
    jobs: Arc<ScriptedProducer>,
}

fn fixture(settings: TasksSettings) -> Fixture {
    let host = Host::new(&settings).unwrap();
    let jobs = ScriptedProducer::new("job", true);
    host.add_producer(Arc::new(jobs.clone()), ProducerToolOptions::new("job").with_promote_after(None)).unwrap();
    let agent = host.create_agent("agent-a", "session-a").unwrap();
    Fixture { host, agent, jobs }
}

impl Fixture {
    async fn call(&self, tool: &str, args: Value) -> Result<String, String> {
        let context = CallContext::for_agent(&self.agent);
        self.host.call_tool(tool, args, &context).await.map(|out| out.text).map_err(|e| e.to_string())
    }

    async fn start(&self, extra: Value) -> (String, Arc<ScriptedTask>) {
        let mut args = json!({"label": "job", "run_in_background": true});
        args.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let reply = self.call("job", args).await.unwrap();
        let id = reply.rsplit(' ').next().unwrap().to_string();
        (id, self.jobs.started().last().unwrap().clone())
    }

    async fn list(&self) -> String {
        self.call("task_list", json!({})).await.unwrap()
    }

    /// The next notice, and when it came.
    async fn next_notice(&self) -> (String, Instant) {
        self.agent.message_injected().await;
        let at = Instant::now();
        let mut unread = self.agent.take_unread();
        assert_eq!(unread.len(), 1, "one notice at a time: {:?}", unread.iter().map(|m| &m.text).collect::<Vec<_>>());
        (unread.remove(0).text, at)
    }
}

#[tokio::test(start_paused = true)]
async fn a_task_nobody_reads_is_warned_once_then_stopped() {
    let f = fixture(TasksSettings::default());
    let started = Instant::now();
    let (id, task) = f.start(json!({"ttl_ms": 10_000})).await;
    assert_eq!(f.list().await, format!("{id} [job] running — job (stopped in 10 s unless read)"));

    let (warning, at) = f.next_notice().await;
    assert_eq!(at - started, Duration::from_secs(9), "a tenth of the TTL before the deadline");
    assert_eq!(
        warning,
        format!(
            "background task {id} (job: job) will be stopped in 1 s: nobody read it for its time to live (10 s). \
             Read it with task_output (any read or view renews it for another 10 s), or stop it with task_kill."
        )
    );
    let (end, at) = f.next_notice().await;
    assert_eq!(at - started, Duration::from_secs(10));
    assert_eq!(
        end,
        format!(
            "background task {id} (job: job) was stopped when its time to live (10 s) ran out \
             [status: killed, reason: ttl expired after 10 s]. Read its output with task_output."
        )
    );
    assert_eq!(task.cancel_requests(), [Some("ttl expired after 10 s".to_string())]);
    assert_eq!(f.list().await, format!("{id} [job] killed — job"), "no time left once it ended");
    // Told once: nothing more comes.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(f.agent.take_unread().is_empty());
}

#[tokio::test(start_paused = true)]
async fn every_read_renews_the_ttl() {
    let f = fixture(TasksSettings::default());
    let (id, _task) = f.start(json!({"ttl_ms": 10_000})).await;
    for read in [
        json!({"task_id": id}),
        json!({"task_id": id, "view": "tail"}),
        json!({"task_id": id, "wait": true, "timeout_ms": 1000}),
    ] {
        tokio::time::sleep(Duration::from_secs(8)).await;
        f.call("task_output", read.clone()).await.unwrap();
        assert!(f.agent.take_unread().is_empty(), "renewed before any warning: {read}");
    }
    let renewed = Instant::now();
    let (warning, at) = f.next_notice().await;
    assert!(warning.contains("will be stopped in 1 s"), "{warning}");
    assert_eq!(at - renewed, Duration::from_secs(9), "counted from the last read");
    // A read after the warning renews too: the next warning is a full TTL away.
    f.call("task_output", json!({"task_id": id})).await.unwrap();
    let renewed = Instant::now();
    let (again, at) = f.next_notice().await;
    assert!(again.contains("will be stopped in 1 s"), "{again}");
    assert_eq!(at - renewed, Duration::from_secs(9));
}

#[tokio::test(start_paused = true)]
async fn a_task_killed_or_finished_first_hears_nothing_of_its_ttl() {
    let f = fixture(TasksSettings::default());
    let (killed, _task) = f.start(json!({"ttl_ms": 5_000})).await;
    f.call("task_kill", json!({"task_id": killed})).await.unwrap();
    let (finished, task) = f.start(json!({"ttl_ms": 5_000})).await;
    task.settle(taskhost_core::tasks::TaskOutcome::completed(None));
    let (notice, _) = f.next_notice().await;
    assert!(notice.contains(&finished) && notice.contains("finished [status: completed]"), "{notice}");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(f.agent.take_unread().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_server_default_applies_and_the_arguments_are_checked() {
    let settings = TasksSettings { default_ttl_ms: 90_000, ..TasksSettings::default() };
    let f = fixture(settings);
    let schema = f.host.tool_definitions().into_iter().find(|d| d.name == "job").unwrap().input_schema;
    let described = schema["properties"]["ttl_ms"]["description"].as_str().unwrap().to_string();
    assert!(
        described.ends_with(
            "Default: 90 s (this server's default); 86400 s for a task of a stable owner (one that reconnects)."
        ),
        "{described}"
    );
    let (id, _task) = f.start(json!({})).await;
    assert_eq!(f.list().await, format!("{id} [job] running — job (stopped in 1 min 30 s unless read)"));

    let error = f.call("job", json!({"label": "x", "ttl_ms": 5000})).await.unwrap_err();
    assert!(error.contains("ttl_ms needs run_in_background: true"), "{error}");
    for bad in [json!(999), json!(-1), json!("60000"), json!(2_592_000_001_u64)] {
        let error = f.call("job", json!({"label": "x", "run_in_background": true, "ttl_ms": bad})).await.unwrap_err();
        assert!(error.contains("ttl_ms must be an integer from 1000 to 2592000000"), "{bad}: {error}");
    }
    assert!(TasksSettings { default_ttl_ms: 10, ..TasksSettings::default() }.validate().is_err());
}

/// A stable owner's task (it outlives its connection and the server) gets
/// `stable_owner_ttl_ms` when its start names none, not the plain default;
/// a plain owner's task keeps the plain default (none here).
#[tokio::test(start_paused = true)]
async fn a_stable_owners_task_gets_the_stable_owner_default() {
    let settings = TasksSettings { stable_owner_ttl_ms: 7_200_000, ..TasksSettings::default() };
    let f = fixture(settings);
    let (plain, _task) = f.start(json!({})).await;
    assert_eq!(f.list().await, format!("{plain} [job] running — job"), "no bound for a plain owner by default");

    let stable = f.host.create_durable_agent("agent-s", "owner:s").unwrap();
    let context = CallContext::for_agent(&stable);
    let reply = f.host.call_tool("job", json!({"label": "kept", "run_in_background": true}), &context).await.unwrap();
    let id = reply.text.rsplit(' ').next().unwrap().to_string();
    let listed = f.host.call_tool("task_list", json!({}), &context).await.unwrap().text;
    assert_eq!(listed, format!("{id} [job] running — kept (stopped in 2 h 0 min unless read)"));
    // Its own ttl_ms wins.
    let reply = f
        .host
        .call_tool("job", json!({"label": "short", "run_in_background": true, "ttl_ms": 60_000}), &context)
        .await
        .unwrap();
    let short = reply.text.rsplit(' ').next().unwrap().to_string();
    let listed = f.host.call_tool("task_list", json!({}), &context).await.unwrap().text;
    assert!(listed.ends_with(&format!("{short} [job] running — short (stopped in 1 min 0 s unless read)")), "{listed}");

    let off = fixture(TasksSettings { stable_owner_ttl_ms: 0, ..TasksSettings::default() });
    let stable = off.host.create_durable_agent("agent-s", "owner:s").unwrap();
    let context = CallContext::for_agent(&stable);
    let reply = off.host.call_tool("job", json!({"label": "kept", "run_in_background": true}), &context).await.unwrap();
    let id = reply.text.rsplit(' ').next().unwrap().to_string();
    let listed = off.host.call_tool("task_list", json!({}), &context).await.unwrap().text;
    assert_eq!(listed, format!("{id} [job] running — kept"), "0 is none");
    assert!(
        TasksSettings { stable_owner_ttl_ms: 10, ..TasksSettings::default() }
            .validate()
            .unwrap_err()
            .to_string()
            .contains("stable_owner_ttl_ms"),
        "a bound out of range names its key"
    );
}
