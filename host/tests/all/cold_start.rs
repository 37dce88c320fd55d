//! `taskhost serve` started from a cached descriptor (issue 16): the tool
//! list answered before the plugin is loaded, and what happens when the
//! background load or the cache entry is wrong. Each test serves the built-in
//! bash plugin with an instance config of its own (an `env` value no other
//! test uses), so its descriptor entry is its own while the compiled code is
//! shared in the default compile cache.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};

use common::{StdioServer, call, is_error, only_text};
use serde_json::json;
use taskhost::config::Config;
use taskhost::plugin::cache::{CompileCache, HEADER_LEN, Lookup, descriptor_key};
use taskhost::plugin::component::content_hash;

const SERVED_FROM_CACHE: &str = "serving from the cached descriptor";

/// A configuration serving bash with a config no other test (or run) uses,
/// plus `extra` TOML.
fn config(extra: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nonce = format!(
        "{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    );
    format!(
        "{extra}\n[[producer]]\ntool = \"bash\"\nplugin = \"builtin:bash\"\n[producer.config.env]\nCOLD_START_TEST = \
         \"{nonce}\"\n[producer.grants.process]\nprograms = [\"bash\"]\nenv.plugin_may_set = [\"COLD_START_TEST\"]\n"
    )
}

/// The descriptor cache of the server `config` runs, and the key of its bash entry.
fn descriptor_entry(config: &str) -> (CompileCache, String) {
    let parsed = Config::parse(config).unwrap();
    // Keyed as the servers' (the test servers share this user's key).
    let cache =
        std::sync::Arc::into_inner(taskhost::plugin::engine::open_cache(&parsed.plugins).expect("the cache opens"))
            .expect("the only holder");
    let bash = taskhost::builtin::find("bash").unwrap().wasm;
    let config_json = serde_json::to_string(&parsed.effective_producers()[0].config_json()).unwrap();
    (cache, descriptor_key(&content_hash(bash), &config_json))
}

/// The descriptor JSON the cache holds for `key`, if a sound entry.
fn cached_json(cache: &CompileCache, key: &str) -> Option<serde_json::Value> {
    match cache.load_descriptor(key) {
        Lookup::Hit(bytes) => Some(serde_json::from_slice(&bytes).unwrap()),
        _ => None,
    }
}

/// Every tool of a listing, as JSON (names, descriptions, schemas).
async fn listing(server: &StdioServer) -> serde_json::Value {
    serde_json::to_value(server.client.list_all_tools().await.unwrap()).unwrap()
}

/// A start keys a built-in plugin's descriptor entry by the hash `build.rs`
/// recorded: it must be the hash of the bytes the binary embeds, or a stale
/// entry could be served for changed bytes.
#[test]
fn every_builtin_plugin_carries_the_hash_of_its_embedded_bytes() {
    for plugin in taskhost::builtin::BUILTIN_PLUGINS {
        assert_eq!(plugin.sha256, content_hash(plugin.wasm), "{}", plugin.name);
    }
    assert_ne!(taskhost::builtin::BASH_SHA256, taskhost::builtin::TICKER_SHA256);
}

/// Serves once to fill the descriptor entry; returns that start's listing.
async fn first_start(config: &str) -> serde_json::Value {
    let server = StdioServer::start("cold-first", Some(config)).await;
    let tools = listing(&server).await;
    let (status, log) = server.disconnect().await;
    assert!(status.success(), "{log}");
    assert!(!log.contains(SERVED_FROM_CACHE), "nothing was cached yet: {log}");
    tools
}

#[tokio::test]
async fn a_cached_start_lists_the_same_tools_and_its_calls_work() {
    let config = config("");
    let uncached = first_start(&config).await;
    let (cache, key) = descriptor_entry(&config);
    assert!(cached_json(&cache, &key).is_some(), "the first start cached its descriptor");

    let server = StdioServer::start("cold-cached", Some(&config)).await;
    assert_eq!(listing(&server).await, uncached, "a cached start lists exactly what an uncached one does");
    let echoed = call(server.client.peer(), "bash", json!({"command": "echo cached"})).await;
    assert!(!is_error(&echoed), "{echoed:?}");
    assert!(only_text(&echoed).starts_with("cached\n"), "{echoed:?}");
    let (status, log) = server.disconnect().await;
    assert!(status.success(), "{log}");
    assert!(log.contains(SERVED_FROM_CACHE), "{log}");
}

#[tokio::test]
async fn a_call_before_any_listing_waits_for_the_background_load() {
    let config = config("");
    first_start(&config).await;
    let server = StdioServer::start("cold-call-first", Some(&config)).await;
    // No listing first: the load has not even begun (serve holds it until
    // its first tools/list); the call starts it and waits for it.
    let echoed = call(server.client.peer(), "bash", json!({"command": "echo first"})).await;
    assert!(!is_error(&echoed), "{echoed:?}");
    assert!(only_text(&echoed).starts_with("first\n"), "{echoed:?}");
    let (status, log) = server.disconnect().await;
    assert!(status.success(), "{log}");
    assert!(log.contains(SERVED_FROM_CACHE), "{log}");
    let begun = log.find("background plugin loads may begin").expect("the call opened the gate");
    assert!(log[begun..].contains("plugin loaded"), "the load ran after the call asked for it: {log}");
}

#[tokio::test]
async fn an_entry_for_another_config_is_not_used() {
    let first = config("");
    first_start(&first).await;
    // The same plugin bytes with another config: another key, so a miss.
    let other = config("");
    let (cache, other_key) = descriptor_entry(&other);
    assert!(cached_json(&cache, &other_key).is_none());
    let server = StdioServer::start("cold-other-config", Some(&other)).await;
    listing(&server).await;
    let (status, log) = server.disconnect().await;
    assert!(status.success(), "{log}");
    assert!(!log.contains(SERVED_FROM_CACHE), "another config's entry was used: {log}");
    assert!(cached_json(&cache, &other_key).is_some(), "this config's descriptor is cached now");
}

#[tokio::test]
async fn a_corrupt_entry_is_refused_and_the_plugin_described_again() {
    let config = config("");
    let uncached = first_start(&config).await;
    let (cache, key) = descriptor_entry(&config);
    let path = cache.descriptor_path(&key);
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > HEADER_LEN);
    bytes[HEADER_LEN + 2] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();

    let server = StdioServer::start("cold-corrupt", Some(&config)).await;
    assert_eq!(listing(&server).await, uncached);
    let (status, log) = server.disconnect().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("refused a descriptor cache entry"), "{log}");
    assert!(!log.contains(SERVED_FROM_CACHE), "{log}");
    assert!(cached_json(&cache, &key).is_some(), "the entry was written again");
}

#[tokio::test]
async fn a_mismatching_entry_loses_to_the_real_describe() {
    let config = config("");
    let uncached = first_start(&config).await;
    let (cache, key) = descriptor_entry(&config);
    let real = cached_json(&cache, &key).unwrap();
    // A sound entry (right digest) whose description is not the plugin's.
    let mut forged = real.clone();
    forged["description"] = json!("a forged description");
    cache.store_descriptor(&key, &serde_json::to_vec(&forged).unwrap()).unwrap();

    let server = StdioServer::start("cold-mismatch", Some(&config)).await;
    // The first listing is answered before the load: from the cache.
    let first = listing(&server).await;
    let bash = |tools: &serde_json::Value| tools.as_array().unwrap().iter().find(|t| t["name"] == "bash").cloned();
    assert_eq!(bash(&first).unwrap()["description"], json!("a forged description"));
    // A call waits for the load; from then on the real descriptor serves.
    let echoed = call(server.client.peer(), "bash", json!({"command": "echo real"})).await;
    assert!(only_text(&echoed).starts_with("real\n"), "{echoed:?}");
    assert_eq!(listing(&server).await, uncached, "the real descriptor won");
    let (status, log) = server.disconnect().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("the cached descriptor differs from the plugin's describe"), "{log}");
    assert_eq!(cached_json(&cache, &key).unwrap(), real, "the entry was rewritten with the real descriptor");
}

#[tokio::test]
async fn a_background_load_that_fails_answers_calls_with_the_error() {
    let config_ok = config("");
    first_start(&config_ok).await;
    // The same instance config (so the same descriptor entry) with a memory
    // cap the plugin does not fit in: an uncached start refuses to serve; a
    // cached one serves the listing and its load fails in the background.
    let config_bad = format!("[plugins]\nmemory_limit_bytes = 1048576\n{}", config_ok.trim_start());
    let (cache, key) = descriptor_entry(&config_ok);
    assert_eq!(descriptor_entry(&config_bad).1, key);
    let server = StdioServer::start("cold-load-fails", Some(&config_bad)).await;
    listing(&server).await;
    let peer = server.client.peer().clone();
    for _ in 0..2 {
        let failed = call(&peer, "bash", json!({"command": "echo never"})).await;
        assert!(is_error(&failed), "{failed:?}");
        let text = only_text(&failed);
        assert!(text.contains("failed to load") && text.contains("memory"), "{text}");
    }
    // The server still serves its other tools.
    assert_eq!(only_text(&call(&peer, "task_list", json!({})).await), "(no background tasks)");
    let (status, log) = server.disconnect().await;
    assert!(status.success(), "{log}");
    assert!(cached_json(&cache, &key).is_none(), "a failed load deletes the entry: the next start describes first");
}
