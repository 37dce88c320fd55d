//! What a plugin author builds from source, run as the real binary:
//! `taskhost new`'s skeletons (Rust, Python, JavaScript) build with their
//! own toolchains and pass `check` and `call`, and the plugin guide's typed
//! producer works word for word.

use crate::cli_plugin::{taskhost, text};
use crate::common;

use std::path::Path;
use std::process::{Command, Output};

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
