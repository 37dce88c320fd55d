//! Hot-reload benchmark with the real `ticker` plugin.
//!
//! Run: `cargo bench -p taskhost --bench reload`
//!
//! Measures, in one run:
//! - file change → new version serving, through the file watcher, for each
//!   way a build lands on the file (`std::fs::write`; a rename onto it; the
//!   old name removed and the build hard-linked, as cargo does), with the
//!   default options (a complete write reloads after a 5 ms coalescing
//!   window) and, as the baseline of the same run, with every change
//!   debounced (`WatchOptions::debounce_only`: 40 ms of quiet + 20 ms
//!   settle, the watcher before complete writes were recognized), in
//!   interleaved rounds; for builds whose compiled code is in the cache and
//!   for new builds (compiled now); also the load → swap time alone (what a
//!   reload costs without the watcher);
//! - `Host::call_tool` background start latency (p50/p99) with no reloads,
//!   while the plugin is reloaded back to back with cached builds (the worst
//!   case: a reload loop owns one of the two cores), and at the watcher's
//!   a rebuild rate (one reload per 200 ms) alternating
//!   cached and freshly compiled builds, in interleaved rounds of the same
//!   run, and the p99 ratios against no reloads.
//!
//! "Rebuilds" are the embedded ticker with a custom section appended: a new
//! content hash (so a real compile unless cached), the same behaviour.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use taskhost::Host;
use taskhost::plugin::{CompileSource, PluginEngine, PluginRuntimeConfig};
use taskhost::reload::{ReloadEvent, ReloadablePlugin, WatchOptions};
use taskhost::settings::TasksSettings;
use taskhost::tools::CallContext;
use taskhost::tools::producer_tool::ProducerToolOptions;

const WASM: &[u8] = taskhost::builtin::TICKER_WASM;

fn rebuilt(tag: &str) -> Vec<u8> {
    const NAME: &[u8] = b"taskhost-bench-build";
    let mut payload = vec![NAME.len() as u8];
    payload.extend_from_slice(NAME);
    payload.extend_from_slice(tag.as_bytes());
    assert!(payload.len() < 128);
    let mut out = WASM.to_vec();
    out.push(0);
    out.push(payload.len() as u8);
    out.extend_from_slice(&payload);
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// How the new build lands on the watched file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Landing {
    /// `std::fs::write`: truncate, write, close.
    Write,
    /// Written next to it, then renamed onto it (`cp` + `mv`, atomic writers).
    Rename,
    /// The old name removed, then a hard link of the built file (cargo).
    HardLink,
}

struct Variant {
    name: &'static str,
    landing: Landing,
    /// Complete writes recognized (the default) or every change debounced.
    fast: bool,
    cached: bool,
    per_round: usize,
    /// The variant this one is compared with.
    baseline: Option<usize>,
}

const VARIANTS: [Variant; 8] = [
    Variant {
        name: "cached, write, debounced (baseline)",
        landing: Landing::Write,
        fast: false,
        cached: true,
        per_round: 2,
        baseline: None,
    },
    Variant {
        name: "cached, write",
        landing: Landing::Write,
        fast: true,
        cached: true,
        per_round: 2,
        baseline: Some(0),
    },
    Variant {
        name: "cached, rename, debounced (baseline)",
        landing: Landing::Rename,
        fast: false,
        cached: true,
        per_round: 2,
        baseline: None,
    },
    Variant {
        name: "cached, rename",
        landing: Landing::Rename,
        fast: true,
        cached: true,
        per_round: 2,
        baseline: Some(2),
    },
    Variant {
        name: "cached, hard link (cargo), debounced (baseline)",
        landing: Landing::HardLink,
        fast: false,
        cached: true,
        per_round: 2,
        baseline: None,
    },
    Variant {
        name: "cached, hard link (cargo)",
        landing: Landing::HardLink,
        fast: true,
        cached: true,
        per_round: 2,
        baseline: Some(4),
    },
    Variant {
        name: "uncached, write, debounced (baseline)",
        landing: Landing::Write,
        fast: false,
        cached: false,
        per_round: 1,
        baseline: None,
    },
    Variant {
        name: "uncached, write",
        landing: Landing::Write,
        fast: true,
        cached: false,
        per_round: 1,
        baseline: Some(6),
    },
];
const ROUNDS: usize = 5;

struct Run {
    variant: usize,
    serving_after: Duration,
    took: Duration,
}

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

async fn bench() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("taskhost-reload-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let engine = PluginEngine::new(PluginRuntimeConfig {
        cache_dir: Some(dir.join("cache")),
        max_live_stores: 1024,
        ..PluginRuntimeConfig::default()
    })?;
    let host = Host::new(&TasksSettings { max_live_tasks_per_owner: 100_000, ..TasksSettings::default() })?;
    let agent = host.create_agent("bench", "bench")?;
    let file = dir.join("ticker.wasm");
    std::fs::write(&file, rebuilt("initial"))?;
    let options =
        ProducerToolOptions::new("ticker").with_foreground_timeout(Duration::from_secs(60)).with_promote_after(None);
    let plugin = ReloadablePlugin::serve(&host, &engine, engine.load_file(&file).await?, json!({}), options).await?;

    // 1. File change → serving, through the watcher: each way of landing
    // the file, with complete writes recognized (the default) and with
    // every change debounced (the watcher before complete writes were
    // recognized: the baseline), in interleaved rounds of the same run.
    let mut events = plugin.subscribe();
    // Two builds whose compiled code gets cached on their first load.
    let cached = [rebuilt("cached A"), rebuilt("cached B")];
    for bytes in &cached {
        engine.load_bytes("ticker", bytes.clone()).await?;
    }
    let deps = dir.join("deps");
    std::fs::create_dir_all(&deps)?;
    let nonce = std::process::id();
    let mut runs: Vec<Run> = Vec::new();
    let mut n = 0usize;
    for round in 0..ROUNDS {
        for (variant, spec) in VARIANTS.iter().enumerate() {
            let options = if spec.fast { WatchOptions::default() } else { WatchOptions::debounce_only() };
            let watch = taskhost::reload::watch(plugin.clone(), &file, options)?;
            for i in 0..spec.per_round {
                n += 1;
                let bytes = if spec.cached {
                    cached[n % 2].clone()
                } else {
                    rebuilt(&format!("fresh {nonce} {round} {variant} {i}"))
                };
                let expect = if spec.cached { CompileSource::Cache } else { CompileSource::Compiled };
                // Prepared before the clock starts: the build tool's own work.
                let staged = match spec.landing {
                    Landing::Write => None,
                    Landing::Rename => {
                        let temp = dir.join(".ticker.wasm.tmp");
                        std::fs::write(&temp, &bytes)?;
                        Some(temp)
                    }
                    Landing::HardLink => {
                        let built = deps.join(format!("ticker-{n}.wasm"));
                        std::fs::write(&built, &bytes)?;
                        Some(built)
                    }
                };
                let written = Instant::now();
                match (spec.landing, &staged) {
                    (Landing::Write, _) => std::fs::write(&file, &bytes)?,
                    (Landing::Rename, Some(temp)) => std::fs::rename(temp, &file)?,
                    (Landing::HardLink, Some(built)) => {
                        std::fs::remove_file(&file)?;
                        std::fs::hard_link(built, &file)?;
                    }
                    _ => unreachable!(),
                }
                let event = tokio::time::timeout(Duration::from_secs(30), events.recv()).await??;
                let serving_after = written.elapsed();
                let ReloadEvent::Reloaded(reloaded) = event else { anyhow::bail!("reload failed: {event}") };
                anyhow::ensure!(reloaded.compile == expect, "expected {expect:?}, got {:?}", reloaded.compile);
                runs.push(Run { variant, serving_after, took: reloaded.took });
                if let (Landing::HardLink, Some(built)) = (spec.landing, staged) {
                    std::fs::remove_file(built)?;
                }
                // Pacing: let the watcher go idle before the next change.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            drop(watch);
        }
    }
    let pick = |variant: usize, which: fn(&Run) -> Duration| {
        median(runs.iter().filter(|r| r.variant == variant).map(which).collect())
    };
    let change: Vec<Duration> = (0..VARIANTS.len()).map(|v| pick(v, |r| r.serving_after)).collect();
    let swap: Vec<Duration> = (0..VARIANTS.len()).map(|v| pick(v, |r| r.took)).collect();

    // 2. Start latency with and without reloads, alternating rounds.
    let ctx = CallContext::for_agent(&agent);
    let args = json!({"count": 1, "interval_ms": 0, "run_in_background": true});
    for _ in 0..200 {
        host.call_tool("ticker", args.clone(), &ctx).await?; // warm-up
    }
    // Samples per mode: 0 no reloads, 1 back-to-back cached reloads, 2 one
    // reload per 200 ms, every other one compiled fresh.
    let mut samples: [Vec<Duration>; 3] = Default::default();
    let mut reloads = [0usize; 3];
    const ROUND: Duration = Duration::from_millis(1500);
    for round in 0..9 {
        let mode = round % 3;
        let stop = Arc::new(AtomicBool::new(false));
        let reloader = (mode > 0).then(|| {
            let (plugin, stop, cached) = (plugin.clone(), stop.clone(), cached.clone());
            tokio::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    if mode == 2 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    let bytes = if mode == 2 && n % 2 == 1 {
                        rebuilt(&format!("load {nonce} {round} {n}"))
                    } else {
                        cached[n % 2].clone()
                    };
                    if plugin.reload_bytes("ticker", bytes).await.is_ok() {
                        n += 1;
                    }
                }
                n
            })
        });
        let round_started = Instant::now();
        while round_started.elapsed() < ROUND {
            let t = Instant::now();
            let out = host.call_tool("ticker", args.clone(), &ctx).await?;
            samples[mode].push(t.elapsed());
            anyhow::ensure!(out.text.starts_with("started background ticker task"), "{}", out.text);
        }
        stop.store(true, Ordering::Relaxed);
        if let Some(reloader) = reloader {
            reloads[mode] += reloader.await?;
        }
        // Let the short tasks settle so rounds start alike.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stats: Vec<(Duration, Duration)> = samples
        .iter_mut()
        .map(|s| {
            s.sort();
            (percentile(s, 0.5), percentile(s, 0.99))
        })
        .collect();
    println!("## Reload results");
    println!("| metric | result |");
    println!("| --- | --- |");
    for (variant, spec) in VARIANTS.iter().enumerate() {
        let samples = runs.iter().filter(|r| r.variant == variant).count();
        let ratio = match spec.baseline {
            Some(base) if base != variant => format!(
                " — **{:.2}× the debounced path ({:.1} ms)**",
                change[variant].as_secs_f64() / change[base].as_secs_f64(),
                ms(change[base])
            ),
            _ => " (baseline)".to_string(),
        };
        println!(
            "| file change → new version serving, {} (median of {samples}) | {:.1} ms{ratio}; load → swap {:.1} ms |",
            spec.name,
            ms(change[variant]),
            ms(swap[variant])
        );
    }
    let names = ["no reloads", "back-to-back cached reloads", "a reload every 200 ms, every other one compiled fresh"];
    for mode in 0..3 {
        let (p50, p99) = stats[mode];
        let ratio = if mode == 0 {
            String::new()
        } else {
            format!(" — **p99 {:.2}× no reloads**", p99.as_secs_f64() / stats[0].1.as_secs_f64())
        };
        println!(
            "| start latency, {}: p50 / p99 ({} starts, {} reloads) | {:.3} / {:.3} ms{ratio} |",
            names[mode],
            samples[mode].len(),
            reloads[mode],
            ms(p50),
            ms(p99)
        );
    }
    host.dispose().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
