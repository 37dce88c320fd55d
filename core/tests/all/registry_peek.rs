//! `TaskRegistry::peek`, the dashboard's non-consuming read: what a viewer
//! sees never goes missing from the owner's reads, order is kept, the owner
//! fence holds, a peek reports nothing, and final-output kinds show their
//! output once settled.

use std::sync::Arc;
use std::time::Duration;

use taskhost_core::agents::{Agent, AgentRegistry};
use taskhost_core::native::scripted::ScriptedTask;
use taskhost_core::notices::deliver_completion_notices;
use taskhost_core::tasks::*;

struct Fixture {
    agents: AgentRegistry,
    registry: TaskRegistry,
    _surface: SurfaceGuard,
    _notices: ListenerGuard,
}

fn fixture() -> Fixture {
    let agents = AgentRegistry::new();
    let registry = TaskRegistry::new(
        agents.clone(),
        RegistryConfig { teardown_timeout: Some(Duration::from_secs(5)), ..RegistryConfig::default() },
    );
    let surface = registry.attach_surface("test");
    let notices = deliver_completion_notices(&registry);
    Fixture { agents, registry, _surface: surface, _notices: notices }
}

fn spec(owner: &Agent, task: &Arc<ScriptedTask>) -> TaskStart {
    TaskStart::new("scripted", "peeked work", task.runner()).with_owner(Some(owner.clone()))
}

#[tokio::test]
async fn peeks_never_take_output_from_the_owner_and_keep_its_order() {
    let fx = fixture();
    let owner = fx.agents.create("alice", "alice").unwrap();
    let task = ScriptedTask::new(true);
    let id = fx.registry.start(spec(&owner, &task)).await.unwrap();

    task.push_output("one\n");
    let peek = fx.registry.peek(&id, Some(&owner), 0).await.unwrap();
    assert_eq!((peek.text.as_str(), peek.start, peek.end, peek.skipped), ("one\n", 0, 4, 0));
    task.push_output("two\n");
    // The owner reads what the viewer saw, then what is new, in order.
    assert_eq!(fx.registry.read(&id, Some(&owner)).await.unwrap().text, "one\ntwo\n");
    assert_eq!(fx.registry.read(&id, Some(&owner)).await.unwrap().text, "", "each byte is read once");

    // The viewer still sees what the owner read, from its offset on.
    task.push_output("three\n");
    let peek = fx.registry.peek(&id, Some(&owner), peek.end).await.unwrap();
    assert_eq!((peek.text.as_str(), peek.start, peek.end), ("two\nthree\n", 4, 14));
    let whole = fx.registry.peek(&id, Some(&owner), 0).await.unwrap();
    assert_eq!(whole.text, "one\ntwo\nthree\n");

    // A peek of the settled task reports nothing: the completion notice
    // still reaches the owner, and the owner's read gets the held output.
    let mut events = fx.registry.subscribe();
    task.settle(TaskOutcome::completed(Some("exit code: 0".to_string())));
    loop {
        if let TaskEvent::Settled { task } = events.recv().await.unwrap()
            && task.id == id
        {
            break;
        }
    }
    let peek = fx.registry.peek(&id, Some(&owner), 14).await.unwrap();
    assert_eq!(peek.snapshot.status, TaskStatus::Completed);
    assert!(!peek.snapshot.reported, "a peek is not a report");
    let unread = owner.take_unread();
    assert_eq!(unread.len(), 1, "the completion notice was delivered: {unread:?}");
    let read = fx.registry.read(&id, Some(&owner)).await.unwrap();
    assert_eq!(read.text, "three\n");
    assert!(read.snapshot.reported);
}

#[tokio::test]
async fn peeks_pass_the_owner_fence() {
    let fx = fixture();
    let alice = fx.agents.create("alice", "alice").unwrap();
    let bob = fx.agents.create("bob", "bob").unwrap();
    let task = ScriptedTask::new(true);
    let id = fx.registry.start(spec(&alice, &task)).await.unwrap();
    task.push_output("secret\n");
    let refused = fx.registry.peek(&id, Some(&bob), 0).await.unwrap_err();
    assert!(matches!(refused, TaskError::ForeignTask(_)), "{refused}");
    assert_eq!(fx.registry.read(&id, Some(&alice)).await.unwrap().text, "secret\n", "bob's try pulled nothing");
    task.settle(TaskOutcome::completed(None));
}

#[tokio::test]
async fn final_output_kinds_show_their_output_once_settled() {
    let fx = fixture();
    let owner = fx.agents.create("alice", "alice").unwrap();
    let task = ScriptedTask::new(false);
    let id = fx.registry.start(spec(&owner, &task)).await.unwrap();
    assert_eq!(fx.registry.peek(&id, Some(&owner), 0).await.unwrap().text, "");
    let mut events = fx.registry.subscribe();
    task.settle(TaskOutcome::completed(None).with_output("the answer"));
    loop {
        if let TaskEvent::Settled { task } = events.recv().await.unwrap()
            && task.id == id
        {
            break;
        }
    }
    let peek = fx.registry.peek(&id, Some(&owner), 0).await.unwrap();
    assert_eq!((peek.text.as_str(), peek.end), ("the answer", 10));
    assert_eq!(fx.registry.read(&id, Some(&owner)).await.unwrap().text, "the answer");
}
