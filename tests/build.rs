//! Builds the fixture plugins (`fixtures/`, a wasm32-wasip2 workspace that
//! uses the plugin SDK) and generates `fixtures.rs`, which `src/lib.rs`
//! includes: the absolute path of each fixture component.

use std::fmt::Write as _;
use std::path::Path;
use std::{env, fs};

/// The fixture crates in `fixtures/`, each a component the tests load.
const FIXTURES: &[&str] = &["misbehave", "ticker-next", "wrong-world", "contract-v0_1", "contract-v0_2_0", "http-get"];

fn main() {
    let artifacts = taskhost_build_support::build_guests(
        Path::new("fixtures"),
        &[Path::new("../wit"), Path::new("../plugins/sdk")],
    );

    let mut code = String::new();
    for name in FIXTURES {
        let path = artifacts.component(name);
        let path = path.to_str().expect("guest target directory is not UTF-8");
        let constant = name.to_uppercase().replace('-', "_");
        writeln!(
            code,
            "/// Path of the built `{name}` fixture component.\n\
             pub const {constant}_PATH: &str = {path:?};"
        )
        .unwrap();
    }

    let out_dir = env::var_os("OUT_DIR").expect("OUT_DIR is set for build scripts");
    fs::write(Path::new(&out_dir).join("fixtures.rs"), code).expect("cannot write fixtures.rs");
}
