//! `ticker`: the reference taskhost producer. Copy it to start a plugin.
//!
//! It is written on the SDK's typed API: [`Ticker`] is a `Producer` with a
//! typed config and typed arguments (the tool's schema is derived from
//! [`TickerArgs`]), [`TickerTask`] a typed `Task`, and
//! `export_producer!(Ticker)` registers them. The model sees exactly what it
//! saw when this plugin hand-wrote its schema (`tests/tests/all/wasm_runtime.rs`
//! compares the whole tool definition).
//!
//! A ticker task emits `<message> <i>\n` for i = 1..=count, tick i being due
//! at `start + i * interval_ms` (so the first line comes one interval after
//! the start, and an interval of 0 makes every tick due at once).
//!
//! Invariants, shared exactly with the host's native twin of this kind so
//! that benchmarks compare like with like:
//! - Ticks are computed from the start instant, never from the previous
//!   tick, so they do not drift; whenever the host calls in late, every tick
//!   due by then is emitted at once. Nothing runs between calls: the host
//!   waits on the pollable from `subscribe`, which is the next tick's instant.
//! - After the last tick, `done` is `completed` with detail `ticks: <count>`
//!   (count 0 completes at once). `cancel` first emits the ticks already
//!   due, then stops: `done` is `killed` with `after <i> ticks`. A cancel
//!   after the last tick was due changes nothing (the work had finished).
//! - `read-output` is a consuming delta of the lines emitted so far.

use core::cell::RefCell;
use core::fmt::Write as _;

use taskhost_plugin_sdk::serde_json::{Value, json};
use taskhost_plugin_sdk::time::Instant;
use taskhost_plugin_sdk::typed::prelude::*;

const MAX_COUNT: u32 = 100_000;
const MAX_INTERVAL_MS: u64 = 3_600_000;
const DEFAULT_COUNT: u32 = 3;
const DEFAULT_INTERVAL_MS: u64 = 1_000;
const DEFAULT_MESSAGE: &str = "tick";
const NANOS_PER_MILLI: u64 = 1_000_000;

/// The instance config: the `config` table of a `[[producer]]` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TickerConfig {
    /// Replaces `"tick"` as the message when the arguments give none.
    default_message: Option<String>,
}

/// The tool arguments. Their derived schema (doc comments as descriptions,
/// the serde defaults, the ranges) is the tool's schema.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct TickerArgs {
    /// How many lines to emit.
    #[serde(default = "default_count")]
    #[schemars(range(max = MAX_COUNT))]
    count: u32,
    /// Milliseconds between two lines.
    #[serde(default = "default_interval_ms")]
    #[schemars(range(max = MAX_INTERVAL_MS))]
    interval_ms: u64,
    /// The text of each line, followed by its number.
    // A string in the schema (not `["string", "null"]`): leaving it out is
    // how the model asks for the default, which `adjust_schema` states.
    #[serde(default)]
    #[schemars(with = "String")]
    message: Option<String>,
}

fn default_count() -> u32 {
    DEFAULT_COUNT
}

fn default_interval_ms() -> u64 {
    DEFAULT_INTERVAL_MS
}

impl TickerConfig {
    fn message(&self) -> &str {
        self.default_message.as_deref().unwrap_or(DEFAULT_MESSAGE)
    }
}

impl TickerArgs {
    /// Range-checks the arguments. The host already validated them against
    /// the schema; checking again keeps the plugin correct on its own.
    fn check(&self) -> Result<(), String> {
        if self.count > MAX_COUNT {
            return Err(format!("invalid arguments: count must be at most {MAX_COUNT}, got {}", self.count));
        }
        if self.interval_ms > MAX_INTERVAL_MS {
            return Err(format!(
                "invalid arguments: interval_ms must be at most {MAX_INTERVAL_MS}, got {}",
                self.interval_ms
            ));
        }
        Ok(())
    }
}

struct Ticker;

impl Producer for Ticker {
    const KIND: &'static str = "ticker";
    const DESCRIPTION: &'static str = "Emits a numbered line every interval_ms milliseconds, count times. \
                                       A reference producer for taskhost plugin authors.";

    type Config = TickerConfig;
    type Args = TickerArgs;
    type Task = TickerTask;

    /// The message's default is the instance's.
    fn adjust_schema(config: &TickerConfig, schema: &mut Value) {
        schema["properties"]["message"]["default"] = json!(config.message());
    }

    fn label(_config: &TickerConfig, args: &TickerArgs) -> Result<String, String> {
        args.check()?;
        Ok(format!("{} ticks every {} ms", args.count, args.interval_ms))
    }

    fn run(config: TickerConfig, args: TickerArgs, _mode: RunMode) -> Result<TickerTask, String> {
        args.check()?;
        let message = args.message.unwrap_or_else(|| config.message().to_owned());
        Ok(TickerTask {
            count: args.count,
            interval_ns: args.interval_ms * NANOS_PER_MILLI,
            start: time::now(),
            message,
            progress: RefCell::new(Progress::default()),
        })
    }
}

/// One ticker task. The plan is fixed at `run`; only `progress` changes.
struct TickerTask {
    count: u32,
    interval_ns: u64,
    start: Instant,
    message: String,
    progress: RefCell<Progress>,
}

#[derive(Default)]
struct Progress {
    /// Ticks emitted so far (the last line written is `<message> <emitted>`).
    emitted: u32,
    cancelled: bool,
    output: OutputBuffer,
}

impl TickerTask {
    /// How many ticks are due at `now`: tick i is due at `start + i * interval`.
    fn ticks_due(&self, now: Instant) -> u32 {
        if self.interval_ns == 0 {
            return self.count;
        }
        let elapsed = now.saturating_sub(self.start);
        // Bounded by `count`, so the narrowing cannot truncate.
        (elapsed / self.interval_ns).min(u64::from(self.count)) as u32
    }

    /// The instant tick `i` is due. No overflow in range: 100 000 ticks of
    /// one hour is about 3.6e17 ns, far below `u64::MAX`.
    fn tick_instant(&self, tick: u32) -> Instant {
        self.start + u64::from(tick) * self.interval_ns
    }

    fn finished(&self, progress: &Progress) -> bool {
        progress.cancelled || progress.emitted == self.count
    }

    /// Emits every tick that is due now and not yet emitted. Called from
    /// each export, because nothing runs in the guest between calls.
    fn catch_up(&self, progress: &mut Progress) {
        // A finished task needs no clock reading (one host call saved).
        if !self.finished(progress) {
            self.emit_due(progress, time::now());
        }
    }

    /// Emits every tick due at `now` and not yet emitted.
    fn emit_due(&self, progress: &mut Progress, now: Instant) {
        if self.finished(progress) {
            return;
        }
        let due = self.ticks_due(now);
        while progress.emitted < due {
            progress.emitted += 1;
            // Writing into a String cannot fail.
            let _ = writeln!(progress.output, "{} {}", self.message, progress.emitted);
        }
    }
}

// `write_input` keeps its default: a ticker takes no input, and the SDK
// refuses it with `ticker tasks take no input` before it reaches the task.
impl Task for TickerTask {
    fn cancel(&self, reason: Option<String>) {
        let mut progress = self.progress.borrow_mut();
        // Ticks that were due before the cancel were emitted by then as far
        // as the model can tell; count them, as the native twin does.
        self.catch_up(&mut progress);
        if self.finished(&progress) {
            return;
        }
        progress.cancelled = true;
        log::debug!("cancelled after {} ticks: {}", progress.emitted, reason.as_deref().unwrap_or("no reason given"));
    }

    fn subscribe(&self) -> Pollable {
        let mut progress = self.progress.borrow_mut();
        self.catch_up(&mut progress);
        if self.finished(&progress) { time::ready_now() } else { time::at(self.tick_instant(progress.emitted + 1)) }
    }

    fn done(&self) -> Option<Outcome> {
        let mut progress = self.progress.borrow_mut();
        self.catch_up(&mut progress);
        if progress.cancelled {
            Some(Outcome::killed().with_detail(format!("after {} ticks", progress.emitted)))
        } else if progress.emitted == self.count {
            Some(Outcome::completed().with_detail(format!("ticks: {}", self.count)))
        } else {
            None
        }
    }

    fn read_output(&self) -> String {
        let mut progress = self.progress.borrow_mut();
        self.catch_up(&mut progress);
        progress.output.take()
    }
}

taskhost_plugin_sdk::export_producer!(Ticker);

// The tick arithmetic is pure, so it is tested natively:
// `cargo test --manifest-path plugins/Cargo.toml -p ticker`.
#[cfg(test)]
mod tests {
    use super::*;

    const START: Instant = 5_000_000_000;
    const MS: u64 = NANOS_PER_MILLI;

    fn task(count: u32, interval_ms: u64) -> TickerTask {
        TickerTask {
            count,
            interval_ns: interval_ms * MS,
            start: START,
            message: "tick".to_owned(),
            progress: RefCell::new(Progress::default()),
        }
    }

    #[test]
    fn tick_i_is_due_i_intervals_after_the_start() {
        let ticker = task(3, 100);
        assert_eq!(ticker.ticks_due(START), 0);
        assert_eq!(ticker.ticks_due(START + 100 * MS - 1), 0);
        assert_eq!(ticker.ticks_due(START + 100 * MS), 1);
        assert_eq!(ticker.ticks_due(START + 250 * MS), 2);
        assert_eq!(ticker.ticks_due(START + 3_600_000 * MS), 3, "capped at count");
        assert_eq!(ticker.tick_instant(1), START + 100 * MS);
        assert_eq!(ticker.tick_instant(3), START + 300 * MS);
    }

    #[test]
    fn a_late_poll_emits_every_due_tick_once() {
        let ticker = task(5, 10);
        let mut progress = Progress::default();
        ticker.emit_due(&mut progress, START + 35 * MS);
        assert_eq!(progress.output.take(), "tick 1\ntick 2\ntick 3\n");
        ticker.emit_due(&mut progress, START + 35 * MS);
        assert_eq!(progress.output.take(), "", "reads are consuming deltas");
        ticker.emit_due(&mut progress, START + 1_000 * MS);
        assert_eq!(progress.output.take(), "tick 4\ntick 5\n");
        assert!(ticker.finished(&progress));
    }

    #[test]
    fn a_zero_interval_makes_every_tick_due_at_the_start() {
        let ticker = task(2, 0);
        let mut progress = Progress::default();
        ticker.emit_due(&mut progress, START);
        assert_eq!(progress.output.take(), "tick 1\ntick 2\n");
    }

    /// The schema the model sees: the one this plugin hand-wrote before it
    /// moved to the typed SDK, with the instance's default message.
    #[test]
    fn the_derived_schema_is_the_hand_written_one() {
        let config = TickerConfig { default_message: Some("beat".into()) };
        let descriptor = taskhost_plugin_sdk::typed::descriptor::<Ticker>(&config).unwrap();
        assert_eq!(descriptor.kind, "ticker");
        assert!(descriptor.streams_output && !descriptor.takes_input);
        let schema: Value = taskhost_plugin_sdk::serde_json::from_str(&descriptor.parameters).unwrap();
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "count": {
                        "type": "integer", "minimum": 0, "maximum": MAX_COUNT, "default": DEFAULT_COUNT,
                        "description": "How many lines to emit."
                    },
                    "interval_ms": {
                        "type": "integer", "minimum": 0, "maximum": MAX_INTERVAL_MS, "default": DEFAULT_INTERVAL_MS,
                        "description": "Milliseconds between two lines."
                    },
                    "message": {
                        "type": "string", "default": "beat",
                        "description": "The text of each line, followed by its number."
                    }
                },
                "additionalProperties": false
            })
        );
    }

    #[test]
    fn a_cancelled_task_emits_nothing_more() {
        let ticker = task(5, 10);
        let mut progress = Progress::default();
        ticker.emit_due(&mut progress, START + 10 * MS);
        progress.cancelled = true;
        ticker.emit_due(&mut progress, START + 1_000 * MS);
        assert_eq!(progress.emitted, 1);
        assert_eq!(progress.output.take(), "tick 1\n");
    }
}
