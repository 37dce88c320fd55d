//! The default filesystem policy of a process tree, and how a grant and the
//! host change it.
//!
//! | What | A command can |
//! |------|---------------|
//! | the workspace (the grant's `working_dirs`, else the server's cwd) and the grant's `read_write_paths` | read and write |
//! | `/tmp`, `/dev/shm` | read and write a private, empty `tmpfs` of its own (1 GiB); a workspace below `/tmp` stays reachable at its path |
//! | `/run/user`, `$XDG_RUNTIME_DIR` | see an empty `tmpfs` (host sockets of tmux, ssh-agent, D-Bus are gone) |
//! | [`DEFAULT_DENY_READ`] (credentials), [`SYSTEM_DENY_READ`], the host's protected paths | nothing: an empty directory it cannot list, or an empty file |
//! | everything else | read and execute, never write |
//!
//! Model: [`FsPolicy`] is the grant's part (`[producer.grants.process.filesystem]`):
//! paths to deny on top of the defaults, and default paths to read after all.
//! A [`TreePolicy`] is everything resolved to canonical paths for a spawn;
//! [`PolicyCache`] reuses the previous resolution when `stat` shows that
//! every path it was resolved from still names the same file (or is still
//! missing); [`super::view`] and [`super::landlock`] enforce
//! it.
//!
//! Invariants: the host's protected paths (its configuration, tokens,
//! compile cache, spill root) can never be read by a tree, whatever the
//! grant says; paths are compared after resolving symlinks, so a link to a
//! credential is the credential.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Credentials below the server's home directory that no tree reads by
/// default.
pub const DEFAULT_DENY_READ: &[&str] = &[
    "~/.ssh",
    "~/.gnupg",
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.kube",
    "~/.docker/config.json",
    "~/.netrc",
    "~/.git-credentials",
    "~/.config/gh",
    "~/.npmrc",
    "~/.pypirc",
];

/// System secrets and host sockets no tree reads by default. (Files the
/// server's user cannot read anyway are harmless to list; they matter when
/// the server runs as root, whose files a tree's root could otherwise read.)
pub const SYSTEM_DENY_READ: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
    "/run/dbus/system_bus_socket",
];

/// Host state every tree is denied by default, besides the host's
/// configured protected paths: taskhost's own cache.
pub const HOST_DENY_READ: &[&str] = &["~/.cache/taskhost"];

/// Directories that get a fresh, empty `tmpfs` in every tree.
const PRIVATE_DIRS: &[&str] = &["/tmp", "/run/user"];

/// A grant's changes to the default filesystem policy.
///
/// ```toml
/// [producer.grants.process.filesystem]
/// deny_read = ["~/private", "/srv/secrets"]  # hidden on top of the defaults
/// allow_read = ["~/.npmrc"]                  # default credentials this tool may read
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FsPolicy {
    /// Paths no process of this grant may read, on top of the defaults
    /// ([`DEFAULT_DENY_READ`], [`SYSTEM_DENY_READ`], the host's protected
    /// paths). `~/` is the server's home directory.
    pub deny_read: Vec<PathBuf>,
    /// Default deny-read paths this grant may read after all (for example
    /// `~/.npmrc` for a publishing tool). The host's protected paths cannot
    /// be allowed this way.
    pub allow_read: Vec<PathBuf>,
}

/// The server's home directory.
pub(crate) fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from).or_else(|| {
        // SAFETY: getpwuid returns a pointer into static storage or null;
        // we copy the string at once.
        unsafe {
            let pw = libc::getpwuid(libc::getuid());
            if pw.is_null() || (*pw).pw_dir.is_null() {
                return None;
            }
            let dir = std::ffi::CStr::from_ptr((*pw).pw_dir);
            Some(PathBuf::from(std::ffi::OsStr::from_encoded_bytes_unchecked(dir.to_bytes())))
        }
    })
}

/// `~/x` → `<home>/x`; other paths as they are.
pub(crate) fn expand(path: &Path, home: Option<&Path>) -> Option<PathBuf> {
    match path.strip_prefix("~") {
        Ok(rest) => home.map(|h| h.join(rest)),
        Err(_) => Some(path.to_path_buf()),
    }
}

/// What a path named when it was resolved: the file's device, inode and
/// type, by `stat` (symlinks followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    kind: u32,
}

impl Identity {
    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(Self { dev: meta.dev(), ino: meta.ino(), kind: meta.mode() & libc::S_IFMT })
    }

    fn is_dir(self) -> bool {
        self.kind == libc::S_IFDIR
    }
}

/// One path resolved for a policy, and what it named: `None` when it did
/// not exist (or could not be resolved).
#[derive(Clone, Debug)]
struct Resolution {
    path: PathBuf,
    found: Option<(Identity, PathBuf)>,
}

impl Resolution {
    /// The path still names what it named, through the same canonical path;
    /// a path that was missing is still missing.
    fn holds(&self) -> bool {
        match &self.found {
            None => Identity::of(&self.path).is_none(),
            Some((identity, canonical)) => {
                Identity::of(&self.path) == Some(*identity) && Identity::of(canonical) == Some(*identity)
            }
        }
    }
}

/// Every path a policy was resolved from, with what it named then.
#[derive(Clone, Debug, Default)]
struct Resolutions(Vec<Resolution>);

impl Resolutions {
    /// Canonical form of a path that exists; `None` otherwise. Recorded.
    fn canonical(&mut self, path: &Path) -> Option<PathBuf> {
        self.resolve(path).map(|(_, canonical)| canonical)
    }

    fn resolve(&mut self, path: &Path) -> Option<(Identity, PathBuf)> {
        let found = path.canonicalize().ok().and_then(|c| Identity::of(&c).map(|identity| (identity, c)));
        self.0.push(Resolution { path: path.to_path_buf(), found: found.clone() });
        found
    }

    fn all_hold(&self) -> bool {
        self.0.iter().all(Resolution::holds)
    }
}

/// The resolved policy of one tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TreePolicy {
    /// Canonical read-write roots.
    pub read_write: Vec<PathBuf>,
    /// Canonical readable roots (Landlock).
    pub read: Vec<PathBuf>,
    /// Canonical directories that get a private `tmpfs`.
    pub private: Vec<PathBuf>,
    /// Canonical paths hidden from the tree.
    pub deny: Vec<PathBuf>,
    /// Canonical paths bound read-only at their own paths (the host's
    /// write-protected paths that exist), so a tree reads but never writes,
    /// replaces or removes them.
    pub write_protected: Vec<PathBuf>,
}

/// Everything a [`TreePolicy`] is resolved from besides the filesystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PolicyInputs {
    workspace: Vec<PathBuf>,
    read_write: Vec<PathBuf>,
    read_only: Vec<PathBuf>,
    grant: FsPolicy,
    protected: Vec<PathBuf>,
    write_protected: Vec<PathBuf>,
    home: Option<PathBuf>,
    runtime_dir: Option<PathBuf>,
}

impl PolicyInputs {
    /// `workspace` are the grant's working roots, `read_write`/`read_only`
    /// its extra Landlock paths (an empty `read_only` means everything is
    /// readable), `protected` and `write_protected` the host's; `$HOME`
    /// and `$XDG_RUNTIME_DIR` are read now.
    pub(crate) fn new(
        workspace: &[PathBuf],
        read_write: &[PathBuf],
        read_only: &[PathBuf],
        grant: &FsPolicy,
        protected: &[PathBuf],
        write_protected: &[PathBuf],
    ) -> Self {
        Self {
            workspace: workspace.to_vec(),
            read_write: read_write.to_vec(),
            read_only: read_only.to_vec(),
            grant: grant.clone(),
            protected: protected.to_vec(),
            write_protected: write_protected.to_vec(),
            home: home(),
            runtime_dir: std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        }
    }
}

impl TreePolicy {
    /// Resolves the policy now, without a cache.
    #[cfg(test)]
    pub(crate) fn new(inputs: &PolicyInputs) -> Self {
        Self::resolve(inputs, &mut Resolutions::default())
    }

    fn resolve(inputs: &PolicyInputs, paths: &mut Resolutions) -> Self {
        let home = inputs.home.as_deref();
        let mut rw: Vec<PathBuf> =
            inputs.workspace.iter().chain(&inputs.read_write).filter_map(|p| paths.canonical(p)).collect();
        rw.sort();
        rw.dedup();
        let private = private_dirs(inputs.runtime_dir.as_deref(), paths);
        let read = if inputs.read_only.is_empty() {
            vec![PathBuf::from("/")]
        } else {
            inputs.read_only.iter().filter_map(|p| paths.canonical(p)).collect()
        };
        let allowed: Vec<PathBuf> = inputs
            .grant
            .allow_read
            .iter()
            .filter_map(|p| expand(p, home))
            .filter_map(|p| paths.canonical(&p))
            .collect();
        let defaults = DEFAULT_DENY_READ
            .iter()
            .chain(SYSTEM_DENY_READ)
            .map(Path::new)
            .chain(inputs.grant.deny_read.iter().map(PathBuf::as_path));
        let mut deny: Vec<PathBuf> = defaults
            .filter_map(|p| expand(p, home))
            .filter_map(|p| paths.canonical(&p))
            .filter(|p| !allowed.contains(p))
            .collect();
        deny.extend(
            HOST_DENY_READ
                .iter()
                .map(Path::new)
                .chain(inputs.protected.iter().map(PathBuf::as_path))
                .filter_map(|p| expand(p, home))
                .filter_map(|p| paths.canonical(&p)),
        );
        deny.sort();
        deny.dedup();
        let mut write_protected: Vec<PathBuf> = inputs
            .write_protected
            .iter()
            .filter_map(|p| expand(p, home))
            .filter_map(|p| paths.canonical(&p))
            .filter(|p| !deny.contains(p))
            .collect();
        write_protected.sort();
        write_protected.dedup();
        Self { read_write: rw, read, private, deny, write_protected }
    }
}

/// Resolved policies of recent spawns, so a spawn does not resolve every
/// default path again (a `canonicalize` per path, ~30 paths).
///
/// Invariant: a cached policy is only used after every path it was resolved
/// from was checked again with `stat`: each path that existed still names
/// the same file (device, inode, type), as does its canonical form, and
/// each path that was missing is still missing. A credential directory
/// created, removed, replaced or re-linked since is seen, as without the
/// cache; only a policy whose every input still holds is reused (one or
/// two `stat`s per path instead of a resolution). The inputs that are not
/// paths (the grant, `$HOME`, `$XDG_RUNTIME_DIR`, the protected paths) are
/// the key. At most [`PolicyCache::ENTRIES`] policies are kept.
#[derive(Debug, Default)]
pub(crate) struct PolicyCache {
    entries: std::sync::Mutex<Vec<Arc<CachedPolicy>>>,
}

#[derive(Debug)]
struct CachedPolicy {
    inputs: PolicyInputs,
    paths: Resolutions,
    policy: Arc<TreePolicy>,
}

impl PolicyCache {
    /// Policies kept (one per grant in practice; the least recently used
    /// goes first).
    pub(crate) const ENTRIES: usize = 8;

    /// The policy [`TreePolicy::new`] would resolve now.
    pub(crate) fn policy(&self, inputs: PolicyInputs) -> Arc<TreePolicy> {
        let cached = {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries.iter().find(|e| e.inputs == inputs).cloned()
        };
        if let Some(cached) = cached
            && cached.paths.all_hold()
        {
            return cached.policy.clone();
        }
        let mut paths = Resolutions::default();
        let policy = Arc::new(TreePolicy::resolve(&inputs, &mut paths));
        let fresh = Arc::new(CachedPolicy { inputs, paths, policy: policy.clone() });
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|e| e.inputs != fresh.inputs);
        entries.push(fresh);
        if entries.len() > Self::ENTRIES {
            entries.remove(0);
        }
        policy
    }
}

impl TreePolicy {
    /// What Landlock lets the tree write: the read-write roots and the
    /// private directories (their fresh `tmpfs` sits on those paths).
    pub(crate) fn landlock_read_write(&self) -> Vec<PathBuf> {
        self.read_write.iter().chain(&self.private).cloned().collect()
    }
}

/// `/tmp`, `/run/user` and `$XDG_RUNTIME_DIR`, canonical,
/// existing, and none below another (a mount below a fresh `tmpfs` would
/// find no mount point).
fn private_dirs(runtime: Option<&Path>, paths: &mut Resolutions) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = PRIVATE_DIRS
        .iter()
        .map(Path::new)
        .chain(runtime)
        .filter_map(|p| paths.resolve(p))
        .filter(|(identity, _)| identity.is_dir())
        .map(|(_, canonical)| canonical)
        .collect();
    dirs.sort();
    dirs.dedup();
    let all = dirs.clone();
    dirs.retain(|d| !all.iter().any(|other| other != d && d.starts_with(other)));
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_private_dirs_collapse_and_allow_read_removes_defaults_only() {
        let dir = std::env::temp_dir().join(format!("taskhost-fs-policy-{}", std::process::id()));
        let cred = dir.join("cred");
        std::fs::create_dir_all(&cred).unwrap();
        let protected = dir.join("protected");
        std::fs::write(&protected, "x").unwrap();
        let grant = FsPolicy { deny_read: vec![cred.clone()], allow_read: vec![cred.clone(), protected.clone()] };
        let policy = TreePolicy::new(&PolicyInputs::new(
            std::slice::from_ref(&dir),
            &[],
            &[],
            &grant,
            std::slice::from_ref(&protected),
            &[],
        ));
        let cred = cred.canonicalize().unwrap();
        let protected = protected.canonicalize().unwrap();
        assert!(!policy.deny.contains(&cred), "allow_read lifts a grant's own deny");
        assert!(policy.deny.contains(&protected), "a host-protected path stays denied");
        assert_eq!(policy.read, vec![PathBuf::from("/")]);
        for d in &policy.private {
            assert!(!policy.private.iter().any(|o| o != d && d.starts_with(o)), "{:?}", policy.private);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A cached policy is reused while its paths hold, and resolved again
    /// when a denied path appears, disappears or is replaced by a link.
    #[test]
    fn the_cache_sees_every_change_of_a_denied_path() {
        let dir = std::env::temp_dir().join(format!("taskhost-fs-policy-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let dir = dir.canonicalize().unwrap();
        let (cred, elsewhere) = (dir.join("cred"), dir.join("elsewhere"));
        std::fs::create_dir_all(&elsewhere).unwrap();
        let grant = FsPolicy { deny_read: vec![cred.clone()], allow_read: vec![] };
        let cache = PolicyCache::default();
        let inputs = |grant: &FsPolicy| PolicyInputs::new(std::slice::from_ref(&dir), &[], &[], grant, &[], &[]);
        let policy = || cache.policy(inputs(&grant));
        let uncached = || TreePolicy::new(&inputs(&grant));

        let first = policy();
        assert!(!first.deny.contains(&cred), "a missing path is not mounted over");
        assert!(Arc::ptr_eq(&first, &policy()), "nothing changed: the resolution is reused");

        std::fs::create_dir(&cred).unwrap();
        let created = policy();
        assert!(created.deny.contains(&cred), "a credential directory created after the first spawn is denied");
        assert_eq!(*created, uncached());

        std::fs::remove_dir(&cred).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &cred).unwrap();
        let linked = policy();
        assert!(linked.deny.contains(&elsewhere), "a link to a directory denies the directory it names");
        assert!(!linked.deny.contains(&cred));
        assert_eq!(*linked, uncached());

        std::fs::remove_file(&cred).unwrap();
        let removed = policy();
        assert!(!removed.deny.contains(&elsewhere) && !removed.deny.contains(&cred));
        assert_eq!(*removed, uncached());

        let other = FsPolicy { deny_read: vec![elsewhere.clone()], allow_read: vec![] };
        let by_grant = cache.policy(inputs(&other));
        assert!(by_grant.deny.contains(&elsewhere), "another grant is another entry");
        assert!(Arc::ptr_eq(&removed, &policy()), "the first grant's entry is still there");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
