//! The launch fence through `taskhost serve --owner`, real SQLite and real
//! processes: a start the store cannot record is refused and its command
//! stopped; a server killed after a command's launch but before its record
//! leaves no command running (the next server kills it), and nobody is
//! ever shown an id for it. The store is held unwritable by holding its
//! write lock from the test (SQLite's own locking: the server's write
//! waits its busy timeout, 5 s, then fails). Every wait ends on an event: a
//! FIFO the command holds open for writing opens when it launched and reads
//! its end of file when it died.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::common::{self, call, only_text, temp_dir, texts};
use crate::durable::{serve, sigkill, store_file};

fn fifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo has no other precondition.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{}", std::io::Error::last_os_error());
}

/// A command that holds `fifo` open for writing for ten minutes: the
/// reader's open returns once it launched, its read ends when it died.
fn holding(fifo: &Path) -> String {
    format!("exec sleep 600 > {}", fifo.display())
}

/// Opens `fifo` for reading: returns once the command opened it (launched).
async fn launched(fifo: PathBuf) -> std::fs::File {
    let opening = tokio::task::spawn_blocking({
        let fifo = fifo.clone();
        move || std::fs::File::open(fifo)
    });
    match tokio::time::timeout(Duration::from_secs(30), opening).await {
        Ok(opened) => opened.unwrap().unwrap(),
        Err(_) => {
            // Unblock the open (so the test fails instead of hanging).
            use std::os::unix::fs::OpenOptionsExt as _;
            let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo);
            panic!("the command never launched");
        }
    }
}

/// Waits (at most 30 s) until the FIFO's every writer (the command) is gone.
async fn died(reader: std::fs::File, what: &str) {
    use std::os::fd::AsRawFd as _;
    let hung_up = tokio::task::spawn_blocking(move || {
        let mut poll = libc::pollfd { fd: reader.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: poll of one pollfd on a descriptor `reader` keeps open.
        let ready = unsafe { libc::poll(&mut poll, 1, 30_000) };
        ready == 1 && poll.revents & libc::POLLHUP != 0
    });
    assert!(hung_up.await.unwrap(), "{what}: the command still runs after 30 s");
}

/// The durable trees' directories of the servers in `dir`.
fn tree_dirs(dir: &Path) -> Vec<PathBuf> {
    let trees = common::state_home(dir).join("taskhost").join("trees");
    std::fs::read_dir(trees).map(|entries| entries.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

/// Waits until a durable tree not in `known` has its launch fence: looks
/// again at each change inotify reports under the trees' directory (the
/// fence is renamed into place), at most 30 s.
async fn fenced(dir: &Path, known: Vec<PathBuf>) {
    use notify::Watcher as _;
    let trees = common::state_home(dir).join("taskhost").join("trees");
    let count = 1;
    let fences = {
        let dir = dir.to_path_buf();
        move || tree_dirs(&dir).iter().filter(|d| !known.contains(d) && d.join("launch").is_file()).count()
    };
    // Armed before the first look: a change after it is an event.
    let (changed, changes) = std::sync::mpsc::channel();
    let mut watcher = notify::recommended_watcher(changed).expect("an inotify watcher");
    watcher.watch(&trees, notify::RecursiveMode::Recursive).expect("watch the trees' directory");
    let found = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let found = fences();
            if found >= count {
                return found;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if changes.recv_timeout(left).is_err() {
                return found;
            }
        }
    })
    .await
    .unwrap();
    drop(watcher);
    assert!(found >= count, "{found} launch fences in {} after 30 s", trees.display());
}

/// Holds the store's write lock until dropped (a transaction never committed).
fn hold_write_lock(dir: &Path) -> rusqlite::Connection {
    let store = rusqlite::Connection::open(store_file(dir)).expect("the store opens");
    store.execute_batch("BEGIN IMMEDIATE").expect("take the write lock");
    store
}

#[tokio::test]
async fn a_start_the_store_cannot_record_is_refused_and_a_crash_before_the_record_leaves_nothing_running() {
    let dir = temp_dir("launch-fence");
    let (client, child) = serve(&dir, Some("alice")).await;
    let peer = client.peer().clone();
    let warm =
        common::started_task(&call(&peer, "bash", json!({"command": "echo warm", "run_in_background": true})).await);
    let read = texts(&call(&peer, "task_output", json!({"task_id": warm, "wait": true, "timeout_ms": 30000})).await);
    assert_eq!(read[0], "warm\n[status: completed, exit code: 0]");

    // The store cannot write for longer than the server waits: refused, and
    // the command it launched is stopped.
    let first = dir.join("first.fifo");
    fifo(&first);
    let lock = hold_write_lock(&dir);
    let starting = {
        let (peer, command) = (peer.clone(), holding(&first));
        tokio::spawn(async move { call(&peer, "bash", json!({"command": command, "run_in_background": true})).await })
    };
    let reader = launched(first).await;
    let refused = starting.await.unwrap();
    drop(lock);
    assert!(common::is_error(&refused), "{refused:?}");
    let text = only_text(&refused);
    assert!(text.contains("could not be recorded in the task store") && text.contains("retry"), "{text}");
    died(reader, "the command of a refused start").await;
    let list = texts(&call(&peer, "task_list", json!({})).await);
    assert_eq!(list[0].lines().filter(|l| l.contains("[bash]")).count(), 1, "only the warm task: {list:?}");

    // The server dies after the launch, before the record: the next one
    // kills what it launched, and nobody was ever shown an id for it.
    let second = dir.join("second.fifo");
    fifo(&second);
    let known = tree_dirs(&dir);
    let lock = hold_write_lock(&dir);
    let starting = {
        let (peer, command) = (peer.clone(), holding(&second));
        tokio::spawn(async move { call(&peer, "bash", json!({"command": command, "run_in_background": true})).await })
    };
    let reader = launched(second).await;
    // After the launch fence is written (the crash point it covers: see
    // `durable_tasks`' invariants for the window before it), before the
    // record (the store is held).
    fenced(&dir, known).await;
    sigkill(child, client).await;
    starting.abort();
    drop(lock);
    let (client, mut child) = serve(&dir, Some("alice")).await;
    died(reader, "a command whose start was never recorded, after the restart").await;
    let peer = client.peer();
    let list = texts(&call(peer, "task_list", json!({})).await);
    let tasks: Vec<&str> = list[0].lines().filter(|l| l.contains("[bash]")).collect();
    assert_eq!(tasks.len(), 1, "only the warm task: {list:?}");
    assert!(tasks[0].contains(&warm), "{list:?}");
    // And it serves: a fresh id, never one issued before.
    let after =
        common::started_task(&call(peer, "bash", json!({"command": "echo after", "run_in_background": true})).await);
    assert_ne!(after, warm);
    let read = texts(&call(peer, "task_output", json!({"task_id": after, "wait": true, "timeout_ms": 30000})).await);
    assert_eq!(read[0], "after\n[status: completed, exit code: 0]");
    drop(client);
    let _ = child.wait().await;
}
