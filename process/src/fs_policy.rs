//! A tree's filesystem policy, resolved from its grant and the host: the
//! paths its view is built from ([`crate::view`] turns them into mounts).
//!
//! Model: the view is an allow list. [`TreePolicy`] holds, canonical and
//! existing: the read-write roots (the workspace and `read_write_paths`),
//! the home allow list, the grant's extra read-only paths and programs, and
//! what must stay hidden or read-only *where the view shows the host*
//! ([`DEFAULT_DENY_READ`] as a second line behind the private home,
//! [`SYSTEM_DENY_READ`] inside `/etc`, the host's protected and
//! write-protected paths, the grant's `deny_read`).
//! [`crate::spawn_cache`] reuses a resolution while the paths it was
//! resolved from are unchanged.
//!
//! Invariants: the host's protected paths are hidden wherever the view
//! shows the host, whatever the grant says; paths are compared after
//! resolving symlinks, so a link to a credential is the credential; what is
//! not named here does not exist for the tree.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Credentials below the server's home directory. The home a tree sees is
/// a private, empty directory, so none of them is there by default; this
/// list is the second line: a home allow-list entry that is one of them is
/// refused (unless `filesystem.allow_read` names it), and one inside an
/// entry (or a workspace) is hidden.
pub const DEFAULT_DENY_READ: &[&str] = &[
    "~/.ssh",
    "~/.gnupg",
    "~/.password-store",
    "~/.local/share/keyrings",
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.kube",
    "~/.docker",
    "~/.netrc",
    "~/.git-credentials",
    "~/.config/git/credentials",
    "~/.config/gh",
    "~/.config/hub",
    "~/.npmrc",
    "~/.yarnrc.yml",
    "~/.config/configstore",
    "~/.pypirc",
    "~/.cargo/credentials",
    "~/.cargo/credentials.toml",
    "~/.gem/credentials",
    "~/.pgpass",
    "~/.my.cnf",
    "~/.vault-token",
    "~/.terraform.d/credentials.tfrc.json",
    "~/.config/op",
    "~/.1password",
    "~/.config/Bitwarden CLI",
    "~/.config/rclone",
    "~/.s3cfg",
    "~/.boto",
    "~/.claude",
    "~/.claude.json",
    "~/.codex",
    "~/.config/anthropic",
    "~/.config/openai",
    "~/.local/share/uv/credentials",
];

/// System secrets inside the system directories a view shows (`/etc`).
/// (Files the server's user cannot read anyway are harmless to list; they
/// matter when the server runs as root, whose files a tree's root could
/// otherwise read.)
pub const SYSTEM_DENY_READ: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/security/opasswd",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
    "/etc/ssl/private",
    "/etc/credstore",
    "/etc/credstore.encrypted",
    "/etc/NetworkManager/system-connections",
    "/etc/wpa_supplicant",
    "/etc/ppp/chap-secrets",
    "/etc/ppp/pap-secrets",
    "/etc/ipsec.secrets",
    "/etc/krb5.keytab",
    "/etc/wireguard",
    "/etc/openvpn",
];

/// Host state every tree is denied by default, besides the host's
/// configured protected paths: taskhost's own cache.
pub const HOST_DENY_READ: &[&str] = &["~/.cache/taskhost"];

/// A grant's changes to the default filesystem policy.
///
/// ```toml
/// [producer.grants.process.filesystem]
/// deny_read = ["~/private", "/srv/secrets"]  # hidden where the view shows them
/// allow_read = ["~/.npmrc"]                  # credentials this tool may read: bound read-only
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FsPolicy {
    /// Paths no process of this grant may read, hidden where the view shows
    /// them (a workspace, a home allow-list entry, a system directory), on
    /// top of the defaults ([`DEFAULT_DENY_READ`], [`SYSTEM_DENY_READ`], the
    /// host's protected paths). `~/` is the server's home directory.
    pub deny_read: Vec<PathBuf>,
    /// Credentials this grant may read after all (for example `~/.npmrc`
    /// for a publishing tool): bound read-only into the tree's home and no
    /// longer hidden. The host's protected paths cannot be allowed this way.
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
pub(crate) struct Resolutions(Vec<Resolution>);

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

    /// Every path still names what it named (one or two `stat`s a path).
    pub(crate) fn all_hold(&self) -> bool {
        self.0.iter().all(Resolution::holds)
    }

    /// The paths, in the order they were resolved.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &Path> {
        self.0.iter().map(|r| r.path.as_path())
    }
}

/// What a tree's private home shows of the real one, read-only, by default
/// (`[producer.grants.process] home_read` adds, `home_read_defaults = false`
/// drops these): toolchains and the caches an offline build reads, the
/// user's git identity. Nothing that holds a credential.
pub const DEFAULT_HOME_READ: &[&str] = &[
    // Rust: the toolchains and the crates cargo already fetched.
    "~/.rustup",
    "~/.cargo/bin",
    "~/.cargo/registry",
    "~/.cargo/git",
    // Python: version managers, user installs, pip's cache.
    "~/.pyenv",
    "~/.local/bin",
    "~/.local/lib",
    "~/.local/share/uv/python",
    "~/.local/share/uv/tools",
    "~/.cache/pip",
    // JavaScript: version managers, npm's cache (not ~/.npm itself: npm
    // writes its logs there, into the private home).
    "~/.nvm",
    "~/.volta",
    "~/.bun/bin",
    "~/.deno/bin",
    "~/.npm/_cacache",
    // Other toolchains and their module caches.
    "~/.rbenv",
    "~/.asdf",
    "~/.local/share/mise",
    "~/.sdkman/candidates",
    "~/.nix-profile",
    "~/go/bin",
    "~/go/pkg/mod",
    "~/.m2/repository",
    // Git's identity and settings (a commit needs a name).
    "~/.gitconfig",
    "~/.config/git/config",
    "~/.config/git/ignore",
    "~/.config/git/attributes",
];

/// The resolved policy of one tree: canonical paths that exist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TreePolicy {
    /// Read-write roots: the workspace, then `read_write_paths`.
    pub read_write: Vec<PathBuf>,
    /// Landlock's readable roots (`/`: everything the view shows).
    pub read: Vec<PathBuf>,
    /// The grant's `read_only_paths` besides `/`: bound read-only.
    pub read_only: Vec<PathBuf>,
    /// The server's home, where the tree's private home is (canonical when
    /// it exists); `None` when there is none to give (unset, or `/`).
    pub home: Option<PathBuf>,
    /// `$HOME` as the server has it, when it differs from `home` (a path
    /// through a symlink): a link to `home` in the view.
    pub home_alias: Option<PathBuf>,
    /// Home allow-list entries that exist: where the home shows each (below
    /// `home`), and the host path it names (they differ through symlinks).
    pub home_read: Vec<(PathBuf, PathBuf)>,
    /// The granted programs' files: bound read-only where the view would not
    /// show them otherwise.
    pub programs: Vec<PathBuf>,
    /// Hidden where the view shows the host.
    pub deny: Vec<PathBuf>,
    /// Read-only where the view shows the host: the host's write-protected
    /// paths that exist, so a tree reads but never writes, replaces or
    /// removes them.
    pub write_protected: Vec<PathBuf>,
}

/// Everything a [`TreePolicy`] is resolved from besides the filesystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PolicyInputs {
    workspace: Vec<PathBuf>,
    read_write: Vec<PathBuf>,
    read_only: Vec<PathBuf>,
    home_read: Vec<PathBuf>,
    programs: Vec<PathBuf>,
    grant: FsPolicy,
    protected: Vec<PathBuf>,
    write_protected: Vec<PathBuf>,
    home: Option<PathBuf>,
}

impl PolicyInputs {
    /// `workspace` are the grant's working roots (resolved by the caller),
    /// `protected` and `write_protected` the host's; `$HOME` is read now.
    pub(crate) fn new(
        grant: &super::ProcessGrant,
        workspace: &[PathBuf],
        protected: &[PathBuf],
        write_protected: &[PathBuf],
    ) -> Self {
        let defaults = if grant.home_read_defaults { DEFAULT_HOME_READ } else { &[] };
        let home_read = defaults
            .iter()
            .map(PathBuf::from)
            .chain(grant.home_read.iter().cloned())
            .chain(grant.filesystem.allow_read.iter().filter(|p| p.starts_with("~")).cloned())
            .collect();
        Self {
            workspace: workspace.to_vec(),
            read_write: grant.read_write_paths.clone(),
            read_only: grant.read_only_paths.clone(),
            home_read,
            programs: grant.program_files(),
            grant: grant.filesystem.clone(),
            protected: protected.to_vec(),
            write_protected: write_protected.to_vec(),
            home: home(),
        }
    }
}

impl TreePolicy {
    /// Resolves the policy now, without a cache.
    #[cfg(test)]
    pub(crate) fn new(inputs: &PolicyInputs) -> Self {
        Self::resolve(inputs, &mut Resolutions::default())
    }

    /// Resolves the policy now, recording every path it was resolved from.
    pub(crate) fn resolve(inputs: &PolicyInputs, paths: &mut Resolutions) -> Self {
        let home = inputs.home.as_deref();
        let canonical_all = |list: &[PathBuf], paths: &mut Resolutions| -> Vec<PathBuf> {
            let mut out: Vec<PathBuf> =
                list.iter().filter_map(|p| expand(p, home)).filter_map(|p| paths.canonical(&p)).collect();
            out.sort();
            out.dedup();
            out
        };
        let mut read_write: Vec<PathBuf> = inputs.workspace.clone();
        read_write.extend(canonical_all(&inputs.read_write, paths));
        read_write.dedup();
        let root = Path::new("/");
        let read = if inputs.read_only.is_empty() || inputs.read_only.iter().any(|p| p == root) {
            let mut read = vec![root.to_path_buf()];
            read.extend(canonical_all(&inputs.read_only, paths).into_iter().filter(|p| p != root));
            read
        } else {
            canonical_all(&inputs.read_only, paths)
        };
        let read_only = read.iter().filter(|p| *p != root).cloned().collect();
        // The view's home: the real one's path (so `$HOME` names it), never `/`.
        let view_home = home.map(|h| paths.canonical(h).unwrap_or_else(|| h.to_path_buf())).filter(|h| h != root);
        let allowed = canonical_all(&inputs.grant.allow_read, paths);
        let mut home_read = Vec::new();
        if let (Some(home), Some(view_home)) = (home, &view_home) {
            for entry in &inputs.home_read {
                let Ok(rest) = entry.strip_prefix("~") else { continue };
                if let Some(canonical) = paths.canonical(&home.join(rest)) {
                    home_read.push((view_home.join(rest), canonical));
                }
            }
        }
        let credentials = DEFAULT_DENY_READ.iter().chain(SYSTEM_DENY_READ).map(PathBuf::from).collect::<Vec<_>>();
        let mut deny: Vec<PathBuf> = canonical_all(&credentials, paths)
            .into_iter()
            .chain(canonical_all(&inputs.grant.deny_read, paths))
            .filter(|p| !allowed.contains(p))
            .collect();
        let host: Vec<PathBuf> =
            HOST_DENY_READ.iter().map(PathBuf::from).chain(inputs.protected.iter().cloned()).collect();
        deny.extend(canonical_all(&host, paths));
        deny.sort();
        deny.dedup();
        let write_protected =
            canonical_all(&inputs.write_protected, paths).into_iter().filter(|p| !deny.contains(p)).collect();
        let programs = inputs.programs.clone();
        let home_alias = home.filter(|h| view_home.as_deref().is_some_and(|v| v != *h)).map(Path::to_path_buf);
        Self { read_write, read, read_only, home: view_home, home_alias, home_read, programs, deny, write_protected }
    }
}

impl TreePolicy {
    /// What Landlock lets the tree write on the host's inodes: the
    /// read-write roots (the view's own writable directories get rules from
    /// the keeper, see [`crate::view::MountPlan::writable`]).
    pub(crate) fn landlock_read_write(&self) -> Vec<PathBuf> {
        self.read_write.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant_with(filesystem: FsPolicy) -> crate::ProcessGrant {
        crate::ProcessGrant { filesystem, ..crate::ProcessGrant::default() }
    }

    #[test]
    fn allow_read_lifts_a_grants_deny_and_never_the_hosts() {
        let dir = std::env::temp_dir().join(format!("taskhost-fs-policy-{}", std::process::id()));
        let cred = dir.join("cred");
        std::fs::create_dir_all(&cred).unwrap();
        let protected = dir.join("protected");
        std::fs::write(&protected, "x").unwrap();
        let grant =
            grant_with(FsPolicy { deny_read: vec![cred.clone()], allow_read: vec![cred.clone(), protected.clone()] });
        let policy = TreePolicy::new(&PolicyInputs::new(
            &grant,
            std::slice::from_ref(&dir),
            std::slice::from_ref(&protected),
            &[],
        ));
        let cred = cred.canonicalize().unwrap();
        let protected = protected.canonicalize().unwrap();
        assert!(!policy.deny.contains(&cred), "allow_read lifts a grant's own deny");
        assert!(policy.deny.contains(&protected), "a host-protected path stays denied");
        assert_eq!(policy.read, vec![PathBuf::from("/")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
