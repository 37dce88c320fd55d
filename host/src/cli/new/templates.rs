//! The files of `taskhost new`'s skeletons, one set per language, with
//! `{name}` (and `{file}`, `{componentize_py}`) for what [`super::run`]
//! fills in. Every language writes the same plugin (see [`super`]).

pub(super) const CARGO_TOML: &str = r#"[package]
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

pub(super) const LIB_RS: &str = r##"//! `{name}`: a taskhost producer plugin. It streams `count` numbered lines,
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

pub(super) const README: &str = r#"# {name}

A taskhost producer plugin (Rust). Build, check and call it:

```sh
rustup target add wasm32-wasip2        # once per toolchain
cargo build --release --target wasm32-wasip2
taskhost check target/wasm32-wasip2/release/{file}.wasm
taskhost call target/wasm32-wasip2/release/{file}.wasm '{"count": 3}' --background
```

`wit/` is the contract of the taskhost that created this crate
(`taskhost:producer@0.2.2`); `src/lib.rs` implements it.
"#;

pub(super) const PY_APP: &str = r##""""`{name}`: a taskhost producer plugin. It streams `count` numbered lines,
one every `interval_ms` milliseconds, and stops when cancelled.

The execution model (see `wit/producer.wit`): every export returns at once;
never sleep or loop waiting. The host waits on the pollable `subscribe`
returns, then calls `done` and `read_output`. Nothing runs between calls, so
each call first emits every line that is due by now. An export's error is a
raised `Err("message")`.
"""

import json
from typing import Optional

import wit_world
from componentize_py_types import Err
from wit_world.exports import producer
from wit_world.imports import monotonic_clock, poll
from wit_world.imports.types import Descriptor, Outcome, RunMode, TerminalStatus

KIND = "{name}"
DESCRIPTION = "Emits a numbered line every interval_ms milliseconds, count times."
# The arguments' JSON Schema. Never declare `run_in_background`: the host adds it.
SCHEMA = {
    "type": "object",
    "properties": {
        "count": {"type": "integer", "minimum": 0, "maximum": 1000, "default": 3, "description": "How many lines."},
        "interval_ms": {"type": "integer", "minimum": 0, "maximum": 60000, "default": 100,
                        "description": "Milliseconds between lines."},
    },
    "additionalProperties": False,
}


def parse_args(args: str):
    """The arguments, already validated by the host against SCHEMA."""
    try:
        value = json.loads(args)
    except ValueError as error:
        raise Err(f"invalid arguments: {error}")
    return value.get("count", 3), value.get("interval_ms", 100)


class Producer(wit_world.exports.Producer):
    def describe(self, config: str) -> Descriptor:
        # streams-output: true; takes-input: false (no `interactive` offered).
        return Descriptor(KIND, DESCRIPTION, json.dumps(SCHEMA), True, False)

    def label(self, config: str, args: str) -> str:
        count, interval_ms = parse_args(args)
        return f"{count} lines, one every {interval_ms} ms"

    def run(self, config: str, args: str, mode: RunMode) -> producer.Task:
        count, interval_ms = parse_args(args)
        return Lines(count, interval_ms * 1_000_000)


class Lines(producer.Task):
    """One task: its own instance, so its state lives here, not in globals."""

    def __init__(self, count: int, interval_ns: int):
        self.start = monotonic_clock.now()
        self.count = count
        self.interval_ns = interval_ns
        self.emitted = 0
        self.cancelled = False
        self.output = ""

    def due(self, n: int) -> int:
        """When line `n` (from 1) is due: computed from the start, so no drift."""
        return self.start + n * self.interval_ns

    def catch_up(self) -> None:
        """Emits every line due by now."""
        now = monotonic_clock.now()
        while not self.cancelled and self.emitted < self.count and self.due(self.emitted + 1) <= now:
            self.emitted += 1
            self.output += f"line {self.emitted}\n"

    def cancel(self, reason: Optional[str]) -> None:
        self.catch_up()
        self.cancelled = True

    def subscribe(self) -> poll.Pollable:
        self.catch_up()
        if self.cancelled or self.emitted >= self.count:
            return monotonic_clock.subscribe_duration(0)
        return monotonic_clock.subscribe_instant(self.due(self.emitted + 1))

    def done(self) -> Optional[Outcome]:
        self.catch_up()
        if self.cancelled:
            status = TerminalStatus.KILLED
        elif self.emitted >= self.count:
            status = TerminalStatus.COMPLETED
        else:
            return None
        return Outcome(status, f"lines: {self.emitted}", None)

    def read_output(self) -> str:
        self.catch_up()
        text, self.output = self.output, ""
        return text

    def write_input(self, data: bytes, close: bool) -> None:
        # Only asked of kinds whose descriptor takes input; this one does not.
        raise Err(f"{KIND} tasks take no input")
"##;

pub(super) const PY_README: &str = r#"# {name}

A taskhost producer plugin (Python, built with componentize-py). Build,
check and call it:

```sh
python3 -m pip install componentize-py=={componentize_py}     # once
componentize-py -d wit -w process-plugin componentize app -o {name}.wasm
taskhost check {name}.wasm
taskhost call {name}.wasm '{"count": 3}' --background
```

`wit/` is the contract of the taskhost that created this directory
(`taskhost:producer@0.1.0`); `app.py` implements it. To see the generated
bindings (the `wit_world` package) for your editor:
`componentize-py -d wit -w process-plugin bindings bindings`.

componentize-py output differs on every build of the same source, so every
rebuild is a new plugin version to taskhost (and compiled afresh).
"#;

pub(super) const JS_INDEX: &str = r#"// `{name}`: a taskhost producer plugin. It streams `count` numbered lines,
// one every `interval_ms` milliseconds, and stops when cancelled.
//
// The execution model (see `wit/producer.wit`): every export returns at
// once; never wait in a loop or on a promise. The host waits on the pollable
// `subscribe` returns, then calls `done` and `readOutput`. Nothing runs
// between calls, so each call first emits every line that is due by now.
//
// ComponentizeJS's mapping of the WIT: the export `producer` is an object
// with the interface's functions and its resource as a class; an export's
// error is a thrown string; clock instants (u64) are BigInts; enums are
// their WIT names as strings.

import { now, subscribeDuration, subscribeInstant } from 'wasi:clocks/monotonic-clock@0.2.12';

const KIND = '{name}';
const DESCRIPTION = 'Emits a numbered line every interval_ms milliseconds, count times.';
// The arguments' JSON Schema. Never declare `run_in_background`: the host adds it.
const SCHEMA = {
  type: 'object',
  properties: {
    count: { type: 'integer', minimum: 0, maximum: 1000, default: 3, description: 'How many lines.' },
    interval_ms: { type: 'integer', minimum: 0, maximum: 60000, default: 100, description: 'Milliseconds between lines.' },
  },
  additionalProperties: false,
};

/** The arguments, already validated by the host against SCHEMA. */
function parseArgs(args) {
  let value;
  try {
    value = JSON.parse(args);
  } catch (error) {
    throw `invalid arguments: ${error.message}`;
  }
  return { count: value.count ?? 3, intervalMs: value.interval_ms ?? 100 };
}

/** One task: its own instance, so its state lives here, not in globals. */
class Lines {
  constructor(count, intervalMs) {
    this.start = now();
    this.count = count;
    this.intervalNs = BigInt(intervalMs) * 1000000n;
    this.emitted = 0;
    this.cancelled = false;
    this.output = '';
  }

  /** When line `n` (from 1) is due: computed from the start, so no drift. */
  due(n) {
    return this.start + BigInt(n) * this.intervalNs;
  }

  /** Emits every line due by now. */
  catchUp() {
    const at = now();
    while (!this.cancelled && this.emitted < this.count && this.due(this.emitted + 1) <= at) {
      this.emitted += 1;
      this.output += `line ${this.emitted}\n`;
    }
  }

  cancel(_reason) {
    this.catchUp();
    this.cancelled = true;
  }

  subscribe() {
    this.catchUp();
    if (this.cancelled || this.emitted >= this.count) return subscribeDuration(0n);
    return subscribeInstant(this.due(this.emitted + 1));
  }

  done() {
    this.catchUp();
    let status;
    if (this.cancelled) status = 'killed';
    else if (this.emitted >= this.count) status = 'completed';
    else return undefined;
    return { status, detail: `lines: ${this.emitted}` };
  }

  readOutput() {
    this.catchUp();
    const text = this.output;
    this.output = '';
    return text;
  }

  // Only asked of kinds whose descriptor takes input; this one does not.
  writeInput(_data, _close) {
    throw `${KIND} tasks take no input`;
  }
}

export const producer = {
  describe(_config) {
    return {
      kind: KIND, description: DESCRIPTION, parameters: JSON.stringify(SCHEMA), streamsOutput: true, takesInput: false,
    };
  },
  label(_config, args) {
    const { count, intervalMs } = parseArgs(args);
    return `${count} lines, one every ${intervalMs} ms`;
  },
  run(_config, args, _mode) {
    const { count, intervalMs } = parseArgs(args);
    return new Lines(count, intervalMs);
  },
  Task: Lines,
};
"#;

/// The skeleton's `package.json`: its name, version and dependencies must
/// match [`JS_LOCK`]'s root entry, or `npm ci` refuses the lockfile.
/// ComponentizeJS 0.23.0 imports `@bytecodealliance/preview2-shim` at run
/// time but declares it only as a development dependency, so it is listed
/// here (else `npm ci` leaves it out and the build fails to start).
pub(super) const JS_PACKAGE: &str = r#"{
  "name": "{name}",
  "version": "0.1.0",
  "private": true,
  "type": "module",
  "scripts": {
    "build": "componentize-js src/index.js --wit wit --world-name process-plugin -d http -d fetch-event -o {name}.wasm"
  },
  "devDependencies": {
    "@bytecodealliance/componentize-js": "0.23.0",
    "@bytecodealliance/preview2-shim": "0.25.0"
  }
}
"#;

/// The JavaScript example's lockfile (its name is replaced): the toolchain
/// CI builds and tests the example with.
pub(super) const JS_LOCK: &str = include_str!("../../../../plugins/examples/js-ticker/package-lock.json");

pub(super) const JS_README: &str = r#"# {name}

A taskhost producer plugin (JavaScript, built with ComponentizeJS). Build,
check and call it:

```sh
npm ci                 # installs ComponentizeJS as package-lock.json pins it
npm run build
taskhost check {name}.wasm
taskhost call {name}.wasm '{"count": 3}' --background
```

`wit/` is the contract of the taskhost that created this directory
(`taskhost:producer@0.1.0`); `src/index.js` implements it. The build
disables `http` and `fetch-event` (`-d http -d fetch-event`): taskhost
serves `wasi:http` only to a plugin granted `[producer.grants.http]`, and
refuses a component that imports it without the grant.

ComponentizeJS output differs on every build of the same source, so every
rebuild is a new plugin version to taskhost (and compiled afresh).
"#;

/// The JavaScript skeleton's lockfile: [`JS_LOCK`] under the skeleton's name.
pub(super) fn js_lock(name: &str) -> String {
    JS_LOCK.replacen("\"name\": \"js-ticker\"", &format!("\"name\": {name:?}"), 2)
}
