//! taskhost's own state directory: what a server keeps between runs, where
//! no process tree may read or write it. One file (or directory) per
//! concern, so the durable store is one more file here.
//!
//! Layout:
//! - `trust.json`: the files the user trusted ([`trust`]; only in the
//!   default directory, see below).
//! - `cache.key`: the compile cache's MAC key, 32 random bytes, `0600`
//!   ([`StateDir::cache_key`]).
//! - `spill/`: the spill root of every server of the user (each makes its
//!   own `0700` directory in it; see `taskhost_process::ProcessHost`).
//! - `tasks.sqlite3` (with its `-wal`, `-shm` files) and `tasks.servers/`:
//!   the durable task store and its servers' locks ([`store`]), its
//!   finished records bounded by [`retention`].
//! - `dev-tasks.sqlite3` and `dev-tasks.servers/`: `taskhost dev`'s own
//!   store, the same kind (never `serve`'s, whose records it must not claim).
//!
//! Invariants:
//! - The directory is created `0700`. An existing one is used only when it
//!   is a real directory (not a symlink), owned by the server's effective
//!   uid and writable by nobody else; group and other read bits are taken
//!   away. Anything else fails [`StateDir::open`] with the directory, why,
//!   and the fix.
//! - The server hands the state directory (and the default one) to the
//!   process host as protected paths before any tree starts: hidden from
//!   every tree, inside a workspace too (`setup::PluginRuntime`).
//! - Trust records always live in the *default* state directory
//!   (`$XDG_STATE_HOME/taskhost`, else `~/.local/state/taskhost`), which
//!   `[state] dir` does not move: a configuration never chooses where its
//!   own trust is looked up.

pub mod retention;
mod schema;
mod server_lock;
pub mod store;
pub mod trust;

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use serde::Deserialize;

/// `[state]`: where taskhost keeps its own state.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct StateSettings {
    /// The state directory (the compile cache's key, the spill root, the
    /// store). Default: [`default_dir`]. Trust records stay in the default
    /// directory whatever this says.
    pub dir: Option<PathBuf>,
    /// Where `serve` records tasks: `sqlite` (default: the file
    /// `tasks.sqlite3` here, so stable owners' records, ids and lost tasks
    /// survive a restart) or `memory` (nothing survives the process).
    pub store: StoreKind,
    /// Finished records the store keeps at most (the newest): see [`retention`].
    pub max_finished_tasks: u64,
    /// Seconds a finished record is kept after its end.
    pub max_finished_age_secs: u64,
    /// Bytes of the finished records' stored texts kept at most.
    pub max_finished_bytes: u64,
}

impl Default for StateSettings {
    fn default() -> Self {
        let limits = retention::RetentionLimits::default();
        Self {
            dir: None,
            store: StoreKind::default(),
            max_finished_tasks: limits.max_finished_tasks,
            max_finished_age_secs: limits.max_finished_age_secs,
            max_finished_bytes: limits.max_finished_bytes,
        }
    }
}

/// `[state] store`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    #[default]
    Sqlite,
    Memory,
}

impl StateSettings {
    /// The bounds on the store's finished records.
    pub fn retention(&self) -> retention::RetentionLimits {
        retention::RetentionLimits {
            max_finished_tasks: self.max_finished_tasks,
            max_finished_age_secs: self.max_finished_age_secs,
            max_finished_bytes: self.max_finished_bytes,
        }
    }

    /// Refuses settings that make no sense, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        self.retention().validate()
    }

    /// The directory in effect.
    pub fn effective_dir(&self) -> anyhow::Result<PathBuf> {
        match &self.dir {
            Some(dir) => Ok(std::path::absolute(dir).unwrap_or_else(|_| dir.clone())),
            None => default_dir(),
        }
    }
}

/// `$XDG_STATE_HOME/taskhost` (an absolute `XDG_STATE_HOME` only, as the
/// XDG spec says), else `~/.local/state/taskhost`.
pub fn default_dir() -> anyhow::Result<PathBuf> {
    let xdg = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from).filter(|p| p.is_absolute());
    let home = || std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".local/state"));
    match xdg.or_else(home) {
        Some(base) => Ok(base.join("taskhost")),
        None => anyhow::bail!(
            "cannot place taskhost's state directory: neither XDG_STATE_HOME (absolute) nor HOME is set; \
             set one of them"
        ),
    }
}

/// taskhost's own configuration directory, `$XDG_CONFIG_HOME/taskhost`
/// (absolute only), else `~/.config/taskhost`: always hidden from trees.
pub fn config_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from).filter(|p| p.is_absolute());
    let home = || std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".config"));
    xdg.or_else(home).map(|base| base.join("taskhost"))
}

/// Length of the compile cache's key.
pub const CACHE_KEY_BYTES: usize = 32;

/// The compile cache's MAC key. Never printed.
#[derive(Clone)]
pub struct CacheKey(pub [u8; CACHE_KEY_BYTES]);

impl std::fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheKey(<redacted>)")
    }
}

/// A checked state directory.
#[derive(Clone, Debug)]
pub struct StateDir {
    dir: PathBuf,
}

/// The state directory file of the trust records.
const TRUST_FILE: &str = "trust.json";
/// The state directory file of the compile cache's key.
const CACHE_KEY_FILE: &str = "cache.key";
/// The state directory's spill root.
const SPILL_DIR: &str = "spill";
/// The state directory's durable trees (their logs and keepers' sockets).
const TREES_DIR: &str = "trees";

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

impl StateDir {
    /// The directory `settings` name (or the default), created or checked.
    pub fn open_configured(settings: &StateSettings) -> anyhow::Result<Self> {
        Self::open(&settings.effective_dir()?)
    }

    /// The default state directory, created or checked: where trust records live.
    pub fn open_default() -> anyhow::Result<Self> {
        Self::open(&default_dir()?)
    }

    /// Creates `dir` (`0700`, parents as needed) or checks the existing one
    /// (see the module's invariants).
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        private_dir(&dir, "[state] dir").with_context(|| format!("taskhost's state directory {}", dir.display()))?;
        Ok(Self { dir })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// A file of this directory (the durable store's, say).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The trust records' file.
    pub fn trust_file(&self) -> PathBuf {
        self.file(TRUST_FILE)
    }

    /// The spill root every server of the user makes its spill directory
    /// in, created `0700` and checked like the state directory.
    pub fn spill_root(&self) -> anyhow::Result<PathBuf> {
        let root = self.file(SPILL_DIR);
        private_dir(&root, "[state] dir").with_context(|| format!("the spill root {}", root.display()))?;
        Ok(root)
    }

    /// Where durable process trees keep their logs and sockets (one
    /// private directory per tree), created `0700`.
    pub fn trees_root(&self) -> anyhow::Result<PathBuf> {
        let root = self.file(TREES_DIR);
        private_dir(&root, "[state] dir")
            .with_context(|| format!("the durable trees' directory {}", root.display()))?;
        Ok(root)
    }

    /// The task store `settings` ask for: SQLite in this directory (its
    /// finished records pruned to the `[state]` bounds now, before anyone
    /// reads them, and as tasks end), or memory.
    pub fn task_store(
        &self,
        settings: &StateSettings,
    ) -> anyhow::Result<std::sync::Arc<dyn taskhost_core::tasks::store::TaskStore>> {
        self.task_store_in(settings, store::STORE_FILE)
    }

    /// As [`Self::task_store`], with the SQLite store in the file `name`.
    pub fn task_store_in(
        &self,
        settings: &StateSettings,
        name: &str,
    ) -> anyhow::Result<std::sync::Arc<dyn taskhost_core::tasks::store::TaskStore>> {
        Ok(match settings.store {
            StoreKind::Memory => std::sync::Arc::new(taskhost_core::tasks::store::MemoryStore::new()),
            StoreKind::Sqlite => {
                let file = self.file(name);
                let store = store::SqliteStore::open(&file)?;
                retention::start(file, settings.retention(), store.end_signal());
                std::sync::Arc::new(store)
            }
        })
    }

    /// The compile cache's key: read from `cache.key`, or created there
    /// once (32 random bytes, `0600`, published atomically so two servers
    /// starting together agree). A key file that is not a `0600` regular
    /// file of this uid holding exactly 32 bytes is replaced with a new key
    /// (every cache entry then misses and is recompiled), with a warning.
    pub fn cache_key(&self) -> anyhow::Result<CacheKey> {
        let path = self.file(CACHE_KEY_FILE);
        for _ in 0..3 {
            match read_key(&path) {
                Ok(Some(key)) => return Ok(key),
                Ok(None) => {}
                Err(why) => {
                    tracing::warn!(file = %path.display(), %why, "replacing the compile cache key; every cached component will be compiled again");
                    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
                }
            }
            if let Some(key) = create_key(&self.dir, &path)? {
                return Ok(key);
            }
        }
        anyhow::bail!("cannot settle the compile cache key {}: it keeps changing", path.display())
    }
}

/// Creates `dir` `0700` (parents as needed) or checks that the existing one
/// is a real directory of this uid writable by nobody else; takes away
/// group and other read bits. `setting` names what moves it, for the fix.
fn private_dir(dir: &Path, setting: &str) -> anyhow::Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).context("cannot create it"),
    }
    let meta = std::fs::symlink_metadata(dir).context("cannot inspect it")?;
    anyhow::ensure!(
        !meta.file_type().is_symlink(),
        "it is a symlink; remove it (taskhost creates the directory) or set {setting} to a real directory"
    );
    anyhow::ensure!(meta.is_dir(), "it is not a directory; remove it or set {setting} elsewhere");
    anyhow::ensure!(
        meta.uid() == euid(),
        "it is owned by uid {}, not by the server's uid {}; remove it, or set {setting} to a directory of the \
         server's user",
        meta.uid(),
        euid()
    );
    let mode = meta.permissions().mode() & 0o7777;
    anyhow::ensure!(
        mode & 0o022 == 0,
        "it is writable by group or others (mode {mode:04o}): anyone who can write it could trust files for \
         this user or forge compiled code; check its contents, then `chmod 700` it (or remove it)"
    );
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot restrict its mode {mode:04o} to 0700"))?;
    }
    Ok(())
}

/// The key in `path`: `Ok(None)` when there is none, `Err` (why) when the
/// file is not a sound key.
fn read_key(path: &Path) -> Result<Option<CacheKey>, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let mut file = match file {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open it: {e}")),
    };
    let meta = file.metadata().map_err(|e| format!("cannot inspect it: {e}"))?;
    if !meta.is_file() {
        return Err("it is not a regular file".into());
    }
    if meta.uid() != euid() {
        return Err(format!("it is owned by uid {}, not {}", meta.uid(), euid()));
    }
    if meta.permissions().mode() & 0o7077 != 0 {
        return Err(format!("its mode is {:04o}, not 0600", meta.permissions().mode() & 0o7777));
    }
    let mut key = [0u8; CACHE_KEY_BYTES];
    let mut extra = Vec::new();
    file.read_exact(&mut key).map_err(|_| format!("it is shorter than {CACHE_KEY_BYTES} bytes"))?;
    file.read_to_end(&mut extra).map_err(|e| format!("cannot read it: {e}"))?;
    if !extra.is_empty() {
        return Err(format!("it is longer than {CACHE_KEY_BYTES} bytes"));
    }
    Ok(Some(CacheKey(key)))
}

/// Writes a new random key to a temporary file and links it to `path`:
/// `Ok(None)` when another server published one first (read it then).
fn create_key(dir: &Path, path: &Path) -> anyhow::Result<Option<CacheKey>> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut key = [0u8; CACHE_KEY_BYTES];
    getrandom::fill(&mut key).map_err(|e| anyhow::anyhow!("no randomness for the compile cache key: {e}"))?;
    let tmp = dir.join(format!(".cache.key-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        file.write_all(&key)?;
        file.sync_all()?;
        std::fs::hard_link(&tmp, path)
    })();
    let _ = std::fs::remove_file(&tmp);
    match written {
        Ok(()) => Ok(Some(CacheKey(key))),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot write the compile cache key {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("taskhost-state-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn creates_a_private_directory_and_one_key() {
        let dir = temp("create");
        let state = StateDir::open(&dir.join("a/b/taskhost")).unwrap();
        assert_eq!(std::fs::metadata(state.path()).unwrap().permissions().mode() & 0o777, 0o700);
        let key = state.cache_key().unwrap();
        let again = state.cache_key().unwrap();
        assert_eq!(key.0, again.0, "the key is created once");
        assert_ne!(key.0, [0u8; 32]);
        let meta = std::fs::metadata(state.file(CACHE_KEY_FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(format!("{key:?}"), "CacheKey(<redacted>)");
        let spill = state.spill_root().unwrap();
        assert_eq!(std::fs::metadata(&spill).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_writable_or_linked_directory_is_refused_with_the_fix() {
        let dir = temp("mode");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let why = format!("{:#}", StateDir::open(&dir).unwrap_err());
        assert!(why.contains("writable by group or others (mode 0777)") && why.contains("chmod 700"), "{why}");
        assert!(why.contains(&dir.display().to_string()), "names the directory: {why}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        StateDir::open(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700, "tightened");
        let link = temp("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let why = format!("{:#}", StateDir::open(&link).unwrap_err());
        assert!(why.contains("it is a symlink"), "{why}");
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_key_with_loose_bits_or_the_wrong_size_is_replaced() {
        let dir = temp("badkey");
        let state = StateDir::open(&dir).unwrap();
        let first = state.cache_key().unwrap();
        let path = state.file(CACHE_KEY_FILE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let second = state.cache_key().unwrap();
        assert_ne!(first.0, second.0, "a readable key is not used");
        std::fs::write(&path, b"short").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let third = state.cache_key().unwrap();
        assert_ne!(third.0[..5], *b"short");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 32);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
