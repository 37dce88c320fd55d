//! Shared support for taskhost's end-to-end tests: where the real plugins and
//! the misbehaving fixture plugins are.
//!
//! `build.rs` builds the fixture workspace `fixtures/` from source for
//! `wasm32-wasip2` (nothing built is committed); the host crate does the
//! same for the real plugins and embeds them. Every path here is absolute
//! and exists once the crate has built.
//!
//! - Real plugins: [`TICKER_PATH`] / [`TICKER_WASM`] (re-exported from
//!   [`taskhost::builtin`]).
//! - Fixtures: [`fixtures::MISBEHAVE_PATH`] (a fault chosen per export by its
//!   config and arguments), [`fixtures::WRONG_WORLD_PATH`] (a valid
//!   component of another world), [`fixtures::TICKER_NEXT_PATH`] (kind
//!   `ticker` with another argument schema: the next build of a reloaded
//!   ticker), [`fixtures::CONTRACT_V0_1_PATH`] (a producer built against
//!   the frozen `taskhost:producer@0.1.0`), [`fixtures::CONTRACT_V0_2_0_PATH`]
//!   (one built against `taskhost:producer@0.2.0`, the patch before the
//!   current 0.2.2), [`fixtures::NOT_A_COMPONENT_WAT_PATH`] (a
//!   core module as WAT text: compile it with `wat::parse_file`). A truncated
//!   component is made at run time with [`truncated`].

pub use taskhost::builtin::{TICKER_PATH, TICKER_WASM};

pub mod agent_calls;
pub mod logs;
pub use taskhost_process::testing::procfs;
pub mod registry_fixture;

/// Paths of the fixture plugins.
pub mod fixtures {
    include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

    /// A core WebAssembly module (not a component), as WAT text.
    pub const NOT_A_COMPONENT_WAT_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/not-a-component.wat");
}

/// The first half of `component`: a file a host must refuse to load, not
/// crash on.
pub fn truncated(component: &[u8]) -> Vec<u8> {
    component[..component.len() / 2].to_vec()
}

/// `component` with a custom section `taskhost-test-build` holding `tag`
/// appended: a different file (another content hash, so an uncached compile)
/// that behaves exactly the same. Stands in for a rebuild of a plugin.
pub fn rebuilt(component: &[u8], tag: &str) -> Vec<u8> {
    const NAME: &[u8] = b"taskhost-test-build";
    let mut payload = Vec::new();
    leb128(&mut payload, NAME.len() as u64);
    payload.extend_from_slice(NAME);
    payload.extend_from_slice(tag.as_bytes());
    let mut out = component.to_vec();
    out.push(0); // custom section id
    leb128(&mut out, payload.len() as u64);
    out.extend_from_slice(&payload);
    out
}

fn leb128(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// `PATH` with the bin directory of the Python virtual environment
/// `.ci/setup` makes (`target/venv`: the MCP client, Selenium,
/// componentize-py) first, when it exists, so the tests' `python3` and
/// `componentize-py` are the pinned ones without a system-wide install.
pub fn tool_path() -> std::ffi::OsString {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/venv/bin");
    let mut dirs: Vec<std::path::PathBuf> = Vec::new();
    if venv.is_dir() {
        dirs.push(venv);
    }
    dirs.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    std::env::join_paths(dirs).expect("PATH entries hold no ':'")
}

/// The plugin engine of a test: `PluginRuntimeConfig::default()` as `edit`
/// changes it, with a compile cache of its own in a new private directory
/// (`tempfile`: a random name, mode 0700; never an earlier run's) unless
/// `edit` names one. Tests run one a process under nextest, so a cache per
/// engine loses nothing.
pub fn engine(edit: impl FnOnce(&mut taskhost::plugin::PluginRuntimeConfig)) -> taskhost::plugin::PluginEngine {
    logs::init();
    let mut config = taskhost::plugin::PluginRuntimeConfig::default();
    edit(&mut config);
    if config.cache_dir.is_none() {
        let cache = tempfile::Builder::new().prefix("taskhost-test-cache-").tempdir().expect("a temporary directory");
        config.cache_dir = Some(cache.keep());
    }
    taskhost::plugin::PluginEngine::new(config).expect("engine")
}
