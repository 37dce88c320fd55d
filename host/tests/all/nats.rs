//! A real 3-node NATS JetStream cluster on loopback for the cluster tests:
//! Debian's `nats-server` (installed by `.ci/setup`), free ports, a store
//! directory per node, and a user with a password (never anonymous).
//!
//! Invariants: readiness is waited for on events (each node's "Server is
//! ready" log line, then the JetStream meta leader answering
//! `$JS.API.INFO`), never on a sleep; a node can be SIGKILLed, SIGSTOPped
//! and SIGCONTed, and restarted on the same ports and store; every node
//! still running is SIGKILLed when the cluster is dropped. A missing
//! `nats-server` fails the test with the fix.
#![allow(dead_code)] // each suite uses a subset

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The user every test client and `taskhost` node connects as.
pub const USER: &str = "taskhost";

/// How long a node may take to say it is ready (a loaded 2-core machine).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// The lines a running `nats-server` wrote to stderr, and a signal for each
/// new one.
#[derive(Default)]
struct LogLines {
    lines: Mutex<Vec<String>>,
    grew: Condvar,
}

impl LogLines {
    /// Waits until a line holds `needle`; panics past `within`, with the log.
    fn wait_for(&self, needle: &str, within: Duration, node: &str) {
        let deadline = Instant::now() + within;
        let mut lines = self.lines.lock().unwrap();
        loop {
            if lines.iter().any(|line| line.contains(needle)) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "nats node {node} never logged {needle:?} within {within:?}:\n{}",
                lines.join("\n")
            );
            lines = self.grew.wait_timeout(lines, left).unwrap().0;
        }
    }
}

/// Rung after any node logs a line: a wait on several nodes' logs at once.
#[derive(Default)]
struct Bell {
    rings: Mutex<u64>,
    rung: Condvar,
}

impl Bell {
    fn ring(&self) {
        *self.rings.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.rung.notify_all();
    }
}

/// One `nats-server` of the cluster.
pub struct NatsNode {
    pub name: String,
    pub port: u16,
    config: PathBuf,
    child: Option<Child>,
    log: Arc<LogLines>,
}

impl NatsNode {
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|child| child.id() as i32)
    }

    fn spawn(&mut self, binary: &Path, log_file: &Path, bell: &Arc<Bell>) {
        let mut child = Command::new(binary)
            .arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", binary.display()));
        let log = Arc::new(LogLines::default());
        let stderr = child.stderr.take().unwrap();
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(log_file).unwrap();
        let lines = Arc::clone(&log);
        let bell = Arc::clone(bell);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(file, "{line}");
                lines.lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                lines.grew.notify_all();
                bell.ring();
            }
        });
        self.child = Some(child);
        self.log = log;
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = self.pid().unwrap_or_else(|| panic!("nats node {} is not running", self.name));
        // SAFETY: kill(2) on our own unreaped child: the pid is not recycled.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "kill({pid}, {signal}): {}", std::io::Error::last_os_error());
    }
}

/// The cluster; its nodes are killed when it is dropped.
pub struct NatsCluster {
    pub dir: PathBuf,
    pub nodes: Vec<NatsNode>,
    pub password: String,
    /// The password in a file of mode 0600 (`[cluster] password_file`).
    pub password_file: PathBuf,
    binary: PathBuf,
    bell: Arc<Bell>,
}

/// `nats-server` on `PATH`, or where Debian puts it (`/usr/sbin`, not on
/// an ordinary user's `PATH`); a missing binary fails with the fix.
pub fn nats_server_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "nats-server is not installed; the cluster tests run a real NATS JetStream cluster: \
             `apt-get install nats-server` as root (bash .ci/setup does it)"
        )
    })
}

/// `count` distinct loopback ports free when asked (held together until all
/// are picked, so no two are the same).
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..count).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|listener| listener.local_addr().unwrap().port()).collect()
}

impl NatsCluster {
    /// Starts 3 nodes in a new temporary directory and waits until
    /// JetStream answers.
    pub async fn start(tag: &str) -> Self {
        Self::start_nodes(tag, 3).await
    }

    /// Starts `count` nodes (1: a JetStream server without a cluster).
    pub async fn start_nodes(tag: &str, count: usize) -> Self {
        Self::start_with(tag, count, false, "").await
    }

    /// 3 nodes whose users are the test's own and `users`: more entries of
    /// the `authorization { users = [...] }` list (each taskhost node's own
    /// user, with its permissions).
    pub async fn start_with_users(tag: &str, users: &str) -> Self {
        Self::start_with(tag, 3, false, users).await
    }

    /// One JetStream server that takes anonymous clients (what a node must
    /// refuse to join).
    pub async fn start_anonymous(tag: &str) -> Self {
        Self::start_with(tag, 1, true, "").await
    }

    async fn start_with(tag: &str, count: usize, anonymous: bool, users: &str) -> Self {
        use std::os::unix::fs::OpenOptionsExt as _;
        let binary = nats_server_binary();
        let dir = crate::common::temp_dir(&format!("nats-{tag}"));
        let password = format!("{:032x}", rand_u128());
        let password_file = dir.join("nats-password");
        std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(&password_file)
            .and_then(|mut file| file.write_all(password.as_bytes()))
            .unwrap();
        let ports = free_ports(count * 2);
        let routes: Vec<String> =
            (0..count).map(|index| format!("nats-route://127.0.0.1:{}", ports[count + index])).collect();
        let mut nodes = Vec::new();
        for index in 0..count {
            let name = format!("n{}", index + 1);
            let store = dir.join(format!("{name}-store"));
            let cluster = if count > 1 {
                format!(
                    "cluster {{ name: taskhost-test, listen: 127.0.0.1:{}, routes: [{}] }}",
                    ports[count + index],
                    routes.join(", ")
                )
            } else {
                String::new()
            };
            let config = dir.join(format!("{name}.conf"));
            let authorization = if anonymous {
                String::new()
            } else {
                format!("authorization {{ users = [ {{ user: {USER}, password: \"{password}\" }} {users} ] }}")
            };
            std::fs::write(
                &config,
                format!(
                    "server_name: {name}\nlisten: 127.0.0.1:{port}\n\
                     jetstream {{ store_dir: {store:?}, max_memory_store: 64MB, max_file_store: 2GB }}\n\
                     {authorization}\n{cluster}\n",
                    port = ports[index],
                ),
            )
            .unwrap();
            nodes.push(NatsNode { name, port: ports[index], config, child: None, log: Arc::default() });
        }
        let mut cluster = Self { dir, nodes, password, password_file, binary, bell: Arc::default() };
        for index in 0..count {
            let log = cluster.log_path(index);
            cluster.nodes[index].spawn(&cluster.binary, &log, &cluster.bell);
        }
        for node in &cluster.nodes {
            node.log.wait_for("Server is ready", READY_WITHIN, &node.name);
        }
        cluster.wait_for_jetstream(None).await;
        cluster
    }

    fn log_path(&self, index: usize) -> PathBuf {
        self.dir.join(format!("{}.log", self.nodes[index].name))
    }

    /// Every node's client URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsNode::url).collect()
    }

    /// `urls()` joined by commas (`taskhost serve --cluster`).
    pub fn url_list(&self) -> String {
        self.urls().join(",")
    }

    /// A client of the test's own, connected to any node.
    pub async fn client(&self) -> async_nats::Client {
        self.client_of(&self.urls()).await
    }

    /// A client connected to node `index` only.
    pub async fn client_to(&self, index: usize) -> async_nats::Client {
        self.client_of(&[self.nodes[index].url()]).await
    }

    async fn client_of(&self, urls: &[String]) -> async_nats::Client {
        async_nats::ConnectOptions::with_user_and_password(USER.into(), self.password.clone())
            .connect(urls)
            .await
            .unwrap_or_else(|error| panic!("cannot connect to the test's NATS cluster {urls:?}: {error}"))
    }

    /// Waits until JetStream answers `$JS.API.INFO` through node `only` (or
    /// any node): the meta leader is elected and reachable. Each try waits
    /// for the reply; a "not ready yet" reply is tried again, until
    /// [`READY_WITHIN`].
    async fn wait_for_jetstream(&self, only: Option<usize>) {
        let urls = match only {
            Some(index) => vec![self.nodes[index].url()],
            None => self.urls(),
        };
        let client = self.client_of(&urls).await;
        let deadline = Instant::now() + READY_WITHIN;
        let mut last = String::new();
        while Instant::now() < deadline {
            match client.request("$JS.API.INFO", "".into()).await {
                Ok(reply) => {
                    let info: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap_or_default();
                    if info.get("error").is_none() && info.get("type").is_some() {
                        return;
                    }
                    last = String::from_utf8_lossy(&reply.payload).into_owned();
                }
                Err(error) => last = error.to_string(),
            }
            // JetStream said it is not ready (or nobody answered yet): ask
            // again after the next line any node logs (an election, a
            // route), at most a quarter second later.
            self.wait_for_any_line(Duration::from_millis(250));
        }
        panic!("JetStream of the test cluster ({urls:?}) never answered $JS.API.INFO within {READY_WITHIN:?}: {last}");
    }

    /// Blocks until some running node logs a new line, or `within`.
    pub fn wait_for_any_line(&self, within: Duration) {
        let counts: Vec<usize> = self.nodes.iter().map(|node| node.log.lines.lock().unwrap().len()).collect();
        let deadline = Instant::now() + within;
        let Some((node, seen)) = self.nodes.iter().zip(counts).find(|(node, _)| node.child.is_some()) else { return };
        let mut lines = node.log.lines.lock().unwrap();
        while lines.len() == seen && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            lines = node.log.grew.wait_timeout(lines, left).unwrap().0;
        }
    }

    /// The number of lines node `index` logged so far (for
    /// [`Self::wait_for_line_after`]).
    pub fn log_len(&self, index: usize) -> usize {
        self.nodes[index].log.lines.lock().unwrap().len()
    }

    /// Every node's log length so far (for [`Self::wait_for_line_on_any`]).
    pub fn log_lens(&self) -> Vec<usize> {
        (0..self.nodes.len()).map(|index| self.log_len(index)).collect()
    }

    /// Waits until a running node logs a line holding `needle` after the
    /// lines `seen` counted, and returns that node's index.
    pub fn wait_for_line_on_any(&self, seen: &[usize], needle: &str) -> usize {
        let deadline = Instant::now() + READY_WITHIN;
        let mut rings = self.bell.rings.lock().unwrap();
        loop {
            for (index, node) in self.nodes.iter().enumerate() {
                let lines = node.log.lines.lock().unwrap();
                if node.child.is_some() && lines.iter().skip(seen[index]).any(|line| line.contains(needle)) {
                    return index;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no nats node logged {needle:?} within {READY_WITHIN:?} (logs in {})",
                self.dir.display()
            );
            rings = self.bell.rung.wait_timeout(rings, left).unwrap().0;
        }
    }

    /// The index of the node named `name`.
    pub fn index_of(&self, name: &str) -> usize {
        self.nodes.iter().position(|node| node.name == name).unwrap_or_else(|| panic!("no nats node {name}"))
    }

    /// SIGKILLs node `index` and reaps it.
    pub fn kill(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        node.signal(libc::SIGKILL);
        node.child.take().unwrap().wait().unwrap();
    }

    /// SIGSTOPs node `index` (it holds its sockets but answers nothing).
    pub fn pause(&self, index: usize) {
        self.nodes[index].signal(libc::SIGSTOP);
    }

    /// SIGCONTs a paused node.
    pub fn resume(&self, index: usize) {
        self.nodes[index].signal(libc::SIGCONT);
    }

    /// Starts a killed node again (same ports, same store) and waits until
    /// JetStream answers through it.
    pub async fn restart(&mut self, index: usize) {
        assert!(self.nodes[index].child.is_none(), "nats node {index} is still running: kill it first");
        let log = self.log_path(index);
        self.nodes[index].spawn(&self.binary, &log, &self.bell);
        let node = &self.nodes[index];
        node.log.wait_for("Server is ready", READY_WITHIN, &node.name);
        self.wait_for_jetstream(Some(index)).await;
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                // A paused node dies of SIGKILL too.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// A random number for passwords (`getrandom`, as the server's tokens).
fn rand_u128() -> u128 {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).unwrap();
    u128::from_le_bytes(bytes)
}
