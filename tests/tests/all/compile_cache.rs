//! The compile cache never turns a file someone else changed into code in
//! the server: a rewritten code section, another valid artifact in an entry's
//! place, an entry with a wrong mode or owner or behind a symlink, and a
//! directory others can write are all refused, and the real plugin is
//! recompiled (and works). The cache stays under its size cap, least
//! recently used first.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::json;
use taskhost::plugin::cache::HEADER_LEN;
use taskhost::plugin::{CompileSource, PluginEngine, PluginRuntimeConfig, PluginVersion, WasmProducer};
use taskhost::producer::Producer as _;
use taskhost_tests::{TICKER_WASM, fixtures, rebuilt};

/// A fresh, empty cache directory for one test.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("taskhost-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn engine_with(dir: &Path, cache_max_bytes: u64) -> PluginEngine {
    taskhost_tests::engine(|config| {
        config.cache_dir = Some(dir.to_path_buf());
        config.cache_max_bytes = cache_max_bytes;
        config.pooling = false;
    })
}

fn engine(dir: &Path) -> PluginEngine {
    engine_with(dir, PluginRuntimeConfig::default().cache_max_bytes)
}

/// The cache file of `version` (exactly one must exist).
fn entry_of(dir: &Path, version: &PluginVersion) -> PathBuf {
    let prefix = format!("{}-", version.content_hash());
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.starts_with(&prefix) && name.ends_with(".cwasm")
        })
        .collect();
    assert_eq!(found.len(), 1, "expected one cache entry for {} in {}: {found:?}", version.version(), dir.display());
    found.into_iter().next().unwrap()
}

/// Byte range of the `.text` section (native code) of the ELF artifact in a
/// cache entry, as offsets into the entry file.
fn text_section(entry: &[u8]) -> std::ops::Range<usize> {
    let elf = &entry[HEADER_LEN..];
    assert_eq!(&elf[..4], b"\x7fELF", "a compiled component is an ELF image");
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum, shstrndx) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let section = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(section(shstrndx) + 0x18);
    for i in 0..shnum {
        let header = section(i);
        let name_at = strtab + u32_at(header);
        let name_end = name_at + elf[name_at..].iter().position(|&b| b == 0).unwrap();
        if &elf[name_at..name_end] == b".text" {
            let (offset, size) = (u64_at(header + 0x18), u64_at(header + 0x20));
            assert!(size > 0, "empty .text");
            return HEADER_LEN + offset..HEADER_LEN + offset + size;
        }
    }
    panic!("no .text section in the compiled component");
}

async fn load_ticker(engine: &PluginEngine) -> std::sync::Arc<PluginVersion> {
    engine.load_bytes("ticker", TICKER_WASM).await.expect("ticker loads")
}

/// The version loaded is the real ticker: it describes itself.
async fn assert_is_the_ticker(version: std::sync::Arc<PluginVersion>) {
    let producer = WasmProducer::new(version, json!({})).await.expect("describe");
    assert_eq!(producer.descriptor().kind, "ticker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_code_section_is_recompiled_not_run() {
    let dir = fresh_dir("text");
    let engine = engine(&dir);
    let cold = load_ticker(&engine).await;
    assert_eq!(cold.compile_source(), CompileSource::Compiled);
    let entry = entry_of(&dir, &cold);
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(std::fs::metadata(&entry).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(load_ticker(&engine).await.compile_source(), CompileSource::Cache, "an intact entry is used");

    // What the attack did: overwrite native code in place (here with `int3`
    // traps, a payload of the attacker's choosing in the real attack).
    let mut bytes = std::fs::read(&entry).unwrap();
    let text = text_section(&bytes);
    let start = text.start + (text.len() / 2).min(4096);
    bytes[start..(start + 64).min(text.end)].fill(0xcc);
    std::fs::write(&entry, &bytes).unwrap();

    let reloaded = load_ticker(&engine).await;
    assert_eq!(reloaded.compile_source(), CompileSource::Compiled, "a tampered entry must not be loaded");
    assert_is_the_ticker(reloaded).await;
    // The recompiled artifact replaced the tampered one.
    assert_ne!(std::fs::read(entry_of(&dir, &cold)).unwrap(), bytes);
    assert_eq!(load_ticker(&engine).await.compile_source(), CompileSource::Cache);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_valid_artifact_in_an_entrys_place_is_recompiled() {
    let dir = fresh_dir("swap");
    let engine = engine(&dir);
    let ticker = load_ticker(&engine).await;
    let misbehave = engine.load_file(fixtures::MISBEHAVE_PATH).await.expect("misbehave loads");
    // A complete, valid entry with its own digest, under the ticker's name.
    std::fs::copy(entry_of(&dir, &misbehave), entry_of(&dir, &ticker)).unwrap();
    let reloaded = load_ticker(&engine).await;
    assert_eq!(reloaded.compile_source(), CompileSource::Compiled, "another plugin's code must not load as the ticker");
    assert_is_the_ticker(reloaded).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_with_a_wrong_mode_owner_or_behind_a_symlink_are_refused() {
    let dir = fresh_dir("perms");
    let engine = engine(&dir);
    let version = load_ticker(&engine).await;
    let entry = entry_of(&dir, &version);
    let intact = std::fs::read(&entry).unwrap();

    // Intact contents, but others may write it: refused, rewritten 0600.
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(load_ticker(&engine).await.compile_source(), CompileSource::Compiled, "mode 0666 must be refused");
    assert_eq!(std::fs::metadata(&entry).unwrap().permissions().mode() & 0o777, 0o600);

    // Intact contents behind a symlink: refused (O_NOFOLLOW).
    let elsewhere = dir.with_extension("elsewhere");
    std::fs::write(&elsewhere, &intact).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::remove_file(&entry).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
    assert_eq!(load_ticker(&engine).await.compile_source(), CompileSource::Compiled, "a symlink must be refused");
    assert!(!std::fs::symlink_metadata(&entry).unwrap().file_type().is_symlink(), "replaced by a real file");
    std::fs::remove_file(&elsewhere).unwrap();

    // Intact contents owned by another user: refused. Only root can give a
    // file away; CI runs as root.
    if is_root() {
        std::os::unix::fs::chown(&entry, Some(65534), Some(65534)).unwrap();
        assert_eq!(
            load_ticker(&engine).await.compile_source(),
            CompileSource::Compiled,
            "another owner must be refused"
        );
        assert_eq!(std::fs::metadata(&entry).unwrap().uid(), 0);
    } else {
        eprintln!("not root: the foreign-owner case needs root to chown and is not exercised");
    }
    assert_eq!(load_ticker(&engine).await.compile_source(), CompileSource::Cache);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether this test runs as root (the owner of its own `/proc` entry).
fn is_root() -> bool {
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_others_can_write_or_own_disables_the_cache() {
    let dir = fresh_dir("opendir");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let open = engine(&dir);
    assert_eq!(open.cache_dir(), None, "a world-writable cache directory must not be used");
    assert_eq!(load_ticker(&open).await.compile_source(), CompileSource::Compiled);
    assert_eq!(load_ticker(&open).await.compile_source(), CompileSource::Compiled);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing written into it");

    let link = dir.with_extension("link");
    let _ = std::fs::remove_file(&link);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    assert_eq!(engine(&link).cache_dir(), None, "a symlinked cache directory must not be used");
    std::fs::remove_file(&link).unwrap();

    if is_root() {
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        assert_eq!(engine(&dir).cache_dir(), None, "a directory of another user must not be used");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_is_trimmed_to_its_cap_least_recently_used_first() {
    // Three builds of the same plugin: three entries of nearly the same size.
    let builds: Vec<Vec<u8>> = ["a", "b", "c"].iter().map(|tag| rebuilt(TICKER_WASM, tag)).collect();
    let measure = fresh_dir("measure");
    let probe = engine(&measure);
    let sample = probe.load_bytes("ticker", builds[0].clone()).await.unwrap();
    let size = std::fs::metadata(entry_of(&measure, &sample)).unwrap().len();
    std::fs::remove_dir_all(&measure).unwrap();

    let dir = fresh_dir("trim");
    // Room for two entries, not three.
    let engine = engine_with(&dir, size * 5 / 2);
    let a = engine.load_bytes("ticker", builds[0].clone()).await.unwrap();
    let b = engine.load_bytes("ticker", builds[1].clone()).await.unwrap();
    let (entry_a, entry_b) = (entry_of(&dir, &a), entry_of(&dir, &b));
    let age = |path: &Path, secs: u64| {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() - Duration::from_secs(secs)).unwrap();
    };
    age(&entry_a, 7200);
    age(&entry_b, 3600);
    // A hit makes `a` the most recently used: `b` is now the oldest.
    let hit = engine.load_bytes("ticker", builds[0].clone()).await.unwrap();
    assert_eq!(hit.compile_source(), CompileSource::Cache);
    let c = engine.load_bytes("ticker", builds[2].clone()).await.unwrap();
    assert!(entry_a.exists(), "the recently used entry was evicted");
    assert!(!entry_b.exists(), "the least recently used entry must be evicted");
    entry_of(&dir, &c);
    let total: u64 = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    assert!(total <= size * 5 / 2, "the directory holds {total} bytes, over its cap {}", size * 5 / 2);
    let again = engine.load_bytes("ticker", builds[1].clone()).await.unwrap();
    assert_eq!(again.compile_source(), CompileSource::Compiled, "an evicted entry is compiled again");
    std::fs::remove_dir_all(&dir).unwrap();
}
