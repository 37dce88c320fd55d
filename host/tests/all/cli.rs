//! The `taskhost` binary's own modes: the demo (the README's first command)
//! and the process-keeper mode (see `taskhost_process::keeper`), whose
//! working path the MCP and dev suites cover end to end (their bash tasks
//! all start through it).

use crate::common;

use std::process::Command;

/// Started with unusable keeper arguments, the binary says so and exits 126
/// (a shell's "cannot execute") instead of running as the CLI.
#[test]
fn the_keeper_mode_refuses_unusable_arguments_clearly() {
    for args in
        [&["--taskhost-process-keeper"][..], &["--taskhost-process-keeper", "x", "0", "0", "3", "-1", "/", "/bin/true"]]
    {
        let output = Command::new(env!("CARGO_BIN_EXE_taskhost")).args(args).output().expect("run taskhost");
        assert_eq!(output.status.code(), Some(126), "{args:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.starts_with("taskhost: the process keeper cannot start: bad keeper argument"), "{stderr}");
        assert!(output.stdout.is_empty(), "the keeper never writes to the command's stdout");
    }
    // A descriptor that was not inherited is named.
    let output = keeper(&["777", "-1"], "-");
    assert_eq!(output.status.code(), Some(126));
    assert!(String::from_utf8_lossy(&output.stderr).contains("descriptor 777 was not inherited"), "{output:?}");
    // A durable keeper's duties that were not handed over are named, and
    // nothing runs.
    let output = keeper(&["-1", "-1"], "99:1024:0");
    assert_eq!(output.status.code(), Some(126));
    assert!(String::from_utf8_lossy(&output.stderr).contains("was not inherited"), "{output:?}");
    // A malformed durable argument is refused as such.
    let output = keeper(&["-1", "-1"], "99:x:0");
    assert_eq!(output.status.code(), Some(126));
    assert!(String::from_utf8_lossy(&output.stderr).contains("bad keeper argument: the durable log cap"), "{output:?}");
}

/// The binary in keeper mode running `/bin/true` from `/`, with
/// `descriptors` (the lifeline and the ruleset) and `durable` (`-` or a
/// durable K's argument); the other fields say "none".
fn keeper(descriptors: &[&str; 2], durable: &str) -> std::process::Output {
    // ns_flags, loopback, lifeline, landlock, seccomp, nproc, data, nofile,
    // fsize, cgroups, mounts, durable, cwd, program, --, argv.
    let mut args = vec!["--taskhost-process-keeper", "0", "0", descriptors[0], descriptors[1]];
    args.extend(["0", "0", "0", "0", "0", "0", "-1", durable, "/", "/bin/true", "--", "true"]);
    Command::new(env!("CARGO_BIN_EXE_taskhost")).args(&args).output().expect("run taskhost")
}

/// The demo checks each step it narrates and fails loudly otherwise; here it
/// runs in its debug build from a clean directory.
#[test]
fn the_demo_runs_its_whole_story() {
    let dir = common::temp_dir("demo");
    let output = Command::new(env!("CARGO_BIN_EXE_taskhost"))
        .arg("demo")
        .current_dir(&dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .output()
        .expect("run taskhost demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    for line in [
        "reloaded ticker: v2 serving new starts; 2 tasks still on v1",
        "| my pid in my namespace: 2",
        "| [status: killed, signal: SIGTERM]",
        "notice → background task ticker-3",
        "(process trees still running under their keepers: 1)",
        "| bash-1 [bash] running — for i in $(seq 1 15)",
        "notice → background task bash-1 (bash: for i in $(seq 1 15)",
        "none lost or repeated; one notice)",
        "Done: every task ended the way its owner asked",
    ] {
        assert!(stdout.contains(line), "the demo did not say {line:?}:\n{stdout}");
    }
    // The restart scene's state directory is gone with the demo.
    let state = stdout
        .split_once("fresh state directory (")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(path, _)| std::path::PathBuf::from(path))
        .expect("the restart scene names its state directory");
    assert!(!state.exists(), "{} was left behind", state.display());
    let _ = std::fs::remove_dir_all(&dir);
}
