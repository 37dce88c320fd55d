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
//! [`TreePolicy::new`] resolves everything to canonical paths once per
//! spawn; [`super::sandbox::MountPlan`] and [`super::landlock`] enforce it.
//!
//! Invariants: the host's protected paths (its configuration, tokens,
//! compile cache, spill root) can never be read by a tree, whatever the
//! grant says; paths are compared after resolving symlinks, so a link to a
//! credential is the credential.

use std::path::{Path, PathBuf};

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
const PRIVATE_DIRS: &[&str] = &["/tmp", "/dev/shm", "/run/user"];

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

/// Canonical form of a path that exists; `None` otherwise.
fn canonical(path: &Path) -> Option<PathBuf> {
    path.canonicalize().ok()
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
}

impl TreePolicy {
    /// Resolves the policy: `workspace` are the grant's working roots,
    /// `read_write`/`read_only` its extra Landlock paths (an empty
    /// `read_only` means everything is readable), `protected` the host's.
    pub(crate) fn new(
        workspace: &[PathBuf],
        read_write: &[PathBuf],
        read_only: &[PathBuf],
        grant: &FsPolicy,
        protected: &[PathBuf],
    ) -> Self {
        let home = home();
        let home = home.as_deref();
        let mut rw: Vec<PathBuf> = workspace.iter().chain(read_write).filter_map(|p| canonical(p)).collect();
        rw.sort();
        rw.dedup();
        let private = private_dirs(home);
        let read = if read_only.is_empty() {
            vec![PathBuf::from("/")]
        } else {
            read_only.iter().filter_map(|p| canonical(p)).collect()
        };
        let allowed: Vec<PathBuf> =
            grant.allow_read.iter().filter_map(|p| expand(p, home)).filter_map(|p| canonical(&p)).collect();
        let defaults = DEFAULT_DENY_READ
            .iter()
            .chain(SYSTEM_DENY_READ)
            .map(Path::new)
            .chain(grant.deny_read.iter().map(PathBuf::as_path));
        let mut deny: Vec<PathBuf> = defaults
            .filter_map(|p| expand(p, home))
            .filter_map(|p| canonical(&p))
            .filter(|p| !allowed.contains(p))
            .collect();
        deny.extend(
            HOST_DENY_READ
                .iter()
                .map(Path::new)
                .chain(protected.iter().map(PathBuf::as_path))
                .filter_map(|p| expand(p, home))
                .filter_map(|p| canonical(&p)),
        );
        deny.sort();
        deny.dedup();
        Self { read_write: rw, read, private, deny }
    }
}

impl TreePolicy {
    /// What Landlock lets the tree write: the read-write roots and the
    /// private directories (their fresh `tmpfs` sits on those paths).
    pub(crate) fn landlock_read_write(&self) -> Vec<PathBuf> {
        self.read_write.iter().chain(&self.private).cloned().collect()
    }
}

/// `/tmp`, `/dev/shm`, `/run/user` and `$XDG_RUNTIME_DIR`, canonical,
/// existing, and none below another (a mount below a fresh `tmpfs` would
/// find no mount point).
fn private_dirs(_home: Option<&Path>) -> Vec<PathBuf> {
    let runtime = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
    let mut dirs: Vec<PathBuf> = PRIVATE_DIRS
        .iter()
        .map(PathBuf::from)
        .chain(runtime)
        .filter_map(|p| canonical(&p))
        .filter(|p| p.is_dir())
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
        let policy = TreePolicy::new(std::slice::from_ref(&dir), &[], &[], &grant, std::slice::from_ref(&protected));
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
}
