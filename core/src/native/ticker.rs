//! The native `ticker` kind, the in-process twin of `plugins/ticker`.
//!
//! Emits `<message> <i>\n` every `interval_ms`, `count` times, scheduled from
//! the start instant so ticks never drift; a late wake-up emits every tick
//! that is due. Completes with `ticks: <count>`; a cancel ends it as killed
//! with `after <i> ticks`. Output is a consuming stream.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::producer::{Descriptor, PreparedRun, Producer, RunMode, runner};
use crate::tasks::{OutputSignal, TaskControl, TaskHooks, TaskOutcome};

pub const KIND: &str = "ticker";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TickerArgs {
    #[serde(default = "default_count")]
    count: u64,
    #[serde(default = "default_interval")]
    interval_ms: u64,
    message: Option<String>,
}

fn default_count() -> u64 {
    3
}

fn default_interval() -> u64 {
    1000
}

/// Instance configuration: `{"default_message": "..."}`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TickerConfig {
    default_message: Option<String>,
}

/// The native ticker producer.
pub struct TickerProducer {
    descriptor: Arc<Descriptor>,
    default_message: String,
}

impl TickerProducer {
    /// Builds an instance from its JSON config (`{}` for the defaults).
    pub fn new(config: &serde_json::Value) -> anyhow::Result<Self> {
        let config: TickerConfig = if config.is_null() {
            TickerConfig::default()
        } else {
            serde_json::from_value(config.clone()).map_err(|e| anyhow::anyhow!("invalid ticker config: {e}"))?
        };
        Ok(Self {
            descriptor: Arc::new(descriptor()),
            default_message: config.default_message.unwrap_or_else(|| "tick".into()),
        })
    }
}

fn descriptor() -> Descriptor {
    Descriptor::new(KIND.to_string(), "Emits a numbered line every interval_ms milliseconds, count times. A reference producer for taskhost plugin authors."
            .to_string(), json!({
            "type": "object",
            "properties": {
                "count": {"type": "integer", "minimum": 0, "maximum": 100000, "default": 3, "description": "How many lines to emit."},
                "interval_ms": {"type": "integer", "minimum": 0, "maximum": 3600000, "default": 1000, "description": "Milliseconds between lines."},
                "message": {"type": "string", "default": "tick", "description": "The text of each line, before its number."}
            },
            "additionalProperties": false
        })).with_streams_output(true)
}

#[async_trait::async_trait]
impl Producer for TickerProducer {
    fn descriptor(&self) -> Arc<Descriptor> {
        self.descriptor.clone()
    }

    async fn prepare(&self, args: serde_json::Value, _mode: RunMode) -> anyhow::Result<PreparedRun> {
        let args: TickerArgs =
            serde_json::from_value(args).map_err(|e| anyhow::anyhow!("invalid ticker arguments: {e}"))?;
        let message = args.message.unwrap_or_else(|| self.default_message.clone());
        let label = format!("{} ticks every {} ms", args.count, args.interval_ms);
        Ok(PreparedRun::new(
            label,
            runner(async move { Ok(start(args.count, Duration::from_millis(args.interval_ms), message)) }),
        ))
    }
}

struct Ticker {
    state: Mutex<TickerState>,
    cancelled: Notify,
    output: std::sync::OnceLock<OutputSignal>,
}

#[derive(Default)]
struct TickerState {
    emitted: u64,
    cancelled: bool,
    unread: String,
}

impl Ticker {
    /// Emits every tick due by `now`; returns whether all are out.
    fn emit_due(&self, start: Instant, interval: Duration, count: u64, message: &str, now: Instant) -> bool {
        let due = if interval.is_zero() {
            count
        } else {
            let elapsed = now.saturating_duration_since(start).as_nanos() / interval.as_nanos();
            (elapsed as u64).min(count)
        };
        let (emitted_any, all_out) = {
            let mut state = self.state.lock().expect("ticker poisoned");
            let before = state.emitted;
            while state.emitted < due {
                state.emitted += 1;
                let line = format!("{message} {}\n", state.emitted);
                state.unread.push_str(&line);
            }
            (state.emitted > before, state.emitted == count)
        };
        if emitted_any && let Some(signal) = self.output.get() {
            signal.raise();
        }
        all_out
    }
}

fn start(count: u64, interval: Duration, message: String) -> TaskHooks {
    let ticker = Arc::new(Ticker {
        state: Mutex::new(TickerState::default()),
        cancelled: Notify::new(),
        output: std::sync::OnceLock::new(),
    });
    let driver = ticker.clone();
    let done = async move {
        let start = Instant::now();
        loop {
            if driver.emit_due(start, interval, count, &message, Instant::now()) {
                return Ok(TaskOutcome::completed(format!("ticks: {count}")));
            }
            let next = {
                let state = driver.state.lock().expect("ticker poisoned");
                if state.cancelled {
                    return Ok(TaskOutcome::killed(format!("after {} ticks", state.emitted)));
                }
                start + interval * (state.emitted as u32 + 1)
            };
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = driver.cancelled.notified() => {}
            }
        }
    };
    TaskHooks::new(ticker, Box::pin(done))
}

#[async_trait::async_trait]
impl TaskControl for Ticker {
    async fn cancel(&self, _reason: Option<&str>) -> anyhow::Result<()> {
        self.state.lock().expect("ticker poisoned").cancelled = true;
        // notify_one stores a permit, so a cancel between the driver's check
        // and its select is not lost.
        self.cancelled.notify_one();
        Ok(())
    }

    fn streams_output(&self) -> bool {
        true
    }

    async fn read_output(&self) -> anyhow::Result<String> {
        Ok(std::mem::take(&mut self.state.lock().expect("ticker poisoned").unread))
    }

    fn watch_output(&self, signal: OutputSignal) {
        let _ = self.output.set(signal);
    }
}
