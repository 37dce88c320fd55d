//! `taskhost dev <plugin.wasm> --watch`, driven through stdin like a script:
//! a background task runs while the plugin file is replaced (written in
//! several steps, as a build does); the console reports one reload, new
//! starts use the new version, the old task completes on the old one, and a
//! half-written file is reported while the previous version keeps serving.

use crate::common;

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);

struct Console {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Console {
    /// `taskhost dev <plugin> <flags>`, with its compile cache in `dir`.
    fn start(plugin: &Path, dir: &Path, flags: &[&str]) -> Self {
        Self::start_binary(Path::new(env!("CARGO_BIN_EXE_taskhost")), plugin, dir, flags)
    }

    /// The same with another copy of the binary.
    fn start_binary(binary: &Path, plugin: &Path, dir: &Path, flags: &[&str]) -> Self {
        let mut child = Command::new(binary)
            .arg("dev")
            .arg(plugin)
            .args(flags)
            .current_dir(dir)
            .env("RUST_LOG", "warn")
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .env("XDG_STATE_HOME", common::state_home(dir))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn taskhost dev");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, stdin, lines, seen: Vec::new() }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to the console");
        self.stdin.flush().unwrap();
    }

    /// A line containing `needle` that was already printed, or the next one.
    /// For asynchronous lines (notices), which may come before or after
    /// the command output around them.
    fn saw_or_expect(&mut self, needle: &str) -> String {
        match self.seen.iter().find(|l| l.contains(needle)) {
            Some(line) => line.clone(),
            None => self.expect(needle),
        }
    }

    /// Waits for a line containing `needle`; returns it.
    fn expect(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => {
                    panic!("no line containing {needle:?} within {TIMEOUT:?}; console said:\n{}", self.seen.join("\n"))
                }
            }
        }
    }
}

#[test]
fn dev_watch_reloads_a_replaced_plugin_and_the_old_task_completes() {
    let dir = common::temp_dir("dev-watch");
    let plugin = dir.join("ticker.wasm");
    let v1 = common::rebuilt(taskhost::builtin::TICKER_WASM, "build 1");
    std::fs::write(&plugin, &v1).unwrap();

    let mut console = Console::start(&plugin, &dir, &["--watch"]);
    console.expect("serving ticker from");
    console.expect("watching for rebuilds");
    // Long enough to outlive two reloads on a loaded machine (at 150 ms a
    // tick, it sometimes finished before the first reload was served).
    console.send(r#"bg {"count": 8, "interval_ms": 1000}"#);
    console.expect("started background ticker task ticker-1");
    console.send("output ticker-1");
    console.expect("[status: running]");

    // A rebuild that writes the file in three steps: one reload, not three,
    // and never the half-written file.
    let v2 = common::rebuilt(taskhost::builtin::TICKER_WASM, "build 2");
    let mut file = std::fs::File::create(&plugin).unwrap();
    for chunk in v2.chunks(v2.len() / 3 + 1) {
        file.write_all(chunk).unwrap();
        file.flush().unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    drop(file);
    let reloaded = console.expect("reloaded ticker:");
    assert_eq!(reloaded, "[reload] reloaded ticker: v2 serving new starts; 1 task still on v1");

    console.send(r#"bg {"count": 2, "interval_ms": 10}"#);
    console.expect("started background ticker task ticker-2");
    console.send("list");
    let old = console.expect("ticker-1 [ticker]");
    assert!(old.contains("running") && old.contains("(v1 ticker@"), "{old}");
    let new = console.expect("ticker-2 [ticker]");
    assert!(new.contains("(v2 ticker@"), "{new}");

    // A half-written file is refused; v2 keeps serving.
    std::fs::write(&plugin, &v2[..v2.len() / 2]).unwrap();
    let failed = console.expect("[reload failed]");
    assert!(failed.contains("reload of ticker failed, v2 still serving") && failed.contains("truncated"), "{failed}");

    console.send("output ticker-1 --wait");
    let status = console.expect("[status: completed");
    assert_eq!(status, "[status: completed, ticks: 8]");
    let ticks: Vec<&String> = console.seen.iter().filter(|l| l.starts_with("tick ")).collect();
    // Every tick of the old task exactly once across the two reads (ticker-2
    // is never read, so its ticks are not among them).
    let expected: Vec<String> = (1..=8).map(|i| format!("tick {i}")).collect();
    assert_eq!(ticks, expected.iter().collect::<Vec<_>>());
    let notice = console.saw_or_expect("[notice] background task ticker-2");
    assert!(notice.ends_with("finished [status: completed, ticks: 2]. Read its output with task_output."), "{notice}");

    console.send("quit");
    console.expect("bye");
    let status = console.child.wait().expect("wait for taskhost dev");
    assert!(status.success(), "{status}");
    let reloads = console.seen.iter().filter(|l| l.starts_with("[reload]")).count();
    assert_eq!(reloads, 1, "{}", console.seen.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dev` serves a plugin with the grants `serve` would give it: the bash
/// plugin runs commands when granted `--program bash`, and without a grant
/// the console says what is missing.
#[test]
fn dev_grants_the_process_capability_like_serve() {
    let dir = common::temp_dir("dev-grant");
    let bash = Path::new(taskhost::builtin::BASH_PATH);

    let mut console = Console::start(bash, &dir, &["--program", "bash"]);
    console.expect("serving bash from");
    console.send(r#"call {"command": "echo from-dev; pwd"}"#);
    console.expect("from-dev");
    let pwd = console.expect("/");
    assert_eq!(Path::new(&pwd).canonicalize().unwrap(), dir.canonicalize().unwrap(), "runs in dev's directory");
    console.expect("[status: completed, exit code: 0]");
    console.send("quit");
    console.expect("bye");
    assert!(console.child.wait().unwrap().success());

    let mut console = Console::start(bash, &dir, &[]);
    console.expect("serving bash from");
    console.send(r#"call {"command": "echo hi"}"#);
    let error = console.expect("error:");
    assert!(error.contains("has no process grant"), "{error}");
    console.send("quit");
    console.expect("bye");
    assert!(console.child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A configuration's Landlock paths reach the tree when it starts from the
/// binary re-run as the keeper (the rules travel to it as a descriptor):
/// writes inside the read-write path work, and a file the tree's view shows
/// but the configuration's `read_only_paths` do not name cannot be read.
#[test]
fn dev_applies_a_configurations_landlock_paths() {
    if taskhost::process::confine::support().landlock_abi.is_none()
        && common::gap_accepted(
            "landlock",
            "this kernel has no Landlock",
            "run on Linux 5.13 or later with Landlock enabled",
        )
    {
        return;
    }
    let dir = common::temp_dir("dev-landlock");
    let config = dir.join("taskhost.toml");
    std::fs::write(
        &config,
        format!(
            "[[producer]]\ntool = \"bash\"\nplugin = \"builtin:bash\"\n[producer.grants.process]\n\
             programs = [\"bash\"]\nread_only_paths = [\"/usr\", \"/etc\", \"/bin\", \"/lib\", \"/lib64\"]\n\
             read_write_paths = [{dir:?}]\n"
        ),
    )
    .unwrap();
    // It lies where its trees write: trusted, as its author would.
    common::trust(&dir, &config);
    let mut console = Console::start(&config, &dir, &[]);
    console.expect("serving bash from");
    console.send(
        r#"call {"command": "echo in > inside.txt && echo wrote-inside; cat /sys/devices/system/cpu/online > /dev/null || echo refused-read"}"#,
    );
    console.expect("wrote-inside");
    console.expect("refused-read");
    console.send("quit");
    console.expect("bye");
    assert!(console.child.wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(dir.join("inside.txt")).unwrap(), "in\n");
    let _ = std::fs::remove_dir_all(&dir);
}

/// When the binary can no longer be executed (here: its file lost its
/// execute bit while it runs; in the field, a noexec mount), process trees
/// fall back to being forked from the host: commands keep working.
#[test]
fn process_trees_fall_back_to_fork_when_the_binary_cannot_be_run_again() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::temp_dir("dev-fallback");
    let copy = dir.join("taskhost-copy");
    std::fs::copy(env!("CARGO_BIN_EXE_taskhost"), &copy).unwrap();
    let mut console =
        Console::start_binary(&copy, Path::new(taskhost::builtin::BASH_PATH), &dir, &["--program", "bash"]);
    console.expect("serving bash from");
    console.send(r#"call {"command": "echo first-through-the-keeper"}"#);
    console.expect("first-through-the-keeper");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    console.send(r#"call {"command": "echo still-works"}"#);
    console.expect("still-works");
    console.expect("[status: completed, exit code: 0]");
    console.send("quit");
    console.expect("bye");
    assert!(console.child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}
