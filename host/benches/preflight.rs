//! The pre-compile contract check against what it saves and what it adds.
//!
//! Run: `cargo bench -p taskhost --bench preflight`
//!
//! For each built-in plugin, in one run: the median time of
//! [`taskhost::plugin::preflight::preflight`] (imports and exports read
//! without compiling: what a wrong import now costs to report), of a full
//! load that compiles (what it cost before), and of a load whose compiled
//! code comes from the cache (the reload path, to which the check is added),
//! and the ratios against the check. (The load path runs the check only
//! when it compiles: a cache hit skips it, so the last column is what the
//! check would add to a reload if it ran there too.)

use std::time::{Duration, Instant};

use taskhost::plugin::preflight::preflight;
use taskhost::plugin::{CompileSource, PluginEngine, PluginRuntimeConfig};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let cache = std::env::temp_dir().join(format!("taskhost-bench-preflight-{}", std::process::id()));
    let uncached =
        PluginEngine::new(PluginRuntimeConfig { pooling: false, cache: false, ..PluginRuntimeConfig::default() })
            .expect("engine");
    let cached = PluginEngine::new(PluginRuntimeConfig {
        pooling: false,
        cache_dir: Some(cache.clone()),
        ..PluginRuntimeConfig::default()
    })
    .expect("engine");
    println!("plugin     size      check (median of 200)   compiling load (median of 5)   cached load (median of 20)");
    for plugin in taskhost::builtin::BUILTIN_PLUGINS {
        let checks: Vec<Duration> = (0..200)
            .map(|_| {
                let started = Instant::now();
                preflight(plugin.wasm).expect("valid").expect("decodable");
                started.elapsed()
            })
            .collect();
        let mut compiles = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            let version = uncached.load_bytes(plugin.name, plugin.wasm).await.expect("load");
            compiles.push(started.elapsed());
            assert_eq!(version.compile_source(), CompileSource::Compiled);
        }
        cached.load_bytes(plugin.name, plugin.wasm).await.expect("warm the cache");
        let mut hits = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            let version = cached.load_bytes(plugin.name, plugin.wasm).await.expect("load");
            hits.push(started.elapsed());
            assert_eq!(version.compile_source(), CompileSource::Cache);
        }
        let (check, compile, hit) = (median(checks), median(compiles), median(hits));
        println!(
            "{:<10} {:>4} KB   {:>8.2} ms              {:>8.1} ms ({:>5.0}x the check)   {:>7.2} ms (check = {:.1}% of it)",
            plugin.name,
            plugin.wasm.len() / 1024,
            ms(check),
            ms(compile),
            ms(compile) / ms(check),
            ms(hit),
            100.0 * ms(check) / ms(hit),
        );
    }
    let _ = std::fs::remove_dir_all(&cache);
}
