//! A plugin's process grant cannot be widened from the outside: a `cat`
//! planted in a world-writable `PATH` directory ahead of the real one never
//! runs (the grant refuses to load, or refuses the spawn), and a plugin
//! cannot set `LD_PRELOAD` (or any variable that changes how a program loads
//! or starts) for the program it was granted.
//!
//! The scenario needs its own `PATH` (the planted directory first), and the
//! environment is the whole process's: the test runs it in a child copy of
//! this test binary with that `PATH`, so no other test of the binary ever
//! sees it (they share one process and spawn programs through `PATH`).

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use serde_json::json;
use taskhost::config::Config;
use taskhost::setup::host_from_config;
use taskhost::tools::CallContext;

/// A producer entry serving the bash plugin as tool `tool`, running `shell`.
fn entry(tool: &str, shell: &str, programs: &str, env: &str) -> String {
    format!(
        "[[producer]]\ntool = \"{tool}\"\nplugin = \"builtin:bash\"\n\
         config = {{ shell = \"{shell}\", env = {{ {env} }} }}\n\
         [producer.grants.process]\nprograms = [{programs}]\n"
    )
}

/// The reply to a bash `command` through `tool`, or the error's text.
async fn reply(host: &taskhost::Host, agent: &taskhost::agents::Agent, tool: &str, command: &str) -> String {
    match host.call_tool(tool, json!({"command": command}), &CallContext::for_agent(agent)).await {
        Ok(reply) => reply.text,
        Err(error) => format!("{error:#}"),
    }
}

/// Set in the child that runs the scenario: the root of its planted files.
const CHILD_ROOT: &str = "TASKHOST_GRANT_PROGRAMS_ROOT";

#[test]
fn planted_programs_never_run_and_loader_variables_are_refused() {
    let root = std::env::temp_dir().join(format!("taskhost-grant-programs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let planted = root.join("bin");
    std::fs::create_dir_all(&planted).unwrap();
    let fake = planted.join("cat");
    std::fs::write(&fake, format!("#!/bin/sh\ntouch {}\n", root.join("planted-cat-ran").display())).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Like /tmp, or a shared tools directory: anyone can plant a file there.
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "grant_programs::scenario_with_a_planted_path", "--ignored", "--nocapture"])
        .env("PATH", format!("{}:/usr/bin:/bin", planted.display()))
        .env(CHILD_ROOT, &root)
        .output()
        .expect("run the scenario in a child");
    let stdout = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success() && stdout.contains("1 passed"),
        "the scenario failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&child.stderr)
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// The scenario, in the child [`planted_programs_never_run_and_loader_variables_are_refused`]
/// starts with the planted `PATH`; it does nothing when run otherwise.
/// Ignored so the runner does not start it alone: it needs a `PATH` set
/// before the process starts (a test cannot set its own), so the parent
/// test runs this binary again with `--ignored --exact` and that `PATH`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs in a child of planted_programs_never_run_and_loader_variables_are_refused"]
async fn scenario_with_a_planted_path() {
    let Some(root) = std::env::var_os(CHILD_ROOT).map(std::path::PathBuf::from) else { return };
    let planted = root.join("bin");
    let marker = root.join("planted-cat-ran");
    let fake = planted.join("cat");
    let real_cat = Path::new("/usr/bin/cat").canonicalize().unwrap();
    let cache = format!("[plugins]\ncache_dir = \"{}\"\n", root.join("cache").display());

    // A grant of `cat` resolves through the planted directory: refused at load.
    let config = Config::parse(&format!("{cache}{}", entry("cat", "cat", "\"cat\"", ""))).unwrap();
    let error = format!("{:#}", host_from_config(&config, &root).await.err().expect("the grant must not load"));
    assert!(
        error.contains(&format!("program \"cat\" resolves to {} through {}", fake.display(), planted.display()))
            && error.contains("writable by group or others")
            && error.contains("Name the absolute path"),
        "{error}"
    );

    // Granted by absolute path, a bare `cat` (found first in the planted
    // directory) is not the granted program; the absolute one runs the real cat.
    let real = real_cat.display();
    let config = Config::parse(&format!(
        "{cache}{}{}{}",
        entry("bare", "cat", &format!("\"{real}\""), ""),
        entry("absolute", &real.to_string(), &format!("\"{real}\""), ""),
        entry("preload", "bash", "\"/bin/bash\"", "LD_PRELOAD = \"/tmp/evil.so\""),
    ))
    .unwrap();
    let host = host_from_config(&config, &root).await.expect("absolute grants load");
    let agent = host.create_agent("agent", "session").unwrap();
    let call = |tool: &'static str| reply(&host, &agent, tool, "true");
    let bare = call("bare").await;
    assert!(
        bare.contains(&format!("it resolves to {}, which is not granted", fake.display())),
        "a bare name must not reach the planted program: {bare}"
    );
    let absolute = call("absolute").await;
    assert!(absolute.contains("exit code: 1") && absolute.contains("invalid option"), "the real cat ran: {absolute}");
    assert!(!marker.exists(), "the planted cat ran");

    let preload = call("preload").await;
    assert!(
        preload.contains("refuses environment variable \"LD_PRELOAD\"")
            && preload.contains("changes what the dynamic loader loads"),
        "{preload}"
    );
    host.dispose().await;
}

/// The grant's argument rules and the names a plugin may set come from the
/// configuration: a rule is checked at load (its key must be a `programs`
/// entry) and on every spawn; a config `env` entry needs its name listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argument_rules_and_plugin_env_names_come_from_the_configuration() {
    let root = std::env::temp_dir().join(format!("taskhost-grant-rules-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let cache = format!("[plugins]\ncache_dir = \"{}\"\n", root.join("cache").display());
    let rule = |tool: &str, key: &str, prefixes: &str| {
        format!(
            "{}[producer.grants.process.arguments.{key}]\nprefixes = [{prefixes}]\npatterns = [\"*\"]\n",
            entry(tool, "bash", "\"bash\"", "APP_MODE = \"on\"")
        )
        .replace("[producer.grants.process]\n", "[producer.grants.process]\nenv.plugin_may_set = [\"APP_*\"]\n")
    };

    let misnamed = Config::parse(&format!("{cache}{}", rule("misnamed", "sh", "[\"-c\"]"))).unwrap();
    let error = format!("{:#}", host_from_config(&misnamed, &root).await.err().expect("a rule must name a program"));
    assert!(error.contains("`arguments.\"sh\"` names no entry of `programs` (bash)"), "{error}");

    let config = Config::parse(&format!(
        "{cache}{}{}{}",
        rule("shell", "bash", "[\"-c\"]"),
        rule("login_only", "bash", "[\"-lc\"]"),
        entry("unlisted", "bash", "\"bash\"", "APP_MODE = \"on\""),
    ))
    .unwrap();
    let host = host_from_config(&config, &root).await.expect("the rules load");
    let agent = host.create_agent("agent", "session").unwrap();
    let call = |tool: &'static str| reply(&host, &agent, tool, "echo \"mode=$APP_MODE\"");
    let shell = call("shell").await;
    assert!(shell.starts_with("mode=on\n") && shell.contains("exit code: 0"), "rule and name allow it: {shell}");
    let login_only = call("login_only").await;
    assert!(
        login_only.contains("refuses these arguments to")
            && login_only.contains("do not begin with an allowed prefix")
            && login_only.contains("first arguments \"-lc\""),
        "{login_only}"
    );
    let unlisted = call("unlisted").await;
    assert!(
        unlisted.contains("does not let this plugin set environment variable \"APP_MODE\" (it may set: nothing)"),
        "{unlisted}"
    );
    host.dispose().await;
    std::fs::remove_dir_all(&root).unwrap();
}
