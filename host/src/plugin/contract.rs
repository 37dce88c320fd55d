//! The producer contract as names: the export a plugin must provide, its
//! functions, and the header check that tells a component from anything
//! else. What both the pre-compile check ([`super::preflight`]) and the
//! loader ([`super::component`]) hold a plugin to, so they cannot drift.

use anyhow::bail;

/// The export every plugin must provide.
pub const PRODUCER_EXPORT: &str = "taskhost:producer/producer@0.1.0";

/// The functions of the `producer` interface, by their component export names.
pub const CONTRACT_FUNCTIONS: &[&str] = &[
    "describe",
    "label",
    "run",
    "[method]task.cancel",
    "[method]task.subscribe",
    "[method]task.done",
    "[method]task.read-output",
];

/// Checks the header: WebAssembly at all, and a component, not a core module.
pub(crate) fn sniff(bytes: &[u8]) -> anyhow::Result<()> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        if bytes.len() >= 4 && &bytes[..4] == b"\0asm" {
            bail!("the file is truncated: it ends inside the WebAssembly header ({} bytes)", bytes.len());
        }
        bail!("not a WebAssembly file: it does not start with the `\\0asm` magic number");
    }
    match bytes[4..8] {
        [1, 0, 0, 0] => bail!(
            "this is a core WebAssembly module, not a component: build the plugin for the \
             `wasm32-wasip2` target (whose output is a component) or wrap the module with \
             `wasm-tools component new`"
        ),
        [_, _, 1, 0] => Ok(()),
        _ => bail!("unsupported WebAssembly version or layer {:02x?}: expected a component (WASI 0.2)", &bytes[4..8]),
    }
}
