//! Builds the built-in plugins (`plugins/`, a wasm32-wasip2 workspace) and
//! generates `builtin_plugins.rs`, which `src/builtin.rs` includes: for each
//! plugin its path and its bytes, so the binary carries them.

use std::fmt::Write as _;
use std::path::Path;
use std::{env, fs};

/// The plugins the binary embeds: guest crate names in `plugins/`. The only
/// list to edit when adding one.
const BUILTIN_PLUGINS: &[&str] = &["ticker"];

fn main() {
    let artifacts = taskhost_build_support::build_guests(Path::new("../plugins"), &[Path::new("../wit")]);

    let mut code = String::new();
    let mut table = String::new();
    for name in BUILTIN_PLUGINS {
        let path = artifacts.component(name);
        let path = path.to_str().expect("guest target directory is not UTF-8");
        let constant = name.to_uppercase().replace('-', "_");
        writeln!(
            code,
            "/// Path of the built `{name}` component (in the build's target directory).\n\
             pub const {constant}_PATH: &str = {path:?};\n\
             /// The `{name}` component, embedded in the binary.\n\
             pub const {constant}_WASM: &[u8] = include_bytes!({path:?});"
        )
        .unwrap();
        writeln!(table, "    BuiltinPlugin {{ name: {name:?}, path: {constant}_PATH, wasm: {constant}_WASM }},")
            .unwrap();
    }
    writeln!(
        code,
        "/// Every built-in plugin, in the order of the build's list.\n\
         pub const BUILTIN_PLUGINS: &[BuiltinPlugin] = &[\n{table}];"
    )
    .unwrap();

    let out_dir = env::var_os("OUT_DIR").expect("OUT_DIR is set for build scripts");
    fs::write(Path::new(&out_dir).join("builtin_plugins.rs"), code).expect("cannot write builtin_plugins.rs");
}
