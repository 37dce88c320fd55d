//! The MCP scenario driven by an independent client: the Python `mcp` SDK
//! (pinned `mcp==2.3.0`, installed by `.ci/setup`) in both of its protocol
//! negotiation modes — `legacy` (the initialize handshake) and `auto`
//! (probe `server/discover`, adopt the newest common version, 2026-07-28
//! here) — over stdio, and over streamable HTTP with a bearer token.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

const PINNED: &str = "2.3.0";
const TOKEN: &str = "python-token-0123456789abcdef";

/// Fails, saying how to fix it, unless the pinned client is installed (the
/// README's test command installs it through `.ci/setup`): a missing client
/// is never a silent pass.
fn require_python_client() {
    let output = Command::new("python3")
        .env("PATH", common::tool_path())
        .args(["-c", "import importlib.metadata as m; print(m.version('mcp'))"])
        .output();
    let why = match output {
        Ok(output) if output.status.success() => {
            let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
            assert_eq!(version, PINNED, "the Python client must be mcp=={PINNED}: run `bash .ci/setup`");
            return;
        }
        Ok(output) => format!("python package mcp missing: {}", String::from_utf8_lossy(&output.stderr).trim()),
        Err(error) => format!("python3 not runnable: {error}"),
    };
    panic!("{why}; run `bash .ci/setup` (it installs mcp=={PINNED})");
}

fn run_script(mode: &str, http: Option<&str>) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/python/mcp_scenario.py");
    let work = common::temp_dir(&format!("python-{mode}"));
    let mut command = Command::new("python3");
    command.env("PATH", common::tool_path()).arg(&script).arg(common::BIN).arg(mode).arg(&work);
    if let Some(url) = http {
        command.arg(url).arg(TOKEN);
    } else {
        // The stdio server's configuration, in its working directory: trusted
        // in the test's own state directory, which the script hands the server.
        let config = work.join("python.toml");
        std::fs::write(&config, "[serve]\nprogress_interval_ms = 100\n").unwrap();
        common::trust(&work, &config);
        command.env("XDG_STATE_HOME", common::state_home(&work));
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "python scenario ({mode}) failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let transport = if http.is_some() { "http" } else { "stdio" };
    assert!(stdout.contains(&format!("mode={mode} transport={transport}: ok")), "stdout:\n{stdout}");
    println!("{stdout}");
}

/// Runs the scenario against a fresh `taskhost serve --http`.
async fn run_over_http(mode: &str) {
    let dir = common::temp_dir(&format!("python-http-{mode}"));
    let config =
        format!("[serve]\nprogress_interval_ms = 100\n\n[[serve.http.tokens]]\nname = \"py\"\ntoken = \"{TOKEN}\"\n");
    let mut command = common::serve_command(&dir, Some(&config));
    command.args(["--http", "127.0.0.1:0"]);
    let (mut child, url) = common::spawn_http_server(command, None).await;
    let mode = mode.to_string();
    tokio::task::spawn_blocking(move || run_script(&mode, Some(&url))).await.unwrap();
    child.kill().await.unwrap();
}

#[test]
fn python_client_legacy_mode_over_stdio() {
    require_python_client();
    run_script("legacy", None);
}

#[test]
fn python_client_auto_mode_over_stdio() {
    require_python_client();
    run_script("auto", None);
}

#[tokio::test]
async fn python_client_legacy_mode_over_http() {
    require_python_client();
    run_over_http("legacy").await;
}

#[tokio::test]
async fn python_client_auto_mode_over_http() {
    require_python_client();
    run_over_http("auto").await;
}
