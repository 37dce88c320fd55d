//! Helpers for the MCP end-to-end tests: the real `taskhost` binary in a
//! private temporary directory, driven by rmcp's own client.
#![allow(dead_code)] // the benches include this file by path and use a subset

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::{RoleClient, RunningService};
use serde_json::Value;

#[allow(unused_imports)] // the mcp bench uses no process helper
pub use taskhost_process::testing::procfs;

pub const BIN: &str = env!("CARGO_BIN_EXE_taskhost");

/// `PATH` with the bin directory of the Python virtual environment
/// `.ci/setup` makes (`target/venv`: the MCP client, Selenium,
/// componentize-py) first, when it exists, so the tests' `python3` and
/// `componentize-py` are the pinned ones without a system-wide install.
pub fn tool_path() -> std::ffi::OsString {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/venv/bin");
    let mut dirs: Vec<std::path::PathBuf> = Vec::new();
    if venv.is_dir() {
        dirs.push(venv);
    }
    dirs.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    std::env::join_paths(dirs).expect("PATH entries hold no ':'")
}

/// The variable that lets a machine without a test's prerequisite pass that
/// test: a comma-separated list of the gaps accepted (`root`, `landlock`),
/// or `all`. Unset (CI), a missing prerequisite fails the test with the fix.
pub const ACCEPT_GAPS: &str = "TASKHOST_TEST_ACCEPT_GAPS";

/// Whether the test may skip itself because `gap` is missing: `true` only
/// when [`ACCEPT_GAPS`] names it (the test then returns, saying so on
/// stderr); otherwise the test fails with `fix`. A missing prerequisite is
/// never a silent pass.
pub fn gap_accepted(gap: &str, missing: &str, fix: &str) -> bool {
    let accepted = std::env::var(ACCEPT_GAPS).unwrap_or_default();
    if accepted.split(',').map(str::trim).any(|name| name == gap || name == "all") {
        eprintln!("skipped, as {ACCEPT_GAPS} accepts the gap {gap:?}: {missing}");
        return true;
    }
    panic!("{missing}; {fix} (or accept the gap: {ACCEPT_GAPS}={gap})");
}

/// A fresh private directory (the server's working directory and config home).
/// Its name is `taskhost-<tag>-` and a random part (`tempfile`: made
/// atomically, never an earlier run's or another user's directory); it is
/// kept after the test, for its logs, and its mode is 0755 so a server run
/// as another user (`taskhost_as`) can reach what the test puts in it.
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::Builder::new()
        .prefix(&format!("taskhost-{tag}-"))
        .permissions(std::fs::Permissions::from_mode(0o755))
        .tempdir()
        .unwrap_or_else(|error| {
            panic!("cannot make a temporary directory in {}: {error}", std::env::temp_dir().display())
        });
    dir.keep()
}

/// A new `<dir>/stderr.log` for the server's logs.
pub fn log_file(dir: &std::path::Path) -> Stdio {
    Stdio::from(std::fs::File::create(dir.join("stderr.log")).unwrap())
}

/// The state directory's base (`XDG_STATE_HOME`) of the servers a test
/// runs in `dir`, beside it (outside the workspace). Created on first use,
/// holding this user's compile cache key (`$XDG_STATE_HOME/taskhost/
/// cache.key` of the test process), so test servers share the compile cache
/// as one user's servers do; the trust records are the test's own.
pub fn state_home(dir: &std::path::Path) -> PathBuf {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let home = PathBuf::from(format!("{}-state", dir.display()));
    let state = home.join("taskhost");
    end_trees_at_exit(state.join("trees"));
    let key_file = state.join("cache.key");
    if !key_file.exists() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&state).unwrap();
        let key = taskhost::state::StateDir::open_default().and_then(|s| s.cache_key()).expect("this user's cache key");
        let written = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&key_file);
        if let Ok(mut file) = written {
            std::io::Write::write_all(&mut file, &key.0).unwrap();
        }
    }
    home
}

/// The durable trees' directories of the test's servers, removed when the
/// test process exits (passed or failed): each tree's keeper then kills it
/// within 5 s (its logs are unlinked), instead of a stable owner's command
/// outliving the test for its time to live. The servers' logs stay.
static TREE_ROOTS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

fn end_trees_at_exit(trees: PathBuf) {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    extern "C" fn remove_tree_roots() {
        let roots = std::mem::take(&mut *TREE_ROOTS.lock().unwrap_or_else(|e| e.into_inner()));
        for root in roots {
            let _ = std::fs::remove_dir_all(root);
        }
    }
    REGISTER.call_once(|| {
        // SAFETY: registers a plain function that runs at exit.
        unsafe { libc::atexit(remove_tree_roots) };
    });
    let mut roots = TREE_ROOTS.lock().unwrap_or_else(|e| e.into_inner());
    if !roots.contains(&trees) {
        roots.push(trees);
    }
}

/// `taskhost trust <file>` with the test's state directory (see
/// [`state_home`]), as the user runs it after writing a configuration or
/// building a plugin that lies where process trees can write.
pub fn trust(dir: &std::path::Path, file: &std::path::Path) {
    let output = std::process::Command::new(BIN)
        .arg("trust")
        .arg(file)
        .env("XDG_STATE_HOME", state_home(dir))
        .output()
        .expect("run taskhost trust");
    assert!(output.status.success(), "taskhost trust {}: {output:?}", file.display());
}

/// `taskhost serve` over stdio in `dir`, with the test's state directory,
/// optionally with a configuration (`dir/test.toml`, trusted: it lies in
/// the server's working directory); the caller wires its stdio.
pub fn serve_command(dir: &std::path::Path, config: Option<&str>) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(BIN);
    command.arg("serve").current_dir(dir).env("RUST_LOG", "info,taskhost=debug");
    command.env("XDG_STATE_HOME", state_home(dir));
    if let Some(config) = config {
        let path = dir.join("test.toml");
        std::fs::write(&path, config).unwrap();
        trust(dir, &path);
        command.arg("--config").arg(path);
    }
    command
}

/// `taskhost serve [--owner NAME]` over stdio in `dir` (with `config` when
/// given), its stderr in the directory's log, and a client on it.
pub async fn serve_stdio(
    dir: &std::path::Path,
    config: Option<&str>,
    owner: Option<&str>,
) -> (Client, tokio::process::Child) {
    let mut command = serve_command(dir, config);
    if let Some(owner) = owner {
        command.arg("--owner").arg(owner);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_file(dir))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn taskhost serve");
    let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    (().serve((stdout, stdin)).await.expect("initialize over stdio"), child)
}

/// Numbered lines ending in `;`, checked as consuming reads return them: a
/// read may cut a line, whose rest starts the next read (the `;` tells a
/// whole line from a cut one).
pub struct NumberedLines {
    /// The number the next line must carry.
    pub next: u64,
    carry: String,
}

impl NumberedLines {
    pub fn new() -> Self {
        Self { next: 1, carry: String::new() }
    }

    /// Checks one read's text: each whole line is `number(next)` then `;`.
    pub fn take(&mut self, read: &str, number: impl Fn(u64) -> String, context: &str) {
        let text = std::mem::take(&mut self.carry) + read;
        let mut lines = text.split('\n').peekable();
        while let Some(line) = lines.next() {
            match line.strip_suffix(';') {
                // A read that ended right after a `;` left the newline for
                // the next read to start with.
                None if line.is_empty() => {}
                Some(numbered) => {
                    assert_eq!(numbered, number(self.next), "{context}");
                    self.next += 1;
                }
                // Cut by the read: the rest comes first in the next one.
                None if lines.peek().is_none() => self.carry = line.to_string(),
                None => panic!("a broken line {line:?} ({context}; expecting {})", self.next),
            }
        }
    }

    /// No cut line waits for its rest.
    pub fn is_whole(&self) -> bool {
        self.carry.is_empty()
    }
}

/// Spawns `command` (a `taskhost serve --http 127.0.0.1:0 …`) and waits up
/// to 20 s for the address it prints on stderr. The rest of its stderr is
/// kept in the file `log` when given (appended as lines arrive), drained
/// otherwise.
pub async fn spawn_http_server(
    mut command: tokio::process::Command,
    log: Option<PathBuf>,
) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt as _;
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = command.spawn().expect("spawn taskhost serve --http");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    // Everything before the address line too: start-up warnings are there.
    let mut text = String::new();
    let url = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let Some(line) = lines.next_line().await.unwrap() else {
                panic!("the server exited before printing its address:\n{text}");
            };
            text.push_str(&line);
            text.push('\n');
            if let Some(url) = line.strip_prefix("taskhost: serving MCP on ") {
                return url.to_string();
            }
        }
    })
    .await
    .expect("the server starts within 20 s");
    // Appended line by line to a file opened once: a server's stderr is
    // never held up by its test (rewriting the whole log per line made a
    // long test's server wait on its own logging).
    let mut log = log.and_then(|log| std::fs::File::create(log).ok());
    if let Some(file) = &mut log {
        let _ = std::io::Write::write_all(file, text.as_bytes());
    }
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(file) = &mut log {
                let _ = std::io::Write::write_all(file, format!("{line}\n").as_bytes());
            }
        }
    });
    (child, url)
}

/// An rmcp client over streamable HTTP on `mcp` (the URL `serve --http`
/// printed), authenticated with `token`.
pub async fn connect_http(mcp: &str, token: &str) -> Client {
    let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
        taskhost::http_client::client(),
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(mcp.to_string())
            .auth_header(token),
    );
    ().serve(transport).await.expect("initialize over HTTP")
}

/// `systemctl stop`: SIGTERM to a `taskhost serve`, which must exit
/// successfully within 20 s.
pub async fn stop_with_sigterm(child: &mut tokio::process::Child) {
    let pid = child.id().expect("running");
    assert!(std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("exits on SIGTERM").unwrap();
    assert!(status.success(), "exit status {status}");
}

/// `taskhost serve` over stdio in `dir` (optionally with a configuration):
/// stdin and stdout piped for the test, stderr into `<dir>/stderr.log`.
pub fn spawn_stdio_server(dir: &std::path::Path, config: Option<&str>) -> tokio::process::Child {
    serve_command(dir, config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_file(dir))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn taskhost serve")
}

pub type Client = RunningService<RoleClient, ()>;

/// A fresh `taskhost serve` over stdio and an rmcp client on its pipes.
/// The test owns the process: closing the client closes the server's stdin
/// and nothing else, which is how a disconnect looks to the server.
pub struct StdioServer {
    pub client: Client,
    pub child: tokio::process::Child,
    pub dir: PathBuf,
}

impl StdioServer {
    pub async fn start(tag: &str, config: Option<&str>) -> Self {
        let dir = temp_dir(tag);
        let mut child = spawn_stdio_server(&dir, config);
        let stdout = child.stdout.take().unwrap();
        let stdin = child.stdin.take().unwrap();
        let client = ().serve((stdout, stdin)).await.expect("initialize over stdio");
        Self { client, child, dir }
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join("stderr.log")
    }

    /// Disconnects (closes the server's stdin) and waits for it to exit.
    pub async fn disconnect(mut self) -> (std::process::ExitStatus, String) {
        let _ = self.client.cancel().await;
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("the server exits within 20 s of its client leaving")
            .unwrap();
        let log = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap();
        (status, log)
    }
}

pub fn args(value: Value) -> JsonObject {
    match value {
        Value::Object(object) => object,
        other => panic!("arguments must be an object, got {other}"),
    }
}

/// Calls a tool; the result must be a tool result (not a protocol error).
pub async fn call(client: &rmcp::service::Peer<RoleClient>, tool: &str, arguments: Value) -> CallToolResult {
    call_within(client, tool, arguments, Duration::from_secs(30)).await
}

/// [`call`] for a call whose own work is long (a compiler run in the
/// foreground): the test's patience is the call's own `timeout_ms`, not
/// the 30 s meant to catch a hung server.
pub async fn call_within(
    client: &rmcp::service::Peer<RoleClient>,
    tool: &str,
    arguments: Value,
    patience: Duration,
) -> CallToolResult {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if !arguments.is_null() {
        params = params.with_arguments(args(arguments));
    }
    tokio::time::timeout(patience, client.call_tool(params))
        .await
        .unwrap_or_else(|_| panic!("{tool} did not answer within {patience:?}"))
        .unwrap_or_else(|e| panic!("{tool} failed at the protocol level: {e}"))
}

/// The id of the background task a tools/call result started, read from
/// its `_meta` (data, never the producer's wording); panics with the result
/// when it started none.
pub fn started_task(result: &CallToolResult) -> String {
    result
        .meta
        .as_ref()
        .and_then(|meta| meta.0.get(taskhost::mcp::STARTED_TASK_META))
        .and_then(|id| id.as_str())
        .unwrap_or_else(|| panic!("the call started no task: {result:?}"))
        .to_string()
}

/// The text blocks of a result.
pub fn texts(result: &CallToolResult) -> Vec<String> {
    result.content.iter().map(|block| block.as_text().expect("text content").text.clone()).collect()
}

pub fn is_error(result: &CallToolResult) -> bool {
    result.is_error == Some(true)
}

/// The one text block of a result with no notices.
pub fn only_text(result: &CallToolResult) -> String {
    let texts = texts(result);
    assert_eq!(texts.len(), 1, "expected a single block, got {texts:?}");
    texts.into_iter().next().unwrap()
}

/// A `task_list` text with each row's time left (` (stopped in … unless
/// read)`) taken out, checking it is there: a stable owner's live tasks
/// carry one (`[tasks] stable_owner_ttl_ms`, a day by default), and it
/// moves with the clock.
pub fn without_time_left(list: &str) -> String {
    list.lines()
        .map(|row| match row.split_once(" (stopped in ") {
            Some((row, left)) => {
                assert!(left.ends_with(" unless read)"), "a time left: {left}");
                row
            }
            None => row,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reads a file until `needle` appears (logs are written asynchronously).
pub async fn wait_for_text(path: &std::path::Path, needle: &str, within: Duration) -> String {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("{needle:?} did not appear in {} within {within:?}; it holds:\n{text}", path.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A command running the `taskhost` binary as this user, or, with `uid`, as
/// that user through `setpriv` (no capabilities, no supplementary groups)
/// from a copy it can run (`taskhost_process::testing::as_user`). The
/// caller makes whatever the server needs the user's own.
pub fn taskhost_as(uid: Option<u32>) -> tokio::process::Command {
    taskhost_process::testing::as_user::command(std::path::Path::new(BIN), uid)
}

/// `taskhost serve` over stdio as `uid` (this user when `None`), in
/// `workspace`, with `home` as `$HOME`, its log in `<base>/stderr.log`, and
/// killed when dropped: the set-up every sandbox suite starts from (a caller
/// adds its own arguments and variables before [`connect_stdio`]).
pub fn serve_stdio_as(
    uid: Option<u32>,
    base: &std::path::Path,
    workspace: &std::path::Path,
    home: &std::path::Path,
) -> tokio::process::Command {
    let mut command = taskhost_as(uid);
    command
        .arg("serve")
        .current_dir(workspace)
        .env("HOME", home)
        .env("RUST_LOG", "info,taskhost=debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_file(base))
        .kill_on_drop(true);
    command
}

/// Spawns `command` (from [`serve_stdio_as`]) and initializes an MCP client
/// over its stdio.
pub async fn connect_stdio(command: &mut tokio::process::Command) -> (Client, tokio::process::Child) {
    let mut child = command.spawn().expect("spawn taskhost serve");
    let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = ().serve((stdout, stdin)).await.expect("initialize over stdio");
    (client, child)
}

/// Consuming `task_output` reads of `id` until the output holds `line`
/// (at most `within`); the output read so far, status lines dropped.
pub async fn read_until(peer: &rmcp::service::Peer<RoleClient>, id: &str, line: &str, within: Duration) -> String {
    let deadline = std::time::Instant::now() + within;
    let mut text = String::new();
    loop {
        let read = texts(&call(peer, "task_output", serde_json::json!({"task_id": id})).await).remove(0);
        let (body, status) = read.rsplit_once('\n').expect("body and status line");
        if body != "(no new output)" {
            text.push_str(body);
            text.push('\n');
        }
        if text.contains(line) {
            return text;
        }
        assert_eq!(status, "[status: running]", "{id} ended before printing {line:?}: {text:?}");
        assert!(std::time::Instant::now() < deadline, "{id} never printed {line:?}: {text:?}");
        // An MCP client gets no event for new output (a notice rides on the
        // next result only), so the reads are paced; the loop ends on the line.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `component` with a custom section `taskhost-test-build` holding `tag`
/// appended: another file (another hash, so an uncached compile) that
/// behaves exactly the same. Stands in for a rebuild of a plugin.
pub fn rebuilt(component: &[u8], tag: &str) -> Vec<u8> {
    const NAME: &[u8] = b"taskhost-test-build";
    let mut payload = vec![NAME.len() as u8];
    payload.extend_from_slice(NAME);
    payload.extend_from_slice(tag.as_bytes());
    assert!(payload.len() < 128, "one-byte LEB128 size");
    let mut out = component.to_vec();
    out.push(0);
    out.push(payload.len() as u8);
    out.extend_from_slice(&payload);
    out
}

/// Waits until the file at `path` holds text for which `check` is true:
/// looks again at each change inotify reports in its directory (armed
/// before the first look), at most `within`. Returns the text.
pub async fn until_file(
    path: &std::path::Path,
    within: Duration,
    check: impl Fn(&str) -> bool + Send + 'static,
) -> String {
    use notify::Watcher as _;
    let (changed, changes) = std::sync::mpsc::channel();
    let mut watcher = notify::recommended_watcher(changed).expect("an inotify watcher");
    let dir = path.parent().expect("a file in a directory").to_path_buf();
    watcher.watch(&dir, notify::RecursiveMode::NonRecursive).expect("watch the file's directory");
    let file = path.to_path_buf();
    let found = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + within;
        loop {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            if check(&text) {
                return Ok(text);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if changes.recv_timeout(left).is_err() {
                return Err(text);
            }
        }
    })
    .await
    .unwrap();
    drop(watcher);
    found.unwrap_or_else(|text| panic!("{} never held what was waited for within {within:?}: {text:?}", path.display()))
}
