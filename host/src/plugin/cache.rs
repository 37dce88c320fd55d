//! The compile cache: compiled components (native code the host will run) and `describe`
//! answers on disk, one [`CompileCache`] per engine, never loading foreign code.
//!
//! Model: one file per key (`<content sha-256>-<engine compatibility hash>`; descriptor entries
//! `desc-<content sha-256>-<config hash>.desc`, see [`descriptor_key`]), each a header (magic,
//! then an HMAC-SHA256 of the entry's kind, its key and the artifact) then the artifact. The
//! MAC key is 32 random bytes in the state directory
//! ([`crate::state::StateDir::cache_key`]), never in the cache directory. Descriptor entries
//! get the same header, checks, writes and trimming; they are never code, and the real
//! `describe` that always follows catches a wrong one (see `super::producer`).
//!
//! Invariants:
//! - The directory is created `0700`; an existing one is used only if it is a real directory
//!   (not a symlink), owned by the effective uid and writable by nobody else, else the cache
//!   is off with one warning naming it and the fix. Group or world read bits on a directory
//!   only its owner can write are taken away (`0700`).
//! - An entry is loaded only if it opens with `O_NOFOLLOW`, is a regular file owned by the
//!   server's uid with no group or other bits, and is at most `cache_max_bytes` long. It is
//!   read whole and its MAC checked before `Component::deserialize` (which copies): no mapping
//!   of a file anyone can still change ever becomes code.
//! - An entry failing any check, a bad MAC included, is a miss: logged, deleted, recompiled and
//!   replaced. The MAC catches a partial rewrite, a swapped artifact (even a valid one: key and
//!   kind are in it) and an entry forged by anyone who can write the directory but cannot read
//!   the key.
//! - Writes are atomic (a `0600` temporary file, `O_EXCL | O_NOFOLLOW`, renamed over the
//!   entry). Each store trims the directory to `cache_max_bytes`, least recently used first (a
//!   hit refreshes the mtime); an artifact larger than the cap is not stored.
//! - Both directories are paths no process tree may read or write
//!   ([`taskhost_process::ProcessHostConfig::protected_paths`]); the key is what still holds
//!   when that protection is carried away (a tree that moves `~/.cache` away, say).

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use hmac::Mac as _;
use sha2::Digest as _;

use crate::state::CacheKey;

/// First bytes of every entry: names the format (and its version; version
/// 1 entries, with an unkeyed digest, are refused and recompiled).
const MAGIC: &[u8; 16] = b"taskhost-cwasm2\n";
/// Magic, then the 32-byte MAC.
pub const HEADER_LEN: usize = MAGIC.len() + 32;
/// File name extension of compiled-component entries.
const EXTENSION: &str = "cwasm";
/// File name extension of descriptor entries (see [`descriptor_key`]).
const DESCRIPTOR_EXTENSION: &str = "desc";

/// A checked compile cache directory.
#[derive(Debug)]
pub struct CompileCache {
    dir: PathBuf,
    max_bytes: u64,
    key: CacheKey,
    next_tmp: AtomicU64,
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// The verified artifact bytes.
    Hit(Vec<u8>),
    Miss,
    /// An entry existed and was refused (and deleted): why.
    Refused(EntryRefused),
}

/// Why a compile cache directory cannot be trusted; each says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheDirRefused {
    #[error("cannot create it: {0}")]
    Create(#[source] std::io::Error),
    #[error("cannot inspect it: {0}")]
    Inspect(#[source] std::io::Error),
    #[error("it is a symlink; point [plugins] cache_dir at a real directory")]
    Symlink,
    #[error("it is not a directory")]
    NotADirectory,
    #[error(
        "it is owned by uid {owner}, not by the server's uid {server}; remove it or set [plugins] cache_dir \
         to a directory of the server's user"
    )]
    ForeignOwner { owner: u32, server: u32 },
    #[error(
        "it is writable by group or others (mode {mode:04o}); anyone who can write it could make the server \
         run their code: `chmod 700` it after checking its contents, or remove it"
    )]
    WritableByOthers { mode: u32 },
    #[error("cannot restrict its mode {mode:04o} to 0700: {source}")]
    Restrict { mode: u32, source: std::io::Error },
}

/// Why a cache entry was refused (and deleted): it is recompiled instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EntryRefused {
    #[error("it is a symlink")]
    Symlink,
    #[error("cannot open it: {0}")]
    Open(#[source] std::io::Error),
    #[error("cannot inspect it: {0}")]
    Inspect(#[source] std::io::Error),
    #[error("it is not a regular file")]
    NotAFile,
    #[error("it is owned by uid {owner}, not by the server's uid {server}")]
    ForeignOwner { owner: u32, server: u32 },
    #[error("its mode is {mode:04o}; entries must be 0600")]
    Mode { mode: u32 },
    #[error("its size {len} is outside {HEADER_LEN}..={max} bytes")]
    Size { len: u64, max: u64 },
    #[error("cannot read it: {0}")]
    Read(#[source] std::io::Error),
    #[error("it changed size while being read")]
    ChangedWhileRead,
    #[error("it does not start with the taskhost cache header (an old or foreign file)")]
    Header,
    #[error("its MAC does not match its contents and key (modified, swapped or forged)")]
    Mac,
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

impl CompileCache {
    /// Creates (`0700`) or checks the directory; entries are authenticated
    /// with `key`. The error says why the directory cannot be trusted and
    /// what to do about it.
    pub fn open(dir: &Path, max_bytes: u64, key: CacheKey) -> Result<Self, CacheDirRefused> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(CacheDirRefused::Create)?;
        let meta = std::fs::symlink_metadata(dir).map_err(CacheDirRefused::Inspect)?;
        if meta.file_type().is_symlink() {
            return Err(CacheDirRefused::Symlink);
        }
        if !meta.is_dir() {
            return Err(CacheDirRefused::NotADirectory);
        }
        if meta.uid() != euid() {
            return Err(CacheDirRefused::ForeignOwner { owner: meta.uid(), server: euid() });
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Err(CacheDirRefused::WritableByOthers { mode });
        }
        if mode & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|source| CacheDirRefused::Restrict { mode, source })?;
        }
        Ok(Self { dir: dir.to_path_buf(), max_bytes, key, next_tmp: AtomicU64::new(0) })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The size cap of the whole directory, in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The file of `key`.
    pub fn entry_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.{EXTENSION}"))
    }

    /// The file of the descriptor entry `key`.
    pub fn descriptor_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.{DESCRIPTOR_EXTENSION}"))
    }

    /// Looks `key` up. A refused entry is deleted (the caller recompiles and
    /// stores it again); the reason is returned for the log.
    pub fn load(&self, key: &str) -> Lookup {
        self.load_at(key, &self.entry_path(key))
    }

    /// Looks the descriptor entry `key` up, with the same checks as a
    /// compiled component (a refused entry is deleted).
    pub fn load_descriptor(&self, key: &str) -> Lookup {
        self.load_at(key, &self.descriptor_path(key))
    }

    /// Stores a descriptor entry (JSON text) under `key`, atomically.
    pub fn store_descriptor(&self, key: &str, json: &[u8]) -> std::io::Result<()> {
        self.store_at(key, &self.descriptor_path(key), json)
    }

    /// Deletes the descriptor entry of `key` (it proved wrong or unusable).
    pub fn discard_descriptor(&self, key: &str) {
        self.remove(&self.descriptor_path(key));
    }

    fn load_at(&self, key: &str, path: &Path) -> Lookup {
        let path = path.to_path_buf();
        match self.read_checked(key, &path) {
            Ok(Some(bytes)) => Lookup::Hit(bytes),
            Ok(None) => Lookup::Miss,
            Err(why) => {
                self.remove(&path);
                Lookup::Refused(why)
            }
        }
    }

    /// Deletes the entry of `key` (after a deserialize failure).
    pub fn discard(&self, key: &str) {
        self.remove(&self.entry_path(key));
    }

    fn remove(&self, path: &Path) {
        if let Err(e) = std::fs::remove_file(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %path.display(), error = %e, "cannot delete a refused compile cache entry");
        }
    }

    fn read_checked(&self, key: &str, path: &Path) -> Result<Option<Vec<u8>>, EntryRefused> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            // No symlink as the last component; a FIFO must not block the open.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path);
        let mut file = match file {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(EntryRefused::Symlink),
            Err(e) => return Err(EntryRefused::Open(e)),
        };
        let meta = file.metadata().map_err(EntryRefused::Inspect)?;
        if !meta.is_file() {
            return Err(EntryRefused::NotAFile);
        }
        if meta.uid() != euid() {
            return Err(EntryRefused::ForeignOwner { owner: meta.uid(), server: euid() });
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o7077 != 0 {
            return Err(EntryRefused::Mode { mode });
        }
        if meta.len() > self.max_bytes || meta.len() < HEADER_LEN as u64 {
            return Err(EntryRefused::Size { len: meta.len(), max: self.max_bytes });
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        (&mut file).take(self.max_bytes + 1).read_to_end(&mut bytes).map_err(EntryRefused::Read)?;
        if bytes.len() as u64 > self.max_bytes || bytes.len() < HEADER_LEN {
            return Err(EntryRefused::ChangedWhileRead);
        }
        if &bytes[..MAGIC.len()] != MAGIC {
            return Err(EntryRefused::Header);
        }
        let (header, artifact) = bytes.split_at(HEADER_LEN);
        if self.mac(path, key, artifact).verify_slice(&header[MAGIC.len()..]).is_err() {
            return Err(EntryRefused::Mac);
        }
        // Least recently used is judged by mtime (atime is often not kept).
        let _ = file.set_modified(std::time::SystemTime::now());
        bytes.drain(..HEADER_LEN);
        Ok(Some(bytes))
    }

    /// Stores `artifact` under `key` atomically, then trims the directory.
    pub fn store(&self, key: &str, artifact: &[u8]) -> std::io::Result<()> {
        self.store_at(key, &self.entry_path(key), artifact)
    }

    fn store_at(&self, key: &str, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
        let total = (HEADER_LEN + artifact.len()) as u64;
        if total > self.max_bytes {
            tracing::info!(
                bytes = total,
                cache_max_bytes = self.max_bytes,
                "compiled component larger than the whole compile cache cap; not cached"
            );
            return Ok(());
        }
        let path = path.to_path_buf();
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join(format!(".tmp-{}-{n}-{key}", std::process::id()));
        let written = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            file.write_all(MAGIC)?;
            file.write_all(&self.mac(&path, key, artifact).finalize().into_bytes())?;
            file.write_all(artifact)?;
            std::fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written?;
        self.trim(&path);
        Ok(())
    }

    /// The HMAC-SHA256 state over the format, the entry's kind (its file
    /// extension), its key and `artifact`: a file moved to another key's
    /// name, or from a descriptor to a component, does not verify.
    fn mac(&self, path: &Path, key: &str, artifact: &[u8]) -> hmac::Hmac<sha2::Sha256> {
        let mut mac = <hmac::Hmac<sha2::Sha256>>::new_from_slice(&self.key.0).expect("HMAC takes any key length");
        let kind = path.extension().map(|e| e.as_encoded_bytes()).unwrap_or_default();
        mac.update(MAGIC);
        for part in [kind, key.as_bytes()] {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac.update(artifact);
        mac
    }

    /// Deletes the least recently used entries until the directory holds at
    /// most `max_bytes`, keeping `keep` (just stored); removes temporary files
    /// of dead writers.
    fn trim(&self, keep: &Path) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let mut files = Vec::new();
        let mut total = 0u64;
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(rest) = name.strip_prefix(".tmp-") {
                let pid = rest.split('-').next().unwrap_or("");
                if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
            }
            total += meta.len();
            if path.extension().is_some_and(|e| e == EXTENSION || e == DESCRIPTOR_EXTENSION) && path != keep {
                files.push((meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len(), path));
            }
        }
        if total <= self.max_bytes {
            return;
        }
        files.sort();
        for (_, len, path) in files {
            if total <= self.max_bytes {
                break;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    total = total.saturating_sub(len);
                    tracing::debug!(file = %path.display(), bytes = len, "evicted from the compile cache");
                }
                Err(e) => tracing::warn!(file = %path.display(), error = %e, "cannot evict a compile cache entry"),
            }
        }
    }
}

/// The key of the descriptor entry of a component (`content_hash`, the
/// SHA-256 of its bytes in hex) described with `config_json` by this host
/// version: `describe` depends on all three.
pub fn descriptor_key(content_hash: &str, config_json: &str) -> String {
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"taskhost-descriptor\n");
    hasher.update(env!("CARGO_PKG_VERSION").as_bytes());
    hasher.update(b"\n");
    hasher.update(config_json.as_bytes());
    let config: [u8; 32] = hasher.finalize().into();
    let config: String = config[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("desc-{content_hash}-{config}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("taskhost-cache-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn key(byte: u8) -> CacheKey {
        CacheKey([byte; 32])
    }

    #[test]
    fn stores_and_verifies_and_refuses_a_flipped_byte() {
        let dir = temp("flip");
        let cache = CompileCache::open(&dir, 1 << 20, key(1)).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        cache.store("k", b"artifact bytes").unwrap();
        let path = cache.entry_path("k");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(matches!(cache.load("k"), Lookup::Hit(b) if b == b"artifact bytes"));
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let Lookup::Refused(why) = cache.load("k") else { panic!("a flipped byte must be refused") };
        assert!(matches!(why, EntryRefused::Mac), "{why}");
        assert!(!path.exists(), "a refused entry is deleted");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_entry_under_another_key_does_not_verify() {
        let dir = temp("swap");
        let cache = CompileCache::open(&dir, 1 << 20, key(1)).unwrap();
        cache.store("a", b"code of a").unwrap();
        std::fs::rename(cache.entry_path("a"), cache.entry_path("b")).unwrap();
        assert!(matches!(cache.load("b"), Lookup::Refused(EntryRefused::Mac)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_entry_forged_without_the_key_is_refused() {
        let dir = temp("forge");
        let cache = CompileCache::open(&dir, 1 << 20, key(1)).unwrap();
        cache.store("k", b"real code").unwrap();
        // Whoever writes the directory but lacks the key: its own MAC, its code.
        let forger = CompileCache::open(&dir, 1 << 20, key(2)).unwrap();
        forger.store("k", b"forged code").unwrap();
        assert!(matches!(forger.load("k"), Lookup::Hit(b) if b == b"forged code"), "valid under the forger's key");
        forger.store("k", b"forged code").unwrap();
        let Lookup::Refused(why) = cache.load("k") else { panic!("a forged entry must be refused") };
        assert!(matches!(why, EntryRefused::Mac), "{why}");
        // A descriptor moved to a component's name does not verify either.
        cache.store_descriptor("d", b"{}").unwrap();
        std::fs::rename(cache.descriptor_path("d"), cache.entry_path("d")).unwrap();
        assert!(matches!(cache.load("d"), Lookup::Refused(EntryRefused::Mac)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_group_writable_directory_is_refused_with_the_fix() {
        let dir = temp("mode");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let why = CompileCache::open(&dir, 1 << 20, key(1)).unwrap_err().to_string();
        assert!(why.contains("writable by group or others (mode 0777)") && why.contains("chmod 700"), "{why}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        CompileCache::open(&dir, 1 << 20, key(1)).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700, "tightened");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_artifact_larger_than_the_cap_is_not_stored() {
        let dir = temp("big");
        let cache = CompileCache::open(&dir, 100, key(1)).unwrap();
        cache.store("k", &[0u8; 100]).unwrap();
        assert!(matches!(cache.load("k"), Lookup::Miss));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
