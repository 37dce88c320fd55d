//! `taskhost serve --cluster` against a real 3-node NATS JetStream cluster
//! on loopback (`nats.rs`): the harness itself, joining, and the cluster
//! store's records (ids, settlement races, a NATS node's death).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use async_nats::jetstream;
use serde_json::json;
use taskhost::cluster::store::ClusterStore;

use crate::common::{self, Client, call, only_text, serve_command, temp_dir, texts};
use crate::nats::NatsCluster;

/// The stream leader of `stream`, as the cluster reports it. A "not
/// available yet" answer (a node just restarted) is asked again after the
/// next line a node logs.
async fn stream_leader(cluster: &NatsCluster, js: &jetstream::Context, stream: &str) -> String {
    for _ in 0..100 {
        match js.get_stream(stream).await {
            Ok(found) => {
                let info = found.cached_info().clone();
                if let Some(leader) = info.cluster.and_then(|cluster| cluster.leader) {
                    return leader;
                }
            }
            Err(error) => eprintln!("stream info of {stream}: {error}"),
        }
        cluster.wait_for_any_line(std::time::Duration::from_millis(250));
    }
    panic!("the stream {stream} has no leader");
}

/// Writes `value` at `revision`, trying again while the cluster has no
/// stream leader to answer (an ack timeout, "no stream found" while one is
/// elected), each try after the next line a node logs, until it is
/// applied: a try that timed out but was applied shows as a wrong-revision
/// refusal with `value` stored. Returns the revision of the write.
async fn update_applied(
    cluster: &NatsCluster,
    bucket: &jetstream::kv::Store,
    key: &str,
    value: &'static str,
    revision: u64,
) -> u64 {
    let mut last = String::new();
    for _ in 0..40 {
        match bucket.update(key, value.into(), revision).await {
            Ok(written) => return written,
            Err(error) if error.kind() == jetstream::kv::UpdateErrorKind::WrongLastRevision => {
                let entry = bucket.entry(key).await.unwrap().expect("the key is there");
                assert_eq!(&entry.value[..], value.as_bytes(), "another writer won: {error}");
                return entry.revision;
            }
            Err(error) => last = error.to_string(),
        }
        cluster.wait_for_any_line(std::time::Duration::from_millis(250));
    }
    panic!("writing {key} failed 40 times: {last}");
}

/// The harness: a replicated bucket keeps answering, reads and writes,
/// with its stream leader SIGKILLed, and with the next leader SIGSTOPped;
/// a restarted node rejoins. Each write waits for the survivors to log the
/// new leader's election, not for a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_node_cluster_survives_the_loss_of_one_node() {
    let mut cluster = NatsCluster::start("harness").await;
    let client = cluster.client().await;
    assert!(client.server_info().auth_required, "the test cluster must not take anonymous clients");
    let js = jetstream::new(client);
    let bucket = taskhost::cluster::store::create_bucket(&js, "harness", 3).await.unwrap();
    let first = bucket.create("k", "1".into()).await.unwrap();
    let elected = "JetStream cluster new stream leader for '$G > KV_harness'";

    let leader = cluster.index_of(&stream_leader(&cluster, &js, "KV_harness").await);
    let seen = cluster.log_lens();
    cluster.kill(leader);
    // The survivor elected logs it.
    cluster.wait_for_line_on_any(&seen, elected);
    let second = update_applied(&cluster, &bucket, "k", "2", first).await;
    assert!(second > first);
    assert_eq!(bucket.get("k").await.unwrap().as_deref(), Some(&b"2"[..]));

    cluster.restart(leader).await;
    let leader = cluster.index_of(&stream_leader(&cluster, &js, "KV_harness").await);
    let seen = cluster.log_lens();
    // A client of a paused server hears nothing until its pings time out:
    // this one is connected to a node that stays up.
    let bucket = jetstream::new(cluster.client_to((leader + 1) % 3).await).get_key_value("harness").await.unwrap();
    cluster.pause(leader);
    let elected_now = cluster.wait_for_line_on_any(&seen, elected);
    assert_ne!(elected_now, leader, "a paused node logs nothing");
    let third = update_applied(&cluster, &bucket, "k", "3", second).await;
    assert!(third > second);
    // A stale revision loses: the compare-and-set the cluster store relies on.
    assert!(bucket.update("k", "stale".into(), second).await.is_err());
    cluster.resume(leader);
    // The resumed node rejoins and may take the leadership back: a read in
    // between may be told "temporarily unavailable" (503), and is asked
    // again once a server logged something.
    let mut last = String::new();
    for _ in 0..40 {
        match bucket.get("k").await {
            Ok(value) => {
                assert_eq!(value.as_deref(), Some(&b"3"[..]));
                return;
            }
            Err(error) => last = error.to_string(),
        }
        cluster.wait_for_any_line(std::time::Duration::from_millis(250));
    }
    panic!("reading k failed 40 times: {last}");
}

pub(crate) const ALICE: &str = "alice-secret-0123456789abcdef";

/// The configuration of taskhost node `node` on `cluster` (its URLs come
/// from `--cluster`): alice's token, the cluster's user and password file.
pub(crate) fn node_config(cluster: &NatsCluster, node: &str, extra: &str) -> String {
    format!(
        "[[serve.http.tokens]]\nname = \"alice\"\ntoken = \"{ALICE}\"\n\n\
         [cluster]\nname = \"t\"\nnode = \"{node}\"\nuser = \"{}\"\npassword_file = {:?}\n{extra}",
        crate::nats::USER,
        cluster.password_file,
    )
}

/// `taskhost serve --http --cluster URLS` as node `node` in a directory of
/// its own, and alice's client.
async fn serve_node(cluster: &NatsCluster, node: &str) -> (Client, tokio::process::Child, PathBuf) {
    serve_node_in(cluster, node, temp_dir(&format!("cluster-{node}"))).await
}

/// As [`serve_node`], in `dir` (a restarted node keeps its directory and
/// state).
pub(crate) async fn serve_node_in(
    cluster: &NatsCluster,
    node: &str,
    dir: PathBuf,
) -> (Client, tokio::process::Child, PathBuf) {
    serve_node_with(cluster, node, dir, "").await
}

/// As [`serve_node_in`], with `extra` keys in `[cluster]`.
pub(crate) async fn serve_node_with(
    cluster: &NatsCluster,
    node: &str,
    dir: PathBuf,
    extra: &str,
) -> (Client, tokio::process::Child, PathBuf) {
    let (url, child) = serve_node_at(cluster, node, &dir, extra).await;
    (common::connect_http(&url, ALICE).await, child, dir)
}

/// Starts node `node` in `dir` with `extra` keys in `[cluster]`; its MCP URL.
pub(crate) async fn serve_node_at(
    cluster: &NatsCluster,
    node: &str,
    dir: &std::path::Path,
    extra: &str,
) -> (String, tokio::process::Child) {
    let mut command = serve_command(dir, Some(&node_config(cluster, node, extra)));
    command.args(["--http", "127.0.0.1:0", "--cluster", &cluster.url_list()]);
    let (child, url) = common::spawn_http_server(command, Some(dir.join("stderr.log"))).await;
    (url, child)
}

/// The task record `id` as the cluster's bucket holds it.
pub(crate) async fn record(js: &jetstream::Context, id: &str) -> serde_json::Value {
    let bucket = js.get_key_value("taskhost-t").await.unwrap();
    let value = bucket.get(format!("task.{id}")).await.unwrap().unwrap_or_else(|| panic!("no record of {id}"));
    serde_json::from_slice(&value).unwrap()
}

/// The id in "started background bash task bash-N" (the first block: an
/// earlier task's completion notice may follow it).
pub(crate) fn id_of(result: &rmcp::model::CallToolResult) -> String {
    let text = texts(result).into_iter().next().expect("a result");
    text.strip_prefix("started background bash task ").unwrap_or_else(|| panic!("not a start: {text}")).to_string()
}

/// Two `taskhost serve --cluster` nodes starting tasks at the same time
/// never issue the same id: 2 × 8 concurrent starts (under the per-agent
/// cap of 10 live tasks) get 16 distinct ids from the two nodes' blocks,
/// and each record names the node that took the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_starting_tasks_together_never_issue_the_same_id() {
    let cluster = NatsCluster::start("ids").await;
    let (a, mut a_child, _) = serve_node(&cluster, "a").await;
    let (b, mut b_child, _) = serve_node(&cluster, "b").await;
    let starts = |client: &Client| {
        let peer = client.peer().clone();
        (0..8).map(move |_| {
            let peer = peer.clone();
            async move { id_of(&call(&peer, "bash", json!({"command": "true", "run_in_background": true})).await) }
        })
    };
    let (from_a, from_b) = tokio::join!(futures::future::join_all(starts(&a)), futures::future::join_all(starts(&b)));
    let mut numbers: Vec<u64> = from_a
        .iter()
        .chain(&from_b)
        .map(|id| id.strip_prefix("bash-").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{id}")))
        .collect();
    numbers.sort_unstable();
    numbers.dedup();
    // Each node issues from a block of 16 it took from the shared counter.
    assert_eq!(numbers.len(), 16, "a: {from_a:?}, b: {from_b:?}");
    assert!(numbers.iter().all(|n| (1..=32).contains(n)), "a: {from_a:?}, b: {from_b:?}");
    let js = jetstream::new(cluster.client().await);
    for (ids, node) in [(&from_a, "a"), (&from_b, "b")] {
        for id in ids {
            let record = record(&js, id).await;
            assert_eq!(record["node"], node, "{id}: {record}");
            assert_eq!(record["kind"], "bash");
            assert!(record["producer_info"].as_str().is_some_and(|info| !info.is_empty()), "{record}");
        }
    }
    common::stop_with_sigterm(&mut a_child).await;
    common::stop_with_sigterm(&mut b_child).await;
}

/// A settlement race between a task's node and another node settling it
/// for a gone node (the sweep's compare-and-set) has exactly one winner per
/// task, and the record holds the winner's end; a node's own store never
/// changes another node's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_race_between_two_nodes_has_exactly_one_winner() {
    use taskhost::ids::TaskId;
    use taskhost::tasks::TaskStatus;
    use taskhost::tasks::store::{ReportState, StoredEnd, StoredTask, TaskStore};

    let cluster = NatsCluster::start("settle").await;
    let open = |node: &'static str| {
        let urls = cluster.urls();
        let password = cluster.password.clone();
        let connect = move || async move {
            Ok(async_nats::ConnectOptions::with_user_and_password(crate::nats::USER.into(), password)
                .connect(urls)
                .await?)
        };
        async move { Arc::new(ClusterStore::open(connect, "taskhost-race", node).await.unwrap()) }
    };
    let a = open("a").await;
    let b = open("b").await;
    // The first 40 are all started before the races. Each of the last 40
    // takes its id as a node does (from a block of 16) and is started just
    // before its race, so a's settlement is decided on the start it wrote
    // last (one round trip) while b reads afresh.
    let start = |id: &TaskId| {
        let task = StoredTask::new(id.clone(), "bash", "race", SystemTime::now());
        let a = a.clone();
        tokio::task::spawn_blocking(move || a.record_start(&task))
    };
    let mut ids: Vec<TaskId> = (1..=40).map(|n| TaskId::new(format!("bash-{n}"))).collect();
    for id in &ids {
        start(id).await.unwrap().unwrap();
    }
    let settle = |store: Arc<ClusterStore>, id: TaskId, status: TaskStatus| {
        tokio::task::spawn_blocking(move || {
            store.settle(&id, &StoredEnd::new(status, None, SystemTime::now(), ReportState::Untold)).unwrap()
        })
    };
    // b settles a's record as a sweep does: only while it is a's and live.
    let sweep = |id: TaskId| {
        let bucket = b.bucket().clone();
        b.client_runtime().spawn(async move {
            taskhost::cluster::store::transition(&bucket, &id, "sweeping", "a", |record| {
                let live = record.status == "running";
                if live {
                    record.status = "lost".into();
                    record.node = "b".into();
                }
                live
            })
            .await
            .unwrap()
        })
    };
    let js = jetstream::new(cluster.client().await);
    let bucket = js.get_key_value("taskhost-race").await.unwrap();
    let mut wins = [0, 0];
    for n in 0..80 {
        if n >= 40 {
            let issuer = a.clone();
            let number = tokio::task::spawn_blocking(move || issuer.issue_number("bash", 0)).await.unwrap().unwrap();
            ids.push(TaskId::new(format!("bash-{number}")));
            start(&ids[n]).await.unwrap().unwrap();
        }
        let id = &ids[n];
        // Every other one of those, b sweeps first: a's settlement is then
        // decided on a start that is no longer the record's latest.
        let (by_a, by_b) = if n >= 40 && n % 2 == 1 {
            let by_b = sweep(id.clone()).await.unwrap();
            (settle(a.clone(), id.clone(), TaskStatus::Completed).await.unwrap(), by_b)
        } else {
            let by_a = settle(a.clone(), id.clone(), TaskStatus::Completed);
            let by_b = sweep(id.clone());
            (by_a.await.unwrap(), by_b.await.unwrap())
        };
        assert!(by_a != by_b, "{id}: a won {by_a}, b won {by_b}");
        wins[usize::from(by_b)] += 1;
        let stored: serde_json::Value =
            serde_json::from_slice(&bucket.get(format!("task.{id}")).await.unwrap().unwrap()).unwrap();
        let expected = if by_a { ("completed", "a") } else { ("lost", "b") };
        assert_eq!((stored["status"].as_str().unwrap(), stored["node"].as_str().unwrap()), expected, "{id}: {stored}");
    }
    // A later settlement changes nothing; b's own store never settles a's record.
    let late = settle(a.clone(), ids[0].clone(), TaskStatus::Failed).await.unwrap();
    assert!(!late);
    let b_on_a = TaskId::new("bash-81");
    let task = StoredTask::new(b_on_a.clone(), "bash", "a's", SystemTime::now());
    let a_start = a.clone();
    tokio::task::spawn_blocking(move || a_start.record_start(&task)).await.unwrap().unwrap();
    assert!(!settle(b.clone(), b_on_a, TaskStatus::Lost).await.unwrap(), "b changed a's record");
    // a's store loads the records still a's; b's loads the ones b settled.
    let (a_loaded, b_loaded) = (a.clone(), b.clone());
    let a_loaded = tokio::task::spawn_blocking(move || a_loaded.load()).await.unwrap().unwrap();
    let b_loaded = tokio::task::spawn_blocking(move || b_loaded.load()).await.unwrap().unwrap();
    assert_eq!(a_loaded.tasks.len(), 81 - wins[1], "wins {wins:?}");
    assert_eq!(b_loaded.tasks.len(), wins[1]);
    // 40 raised one by one, then three blocks of 16 issued.
    assert_eq!(a_loaded.counters, [("bash".to_string(), 88)]);
}

/// SIGKILL of the NATS node leading the registry's stream changes nothing
/// a client sees: starts, listings and kills go on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_nats_node_changes_nothing_a_client_sees() {
    let mut cluster = NatsCluster::start("kill-one").await;
    let (client, mut child, _) = serve_node(&cluster, "a").await;
    let peer = client.peer().clone();
    let first = call(&peer, "bash", json!({"command": "sleep 600", "run_in_background": true})).await;
    assert_eq!(only_text(&first), "started background bash task bash-1");

    let js = jetstream::new(cluster.client().await);
    let leader = cluster.index_of(&stream_leader(&cluster, &js, "KV_taskhost-t").await);
    cluster.kill(leader);
    let second = call(&peer, "bash", json!({"command": "sleep 600", "run_in_background": true})).await;
    assert_eq!(only_text(&second), "started background bash task bash-2");
    let listed = texts(&call(&peer, "task_list", json!({})).await);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        crate::common::without_time_left(&listed[0]),
        "bash-1 [bash] running — sleep 600\nbash-2 [bash] running — sleep 600"
    );
    let killed = call(&peer, "task_kill", json!({"task_id": "bash-1"})).await;
    assert_eq!(texts(&killed), ["requested cancellation of task bash-1"]);
    cluster.restart(leader).await;
    // bash-1's end notice rides on this result when the kill has settled by then.
    let third = texts(&call(&peer, "bash", json!({"command": "true", "run_in_background": true})).await);
    assert_eq!(third[0], "started background bash task bash-3");
    assert!(third[1..].iter().all(|notice| notice.contains("bash-1")), "{third:?}");
    assert!(third.len() <= 2, "{third:?}");
    common::stop_with_sigterm(&mut child).await;
}

/// A node SIGKILLed and started again loads the records naming it from the
/// cluster: its stable owner's running command is re-adopted under the
/// same id, and ids go on from the cluster's counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_takes_its_records_back_from_the_cluster() {
    let cluster = NatsCluster::start("restart").await;
    let (client, child, dir) = serve_node(&cluster, "a").await;
    let started = call(client.peer(), "bash", json!({"command": "sleep 600", "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    crate::durable::sigkill(child, client).await;

    let (client, mut child, _) = serve_node_in(&cluster, "a", dir).await;
    let peer = client.peer().clone();
    let listed = texts(&call(&peer, "task_list", json!({})).await);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(crate::common::without_time_left(&listed[0]), "bash-1 [bash] running — sleep 600");
    // The numbers left in the block the node took before its crash are skipped.
    let next = call(&peer, "bash", json!({"command": "true", "run_in_background": true})).await;
    assert_eq!(id_of(&next), "bash-17");
    // bash-2's end notice may ride on this result.
    let killed = call(&peer, "task_kill", json!({"task_id": "bash-1"})).await;
    assert_eq!(texts(&killed)[0], "requested cancellation of task bash-1");
    common::stop_with_sigterm(&mut child).await;
}

/// A node refuses to join a NATS server that takes anonymous clients, with
/// the fix; `insecure = true` joins it, with a warning.
#[tokio::test]
async fn a_node_refuses_an_anonymous_server_unless_insecure() {
    let cluster = NatsCluster::start_anonymous("anonymous").await;
    let dir = temp_dir("cluster-anonymous");
    let output = serve_command(&dir, None)
        .args(["--http", "127.0.0.1:0", "--cluster", &cluster.url_list()])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("accepts anonymous clients") && stderr.contains("insecure = true"), "{stderr}");

    let config = format!(
        "[[serve.http.tokens]]\nname = \"alice\"\ntoken = \"{ALICE}\"\n\n[cluster]\nnats = [{:?}]\ninsecure = true\n",
        cluster.urls()[0]
    );
    let mut command = serve_command(&dir, Some(&config));
    command.args(["--http", "127.0.0.1:0"]);
    let (mut child, url) = common::spawn_http_server(command, Some(dir.join("stderr.log"))).await;
    let client = common::connect_http(&url, ALICE).await;
    let started = call(client.peer(), "bash", json!({"command": "true", "run_in_background": true})).await;
    assert_eq!(only_text(&started), "started background bash task bash-1");
    common::stop_with_sigterm(&mut child).await;
    let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap();
    assert!(log.contains("accepts anonymous clients ([cluster] insecure = true)"), "{log}");
}

/// The sandbox keeps NATS from commands of a server run as `uid` (this
/// user when `None`): the password file, even in the served workspace,
/// cannot be read by a tree; the password is in no task's environment; the
/// NATS port cannot be reached (no network by default).
async fn commands_cannot_reach_the_cluster(tag: &str, uid: Option<u32>) {
    use std::os::unix::fs::PermissionsExt as _;
    let cluster = NatsCluster::start(tag).await;
    let base = temp_dir(tag);
    let workspace = base.join("work");
    let home = base.join("home");
    let state_home = base.join("state");
    for dir in [&workspace, &home, &state_home] {
        std::fs::create_dir_all(dir).unwrap();
    }
    // The hardest place: inside the working directory every tree sees.
    let password_file = workspace.join("nats-password");
    std::fs::copy(&cluster.password_file, &password_file).unwrap();
    std::fs::set_permissions(&password_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Outside the workspace: no trust record needed.
    let config_file = base.join("taskhost.toml");
    let config =
        node_config(&cluster, "a", "").replace(&format!("{:?}", cluster.password_file), &format!("{password_file:?}"));
    std::fs::write(&config_file, config).unwrap();
    if let Some(uid) = uid {
        for path in [&base, &workspace, &home, &state_home, &password_file, &config_file] {
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
        }
    }
    let mut server = common::serve_stdio_as(uid, &base, &workspace, &home);
    server
        .env("XDG_STATE_HOME", &state_home)
        .arg("--config")
        .arg(&config_file)
        .args(["--cluster", &cluster.url_list()]);
    let (client, mut child) = common::connect_stdio(&mut server).await;
    let port = cluster.nodes[0].port;
    let script = format!(
        "echo READ-BYTES=$(cat nats-password 2>/dev/null | wc -c); \
         echo ENV-MATCHES=$(env | grep -c -F {password}); \
         (echo > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo NATS-REACHED || echo NATS-UNREACHABLE",
        password = cluster.password,
    );
    let id = id_of(&call(client.peer(), "bash", json!({"command": script, "run_in_background": true})).await);
    let output =
        texts(&call(client.peer(), "task_output", json!({"task_id": id, "wait": true, "timeout_ms": 30_000})).await)
            .join("\n");
    // Denied or shown empty: no byte of it.
    assert!(output.contains("READ-BYTES=0\n"), "{output}");
    assert!(output.contains("ENV-MATCHES=0\n"), "{output}");
    assert!(!output.contains(&cluster.password), "the password reached a command: {output}");
    assert!(output.contains("NATS-UNREACHABLE"), "{output}");
    // The server did join the cluster: the record is in the bucket.
    let js = jetstream::new(cluster.client().await);
    assert_eq!(record(&js, &id).await["node"], "a");
    drop(client);
    let _ = child.start_kill();
    let _ = child.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_cannot_reach_the_cluster_or_its_secrets() {
    commands_cannot_reach_the_cluster("cluster-secrets", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_of_an_unprivileged_node_cannot_reach_the_cluster_or_its_secrets() {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0
        && common::gap_accepted("root", "switching to another uid needs root", "run the tests as root (CI does)")
    {
        return;
    }
    commands_cannot_reach_the_cluster("cluster-secrets-nobody", Some(65534)).await;
}
