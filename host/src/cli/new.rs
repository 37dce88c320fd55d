//! `taskhost new <name> --lang rust`: a producer skeleton that builds and
//! passes `taskhost check` as written.
//!
//! Model: the skeleton is self-contained: it carries its own copy of this
//! host's `wit/` (embedded in the binary, so the contract version always
//! matches the host that wrote it) and generates its bindings with
//! `wit-bindgen` from crates.io; it needs nothing from this repository. It is
//! a streaming producer with cancel (numbered lines on a clock pollable), the
//! smallest plugin that shows the whole execution model. Nothing existing is
//! overwritten: the target directory must not exist.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::target::usage;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Lang {
    /// A Rust crate built for `wasm32-wasip2` with `wit-bindgen`.
    Rust,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Exit codes: 0 created; 1 the files could not be written; 2 a usage mistake.")]
pub struct NewArgs {
    /// The plugin's name: lowercase letters, digits and `-`, starting with a
    /// letter. Also its task kind and the directory it is created in.
    pub name: String,
    /// The language of the skeleton.
    #[arg(long, value_enum, default_value = "rust")]
    pub lang: Lang,
    /// Where to create it (default: `./<name>`).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// This host's contract, written into every skeleton.
const WIT: &[(&str, &str)] = &[
    ("producer.wit", include_str!("../../../wit/producer.wit")),
    ("process.wit", include_str!("../../../wit/process.wit")),
    ("subagents.wit", include_str!("../../../wit/subagents.wit")),
    ("deps/cli.wit", include_str!("../../../wit/deps/cli.wit")),
    ("deps/clocks.wit", include_str!("../../../wit/deps/clocks.wit")),
    ("deps/filesystem.wit", include_str!("../../../wit/deps/filesystem.wit")),
    ("deps/io.wit", include_str!("../../../wit/deps/io.wit")),
    ("deps/random.wit", include_str!("../../../wit/deps/random.wit")),
    ("deps/sockets.wit", include_str!("../../../wit/deps/sockets.wit")),
];

const CARGO_TOML: &str = r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"

[lib]
crate-type = ["cdylib"]          # a component is a cdylib

[dependencies]
wit-bindgen = { version = "0.63", default-features = false, features = ["macros", "realloc", "std"] }
serde_json = "1"

[profile.release]                # small components compile and load faster
opt-level = "s"
lto = true
strip = "debuginfo"
panic = "abort"

# Its own workspace, so it builds wherever it is created.
[workspace]
"#;

const LIB_RS: &str = r##"//! `{name}`: a taskhost producer plugin. It streams `count` numbered lines,
//! one every `interval_ms` milliseconds, and stops when cancelled.
//!
//! The execution model (see `wit/producer.wit`): every export returns at
//! once; the host waits on the pollable `subscribe` returns, then calls
//! `done` and `read-output`. Nothing runs between calls, so each call first
//! emits every line that is due by now.

use std::cell::RefCell;

wit_bindgen::generate!({ world: "plugin", path: "wit", generate_all });

use exports::taskhost::producer::producer::{Descriptor, Guest, GuestTask, RunMode, Task};
use taskhost::producer::types::{Outcome, TerminalStatus};
use wasi::clocks::monotonic_clock;
use wasi::io::poll::Pollable;

const KIND: &str = "{name}";
const DESCRIPTION: &str = "Emits a numbered line every interval_ms milliseconds, count times.";
/// The arguments' JSON Schema. Never declare `run_in_background`: the host adds it.
const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "count": {"type": "integer", "minimum": 0, "maximum": 1000, "default": 3, "description": "How many lines."},
    "interval_ms": {"type": "integer", "minimum": 0, "maximum": 60000, "default": 100, "description": "Milliseconds between lines."}
  },
  "additionalProperties": false
}"#;

struct Plugin;

impl Guest for Plugin {
    type Task = Lines;

    fn describe(_config: String) -> Result<Descriptor, String> {
        Ok(Descriptor {
            kind: KIND.into(),
            description: DESCRIPTION.into(),
            parameters: SCHEMA.into(),
            streams_output: true,
            takes_input: false,
        })
    }

    fn label(_config: String, args: String) -> Result<String, String> {
        let (count, interval_ms) = parse_args(&args)?;
        Ok(format!("{count} lines, one every {interval_ms} ms"))
    }

    fn run(_config: String, args: String, _mode: RunMode) -> Result<Task, String> {
        let (count, interval_ms) = parse_args(&args)?;
        Ok(Task::new(Lines {
            start: monotonic_clock::now(),
            count,
            interval_ns: interval_ms.saturating_mul(1_000_000),
            state: RefCell::new(State::default()),
        }))
    }
}

/// The arguments, already validated by the host against `SCHEMA`.
fn parse_args(args: &str) -> Result<(u64, u64), String> {
    let args: serde_json::Value = serde_json::from_str(args).map_err(|e| format!("invalid arguments: {e}"))?;
    let count = args.get("count").and_then(|v| v.as_u64()).unwrap_or(3);
    let interval_ms = args.get("interval_ms").and_then(|v| v.as_u64()).unwrap_or(100);
    Ok((count, interval_ms))
}

/// One task: its own instance, so its state lives here, not in globals.
struct Lines {
    start: monotonic_clock::Instant,
    count: u64,
    interval_ns: u64,
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    emitted: u64,
    cancelled: bool,
    /// Written but not yet read: `read-output` hands it over once.
    output: String,
}

impl Lines {
    /// When line `n` (from 1) is due: computed from the start, so no drift.
    fn due(&self, n: u64) -> monotonic_clock::Instant {
        self.start.saturating_add(n.saturating_mul(self.interval_ns))
    }

    /// Emits every line due by now.
    fn catch_up(&self) {
        let now = monotonic_clock::now();
        let mut state = self.state.borrow_mut();
        while !state.cancelled && state.emitted < self.count && self.due(state.emitted + 1) <= now {
            state.emitted += 1;
            let line = format!("line {}\n", state.emitted);
            state.output.push_str(&line);
        }
    }
}

impl GuestTask for Lines {
    fn cancel(&self, _reason: Option<String>) {
        self.catch_up();
        self.state.borrow_mut().cancelled = true;
    }

    fn subscribe(&self) -> Pollable {
        self.catch_up();
        let state = self.state.borrow();
        if state.cancelled || state.emitted >= self.count {
            return monotonic_clock::subscribe_duration(0);
        }
        monotonic_clock::subscribe_instant(self.due(state.emitted + 1))
    }

    fn done(&self) -> Option<Outcome> {
        self.catch_up();
        let state = self.state.borrow();
        let status = if state.cancelled {
            TerminalStatus::Killed
        } else if state.emitted >= self.count {
            TerminalStatus::Completed
        } else {
            return None;
        };
        Some(Outcome { status, detail: Some(format!("lines: {}", state.emitted)), output: None })
    }

    fn read_output(&self) -> String {
        self.catch_up();
        std::mem::take(&mut self.state.borrow_mut().output)
    }

    /// Only asked of kinds whose descriptor says `takes_input`.
    fn write_input(&self, _data: Vec<u8>, _close: bool) -> Result<(), String> {
        Err(format!("{KIND} tasks take no input"))
    }
}

export!(Plugin);
"##;

const README: &str = r#"# {name}

A taskhost producer plugin (Rust). Build, check and call it:

```sh
rustup target add wasm32-wasip2        # once per toolchain
cargo build --release --target wasm32-wasip2
taskhost check target/wasm32-wasip2/release/{file}.wasm
taskhost call target/wasm32-wasip2/release/{file}.wasm '{"count": 3}' --background
```

`wit/` is the contract of the taskhost that created this crate
(`taskhost:producer@0.2.0`); `src/lib.rs` implements it.
"#;

pub fn run(args: NewArgs) -> anyhow::Result<()> {
    let name = args.name.as_str();
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if !valid {
        usage!(
            "{name:?} is not a plugin name: use lowercase letters, digits and `-`, starting with a letter \
             (at most 64 bytes), like `my-producer`"
        );
    }
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from(name));
    if dir.exists() {
        usage!("{} already exists: choose another name or --dir (nothing is overwritten)", dir.display());
    }
    let file = name.replace('-', "_");
    match args.lang {
        Lang::Rust => {
            write(&dir, "Cargo.toml", &CARGO_TOML.replace("{name}", name))?;
            write(&dir, "src/lib.rs", &LIB_RS.replace("{name}", name))?;
            write(&dir, "README.md", &README.replace("{name}", name).replace("{file}", &file))?;
            write(&dir, ".gitignore", "/target\n")?;
            for (path, text) in WIT {
                write(&dir, &format!("wit/{path}"), text)?;
            }
        }
    }
    println!("created {} ({:?})", dir.display(), args.lang);
    println!("  cd {}", dir.display());
    println!("  cargo build --release --target wasm32-wasip2");
    println!("  taskhost check target/wasm32-wasip2/release/{file}.wasm");
    Ok(())
}

fn write(dir: &Path, relative: &str, text: &str) -> anyhow::Result<()> {
    let path = dir.join(relative);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
}
