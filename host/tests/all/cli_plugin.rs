//! The plugin author's commands, run as the real binary: `taskhost check`
//! on the built ticker and on one component per author mistake (WAT text
//! components compiled here, each with the exact message it must get), and
//! `taskhost call` on the ticker in the foreground and the background;
//! `taskhost dev --script`; and `check` / `call` / `dev` on a stdout whose
//! reader has left.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The built ticker component (built by `host/build.rs`).
const TICKER: &str = taskhost::builtin::TICKER_PATH;

/// Runs the binary with a private compile cache.
pub(crate) fn taskhost(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_taskhost"))
        .args(args)
        .current_dir(dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("run taskhost")
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes a component compiled from WAT text into `dir`.
fn component(dir: &Path, name: &str, wat: &str) -> PathBuf {
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, wat::parse_str(wat).expect("valid WAT")).unwrap();
    path
}

/// The body of a component whose `export` has `describe` only.
fn describe_only_body(export: &str) -> String {
    format!(
        r#"(core module $m (func (export "f")))
           (core instance $i (instantiate $m))
           (func $f (canon lift (core func $i "f")))
           (instance $p (export "describe" (func $f)))
           (export "{export}" (instance $p))"#
    )
}

/// A component whose `export` has `describe` only.
fn only_describe(export: &str) -> String {
    format!("(component {})", describe_only_body(export))
}

/// `check` refuses `path` with exit code 1 and exactly `message` on stderr.
fn assert_refused(dir: &Path, path: &Path, message: &str) {
    let output = taskhost(dir, &["check", path.to_str().unwrap()]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{}: {output:?}", path.display());
    assert!(stderr.contains(message), "{}: wanted {message:?} in:\n{stderr}", path.display());
}

#[test]
fn check_describes_the_ticker_as_the_model_sees_it() {
    let dir = common::temp_dir("check-ticker");
    let output = taskhost(&dir, &["check", TICKER]);
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(stdout.contains(&format!("contract: {TICKER} fits taskhost:producer@0.2.2")), "{stdout}");
    assert!(stdout.contains("taskhost:producer/host-log@0.2.2"), "{stdout}");
    assert!(stdout.contains("\"name\": \"ticker\""), "{stdout}");
    assert!(stdout.contains("\"run_in_background\""), "the model's schema offers background runs:\n{stdout}");
    assert!(stdout.contains("\"interval_ms\""), "{stdout}");
    assert!(stdout.contains(&format!("ok: {TICKER} is a valid taskhost producer plugin")), "{stdout}");

    // The instance config reaches describe.
    let output = taskhost(&dir, &["check", TICKER, "--config", r#"{"default_message": "beat"}"#]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(text(&output.stdout).contains("\"default\": \"beat\""), "{output:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_names_each_author_mistake_and_what_to_change() {
    let dir = common::temp_dir("check-mistakes");
    let cases = [
        (
            "unknown-import",
            r#"(component (import "acme:secret/vault@1.0.0" (instance (export "open" (func)))))"#.to_string(),
            "the component imports `acme:secret/vault@1.0.0`, which taskhost does not provide; taskhost provides wasi:io",
        ),
        (
            "componentize-js-default",
            r#"(component (import "wasi:http/types@0.2.3" (instance (export "f" (func)))))"#.to_string(),
            "it imports `wasi:http/types@0.2.3`, which its configuration does not grant: add \
             [producer.grants.http] to its [[producer]] entry (with the origins it may reach, e.g. \
             `grants.http = { origins = [\"https://api.example.com\"] }`; a component that does not mean to use \
             HTTP should not import it (ComponentizeJS adds it by default: build with `-d http -d fetch-event`))",
        ),
        (
            "wasi-0.3",
            r#"(component (import "wasi:io/poll@0.3.0" (instance)))"#.to_string(),
            "the component imports `wasi:io/poll@0.3.0` (wasi:io@0.3.0); this host speaks WASI 0.2.x",
        ),
        (
            "newer-contract",
            format!(
                r#"(component
                     (import "taskhost:producer/host-log@0.3.0" (instance (export "log" (func (param "m" string)))))
                     {})"#,
                describe_only_body("taskhost:producer/producer@0.3.0")
            ),
            "the component was built against taskhost:producer@0.3.0; this host speaks 0.1.x and 0.2.x \
             (newest: taskhost:producer/producer@0.2.2)",
        ),
        (
            "missing-functions",
            only_describe("taskhost:producer/producer@0.2.0"),
            "the export `taskhost:producer/producer@0.2.0` lacks `label`, `run`, `[method]task.cancel`, \
             `[method]task.subscribe`, `[method]task.done`, `[method]task.read-output`, `[method]task.write-input` \
             of the contract",
        ),
        (
            "missing-functions-0.1",
            only_describe("taskhost:producer/producer@0.1.0"),
            "the export `taskhost:producer/producer@0.1.0` lacks `label`, `run`, `[method]task.cancel`, \
             `[method]task.subscribe`, `[method]task.done`, `[method]task.read-output` of the contract",
        ),
        (
            "wrong-world",
            only_describe("taskhost:wrong/thing"),
            "the component does not export `taskhost:producer/producer@0.2.2`, so it is not a taskhost producer \
             (world `taskhost:producer/plugin`); it exports `taskhost:wrong/thing`",
        ),
        (
            "two-problems",
            r#"(component
                 (import "wasi:io/poll@0.3.0" (instance))
                 (import "acme:kv/store@1.0.0" (instance)))"#
                .to_string(),
            "the component does not fit the taskhost `plugin` world (3 problems):\n- the component imports \
             `wasi:io/poll@0.3.0`",
        ),
        (
            "core-module",
            "(module)".to_string(),
            "this is a core WebAssembly module, not a component: build the plugin for the `wasm32-wasip2` target",
        ),
    ];
    for (name, wat, message) in &cases {
        let path = component(&dir, name, wat);
        assert_refused(&dir, &path, message);
    }

    let not_wasm = dir.join("script.wasm");
    std::fs::write(&not_wasm, "#!/bin/sh\necho hi\n").unwrap();
    assert_refused(&dir, &not_wasm, "not a WebAssembly file: it does not start with the `\\0asm` magic number");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plugin importing a capability its configuration does not grant is
/// refused by `check` before compiling, with the grant to add; the built
/// subagent plugin, checked as a bare file (granted nothing), is one.
#[test]
fn check_refuses_a_capability_the_configuration_does_not_grant() {
    let dir = common::temp_dir("check-grants");
    assert_refused(
        &dir,
        Path::new(taskhost::builtin::SUBAGENT_PATH),
        "it imports `taskhost:producer/subagents@0.2.2`, which its configuration does not grant: add \
         [producer.grants.subagents] to its [[producer]] entry",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_exit_codes_tell_usage_mistakes_from_invalid_plugins() {
    let dir = common::temp_dir("check-usage");
    let missing = taskhost(&dir, &["check", "nowhere.wasm"]);
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    assert!(text(&missing.stderr).contains("nowhere.wasm does not exist"), "{missing:?}");

    let bad_config = taskhost(&dir, &["check", TICKER, "--config", "[1]"]);
    assert_eq!(bad_config.status.code(), Some(2), "{bad_config:?}");
    assert!(text(&bad_config.stderr).contains("--config must be a JSON object"), "{bad_config:?}");

    // A config the plugin refuses is the plugin's answer: invalid, exit 1.
    let refused = taskhost(&dir, &["check", TICKER, "--config", r#"{"nope": 1}"#]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(text(&refused.stderr).contains("refused its config in describe"), "{refused:?}");

    let help = taskhost(&dir, &["check", "--help"]);
    assert!(text(&help.stdout).contains("Exit codes: 0 the plugin is valid; 1 it is not"), "{help:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dev_errors_on_a_bare_wasm_name_the_file_not_a_producer_entry() {
    let dir = common::temp_dir("dev-bare");
    let path = component(&dir, "missing-functions", &only_describe("taskhost:producer/producer@0.1.0"));
    let output = Command::new(env!("CARGO_BIN_EXE_taskhost"))
        .args(["dev", path.to_str().unwrap()])
        .current_dir(&dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("XDG_STATE_HOME", common::state_home(&dir))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run taskhost dev");
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(stderr.contains(&format!("cannot load plugin {}", path.display())), "{stderr}");
    assert!(!stderr.contains("[[producer]]"), "names an entry the author never wrote: {stderr}");

    // A config the plugin refuses: the error names the plugin file too.
    let output = Command::new(env!("CARGO_BIN_EXE_taskhost"))
        .args(["dev", TICKER, "--config", r#"{"nope": 1}"#])
        .current_dir(&dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("XDG_STATE_HOME", common::state_home(&dir))
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run taskhost dev");
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr.contains(&format!(
            "taskhost: error: plugin {TICKER}: plugin ticker refused its config in describe: invalid config: unknown \
             field `nope`"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("[[producer]]"), "names an entry the author never wrote: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dev --script` with the script on stdin (`-`) or in a file.
fn dev_script(dir: &Path, script: &str, stdin_script: bool) -> Output {
    use std::io::Write as _;
    let file = dir.join("script.txt");
    std::fs::write(&file, script).unwrap();
    let source = if stdin_script { "-" } else { "script.txt" };
    let mut child = Command::new(env!("CARGO_BIN_EXE_taskhost"))
        .args(["dev", TICKER, "--script", source])
        .current_dir(dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run taskhost dev");
    let mut stdin = child.stdin.take().unwrap();
    if stdin_script {
        stdin.write_all(script.as_bytes()).unwrap();
    }
    drop(stdin);
    child.wait_with_output().expect("wait for taskhost dev")
}

/// Script mode runs each command to its end before the next (a `bg`, a
/// `wait` for it, then its whole output), echoes each, and exits 0; no
/// sleep anywhere.
#[test]
fn dev_script_runs_each_command_to_its_end_in_order() {
    let dir = common::temp_dir("dev-script");
    let script = "\
# a comment, then a blank line

call {\"count\": 2, \"interval_ms\": 1, \"message\": \"fg\"}
bg {\"count\": 3, \"interval_ms\": 10, \"message\": \"bg\"}
wait ticker-1
output ticker-1
list
";
    for stdin_script in [false, true] {
        let output = dev_script(&dir, script, stdin_script);
        let stdout = text(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        let expected = "\
> call {\"count\": 2, \"interval_ms\": 1, \"message\": \"fg\"}
fg 1
fg 2
[status: completed, ticks: 2]
> bg {\"count\": 3, \"interval_ms\": 10, \"message\": \"bg\"}
started background ticker task ticker-1
> wait ticker-1
ticker-1 finished first
ticker-1 [ticker] completed — 3 ticks every 10 ms
";
        assert!(stdout.contains(expected), "stdin: {stdin_script}; wanted\n{expected}\nin:\n{stdout}");
        let rest = stdout.split_once(expected).unwrap().1;
        // The completion notice may come before `output` or after it (it
        // is printed when it has arrived); everything else is in order.
        let rest: String = rest.lines().filter(|l| !l.starts_with("[notice]")).map(|l| format!("{l}\n")).collect();
        assert!(
            rest.starts_with("> output ticker-1\nbg 1\nbg 2\nbg 3\n[status: completed, ticks: 3]\n> list\nticker-1 [ticker] completed"),
            "{stdout}"
        );
        assert!(rest.ends_with("bye\n"), "{stdout}");
        assert!(!stdout.contains("type `help`"), "no prompt text in a script: {stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The first command that fails stops the script: exit 1, the line on
/// stderr, nothing after it run, every task disposed. A missing script is a
/// usage mistake.
#[test]
fn dev_script_stops_at_the_first_error() {
    let dir = common::temp_dir("dev-script-error");
    let script = "\
bg {\"count\": 1000, \"interval_ms\": 60000}
call {\"count\": \"three\"}
list
";
    for stdin_script in [false, true] {
        let output = dev_script(&dir, script, stdin_script);
        let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        let source = if stdin_script { "stdin" } else { "script.txt" };
        assert!(
            stderr.contains(&format!("taskhost: error: script {source} line 2: call {{\"count\": \"three\"}}: ")),
            "{stderr}"
        );
        assert!(stderr.contains("at /count"), "{stderr}");
        assert!(!stdout.contains("> list"), "nothing runs after the failure: {stdout}");
        assert!(stdout.ends_with("stopping 1 running task\nbye\n"), "{stdout}");
    }

    // An error answer of a tool fails the script too.
    let output = dev_script(&dir, "kill ticker-9\nlist\n", false);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(text(&output.stderr).contains("script script.txt line 1: kill ticker-9: "), "{output:?}");
    assert!(!text(&output.stdout).contains("> list"), "{output:?}");

    let output = Command::new(env!("CARGO_BIN_EXE_taskhost"))
        .args(["dev", TICKER, "--script", "nowhere.txt"])
        .current_dir(&dir)
        .output()
        .expect("run taskhost dev");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(text(&output.stderr).contains("cannot read the script nowhere.txt"), "{output:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the binary with stdout a pipe whose reader has already left, as
/// after `| head -1`: the first write fails with `EPIPE`.
fn with_closed_stdout(dir: &Path, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let child = Command::new(env!("CARGO_BIN_EXE_taskhost"))
        .args(args)
        .current_dir(dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run taskhost");
    child.wait_with_output().expect("wait for taskhost")
}

/// `check` and `call` on a closed stdout stop quietly with 141 (what a
/// shell reports for a program `SIGPIPE` killed), without a panic; a
/// background task of `call` is killed with the host (the call returns
/// although its task would tick for 100 s). `dev` goes on and ends as usual.
#[test]
fn a_closed_stdout_ends_check_and_call_quietly() {
    let dir = common::temp_dir("closed-stdout");
    let cases: [&[&str]; 3] = [
        &["check", TICKER],
        &["call", TICKER, r#"{"count": 2, "interval_ms": 1}"#],
        &["call", TICKER, r#"{"count": 100000, "interval_ms": 1}"#, "--background"],
    ];
    for args in cases {
        let output = with_closed_stdout(&dir, args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(141), "{args:?}: {output:?}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(!stderr.contains("error"), "{args:?}: nothing to say, no one to say it to: {stderr}");
    }

    std::fs::write(dir.join("script.txt"), "call {\"count\": 1, \"interval_ms\": 0}\nlist\n").unwrap();
    let output = with_closed_stdout(&dir, &["dev", TICKER, "--script", "script.txt"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(!text(&output.stderr).contains("panicked"), "{output:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn call_runs_the_ticker_in_the_foreground() {
    let dir = common::temp_dir("call-fg");
    let output = taskhost(&dir, &["call", TICKER, r#"{"count": 3, "interval_ms": 5, "message": "fg"}"#]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stdout = text(&output.stdout);
    assert!(stdout.contains("fg 1\nfg 2\nfg 3"), "{stdout}");
    assert!(stdout.contains("[status: completed, ticks: 3]"), "{stdout}");

    // Arguments the schema refuses: the tool's answer, exit 1.
    let output = taskhost(&dir, &["call", TICKER, r#"{"count": "three"}"#]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let said = text(&output.stdout) + &text(&output.stderr);
    assert!(said.contains("at /count"), "the argument error names its location: {said}");

    // Not JSON: a usage mistake.
    let output = taskhost(&dir, &["call", TICKER, "{count: 3}"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(text(&output.stderr).contains("the arguments are not JSON"), "{output:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn call_in_the_background_streams_until_the_end() {
    let dir = common::temp_dir("call-bg");
    let output =
        taskhost(&dir, &["call", TICKER, r#"{"count": 4, "interval_ms": 20, "message": "bg"}"#, "--background"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stdout = text(&output.stdout);
    assert!(stdout.contains("ticker-1"), "the start answer names the task: {stdout}");
    let ticks =
        stdout.find("bg 1\nbg 2\nbg 3\nbg 4\n").unwrap_or_else(|| panic!("every tick, once, in order: {stdout}"));
    assert_eq!(stdout.matches("bg 1\n").count(), 1, "{stdout}");
    let status = stdout.find("[status: completed, ticks: 4]").unwrap_or_else(|| panic!("{stdout}"));
    assert!(ticks < status, "the status line comes last: {stdout}");

    // --wait: one task_output that waits for the end, as the model reads it.
    let output = taskhost(
        &dir,
        &["call", TICKER, r#"{"count": 2, "interval_ms": 20, "message": "w"}"#, "--background", "--wait"],
    );
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(text(&output.stdout).contains("w 1\nw 2\n[status: completed, ticks: 2]"), "{output:?}");

    // --wait without --background is a usage mistake.
    let output = taskhost(&dir, &["call", TICKER, "{}", "--wait"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
