//! Trust records: the configuration and plugin files the user vouched for,
//! by canonical path and SHA-256, as direnv's `allow` (`taskhost trust`).
//!
//! Model: a [`TrustStore`] is `trust.json` in the default state directory.
//! A [`TrustPolicy`] is what one server applies: the roots its process
//! trees can write ([`WritableRoot`], computed from the configuration by
//! `config`), the store, and the files its developer named on the command
//! line. [`TrustPolicy::admit`] lets a file in through its bytes' hash: a
//! file outside every writable root needs nothing; one inside needs a record
//! of its canonical path with exactly that hash.
//!
//! Invariants:
//! - A record is (canonical path, SHA-256 of the exact bytes). The bytes
//!   checked are the bytes used: callers hash what they read once and
//!   parse or load that.
//! - A file is inside a writable root when its canonical path or its path
//!   as named (absolute, links not resolved) is the root or below it.
//! - Writes hold an exclusive `flock` on `trust.lock` and replace
//!   `trust.json` atomically (a `0600` temporary file renamed over it), so
//!   concurrent `trust` runs lose no record and a reader never sees half a
//!   file.
//! - Bounded: at most [`MAX_RECORDS`] records in at most
//!   [`MAX_TRUST_FILE_BYTES`]; a file over that, or one that does not parse,
//!   trusts nothing and says why (it is never read in part).

use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::StateDir;

/// Records kept at most; trusting one more is refused with the fix.
pub const MAX_RECORDS: usize = 4096;
/// The largest `trust.json` read.
pub const MAX_TRUST_FILE_BYTES: u64 = 4 << 20;
/// The format of `trust.json`.
const FORMAT_VERSION: u32 = 1;

/// What kind of file a record vouches for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// A `taskhost.toml`.
    Config,
    /// A `.wasm` plugin component.
    Plugin,
}

impl FileKind {
    /// `configuration` / `plugin`, for messages.
    pub fn noun(self) -> &'static str {
        match self {
            FileKind::Config => "configuration",
            FileKind::Plugin => "plugin",
        }
    }

    /// The kind a path's extension says (`.wasm` is a plugin, anything else
    /// a configuration).
    pub fn of(path: &Path) -> Self {
        if path.extension().is_some_and(|e| e == "wasm") { FileKind::Plugin } else { FileKind::Config }
    }
}

/// One trusted file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// Canonical path (UTF-8; a path that is not cannot be trusted).
    pub path: String,
    /// SHA-256 of the file's bytes, lowercase hex.
    pub sha256: String,
    pub kind: FileKind,
    /// When it was trusted (seconds since the Unix epoch).
    pub trusted_at: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrustFile {
    version: u32,
    records: Vec<Record>,
}

/// SHA-256 of `bytes`, lowercase hex (the same form as a plugin's content hash).
pub fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The trust records of one user (`trust.json` in the default state directory).
#[derive(Clone, Debug)]
pub struct TrustStore {
    file: PathBuf,
    lock: PathBuf,
}

impl TrustStore {
    /// The records of `state` (which should be the default state directory).
    pub fn new(state: &StateDir) -> Self {
        Self { file: state.trust_file(), lock: state.file("trust.lock") }
    }

    /// The records' file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The directory the records are in.
    pub fn dir(&self) -> &Path {
        self.file.parent().unwrap_or(Path::new("/"))
    }

    /// Every record, in the order they were made.
    pub fn records(&self) -> anyhow::Result<Vec<Record>> {
        Ok(self.read()?.records)
    }

    /// The record of a canonical path, if any.
    pub fn lookup(&self, canonical: &Path) -> anyhow::Result<Option<Record>> {
        let path = utf8(canonical)?;
        Ok(self.read()?.records.into_iter().find(|r| r.path == path))
    }

    /// Records `canonical` with `sha256`, replacing its earlier record
    /// (returned).
    pub fn trust(&self, canonical: &Path, sha256: &str, kind: FileKind) -> anyhow::Result<Option<Record>> {
        let path = utf8(canonical)?.to_string();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.update(|file| {
            let previous = file.records.iter().position(|r| r.path == path).map(|i| file.records.remove(i));
            anyhow::ensure!(
                file.records.len() < MAX_RECORDS,
                "{} already holds {MAX_RECORDS} records, the most it keeps; remove some with `taskhost untrust`",
                self.file.display()
            );
            file.records.push(Record { path: path.clone(), sha256: sha256.to_string(), kind, trusted_at: now });
            Ok(previous)
        })
    }

    /// Removes the record of `path` (canonical, or as recorded when the file
    /// is gone); returns it.
    pub fn untrust(&self, path: &Path) -> anyhow::Result<Option<Record>> {
        let path = utf8(path)?.to_string();
        self.update(|file| Ok(file.records.iter().position(|r| r.path == path).map(|i| file.records.remove(i))))
    }

    fn read(&self) -> anyhow::Result<TrustFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&self.file);
        let file = match file {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TrustFile::default()),
            Err(e) => return Err(e).with_context(|| format!("cannot open the trust records {}", self.file.display())),
        };
        let meta = file.metadata()?;
        anyhow::ensure!(meta.is_file(), "the trust records {} are not a regular file", self.file.display());
        anyhow::ensure!(
            meta.uid() == super::euid(),
            "the trust records {} are owned by uid {}, not by the server's uid {}",
            self.file.display(),
            meta.uid(),
            super::euid()
        );
        let mut text = String::new();
        file.take(MAX_TRUST_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .with_context(|| format!("cannot read the trust records {}", self.file.display()))?;
        anyhow::ensure!(
            text.len() as u64 <= MAX_TRUST_FILE_BYTES,
            "the trust records {} are over {MAX_TRUST_FILE_BYTES} bytes; nothing is trusted until it is fixed",
            self.file.display()
        );
        let parsed: TrustFile = serde_json::from_str(&text)
            .with_context(|| format!("the trust records {} do not parse; nothing is trusted", self.file.display()))?;
        anyhow::ensure!(
            parsed.version == FORMAT_VERSION,
            "the trust records {} are format {}, this taskhost reads {FORMAT_VERSION}",
            self.file.display(),
            parsed.version
        );
        Ok(parsed)
    }

    /// Reads, changes and writes the records under the lock.
    fn update<T>(&self, change: impl FnOnce(&mut TrustFile) -> anyhow::Result<T>) -> anyhow::Result<T> {
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.lock)
            .with_context(|| format!("cannot open {}", self.lock.display()))?;
        // SAFETY: flock on a descriptor we own; released when it closes.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot lock {}", self.lock.display()));
        }
        let mut file = self.read()?;
        file.version = FORMAT_VERSION;
        let result = change(&mut file)?;
        let text = serde_json::to_string_pretty(&file).expect("records serialize");
        let tmp = self.file.with_extension(format!("json.tmp-{}", std::process::id()));
        let written = (|| {
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            out.write_all(text.as_bytes())?;
            out.write_all(b"\n")?;
            out.sync_all()?;
            std::fs::rename(&tmp, &self.file)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.with_context(|| format!("cannot write the trust records {}", self.file.display()))?;
        drop(lock);
        Ok(result)
    }
}

fn utf8(path: &Path) -> anyhow::Result<&str> {
    path.to_str().with_context(|| format!("{} is not valid UTF-8; taskhost trusts only UTF-8 paths", path.display()))
}

/// A directory (or file) the process trees of a server can write, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritableRoot {
    /// As configured, made absolute.
    pub path: PathBuf,
    /// Canonical, when it exists.
    pub canonical: Option<PathBuf>,
    /// Why trees can write it (`the server's working directory`, ...).
    pub why: String,
}

impl WritableRoot {
    pub fn new(path: &Path, why: impl Into<String>) -> Self {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        Self { canonical: path.canonicalize().ok(), path, why: why.into() }
    }

    fn holds(&self, named: &Path, canonical: &Path) -> bool {
        let under = |root: &Path| named.starts_with(root) || canonical.starts_with(root);
        under(&self.path) || self.canonical.as_deref().is_some_and(under)
    }
}

/// Why a file was not admitted.
#[derive(Clone, Debug)]
pub struct Untrusted {
    pub kind: FileKind,
    /// The file as named (absolute).
    pub file: PathBuf,
    /// The writable root it lies in.
    pub root: WritableRoot,
    pub reason: UntrustedReason,
}

#[derive(Clone, Debug)]
pub enum UntrustedReason {
    /// No record for the file.
    Never,
    /// A record with another hash: the file changed since it was trusted.
    Changed { trusted: String, now: String },
    /// The records could not be read (then nothing is trusted).
    Store(String),
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let file = self.file.display();
        write!(
            f,
            "refusing the {} {file}: it lies in {} ({}), which process trees of this server can write, so a command \
             a model ran could have written it; ",
            self.kind.noun(),
            self.root.path.display(),
            self.root.why
        )?;
        match &self.reason {
            UntrustedReason::Never => write!(f, "it was never trusted")?,
            UntrustedReason::Changed { trusted, now } => write!(
                f,
                "it changed since it was trusted (sha256 {} now, {} when trusted)",
                &now[..12.min(now.len())],
                &trusted[..12.min(trusted.len())]
            )?,
            UntrustedReason::Store(why) => write!(f, "the trust records cannot be read ({why})")?,
        }
        write!(f, ". Check it, then run: taskhost trust {file}")
    }
}

impl std::error::Error for Untrusted {}

/// What one server trusts (see the module docs).
#[derive(Clone, Debug)]
pub struct TrustPolicy {
    store: TrustStore,
    writable: Vec<WritableRoot>,
    /// Canonical files the developer named on the command line.
    named: Vec<PathBuf>,
}

impl TrustPolicy {
    pub fn new(store: TrustStore, writable: Vec<WritableRoot>) -> Self {
        Self { store, writable, named: Vec::new() }
    }

    /// Trusts `file` whatever its hash: the one plugin a developer named on
    /// the command line of `taskhost dev` (it gets its own grant, no more).
    pub fn with_named(mut self, file: &Path) -> Self {
        if let Ok(canonical) = file.canonicalize() {
            self.named.push(canonical);
        }
        self
    }

    /// The trust records' file: a change to it may admit a refused file.
    pub fn records_file(&self) -> &Path {
        self.store.file()
    }

    /// The roots trees can write.
    pub fn writable(&self) -> &[WritableRoot] {
        &self.writable
    }

    /// Fails when `dir` (taskhost's own state: `what`) lies where trees can
    /// write: hidden from them or not, a tree could move a directory above
    /// it away and put its own in its place (its own trust records, say),
    /// which the next server would use.
    pub fn ensure_out_of_reach(&self, what: &str, dir: &Path) -> anyhow::Result<()> {
        match self.writable_root_of(dir) {
            None => Ok(()),
            Some(root) => anyhow::bail!(
                "{what} {} lies in {} ({}), which process trees of this server can write: a tree could move a \
                 directory above it away and put its own in its place. Keep it out of every workspace: set \
                 XDG_STATE_HOME (or [state] dir) to a directory outside {}",
                dir.display(),
                root.path.display(),
                root.why,
                root.path.display()
            ),
        }
    }

    /// The writable root `file` lies in, if any.
    pub fn writable_root_of(&self, file: &Path) -> Option<&WritableRoot> {
        let named = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
        let canonical = file.canonicalize().unwrap_or_else(|_| named.clone());
        self.writable.iter().find(|root| root.holds(&named, &canonical))
    }

    /// Admits `file`, whose bytes (read once by the caller, who uses those)
    /// hash to `sha256`: at once outside every writable root or when named
    /// on the command line; inside one only with a record of that hash.
    pub fn admit(&self, file: &Path, kind: FileKind, sha256: &str) -> Result<(), Box<Untrusted>> {
        let Some(root) = self.writable_root_of(file) else { return Ok(()) };
        let named = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
        let canonical = file.canonicalize().unwrap_or_else(|_| named.clone());
        if self.named.contains(&canonical) {
            return Ok(());
        }
        let refuse = |reason| Box::new(Untrusted { kind, file: named.clone(), root: root.clone(), reason });
        match self.store.lookup(&canonical) {
            Ok(Some(record)) if record.sha256 == sha256 => {
                tracing::debug!(file = %canonical.display(), kind = kind.noun(), "trusted by hash");
                Ok(())
            }
            Ok(Some(record)) => {
                Err(refuse(UntrustedReason::Changed { trusted: record.sha256, now: sha256.to_string() }))
            }
            Ok(None) => Err(refuse(UntrustedReason::Never)),
            Err(err) => Err(refuse(UntrustedReason::Store(format!("{err:#}")))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("taskhost-trust-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.canonicalize().unwrap()
    }

    #[test]
    fn a_file_in_a_writable_root_is_admitted_only_with_its_hash() {
        let dir = temp("admit");
        let store = TrustStore::new(&StateDir::open(&dir.join("state")).unwrap());
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let file = work.join("taskhost.toml");
        std::fs::write(&file, "x").unwrap();
        let outside = dir.join("outside.toml");
        std::fs::write(&outside, "x").unwrap();
        let policy = TrustPolicy::new(store.clone(), vec![WritableRoot::new(&work, "the server's working directory")]);
        policy.admit(&outside, FileKind::Config, &sha256_hex(b"x")).expect("outside every root");
        let never = policy.admit(&file, FileKind::Config, &sha256_hex(b"x")).unwrap_err().to_string();
        assert!(never.contains("never trusted") && never.contains(&format!("taskhost trust {}", file.display())));
        assert!(never.contains("the server's working directory"), "{never}");
        store.trust(&file, &sha256_hex(b"x"), FileKind::Config).unwrap();
        policy.admit(&file, FileKind::Config, &sha256_hex(b"x")).expect("trusted");
        let changed = policy.admit(&file, FileKind::Config, &sha256_hex(b"y")).unwrap_err().to_string();
        assert!(changed.contains("changed since it was trusted"), "{changed}");
        // A link from outside into the root is inside; the record is by canonical path.
        let link = dir.join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        policy.admit(&link, FileKind::Config, &sha256_hex(b"x")).expect("the canonical file is trusted");
        assert!(policy.admit(&link, FileKind::Config, &sha256_hex(b"z")).is_err());
        assert_eq!(store.untrust(&file).unwrap().unwrap().sha256, sha256_hex(b"x"));
        assert!(policy.admit(&file, FileKind::Config, &sha256_hex(b"x")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_broken_record_file_trusts_nothing() {
        let dir = temp("broken");
        let state = StateDir::open(&dir.join("state")).unwrap();
        let store = TrustStore::new(&state);
        let file = dir.join("a.wasm");
        std::fs::write(&file, "x").unwrap();
        store.trust(&file, &sha256_hex(b"x"), FileKind::Plugin).unwrap();
        std::fs::write(store.file(), "{ not json").unwrap();
        let policy = TrustPolicy::new(store.clone(), vec![WritableRoot::new(&dir, "a test root")]);
        let why = policy.admit(&file, FileKind::Plugin, &sha256_hex(b"x")).unwrap_err().to_string();
        assert!(why.contains("trust records cannot be read") && why.contains("do not parse"), "{why}");
        assert!(store.trust(&file, &sha256_hex(b"x"), FileKind::Plugin).is_err(), "a broken file is not overwritten");
        let named = policy.clone().with_named(&file);
        named.admit(&file, FileKind::Plugin, &sha256_hex(b"other")).expect("named on the command line");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
