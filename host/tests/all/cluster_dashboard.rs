//! The dashboard of any node shows, reads and stops the tasks every node
//! runs, for the token that may see them, and nothing more: through the
//! dashboard's JSON API and its event stream, on a real 3-node NATS
//! cluster with two taskhost nodes.

use serde_json::{Value, json};

use crate::cluster::{ALICE, id_of, serve_node_at};
use crate::cluster_serving::{BOB, with_bob};
use crate::common::{self, call, temp_dir, texts};
use crate::nats::NatsCluster;

/// A dashboard API answer: status and JSON.
async fn api(request: reqwest::RequestBuilder, token: &str) -> (u16, Value) {
    let response = request.bearer_auth(token).send().await.expect("a dashboard request");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
}

/// The first event of the dashboard's event stream (its snapshot).
async fn first_snapshot(url: &str, token: &str) -> Value {
    let mut response = reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .header("Accept", "text/event-stream")
        .send()
        .await
        .expect("the event stream");
    assert_eq!(response.status().as_u16(), 200);
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(20), response.chunk())
            .await
            .expect("an event within 20 s")
            .unwrap()
            .expect("the stream goes on");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let event = text.split("\n\n").next().unwrap();
    assert!(event.starts_with("event: snapshot"), "{event}");
    let data: String = event.lines().filter_map(|line| line.strip_prefix("data: ")).collect();
    serde_json::from_str(&data).unwrap()
}

fn ids(listing: &Value) -> Vec<(String, String)> {
    listing["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("no tasks in {listing}"))
        .iter()
        .map(|task| (task["id"].as_str().unwrap().to_string(), task["node"].as_str().unwrap_or("").to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_nodes_dashboard_shows_reads_and_stops_a_task_another_node_runs() {
    let cluster = NatsCluster::start("dashboard").await;
    let extra = with_bob();
    let (a_url, mut a_child) = serve_node_at(&cluster, "a", &temp_dir("cluster-dashboard-a"), &extra).await;
    let (b_url, mut b_child) = serve_node_at(&cluster, "b", &temp_dir("cluster-dashboard-b"), &extra).await;
    let a = common::connect_http(&a_url, ALICE).await;
    let started = call(a.peer(), "bash", json!({"command": "echo from-node-a; sleep 600", "run_in_background": true}));
    let id = id_of(&started.await);
    common::read_until(a.peer(), &id, "from-node-a", std::time::Duration::from_secs(20)).await;
    let b_api = format!("{}/dashboard/api", b_url.trim_end_matches("/mcp"));
    let http = reqwest::Client::new();

    // Listed on b, with the node that runs it; not for bob.
    let (status, listing) = api(http.get(format!("{b_api}/tasks")), ALICE).await;
    assert_eq!(status, 200);
    assert!(ids(&listing).contains(&(id.clone(), "a".to_string())), "{listing}");
    let (_, bobs) = api(http.get(format!("{b_api}/tasks")), BOB).await;
    assert!(!ids(&bobs).iter().any(|(task, _)| *task == id), "bob sees alice's task: {bobs}");
    let snapshot = first_snapshot(&format!("{b_api}/events"), ALICE).await;
    assert!(ids(&snapshot).contains(&(id.clone(), "a".to_string())), "{snapshot}");

    // Read on b, as a does (never consumed: the owner's read still gets it).
    let (status, output) = api(http.get(format!("{b_api}/tasks/{id}/output")), ALICE).await;
    assert_eq!(status, 200, "{output}");
    assert!(output["text"].as_str().unwrap().contains("from-node-a"), "{output}");
    let (status, refused) = api(http.get(format!("{b_api}/tasks/{id}/output")), BOB).await;
    assert_eq!(status, 404, "{refused}");
    let (status, refused) = api(http.post(format!("{b_api}/tasks/{id}/kill")), BOB).await;
    assert_eq!(status, 404, "bob cannot stop it: {refused}");

    // Stopped from b: a settles it, and alice is told on a that the dashboard did it.
    let (status, killed) = api(http.post(format!("{b_api}/tasks/{id}/kill")), ALICE).await;
    assert_eq!(status, 200, "{killed}");
    let listed = texts(&call(a.peer(), "task_wait", json!({"task_ids": [id], "timeout_ms": 20000})).await).join("\n");
    assert!(listed.contains("killed"), "{listed}");
    let (_, after) = api(http.get(format!("{b_api}/tasks")), ALICE).await;
    let task = after["tasks"].as_array().unwrap().iter().find(|task| task["id"] == id.as_str()).cloned();
    assert_eq!(task.as_ref().map(|task| task["status"].clone()), Some(json!("killed")), "{after}");
    common::stop_with_sigterm(&mut a_child).await;
    common::stop_with_sigterm(&mut b_child).await;
}
