//! The `taskhost` binary in process-keeper mode (see
//! `capabilities::process::keeper`): started with unusable arguments it says
//! so and exits 126, the code a shell uses for "cannot execute", instead of
//! running as the CLI. The working path is covered end to end by the MCP and
//! dev suites, whose bash tasks all start through it.

use std::process::Command;

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
    let output = Command::new(env!("CARGO_BIN_EXE_taskhost"))
        .args(["--taskhost-process-keeper", "0", "0", "0", "777", "-1", "/", "/bin/true", "--", "true"])
        .output()
        .expect("run taskhost");
    assert_eq!(output.status.code(), Some(126));
    assert!(String::from_utf8_lossy(&output.stderr).contains("descriptor 777 was not inherited"), "{output:?}");
}
