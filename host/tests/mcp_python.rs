//! The MCP scenario driven by an independent client: the Python `mcp` SDK
//! (pinned `mcp==2.3.0`, installed by `.ci/run`) over stdio, in both of its
//! protocol negotiation modes: `legacy` (the initialize handshake) and
//! `auto` (probe `server/discover`, adopt the newest common version).

mod common;

use std::path::PathBuf;
use std::process::Command;

const PINNED: &str = "2.3.0";

/// The installed `mcp` version, or why there is none.
fn python_mcp_version() -> Result<String, String> {
    let output = Command::new("python3")
        .args(["-c", "import importlib.metadata as m; print(m.version('mcp'))"])
        .output()
        .map_err(|e| format!("python3 not runnable: {e}"))?;
    if !output.status.success() {
        return Err(format!("python package mcp missing: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn run_scenario(mode: &str) {
    match python_mcp_version() {
        Ok(version) => assert_eq!(version, PINNED, "the Python client must be mcp=={PINNED}"),
        // CI installs the client, so there a missing one is a failure.
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPED: {why}; install it with `python3 -m pip install mcp=={PINNED}`");
            return;
        }
        Err(why) => panic!("{why}; .ci/run must run `python3 -m pip install mcp=={PINNED}`"),
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/python/mcp_scenario.py");
    let work = common::temp_dir(&format!("python-{mode}"));
    let output = Command::new("python3").arg(&script).arg(common::BIN).arg(mode).arg(&work).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "python scenario ({mode}) failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains(&format!("mode={mode}: ok")), "stdout:\n{stdout}");
    println!("{stdout}");
}

#[test]
fn python_client_legacy_mode() {
    run_scenario("legacy");
}

#[test]
fn python_client_auto_mode() {
    run_scenario("auto");
}
