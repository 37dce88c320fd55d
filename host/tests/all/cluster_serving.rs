//! Any node serves any owner, through three real `taskhost serve --cluster`
//! nodes on a real 3-node NATS JetStream cluster: a task started on node a
//! is read, viewed, given input, waited for and killed from node b, and
//! listed by its owner from node c; another owner is fenced off on every
//! node.

use std::time::Duration;

use serde_json::json;

use crate::cluster::{ALICE, id_of, serve_node_at};
use crate::common::{self, call, only_text, temp_dir, texts};
use crate::nats::NatsCluster;

const BOB: &str = "bob-secret-0123456789abcdef0123";

/// Both tokens, then `[cluster]` (written after the tokens table).
fn with_bob() -> String {
    format!("\n[[serve.http.tokens]]\nname = \"bob\"\ntoken = \"{BOB}\"\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_on_one_node_is_served_from_the_others() {
    let cluster = NatsCluster::start("serving").await;
    let extra = with_bob();
    let (a_url, mut a_child) = serve_node_at(&cluster, "a", &temp_dir("cluster-serving-a"), &extra).await;
    let (b_url, mut b_child) = serve_node_at(&cluster, "b", &temp_dir("cluster-serving-b"), &extra).await;
    let (c_url, mut c_child) = serve_node_at(&cluster, "c", &temp_dir("cluster-serving-c"), &extra).await;
    let a = common::connect_http(&a_url, ALICE).await;
    let b = common::connect_http(&b_url, ALICE).await;
    let c = common::connect_http(&c_url, ALICE).await;
    let bob_on_b = common::connect_http(&b_url, BOB).await;

    let command = "echo hello; while read l; do echo \"got $l\"; done; sleep 600";
    let id = id_of(
        &call(a.peer(), "bash", json!({"command": command, "run_in_background": true, "interactive": true})).await,
    );

    // Read (consuming) from b.
    let read = common::read_until(b.peer(), &id, "hello", Duration::from_secs(30)).await;
    assert_eq!(read, "hello\n");
    // Input from b, the answer read from b.
    let sent = call(b.peer(), "task_input", json!({"task_id": id, "text": "world\n"})).await;
    assert_eq!(only_text(&sent), format!("sent 6 bytes to task {id}"));
    assert_eq!(common::read_until(b.peer(), &id, "got world", Duration::from_secs(30)).await, "got world\n");
    // A view from b: everything kept, nothing consumed.
    let view = texts(&call(b.peer(), "task_output", json!({"task_id": id, "view": "all"})).await).remove(0);
    assert!(view.contains("hello") && view.contains("got world"), "{view}");
    // Listed by its owner from c, with c's own task.
    let on_c = id_of(&call(c.peer(), "bash", json!({"command": "sleep 600", "run_in_background": true})).await);
    let listing = texts(&call(c.peer(), "task_list", json!({})).await).remove(0);
    let listing = common::without_time_left(&listing);
    assert!(listing.contains(&format!("{id} [bash] running — {command}")), "{listing}");
    assert!(listing.contains(&format!("{on_c} [bash] running — sleep 600")), "{listing}");

    // Bob is fenced off on b as he would be on a, and lists nothing of alice's.
    let refused = call(bob_on_b.peer(), "task_output", json!({"task_id": id})).await;
    assert!(texts(&refused)[0].contains("belongs to another session"), "{:?}", texts(&refused));
    let refused = call(bob_on_b.peer(), "task_kill", json!({"task_id": id})).await;
    assert!(texts(&refused)[0].contains("belongs to another session"), "{:?}", texts(&refused));
    let bobs = texts(&call(bob_on_b.peer(), "task_list", json!({})).await).remove(0);
    assert_eq!(bobs, "(no background tasks)");

    // Waited for from b (still running), then killed from b and waited for to its end.
    let waited = texts(&call(b.peer(), "task_wait", json!({"task_ids": [id], "timeout_ms": 100})).await).remove(0);
    assert!(waited.contains("running"), "{waited}");
    let killed = call(b.peer(), "task_kill", json!({"task_id": id})).await;
    assert_eq!(texts(&killed)[0], format!("requested cancellation of task {id}"));
    let ended = texts(&call(b.peer(), "task_wait", json!({"task_ids": [id], "timeout_ms": 30_000})).await).remove(0);
    assert!(ended.contains("killed"), "{ended}");
    let record = crate::cluster::record(&async_nats::jetstream::new(cluster.client().await), &id).await;
    assert_eq!((record["status"].as_str(), record["node"].as_str()), (Some("killed"), Some("a")), "{record}");

    for child in [&mut a_child, &mut b_child, &mut c_child] {
        common::stop_with_sigterm(child).await;
    }
}
