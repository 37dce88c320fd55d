//! Every artifact the end-to-end tests rely on exists and is what it claims
//! to be: the real plugins and the fixtures are components, the
//! not-a-component fixture compiles to a core module, and a truncated
//! component keeps a valid preamble (so only a real parse can refuse it).

use taskhost_tests::{TICKER_PATH, TICKER_WASM, fixtures, truncated};

/// `\0asm` followed by the version and layout fields.
const MAGIC: &[u8; 4] = b"\0asm";
/// Version 0x0d, layout 1: the component-model binary format.
const COMPONENT_VERSION_LAYOUT: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];
/// Version 1, layout 0: a core module.
const CORE_MODULE_VERSION_LAYOUT: [u8; 4] = [0x01, 0x00, 0x00, 0x00];

fn assert_component(name: &str, bytes: &[u8]) {
    assert!(bytes.len() > 8 && bytes.starts_with(MAGIC), "{name} is not WebAssembly");
    assert_eq!(bytes[4..8], COMPONENT_VERSION_LAYOUT, "{name} is not a component");
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|error| panic!("cannot read {path}: {error}"))
}

#[test]
fn the_ticker_plugin_is_a_component_and_embedded_as_built() {
    let on_disk = read(TICKER_PATH);
    assert_component("ticker", &on_disk);
    assert_eq!(on_disk, TICKER_WASM, "the embedded ticker differs from the built file");
}

#[test]
fn the_fixture_plugins_are_components() {
    assert_component("misbehave", &read(fixtures::MISBEHAVE_PATH));
    assert_component("ticker-next", &read(fixtures::TICKER_NEXT_PATH));
    assert_component("wrong-world", &read(fixtures::WRONG_WORLD_PATH));
}

#[test]
fn the_not_a_component_fixture_is_a_core_module() {
    let module = wat::parse_file(fixtures::NOT_A_COMPONENT_WAT_PATH).expect("not-a-component.wat compiles");
    assert!(module.starts_with(MAGIC));
    assert_eq!(module[4..8], CORE_MODULE_VERSION_LAYOUT);
}

#[test]
fn a_truncated_component_keeps_its_preamble() {
    let cut = truncated(TICKER_WASM);
    assert_component("truncated ticker", &cut);
    assert!(cut.len() < TICKER_WASM.len());
}
