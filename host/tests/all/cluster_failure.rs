//! Nodes that fail alone, against a real 3-node NATS JetStream cluster and
//! real `taskhost serve --cluster` nodes: a node SIGKILLed or SIGSTOPped
//! past `node_timeout_ms` has its live tasks settled lost by a survivor,
//! told once, and its process trees killed when it returns; it never
//! reports them running again, and no command runs twice. Two live
//! servers never share a node name.

use std::path::Path;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt as _;
use serde_json::{Value, json};

use crate::cluster::{id_of, serve_node_with};
use crate::common::{self, call, temp_dir, texts};
use crate::nats::NatsCluster;

/// A short timeout (the least is 1 s; this one leaves a loaded 2-core
/// machine room for a beat): a node is declared gone about 2 s after its
/// last beat.
const QUICK: &str = "node_timeout_ms = 2000\n";

/// The record of `id` once it is no longer live, watched on its key (the
/// first value is the current one).
async fn settled_record(js: &jetstream::Context, id: &str) -> Value {
    let bucket = js.get_key_value("taskhost-t").await.unwrap();
    let mut updates = bucket.watch_with_history(format!("task.{id}")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(entry) = updates.next().await {
            let record: Value = serde_json::from_slice(&entry.unwrap().value).unwrap();
            if !matches!(record["status"].as_str(), Some("running" | "stopping")) {
                return record;
            }
        }
        panic!("the watch of {id} ended");
    })
    .await
    .unwrap_or_else(|_| panic!("{id} was not settled within 60 s"))
}

/// The pid of the keeper of `id`'s durable tree, from its record.
async fn keeper_pid(js: &jetstream::Context, id: &str) -> i32 {
    let record = crate::cluster::record(js, id).await;
    let tree: Value =
        serde_json::from_str(record["tree"].as_str().unwrap_or_else(|| panic!("no tree: {record}"))).unwrap();
    tree["record"]["keeper_pid"].as_i64().expect("a keeper pid") as i32
}

/// Waits until process `pid` has exited (its pidfd turns readable).
async fn wait_gone(pid: i32, what: &str) {
    let what = what.to_string();
    tokio::task::spawn_blocking(move || {
        // SAFETY: pidfd_open takes a pid and flags; the fd is closed below.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        if fd < 0 {
            return; // gone already
        }
        let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, 60_000) };
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        assert_eq!(ready, 1, "{what} (pid {pid}) still runs 60 s later");
    })
    .await
    .unwrap();
}

/// Waits until the command wrote its marker line (it runs in the node's
/// directory): each change in the directory is a signal.
async fn wait_for_marker(path: &Path) {
    common::until_file(path, Duration::from_secs(30), |text| text.ends_with('\n')).await;
}

/// Whether a listing (or any answer) shows task `id` running.
fn reports_running(text: &str, id: &str) -> bool {
    text.lines().any(|line| line.starts_with(&format!("{id} ")) && line.contains("running"))
}

/// A command that appends to `marker` once per run, then runs long.
fn marked_command() -> Value {
    json!({"command": "echo run >> marker; exec sleep 600", "run_in_background": true})
}

/// Waits until node `dir`'s log says it took in the end of `id` (the
/// survivor's registry keeps it from then on).
async fn taken_in(dir: &Path, id: &str) {
    let needle = format!("an end recorded by another node is taken in task={id}");
    common::until_file(&dir.join("stderr.log"), Duration::from_secs(60), move |log| log.contains(&needle)).await;
}

/// SIGKILL of a taskhost node mid-task: a survivor declares it gone and
/// settles its task lost (the record now the survivor's), the owner
/// connected there is told once, the survivor's own task runs on, and the
/// node restarted kills the tree it left: the command ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_tasks_are_settled_lost_once_and_its_trees_killed_when_it_returns() {
    let cluster = NatsCluster::start("gone").await;
    let (a, a_child, a_dir) = serve_node_with(&cluster, "a", temp_dir("cluster-gone-a"), QUICK).await;
    let (b, mut b_child, b_dir) = serve_node_with(&cluster, "b", temp_dir("cluster-gone-b"), QUICK).await;
    let on_a = id_of(&call(a.peer(), "bash", marked_command()).await);
    let on_b = id_of(&call(b.peer(), "bash", json!({"command": "sleep 600", "run_in_background": true})).await);
    // A task of a's that ended before a died.
    let ended = id_of(&call(a.peer(), "bash", json!({"command": "echo early", "run_in_background": true})).await);
    wait_for_marker(&a_dir.join("marker")).await;
    let js = jetstream::new(cluster.client().await);
    assert_eq!(settled_record(&js, &ended).await["status"], "completed");
    let keeper = keeper_pid(&js, &on_a).await;

    crate::durable::sigkill(a_child, a).await;
    let settled = settled_record(&js, &on_a).await;
    assert_eq!(settled["status"], "lost", "{settled}");
    assert_eq!(settled["node"], "b", "the survivor keeps the record: {settled}");
    assert!(settled["detail"].as_str().is_some_and(|d| d.contains("node a was silent")), "{settled}");

    // Alice, connected to b, sees it lost there, told once; the task that
    // had ended on a is b's now too.
    taken_in(&b_dir, &on_a).await;
    taken_in(&b_dir, &ended).await;
    assert_eq!(crate::cluster::record(&js, &ended).await["node"], "b");
    let mut seen = texts(&call(b.peer(), "task_list", json!({})).await);
    let listing = seen[0].clone();
    assert!(listing.contains(&format!("{on_a} [bash] lost")), "{listing}");
    assert!(listing.contains(&format!("{ended} [bash] completed")), "{listing}");
    assert!(listing.contains(&format!("{on_b} [bash] running")), "b's own task runs on: {listing}");
    seen.extend(texts(&call(b.peer(), "task_list", json!({})).await));
    let notices = seen.iter().filter(|text| text.starts_with(&format!("background task {on_a} "))).count();
    assert_eq!(notices, 1, "one notice of {on_a}: {seen:?}");
    // The end of the task that had ended on a, whose notice waited in
    // alice's session on a (put there, never delivered), is told by b once.
    let notices = seen.iter().filter(|text| text.starts_with(&format!("background task {ended} "))).count();
    assert_eq!(notices, 1, "one notice of {ended}: {seen:?}");

    // a returns: the tree it left is killed, never reported running.
    let (a, mut a_child, a_dir) = serve_node_with(&cluster, "a", a_dir, QUICK).await;
    wait_gone(keeper, "the keeper of a's fenced tree").await;
    let listed = texts(&call(a.peer(), "task_list", json!({})).await).join("\n");
    assert!(!reports_running(&listed, &on_a), "{listed}");
    assert!(listed.contains(&format!("{on_a} [bash] lost")), "listed from a, kept by b: {listed}");
    assert!(!listed.contains(&format!("background task {ended} ")), "told again from a: {listed}");
    assert_eq!(std::fs::read_to_string(a_dir.join("marker")).unwrap(), "run\n", "the command ran once");
    let after = settled_record(&js, &on_a).await;
    assert_eq!((after["status"].as_str(), after["node"].as_str()), (Some("lost"), Some("b")), "{after}");
    common::stop_with_sigterm(&mut a_child).await;
    common::stop_with_sigterm(&mut b_child).await;
}

/// A node paused (SIGSTOP) past the timeout, then resumed (SIGCONT): the
/// others settled its task lost meanwhile; the resumed node never reports
/// it running (it answers "retry" while it settles, then lists it lost),
/// kills its tree, and serves again under the same name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_never_reports_a_fenced_task_running() {
    let cluster = NatsCluster::start("paused").await;
    let (a, mut a_child, a_dir) = serve_node_with(&cluster, "a", temp_dir("cluster-paused-a"), QUICK).await;
    let (b, mut b_child, b_dir) = serve_node_with(&cluster, "b", temp_dir("cluster-paused-b"), QUICK).await;
    let on_a = id_of(&call(a.peer(), "bash", marked_command()).await);
    // A task of a's that ended before the pause, its output unread.
    let ended = id_of(&call(a.peer(), "bash", json!({"command": "echo early", "run_in_background": true})).await);
    wait_for_marker(&a_dir.join("marker")).await;
    let js = jetstream::new(cluster.client().await);
    assert_eq!(settled_record(&js, &ended).await["status"], "completed");
    stream_holds(&js, &ended, "early").await;
    let keeper = keeper_pid(&js, &on_a).await;

    let pid = a_child.id().expect("a runs") as i32;
    // SAFETY: signals to a process this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let settled = settled_record(&js, &on_a).await;
    assert_eq!((settled["status"].as_str(), settled["node"].as_str()), (Some("lost"), Some("b")), "{settled}");
    taken_in(&b_dir, &ended).await;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);

    // The first answer after the resume ("retry" while it settles, or the
    // task lost) and every one after it rejoined never say "running".
    let first = texts(&call(a.peer(), "task_list", json!({})).await).join("\n");
    assert!(!reports_running(&first, &on_a), "a resumed node reported a fenced task running: {first}");
    common::until_file(&a_dir.join("stderr.log"), Duration::from_secs(60), |log| {
        log.contains("this node rejoined the cluster")
    })
    .await;
    let listing = texts(&call(a.peer(), "task_list", json!({})).await).join("\n");
    let answers = [first, listing.clone()];
    assert!(!reports_running(&listing, &on_a), "{answers:?}");
    assert!(listing.contains(&format!("{on_a} [bash] lost")), "{answers:?}");
    wait_gone(keeper, "the keeper of the paused node's fenced tree").await;
    assert_eq!(std::fs::read_to_string(a_dir.join("marker")).unwrap(), "run\n", "the command ran once");
    // The ended task is b's alone now: read through a (forwarded to b),
    // then through b, its output comes once; its end is told once.
    let via_a = texts(&call(a.peer(), "task_output", json!({"task_id": ended})).await);
    assert!(via_a[0].contains("early"), "{via_a:?}");
    let via_b = texts(&call(b.peer(), "task_output", json!({"task_id": ended})).await);
    assert!(!via_b[0].contains("early"), "read once, not served by two nodes: {via_b:?}");
    // It serves again: a new start runs on a.
    let started = call(a.peer(), "bash", json!({"command": "true", "run_in_background": true})).await;
    let next = id_of(&started);
    assert_eq!(crate::cluster::record(&js, &next).await["node"], "a");
    let on_b_again = texts(&call(b.peer(), "task_list", json!({})).await);
    let every_answer = [answers.to_vec(), via_a, via_b, texts(&started), on_b_again].concat();
    let notice = format!("background task {ended} ");
    let told: usize = every_answer.iter().map(|text| text.matches(&notice).count()).sum();
    assert_eq!(told, 1, "{every_answer:?}");
    common::stop_with_sigterm(&mut a_child).await;
    common::stop_with_sigterm(&mut b_child).await;
}

/// A second server with a live node's name is refused, naming the holder;
/// the first one serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_name_is_served_by_one_process_at_a_time() {
    let cluster = NatsCluster::start("twice").await;
    let (a, mut a_child, _) = serve_node_with(&cluster, "a", temp_dir("cluster-twice-a"), QUICK).await;
    let dir = temp_dir("cluster-twice-a2");
    let mut command = common::serve_command(&dir, Some(&crate::cluster::node_config(&cluster, "a", QUICK)));
    command.args(["--http", "127.0.0.1:0", "--cluster", &cluster.url_list()]);
    let output =
        tokio::time::timeout(Duration::from_secs(60), command.output()).await.expect("refused in time").unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("the node name \"a\" is in use"), "{stderr}");
    let started = call(a.peer(), "bash", json!({"command": "true", "run_in_background": true})).await;
    assert!(id_of(&started).starts_with("bash-"));
    common::stop_with_sigterm(&mut a_child).await;
}

/// Waits until the cluster's output stream holds a piece of `id`'s output
/// that contains `text` (an ordered consumer on the task's subject: each
/// message is an event).
async fn stream_holds(js: &jetstream::Context, id: &str, text: &str) {
    let stream = js.get_stream("OUTPUT_taskhost-t").await.unwrap();
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: format!("taskhost.t.output.{id}"),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(message) = messages.next().await {
            if String::from_utf8_lossy(&message.unwrap().payload).contains(text) {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the output stream has no piece of {id} with {text:?} within 30 s"));
}

/// A killed node's task keeps its output: the survivor that settles it
/// replays it from the cluster's output stream, so its owner's next read
/// (on any node) goes on exactly where the last one ended, and views show
/// all of it, stderr's label included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_output_is_read_on_where_its_owner_left_off() {
    let cluster = NatsCluster::start("output").await;
    let (a, a_child, a_dir) = serve_node_with(&cluster, "a", temp_dir("cluster-output-a"), QUICK).await;
    let (b, mut b_child, b_dir) = serve_node_with(&cluster, "b", temp_dir("cluster-output-b"), QUICK).await;
    let command = "echo one; echo two; while [ ! -e go ]; do sleep 0.05; done; echo three; echo four >&2; echo run >> marker; exec sleep 600";
    let id = id_of(&call(a.peer(), "bash", json!({"command": command, "run_in_background": true})).await);

    // The owner reads the first lines through b (the read is a's), once
    // they are logged: a piece is copied to the stream after it is logged.
    let js = jetstream::new(cluster.client().await);
    stream_holds(&js, &id, "two").await;
    let read = texts(&call(b.peer(), "task_output", json!({"task_id": id})).await).join("\n");
    assert!(read.contains("one\ntwo"), "{read}");
    std::fs::write(a_dir.join("go"), "").unwrap();
    wait_for_marker(&a_dir.join("marker")).await;
    stream_holds(&js, &id, "four").await;

    crate::durable::sigkill(a_child, a).await;
    taken_in(&b_dir, &id).await;
    let next = texts(&call(b.peer(), "task_output", json!({"task_id": id})).await).join("\n");
    assert!(next.contains("three") && next.contains("four"), "the rest, from the stream: {next}");
    assert!(!next.contains("one") && !next.contains("two"), "read once only: {next}");
    assert!(next.contains("lost"), "{next}");
    let again = texts(&call(b.peer(), "task_output", json!({"task_id": id})).await).join("\n");
    assert!(!again.contains("three") && !again.contains("four"), "nothing new: {again}");
    let view = texts(&call(b.peer(), "task_output", json!({"task_id": id, "view": "all"})).await).remove(0);
    for line in ["one", "two", "three", "[stderr]", "four"] {
        assert!(view.contains(line), "{line} in the view: {view}");
    }
    assert_eq!(std::fs::read_to_string(a_dir.join("marker")).unwrap(), "run\n", "the command ran once");
    common::stop_with_sigterm(&mut b_child).await;
}

/// A node cut off from NATS (every NATS node SIGSTOPped: the sockets stay
/// open and nothing answers) keeps its trees running and answers its
/// owner's reads within seconds (a read records its cursor for at most
/// `READ_RECORD_WITHIN`), refuses a start with "cluster unavailable, retry"
/// (that command never runs), and once NATS answers again the owner reads
/// every line once, in order, the ones printed during the outage too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_nats_refuses_starts_clearly_and_loses_no_line() {
    const LINES: u64 = 400;
    let cluster = NatsCluster::start("cut-off").await;
    let (client, mut child, dir) = serve_node_with(&cluster, "a", temp_dir("cluster-cut-off-a"), "").await;
    let command = format!("for i in $(seq 1 {LINES}); do echo \"$i;\"; sleep 0.05; done");
    let id = id_of(&call(client.peer(), "bash", json!({"command": command, "run_in_background": true})).await);
    let mut lines = common::NumberedLines::new();
    let read = async |lines: &mut common::NumberedLines, context: &str| -> Option<String> {
        let answer = texts(&call(client.peer(), "task_output", json!({"task_id": id})).await).remove(0);
        if answer.starts_with("cluster unavailable, retry") {
            return None; // nothing was consumed
        }
        let (body, status) = answer.rsplit_once('\n').unwrap_or(("", &answer));
        if body != "(no new output)" {
            lines.take(&format!("{body}\n"), |n| n.to_string(), context);
        }
        Some(status.to_string())
    };
    while lines.next < 5 {
        read(&mut lines, "before the outage").await;
    }

    for node in 0..3 {
        cluster.pause(node);
    }
    let asked = std::time::Instant::now();
    let during = read(&mut lines, "during the outage").await;
    let read_took = asked.elapsed();
    assert!(read_took < Duration::from_secs(15), "a read during the outage took {read_took:?} ({during:?})");
    let asked = std::time::Instant::now();
    let refused = call(
        client.peer(),
        "bash",
        json!({"command": "echo run >> refused-marker; exec sleep 600", "run_in_background": true}),
    )
    .await;
    let start_took = asked.elapsed();
    assert!(common::is_error(&refused), "a start during the outage: {:?}", texts(&refused));
    assert!(texts(&refused)[0].contains("cluster unavailable, retry"), "{:?}", texts(&refused));
    assert!(start_took < Duration::from_secs(30), "the refusal took {start_took:?}");
    for node in 0..3 {
        cluster.resume(node);
    }

    loop {
        match read(&mut lines, "after the outage").await {
            Some(status) if status.starts_with("[status: completed") => break,
            Some(status) => assert_eq!(status, "[status: running]"),
            None => {}
        }
    }
    assert_eq!(lines.next, LINES + 1, "every line once");
    assert!(!dir.join("refused-marker").exists(), "the refused start ran");
    common::stop_with_sigterm(&mut child).await;
}
