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
fn taskhost(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_taskhost"))
        .args(args)
        .current_dir(dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("run taskhost")
}

fn text(bytes: &[u8]) -> String {
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

/// `new --lang rust` writes a crate that builds for wasm32-wasip2 with a
/// plain cargo (its own WIT copy, nothing from this repository) and passes
/// `check`; its task streams and completes through `call`.
#[test]
fn new_rust_skeleton_builds_and_passes_check() {
    let dir = common::temp_dir("new-rust");
    let output = taskhost(&dir, &["new", "my-lines", "--lang", "rust"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(dir.join("my-lines/wit/producer.wit").is_file());

    // Nothing is overwritten, and a bad name is a usage mistake.
    assert_eq!(taskhost(&dir, &["new", "my-lines"]).status.code(), Some(2));
    assert_eq!(taskhost(&dir, &["new", "My Lines"]).status.code(), Some(2));

    // A target directory kept across runs, so only the first builds wit-bindgen.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("new-skeleton-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let build = Command::new(cargo)
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .current_dir(dir.join("my-lines"))
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo");
    assert!(build.status.success(), "the skeleton does not build: {}", text(&build.stderr));
    let wasm = target.join("wasm32-wasip2/release/my_lines.wasm");
    let wasm = wasm.to_str().unwrap();

    let check = taskhost(&dir, &["check", wasm]);
    assert_eq!(check.status.code(), Some(0), "{check:?}");
    assert!(text(&check.stdout).contains("\"name\": \"my-lines\""), "{check:?}");

    let call = taskhost(&dir, &["call", wasm, r#"{"count": 3, "interval_ms": 5}"#, "--background"]);
    assert_eq!(call.status.code(), Some(0), "{call:?}");
    assert!(text(&call.stdout).contains("line 1\nline 2\nline 3\n[status: completed, lines: 3]"), "{call:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `program args` in `dir`; a missing program fails with what to run.
fn run_tool(dir: &Path, program: &str, args: &[&str]) -> Output {
    match Command::new(program).env("PATH", common::tool_path()).args(args).current_dir(dir).output() {
        Ok(output) => output,
        Err(err) => panic!("cannot run {program} ({err}): install the plugin toolchains with .ci/setup"),
    }
}

/// Checks `wasm` (named `name`) and calls it in the background: it streams
/// three lines and completes, as every skeleton does.
fn assert_skeleton_works(dir: &Path, wasm: &Path, name: &str) {
    let wasm = wasm.to_str().unwrap();
    let check = taskhost(dir, &["check", wasm]);
    assert_eq!(check.status.code(), Some(0), "{check:?}");
    assert!(text(&check.stdout).contains(&format!("\"name\": \"{name}\"")), "{check:?}");
    let call = taskhost(dir, &["call", wasm, r#"{"count": 3, "interval_ms": 5}"#, "--background"]);
    assert_eq!(call.status.code(), Some(0), "{call:?}");
    assert!(text(&call.stdout).contains("line 1\nline 2\nline 3\n[status: completed, lines: 3]"), "{call:?}");
}

/// `new --lang python` writes a module that builds with the pinned
/// componentize-py, with the very command the binary prints, and passes
/// `check`; its task streams and completes through `call`. A missing
/// componentize-py fails the test (CI installs it with `.ci/setup`).
#[test]
fn new_python_skeleton_builds_and_passes_check() {
    let dir = common::temp_dir("new-python");
    let output = taskhost(&dir, &["new", "py-lines", "--lang", "python"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stdout = text(&output.stdout);
    let build = "componentize-py -d wit -w process-plugin componentize app -o py-lines.wasm";
    assert!(stdout.contains(build), "{stdout}");
    let skeleton = dir.join("py-lines");
    assert!(skeleton.join("wit/producer.wit").is_file() && skeleton.join("app.py").is_file());

    let version = run_tool(&skeleton, "componentize-py", &["--version"]);
    let pinned = format!("componentize-py {}", taskhost::cli::new::COMPONENTIZE_PY_VERSION);
    assert_eq!(text(&version.stdout).trim(), pinned, "run .ci/setup for the pinned componentize-py");
    let args: Vec<&str> = build.split(' ').skip(1).collect();
    let built = run_tool(&skeleton, "componentize-py", &args);
    assert!(built.status.success(), "the skeleton does not build: {}", text(&built.stderr));
    assert_skeleton_works(&dir, &skeleton.join("py-lines.wasm"), "py-lines");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `new --lang js` writes a package whose lockfile is the JavaScript
/// example's (so `npm ci` installs the toolchain CI tests), which builds
/// with `npm run build` and passes `check`. The example's installed
/// `node_modules` stands in for the skeleton's `npm ci` (the same lockfile
/// gives the same tree); a missing one fails the test (run `.ci/setup`).
#[test]
fn new_js_skeleton_builds_and_passes_check() {
    let dir = common::temp_dir("new-js");
    let output = taskhost(&dir, &["new", "js-lines", "--lang", "js"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stdout = text(&output.stdout);
    assert!(stdout.contains("npm ci\n  npm run build\n  taskhost check js-lines.wasm"), "{stdout}");
    let skeleton = dir.join("js-lines");

    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/examples/js-ticker");
    let lock = |path: &Path| {
        let lock: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        lock["packages"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| !k.is_empty())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        lock(&skeleton.join("package-lock.json")),
        lock(&example.join("package-lock.json")),
        "the skeleton pins the example's toolchain"
    );
    let modules = example.join("node_modules");
    assert!(
        modules.join(".bin/componentize-js").exists(),
        "ComponentizeJS is not installed in {}: run .ci/setup",
        example.display()
    );
    std::os::unix::fs::symlink(&modules, skeleton.join("node_modules")).unwrap();
    let built = run_tool(&skeleton, "npm", &["run", "build"]);
    assert!(built.status.success(), "the skeleton does not build: {}{}", text(&built.stdout), text(&built.stderr));
    assert_skeleton_works(&dir, &skeleton.join("js-lines.wasm"), "js-lines");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Copies the directory `from` to `to`, recursively (no `target`).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (path, name) = (entry.path(), entry.file_name());
        if name == "target" {
            continue;
        }
        if path.is_dir() {
            copy_dir(&path, &to.join(&name));
        } else {
            std::fs::copy(&path, to.join(&name)).unwrap();
        }
    }
}

/// The fenced blocks of `lang` in `text`, in order.
fn fenced<'a>(text: &'a str, lang: &str) -> Vec<&'a str> {
    let open = format!("```{lang}\n");
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&open) {
        let body = &rest[start + open.len()..];
        let end = body.find("```\n").expect("a fenced block is closed");
        blocks.push(&body[..end]);
        rest = &body[end..];
    }
    blocks
}

/// The plugin guide's typed producer, word for word: its `Cargo.toml` (the
/// git dependency pointed at this checkout's SDK, the only change) and
/// `src/lib.rs` build with section 2's command, `check` prints section 1's
/// tool definition, and section 3's `dev --script` smoke test runs as
/// printed. The SDK it builds is a copy of `plugins/sdk` alone, outside the
/// repository, with its own WIT.
#[test]
fn guide_typed_producer_works_word_for_word() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide = std::fs::read_to_string(root.join("plugins/sdk/README.md")).unwrap();
    let section = |from: &str, to: &str| {
        let start = guide.find(from).unwrap_or_else(|| panic!("no {from:?} in the guide"));
        let end = guide[start..].find(to).unwrap_or_else(|| panic!("no {to:?} after {from:?}")) + start;
        guide[start..end].to_string()
    };
    let create = section("## 1. Create the crate", "### 1b.");
    let manifest = fenced(&create, "toml")[0];
    let source = fenced(&create, "rust")[0];
    let shown: serde_json::Value = serde_json::from_str(fenced(&create, "json")[0]).expect("the guide's JSON");
    let build = section("## 2. Build", "## 3. Check");
    let build = fenced(&build, "sh")[0].lines().find(|l| l.starts_with("cargo build")).unwrap().to_string();
    let check = section("## 3. Check", "## 4. Configure");
    let smoke = fenced(&check, "sh").into_iter().find(|b| b.contains("--script")).expect("the script example");

    let dir = common::temp_dir("guide-typed");
    let krate = dir.join("my-timer");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    let git = "taskhost-plugin-sdk = { git = \"https://git.example/taskhost.git\" }";
    assert!(manifest.contains(git), "the guide's dependency line changed: update this test\n{manifest}");
    // The SDK directory alone, copied out of the repository: it must build
    // with nothing around it (what a git dependency relies on).
    let sdk = dir.join("sdk");
    copy_dir(&root.join("plugins/sdk"), &sdk);
    let manifest =
        manifest.replace(git, &format!("taskhost-plugin-sdk = {{ path = {:?} }}", sdk.display().to_string()));
    std::fs::write(krate.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(krate.join("src/lib.rs"), source).unwrap();
    // The guest workspace's versions, so the build needs nothing new.
    std::fs::copy(root.join("plugins/Cargo.lock"), krate.join("Cargo.lock")).unwrap();
    // A target directory kept across runs (only the first builds the
    // dependencies), where the guide's relative paths expect it.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("guide-typed-target");
    std::fs::create_dir_all(&target).unwrap();
    std::os::unix::fs::symlink(&target, krate.join("target")).unwrap();

    let mut words = build.split_whitespace();
    assert_eq!(words.next(), Some("cargo"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .args(words)
        .current_dir(&krate)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run cargo");
    assert!(built.status.success(), "the guide's producer does not build: {}", text(&built.stderr));

    let wasm = "target/wasm32-wasip2/release/my_timer.wasm";
    let checked = taskhost(&krate, &["check", wasm]);
    assert_eq!(checked.status.code(), Some(0), "{checked:?}");
    let stdout = text(&checked.stdout);
    let definition = stdout
        .split_once("as the model sees it:\n")
        .and_then(|(_, rest)| rest.split_once("\n\nok: "))
        .unwrap_or_else(|| panic!("no tool definition in:\n{stdout}"))
        .0;
    let mut definition: serde_json::Value = serde_json::from_str(definition).unwrap();
    let mut shown = shown;
    // The guide abridges the host's own text.
    for value in [&mut definition, &mut shown] {
        for option in ["run_in_background", "ttl_ms"] {
            value["inputSchema"]["properties"][option].as_object_mut().unwrap().remove("description");
        }
    }
    assert_eq!(definition, shown, "the guide shows another tool definition than check prints");

    let call = taskhost(&krate, &["call", wasm, r#"{"seconds": 0}"#, "--background", "--wait"]);
    assert_eq!(call.status.code(), Some(0), "{call:?}");
    assert!(text(&call.stdout).contains("rang after 0 s"), "{call:?}");

    // Section 3's script, run by a shell as printed, with this taskhost.
    let path = format!(
        "{}:{}",
        Path::new(env!("CARGO_BIN_EXE_taskhost")).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let smoked = Command::new("bash")
        .args(["-euc", smoke])
        .current_dir(&krate)
        .env("PATH", path)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("run bash");
    assert_eq!(smoked.status.code(), Some(0), "{smoked:?}");
    let stdout = text(&smoked.stdout);
    assert!(stdout.contains("> wait timer-1\ntimer-1 finished first\n"), "{stdout}");
    assert!(stdout.contains("> output timer-1\nrang after 1 s\n"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
