//! Everyday work inside the default sandbox, through `taskhost serve`'s
//! default `bash` tool, as this user (root in CI) and as an unprivileged
//! server (`setpriv` to 65534): the allow-listed view must not get in the
//! way of what a coding agent does.
//!
//! - `cargo build` and `cargo test` of a small crate whose dependency (`libc`)
//!   is in the server user's cargo cache, `--offline`: the toolchain and the
//!   cache come from the home allow list. As this user only: the toolchain of
//!   this machine is the server user's (`~/.rustup`), which 65534 cannot read;
//!   the unprivileged server gets the same view of *its* home.
//! - Python tests with `python3 -m unittest` (pytest is not installed here and
//!   cannot be without the network: the standard library's runner exercises the
//!   same interpreter, imports and files).
//! - `npm test` of a small package.
//! - `git status/diff/add/commit` in the workspace.
//! - A dev server on loopback inside the tree, fetched from the tree.
//! - An interactive `python3` driven with `task_input`.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{call, call_within, only_text, texts};
use serde_json::json;

const NOBODY: u32 = 65534;
/// How long one everyday command may run in the foreground.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

struct Server {
    client: rmcp::service::RunningService<rmcp::service::RoleClient, ()>,
    child: tokio::process::Child,
    base: PathBuf,
    workspace: PathBuf,
}

impl Server {
    /// `taskhost serve` in a fresh workspace, with `home` as `$HOME` (as
    /// `uid` when given: then `base` and the workspace are that user's).
    async fn start(tag: &str, uid: Option<u32>, home: Option<&Path>) -> Self {
        let base = common::temp_dir(tag);
        let workspace = base.join("work");
        std::fs::create_dir_all(&workspace).unwrap();
        let home = home.map(Path::to_path_buf).unwrap_or_else(|| base.join("home"));
        std::fs::create_dir_all(&home).unwrap();
        if let Some(uid) = uid {
            for path in [&base, &workspace, &home] {
                std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
            }
        }
        let (client, child) = common::connect_stdio(&mut common::serve_stdio_as(uid, &base, &workspace, &home)).await;
        Self { client, child, base, workspace }
    }

    /// Runs `command` in the foreground. A cold `cargo build` on a loaded
    /// 2-core CI machine takes well over the 30 s `call` allows a quick tool
    /// (35 s seen), so the test waits as long as the command may run.
    async fn bash(&self, command: &str) -> String {
        let arguments = json!({ "command": command, "timeout_ms": COMMAND_TIMEOUT.as_millis() as u64 });
        only_text(&call_within(self.client.peer(), "bash", arguments, COMMAND_TIMEOUT + Duration::from_secs(10)).await)
    }

    /// Writes `files` (relative to the workspace) as the server's user.
    fn write(&self, uid: Option<u32>, files: &[(&str, &str)]) {
        for (name, text) in files {
            let path = self.workspace.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            if let Some(uid) = uid {
                let mut dir = path.as_path();
                while dir != self.workspace {
                    std::os::unix::fs::chown(dir, Some(uid), Some(uid)).unwrap();
                    dir = dir.parent().unwrap();
                }
            }
        }
    }

    async fn stop(mut self) {
        let _ = self.client.cancel().await;
        let status =
            tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.expect("server exits").unwrap();
        let log = std::fs::read_to_string(self.base.join("stderr.log")).unwrap_or_default();
        assert!(status.success(), "server exit {status}; log:\n{log}");
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn completed(output: &str) {
    assert!(output.ends_with("[status: completed, exit code: 0]"), "the command failed:\n{output}");
}

const CRATE: &[(&str, &str)] = &[
    (
        "everyday/Cargo.toml",
        "[package]\nname = \"everyday\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nlibc = \"0.2\"\n",
    ),
    (
        "everyday/src/lib.rs",
        "pub fn pid() -> i32 { unsafe { libc::getpid() } }\n\n#[test]\nfn a_pid_is_positive() { assert!(pid() > 0); }\n",
    ),
];

async fn cargo_builds_and_tests(server: &Server) {
    let out =
        server.bash("cd everyday && cargo build --offline -q && cargo test --offline -q --lib 2>&1 | tail -3").await;
    completed(&out);
    assert!(out.contains("test result: ok. 1 passed"), "{out}");
}

async fn python_tests_run(server: &Server, uid: Option<u32>) {
    server.write(
        uid,
        &[
            ("py/calc.py", "def add(a, b):\n    return a + b\n"),
            (
                "py/test_calc.py",
                "import unittest\nimport calc\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        \
                 self.assertEqual(calc.add(2, 3), 5)\n\nif __name__ == '__main__':\n    unittest.main()\n",
            ),
        ],
    );
    let out = server.bash("cd py && python3 -m unittest -v 2>&1 | tail -3").await;
    completed(&out);
    assert!(out.contains("OK"), "{out}");
}

async fn npm_test_runs(server: &Server, uid: Option<u32>) {
    server.write(
        uid,
        &[
            (
                "js/package.json",
                "{\"name\":\"everyday\",\"version\":\"1.0.0\",\"scripts\":{\"test\":\"node test.js\"}}\n",
            ),
            ("js/test.js", "const assert = require('assert');\nassert.strictEqual(1 + 1, 2);\nconsole.log('js ok');\n"),
        ],
    );
    let out = server.bash("cd js && npm test 2>&1 | tail -2").await;
    completed(&out);
    assert!(out.contains("js ok"), "{out}");
}

async fn git_works(server: &Server) {
    let id = "-c user.email=agent@example.com -c user.name=agent";
    let script = format!(
        "git init -q repo && cd repo && echo one > f && git add f && git {id} commit -qm one \
         && echo two >> f && git diff --stat && git status --short && git {id} commit -qam two \
         && git log --oneline | wc -l"
    );
    let out = server.bash(&script).await;
    completed(&out);
    assert!(out.contains(" M f") && out.contains("1 file changed"), "{out}");
    assert!(out.contains("2\n[status"), "two commits: {out}");
    // The next command's view holds the new repository's config and hooks
    // read-only; commits still work.
    let script = format!(
        "cd repo && (git config core.fsmonitor /bin/true 2>/dev/null; echo config=$?) \
         && (touch .git/hooks/post-commit 2>/dev/null; echo hooks=$?) \
         && git {id} commit -q --allow-empty -m three && git log --oneline | wc -l"
    );
    let out = server.bash(&script).await;
    completed(&out);
    assert!(out.contains("config=") && !out.contains("config=0"), "the repository's .git/config is writable: {out}");
    assert!(out.contains("hooks=") && !out.contains("hooks=0"), "the repository's hooks are writable: {out}");
    assert!(out.contains("3\n[status"), "a third commit: {out}");
}

async fn a_dev_server_answers_on_loopback(server: &Server) {
    let script = "mkfifo /tmp/ready
        python3 -u -m http.server 8765 --bind 127.0.0.1 > /tmp/ready 2>/dev/null &
        read line < /tmp/ready; echo \"server: $line\"
        python3 -c \"import urllib.request; print('fetched', urllib.request.urlopen('http://127.0.0.1:8765/').status)\"
        kill %1";
    let out = server.bash(script).await;
    completed(&out);
    assert!(out.contains("server: Serving HTTP on 127.0.0.1 port 8765"), "{out}");
    assert!(out.contains("fetched 200"), "{out}");
}

async fn an_interactive_python_takes_input(server: &Server) {
    let peer = server.client.peer();
    let id = common::started_task(
        &call(peer, "bash", json!({"command": "python3 -u -i -q", "run_in_background": true, "interactive": true}))
            .await,
    );
    call(peer, "task_input", json!({"task_id": id, "text": "x = 6 * 7\nprint('answer', x)\n"})).await;
    assert!(
        common::read_until(server.client.peer(), &id, "answer 42", Duration::from_secs(30)).await.contains("answer 42")
    );
    call(peer, "task_input", json!({"task_id": id, "text": "import os; print('home', os.environ['HOME'])\n"})).await;
    common::read_until(server.client.peer(), &id, "home ", Duration::from_secs(30)).await;
    call(peer, "task_input", json!({"task_id": id, "text": "exit()\n", "close": true})).await;
    let end = texts(&call(peer, "task_output", json!({"task_id": id, "wait": true, "timeout_ms": 30_000})).await);
    assert!(end[0].ends_with("[status: completed, exit code: 0]"), "{end:?}");
}

#[tokio::test]
async fn everyday_work_runs_in_the_sandbox_with_the_server_as_this_user() {
    let home = std::env::var_os("HOME").map(PathBuf::from).expect("HOME");
    assert!(
        home.join(".cargo/registry").is_dir(),
        "this test builds a crate offline from the cargo cache of {}: run `cargo fetch` in the repository first",
        home.display()
    );
    let server = Server::start("everyday-self", None, Some(&home)).await;
    server.write(None, CRATE);
    cargo_builds_and_tests(&server).await;
    python_tests_run(&server, None).await;
    npm_test_runs(&server, None).await;
    git_works(&server).await;
    a_dev_server_answers_on_loopback(&server).await;
    an_interactive_python_takes_input(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn everyday_work_runs_in_the_sandbox_with_an_unprivileged_server() {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    assert_eq!(uid, 0, "this test runs the server as 65534 through setpriv, which needs root (CI runs as root)");
    let server = Server::start("everyday-nobody", Some(NOBODY), None).await;
    python_tests_run(&server, Some(NOBODY)).await;
    npm_test_runs(&server, Some(NOBODY)).await;
    git_works(&server).await;
    a_dev_server_answers_on_loopback(&server).await;
    an_interactive_python_takes_input(&server).await;
    server.stop().await;
}
