//! Builds taskhost's WebAssembly guest workspaces from a build script. The plugins
//! (`plugins/`) and test fixtures (`tests/fixtures/`) are Cargo workspaces of their own, built
//! for `wasm32-wasip2`; a crate that needs them calls [`build_guests`] from its `build.rs`.
//!
//! Invariants:
//! - The nested `cargo build --release --target wasm32-wasip2` uses its own target directory,
//!   `<outer target dir>/wasm-guests/<checkout key>`: the outer cargo holds its target
//!   directory's lock while build scripts run, so sharing it would deadlock. One checkout's
//!   guest workspaces share it (their lock files pin the same registry crates, so those
//!   compile once; a second nested build waits for the first's lock); each checkout gets its
//!   own, as artifacts of path crates from two checkouts would collide.
//! - Guest crate names are unique across the checkout's guest workspaces: their components
//!   land side by side (the architecture test checks it).
//! - `TASKHOST_GUEST_TARGET_DIR` (an absolute path) names the directory instead: CI builds
//!   the guests there itself, so the build scripts find them fresh.
//! - The outer build's compiler settings never leak into the guest build: flags meant for the
//!   host target (`RUSTFLAGS` and friends), a forced `--target`, a pinned toolchain or a
//!   clippy wrapper are cleared.
//! - The build script reruns only when the guest sources, the extra watched paths (the WIT
//!   package, a shared SDK) or this crate change: a no-op outer build starts no nested cargo.
//! - Failures panic with a message that says what to do (a build script reports by failing).

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The target every guest is built for.
pub const GUEST_TARGET: &str = "wasm32-wasip2";

/// Environment variables of the outer build that must not reach the nested
/// guest build: they carry host-target flags, a forced target, a pinned
/// toolchain, or a rustc wrapper (clippy sets one for workspace members).
const CLEARED_ENV: &[&str] = &[
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_RUSTFLAGS",
    "RUSTUP_TOOLCHAIN",
    "RUSTC_WORKSPACE_WRAPPER",
];

/// When set to an absolute path, the guest target directory to use instead
/// of the one derived from the outer build (see the module's invariants).
pub const GUEST_TARGET_DIR_ENV: &str = "TASKHOST_GUEST_TARGET_DIR";

/// The components a guest workspace build produced.
#[derive(Clone, Debug)]
pub struct GuestArtifacts {
    dir: PathBuf,
}

impl GuestArtifacts {
    /// The directory holding the built `.wasm` files
    /// (`<outer target>/wasm-guests/wasm32-wasip2/release`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The absolute path of the component built from the cdylib crate
    /// `crate_name` (dashes become underscores, as in Cargo's file names).
    ///
    /// Panics if the build did not produce it: a misspelt name must fail
    /// the build, not a test much later.
    pub fn component(&self, crate_name: &str) -> PathBuf {
        let path = self.dir.join(format!("{}.wasm", crate_name.replace('-', "_")));
        assert!(
            path.is_file(),
            "guest crate `{crate_name}` produced no component at {}; is it a member of the \
             guest workspace with crate-type = [\"cdylib\"]?",
            path.display()
        );
        path
    }
}

/// Builds every member of the guest workspace at `workspace` (the directory
/// holding its `Cargo.toml`) in release mode for `wasm32-wasip2`, and returns
/// where the components are.
///
/// `also_watch` lists paths outside the workspace the guests are built from
/// (the WIT package, a path dependency such as the SDK): a change there
/// reruns the build script. Relative paths are taken from the calling
/// crate's manifest directory.
///
/// Call it from `build.rs` only: it reads the variables Cargo sets for build
/// scripts and prints `cargo:` directives.
pub fn build_guests(workspace: &Path, also_watch: &[&Path]) -> GuestArtifacts {
    let manifest_dir = PathBuf::from(required_env("CARGO_MANIFEST_DIR"));
    let workspace = absolute(&manifest_dir, workspace);
    let manifest = workspace.join("Cargo.toml");
    assert!(manifest.is_file(), "guest workspace manifest {} does not exist", manifest.display());

    watch_guest_sources(&workspace);
    for path in also_watch {
        println!("cargo:rerun-if-changed={}", absolute(&manifest_dir, path).display());
    }
    for name in CLEARED_ENV {
        // The guest build reads them; a change must rebuild the guests.
        println!("cargo:rerun-if-env-changed={name}");
    }
    println!("cargo:rerun-if-env-changed={GUEST_TARGET_DIR_ENV}");

    let cargo = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let target_dir = guest_target_dir();
    ensure_target_installed();

    let mut command = Command::new(&cargo);
    command
        .arg("build")
        .arg("--release")
        .arg("--target")
        .arg(GUEST_TARGET)
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir);
    for name in CLEARED_ENV {
        command.env_remove(name);
    }
    let output = command.output().unwrap_or_else(|error| {
        panic!("could not run `{}` to build the guests in {}: {error}", cargo.to_string_lossy(), workspace.display())
    });
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("target may not be installed") || stderr.contains("can't find crate for `core`") {
            format!("\nhint: install the guest target with `rustup target add {GUEST_TARGET}`")
        } else {
            String::new()
        };
        panic!(
            "building the guest workspace {} for {GUEST_TARGET} failed ({}):\n{stderr}{hint}",
            workspace.display(),
            output.status
        );
    }

    GuestArtifacts { dir: target_dir.join(GUEST_TARGET).join("release") }
}

/// Emits `rerun-if-changed` for the workspace manifest, its lock file and
/// every member directory, but not for a `target` directory someone left by
/// building the workspace by hand (it changes on every such build).
fn watch_guest_sources(workspace: &Path) {
    let entries =
        fs::read_dir(workspace).unwrap_or_else(|error| panic!("cannot list {}: {error}", workspace.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|error| panic!("cannot list {}: {error}", workspace.display()));
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        // Cargo scans a watched directory recursively.
        println!("cargo:rerun-if-changed={}", entry.path().display());
    }
}

/// `TASKHOST_GUEST_TARGET_DIR` when set to an absolute path, else
/// `<outer target dir>/wasm-guests/<checkout key>`. The outer target
/// directory is `CARGO_TARGET_DIR` when set to an absolute path, else the
/// ancestor of `OUT_DIR` that Cargo marked with `CACHEDIR.TAG`; failing both,
/// a directory inside `OUT_DIR` (correct, only not shared between crates).
///
/// The key (a hash of the checkout's canonical path: the directory holding
/// this crate) keeps checkouts that share one target directory apart: Cargo
/// hashes path dependencies relative to their workspace, so two checkouts of
/// a guest workspace would otherwise overwrite each other's artifacts (an
/// SDK built from another checkout's WIT) and take them for fresh. Within a
/// checkout the guest workspaces differ in path, so their path crates do not
/// collide, while the registry crates they share are built once.
fn guest_target_dir() -> PathBuf {
    if let Some(dir) = env::var_os(GUEST_TARGET_DIR_ENV).map(PathBuf::from).filter(|dir| dir.is_absolute()) {
        return dir;
    }
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new("/"));
    let canonical = checkout.canonicalize().unwrap_or_else(|_| checkout.to_path_buf());
    // FNV-1a: stable across runs and Rust versions, unlike DefaultHasher.
    let key = canonical
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3));
    let key = format!("{key:016x}");
    let out_dir = PathBuf::from(required_env("OUT_DIR"));
    let outer = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .or_else(|| out_dir.ancestors().find(|dir| dir.join("CACHEDIR.TAG").is_file()).map(Path::to_path_buf));
    match outer {
        Some(outer) => outer.join("wasm-guests").join(key),
        None => out_dir.join("wasm-guests").join(key),
    }
}

/// Fails early, with the fix, when the standard library for the guest
/// target is missing. rustup never installs targets on its own here.
fn ensure_target_installed() {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| OsString::from("rustc"));
    let Ok(output) = Command::new(&rustc).args(["--print", "target-libdir", "--target", GUEST_TARGET]).output() else {
        // Not knowing is no reason to stop: the build itself will tell.
        return;
    };
    let libdir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || libdir.is_empty() || !Path::new(&libdir).is_dir() {
        panic!(
            "the Rust target {GUEST_TARGET} is not installed for {}; taskhost builds its \
             plugins for it. Run:\n    rustup target add {GUEST_TARGET}",
            rustc.to_string_lossy()
        );
    }
}

fn required_env(name: &str) -> OsString {
    env::var_os(name).unwrap_or_else(|| panic!("{name} is not set: build_guests must run from a build script"))
}

fn absolute(base: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() { path.to_path_buf() } else { base.join(path) }
}
