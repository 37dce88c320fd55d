//! Builds the built-in plugins (`plugins/`, a wasm32-wasip2 workspace) and
//! generates `builtin_plugins.rs`, which `src/builtin.rs` includes: for each
//! plugin its path, its bytes (so the binary carries them) and their SHA-256
//! (so a start does not hash them again).

use std::fmt::Write as _;
use std::path::Path;
use std::{env, fs};

use sha2::Digest as _;

/// The plugins the binary embeds: guest crate names in `plugins/`. The only
/// list to edit when adding one.
const BUILTIN_PLUGINS: &[&str] = &["ticker", "bash", "subagent"];

fn main() {
    let artifacts = taskhost_build_support::build_guests(Path::new("../plugins"), &[Path::new("../wit")]);

    let out_dir = env::var_os("OUT_DIR").expect("OUT_DIR is set for build scripts");
    let mut code = String::new();
    let mut table = String::new();
    for name in BUILTIN_PLUGINS {
        let path = artifacts.component(name);
        let path = path.to_str().expect("guest target directory is not UTF-8");
        let constant = name.to_uppercase().replace('-', "_");
        // Embedded from a copy in OUT_DIR, which nothing but this script
        // writes: the bytes the binary carries are exactly the bytes hashed
        // here, whatever later happens to the guest build's own file.
        let bytes = fs::read(path).expect("cannot read a built-in plugin");
        let sha256: String = sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        let embedded = Path::new(&out_dir).join(format!("{name}.wasm"));
        fs::write(&embedded, &bytes).expect("cannot copy a built-in plugin into OUT_DIR");
        let embedded = embedded.to_str().expect("OUT_DIR is not UTF-8").to_string();
        writeln!(
            code,
            "/// Path of the built `{name}` component (in the build's target directory).\n\
             pub const {constant}_PATH: &str = {path:?};\n\
             /// The `{name}` component, embedded in the binary.\n\
             pub const {constant}_WASM: &[u8] = include_bytes!({embedded:?});\n\
             /// The SHA-256 of [`{constant}_WASM`], lower-case hex.\n\
             pub const {constant}_SHA256: &str = {sha256:?};"
        )
        .unwrap();
        writeln!(
            table,
            "    BuiltinPlugin {{ name: {name:?}, path: {constant}_PATH, wasm: {constant}_WASM, sha256: {constant}_SHA256 }},"
        )
        .unwrap();
    }
    writeln!(
        code,
        "/// Every built-in plugin, in the order of the build's list.\n\
         pub const BUILTIN_PLUGINS: &[BuiltinPlugin] = &[\n{table}];"
    )
    .unwrap();

    fs::write(Path::new(&out_dir).join("builtin_plugins.rs"), code).expect("cannot write builtin_plugins.rs");
}
