//! The mandatory read-only set inside a tree's workspace: what runs code
//! outside the sandbox the next time the user's editor, shell or git looks
//! at the workspace, found by a bounded scan.
//!
//! | Where | Read-only |
//! |---|---|
//! | every repository found ([`SCAN_DEPTH`] levels deep) | `.git/config`, `.git/hooks`, `.git/info`, `.git/config.worktree`, each submodule's `config`, `hooks`, `info` under `.git/modules`, the directory `core.hooksPath` names; a `.git` *file* (a worktree's pointer) itself, and the same set in the git directory it points to |
//! | the workspace root and every repository root | [`EDITOR_FILES`]: direnv, editor tasks and settings, dev containers, hook managers |
//! | every scanned directory | `taskhost.toml` |
//!
//! Model: [`Scanner`] walks each read-write root breadth-first, at most
//! [`SCAN_DEPTH`] levels below it and [`SCAN_DIRS`] directories per root,
//! skipping hidden directories and [`SKIP_DIRS`]; it remembers each
//! directory's listing by device, inode and modification time, so a spawn
//! whose workspace did not change `stat`s the scanned directories and reads
//! none. A repository's git directory outside the roots (a worktree of a
//! repository elsewhere) is returned too: the view binds it read-write, its
//! own read-only set inside.
//!
//! Invariant: a `.git/hooks` or `.git/info` that is missing is created
//! (empty, as `git init` makes them) so it can be held read-only; the scan
//! never follows a symlink out of a root.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How many levels below a root the scan looks for repositories and
/// `taskhost.toml` (the root, its children and grandchildren: a monorepo's
/// `crates/x/.git`).
pub const SCAN_DEPTH: usize = 2;
/// Directories read per root at most; the rest of a huge workspace is not
/// scanned (its root and first levels are).
pub const SCAN_DIRS: usize = 256;
/// Read-only paths per tree at most: a spawn that would need more is
/// refused (narrow `working_dirs`).
pub const MAX_READ_ONLY: usize = 256;

/// Directories the scan does not enter: dependency and build trees.
pub const SKIP_DIRS: &[&str] = &["node_modules", "target", "__pycache__", "venv", "dist", "build"];

/// Files and directories at the workspace root and each repository root
/// that make a tool run code when a user opens the directory: direnv
/// (`.envrc`), editors' tasks and settings (`.vscode`, `.idea`, `.zed`,
/// `.devcontainer`, Vim/Neovim's `exrc` files), mise, and git hook
/// managers (pre-commit, husky, lefthook).
pub const EDITOR_FILES: &[&str] = &[
    ".envrc",
    ".vscode",
    ".idea",
    ".zed",
    ".devcontainer",
    ".nvim.lua",
    ".nvimrc",
    ".exrc",
    ".mise.toml",
    "mise.toml",
    ".mise",
    ".pre-commit-config.yaml",
    ".husky",
    "lefthook.yml",
    ".lefthook.yml",
    ".lefthook",
];

/// What the scan found for a set of roots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    /// Existing paths to hold read-only (canonical).
    pub read_only: Vec<PathBuf>,
    /// Git directories outside every root (canonical): bound read-write.
    pub git_dirs: Vec<PathBuf>,
}

/// A directory as last listed.
#[derive(Debug)]
struct Listing {
    stamp: Stamp,
    /// Subdirectories the scan may enter.
    subdirs: Vec<OsString>,
    /// Names of interest present (`.git`, `taskhost.toml`, editor files).
    present: Vec<OsString>,
    /// `.git` is a file (a worktree's pointer), not a directory.
    git_is_file: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self { dev: meta.dev(), ino: meta.ino(), mtime: meta.mtime(), mtime_nsec: meta.mtime_nsec() }
    }
}

/// Walks workspaces, remembering listings (see the module doc). One per
/// process host.
#[derive(Debug, Default)]
pub(crate) struct Scanner {
    listings: Mutex<HashMap<PathBuf, Arc<Listing>>>,
}

/// Listings remembered at most (the least useful are dropped wholesale).
const LISTINGS: usize = 4096;

impl Scanner {
    /// The read-only set of `roots` (canonical read-write roots), or why a
    /// tree cannot be given it.
    pub(crate) fn scan(&self, roots: &[PathBuf]) -> Result<Found, String> {
        let mut found = Found::default();
        for root in roots {
            self.scan_root(root, roots, &mut found);
        }
        found.read_only.sort();
        found.read_only.dedup();
        found.git_dirs.sort();
        found.git_dirs.dedup();
        if found.read_only.len() > MAX_READ_ONLY {
            return Err(format!(
                "the workspace holds {} paths that must stay read-only (repositories' hooks and configuration, \
                 editor and taskhost files), more than the {MAX_READ_ONLY} a tree may hold: narrow the grant's \
                 `working_dirs` to the project",
                found.read_only.len()
            ));
        }
        Ok(found)
    }

    fn scan_root(&self, root: &Path, roots: &[PathBuf], found: &mut Found) {
        let mut queue = std::collections::VecDeque::from([(root.to_path_buf(), 0usize)]);
        let mut read = 0;
        while let Some((dir, depth)) = queue.pop_front() {
            if read == SCAN_DIRS {
                break;
            }
            read += 1;
            let Some(listing) = self.listing(&dir) else { continue };
            let has = |name: &str| listing.present.iter().any(|p| p == name);
            if has("taskhost.toml") {
                found.read_only.push(dir.join("taskhost.toml"));
            }
            let repository = has(".git");
            if dir == root || repository {
                for name in EDITOR_FILES.iter().filter(|n| has(n)) {
                    found.read_only.push(dir.join(name));
                }
            }
            if repository {
                if listing.git_is_file {
                    found.read_only.push(dir.join(".git"));
                    worktree(&dir, roots, found);
                } else {
                    git_dir(&dir.join(".git"), &dir, found);
                }
            }
            if depth < SCAN_DEPTH {
                queue.extend(listing.subdirs.iter().map(|name| (dir.join(name), depth + 1)));
            }
        }
    }

    /// `dir`'s listing: the remembered one while its stamp holds.
    fn listing(&self, dir: &Path) -> Option<Arc<Listing>> {
        let meta = std::fs::symlink_metadata(dir).ok().filter(|m| m.is_dir())?;
        let stamp = Stamp::of(&meta);
        if let Some(known) = self.listings.lock().unwrap_or_else(|e| e.into_inner()).get(dir)
            && known.stamp == stamp
        {
            return Some(known.clone());
        }
        let mut listing = Listing { stamp, subdirs: Vec::new(), present: Vec::new(), git_is_file: false };
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let name = entry.file_name();
            let Ok(kind) = entry.file_type() else { continue };
            let text = name.to_string_lossy();
            if text == ".git" || text == "taskhost.toml" || EDITOR_FILES.contains(&text.as_ref()) {
                listing.git_is_file |= text == ".git" && kind.is_file();
                listing.present.push(name.clone());
            }
            if kind.is_dir() && !text.starts_with('.') && !SKIP_DIRS.contains(&text.as_ref()) {
                listing.subdirs.push(name);
            }
        }
        let listing = Arc::new(listing);
        let mut listings = self.listings.lock().unwrap_or_else(|e| e.into_inner());
        if listings.len() >= LISTINGS {
            listings.clear();
        }
        listings.insert(dir.to_path_buf(), listing.clone());
        Some(listing)
    }
}

/// The read-only set of the git directory `git` of the working tree `top`.
fn git_dir(git: &Path, top: &Path, found: &mut Found) {
    for name in ["hooks", "info"] {
        // As `git init` makes them, so they can be held read-only.
        let _ = std::fs::create_dir(git.join(name));
    }
    for name in ["config", "hooks", "info", "config.worktree"] {
        push_existing(&git.join(name), found);
    }
    if let Ok(modules) = std::fs::read_dir(git.join("modules")) {
        for module in modules.flatten() {
            for name in ["config", "hooks", "info"] {
                push_existing(&module.path().join(name), found);
            }
        }
    }
    if let Some(hooks) = hooks_path(&git.join("config"), top) {
        push_existing(&hooks, found);
    }
}

/// A worktree whose `.git` is a pointer file: the git directory it names
/// and that directory's common directory get the same read-only set, and
/// are bound read-write when they lie outside every root.
fn worktree(top: &Path, roots: &[PathBuf], found: &mut Found) {
    let Ok(text) = std::fs::read_to_string(top.join(".git")) else { return };
    let Some(pointer) = text.lines().find_map(|l| l.strip_prefix("gitdir:")) else { return };
    let Ok(git) = top.join(pointer.trim()).canonicalize() else { return };
    let common = match std::fs::read_to_string(git.join("commondir")) {
        Ok(rel) => git.join(rel.trim()).canonicalize().unwrap_or_else(|_| git.clone()),
        Err(_) => git.clone(),
    };
    for dir in [&git, &common] {
        if !roots.iter().any(|root| dir.starts_with(root)) {
            found.git_dirs.push(dir.clone());
        }
    }
    push_existing(&git.join("config.worktree"), found);
    git_dir(&common, top, found);
}

/// The directory `core.hooksPath` names in the git configuration `config`
/// (relative to the working tree `top`), when it is set.
fn hooks_path(config: &Path, top: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(config).ok()?;
    let mut in_core = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_core = line.trim_start_matches('[').trim_end_matches(']').trim().eq_ignore_ascii_case("core");
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        if in_core && key.trim().eq_ignore_ascii_case("hookspath") {
            let value = value.trim().trim_matches('"');
            let path = match value.strip_prefix("~/") {
                Some(rest) => crate::fs_policy::home()?.join(rest),
                None => top.join(value),
            };
            return path.canonicalize().ok();
        }
    }
    None
}

fn push_existing(path: &Path, found: &mut Found) {
    if let Ok(canonical) = path.canonicalize() {
        found.read_only.push(canonical);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_finds_repositories_editor_files_and_configs_and_remembers_listings() {
        let root = std::env::temp_dir().join(format!("taskhost-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for dir in [".git", "crates/a/.git/modules/sub", "deep/one/two/.git", "node_modules/x/.git", ".vscode"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        let root = root.canonicalize().unwrap();
        std::fs::write(root.join(".git/config"), "[core]\n\thooksPath = .husky\n").unwrap();
        std::fs::create_dir(root.join(".husky")).unwrap();
        std::fs::write(root.join("crates/a/.git/config"), "").unwrap();
        std::fs::write(root.join("crates/a/.git/modules/sub/config"), "").unwrap();
        std::fs::write(root.join("crates/a/taskhost.toml"), "").unwrap();
        std::fs::write(root.join(".envrc"), "").unwrap();
        let scanner = Scanner::default();
        let found = scanner.scan(std::slice::from_ref(&root)).unwrap();
        let rel: Vec<String> =
            found.read_only.iter().map(|p| p.strip_prefix(&root).unwrap().display().to_string()).collect();
        let want = [
            ".envrc",
            ".git/config",
            ".git/hooks",
            ".git/info",
            ".husky",
            ".vscode",
            "crates/a/.git/config",
            "crates/a/.git/hooks",
            "crates/a/.git/info",
            "crates/a/.git/modules/sub/config",
            "crates/a/taskhost.toml",
        ];
        assert_eq!(rel, want, "three levels down and node_modules are not scanned");
        assert!(root.join("crates/a/.git/hooks").is_dir(), "a missing hooks directory is made");
        // Unchanged: the same listings; a new repository at the root is seen.
        let listed = scanner.listings.lock().unwrap().len();
        assert_eq!(scanner.scan(std::slice::from_ref(&root)).unwrap(), found);
        assert_eq!(scanner.listings.lock().unwrap().len(), listed);
        std::fs::create_dir_all(root.join("new/.git")).unwrap();
        let again = scanner.scan(std::slice::from_ref(&root)).unwrap();
        assert!(again.read_only.contains(&root.join("new/.git/hooks")), "{:?}", again.read_only);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_worktree_brings_its_git_directories_and_their_read_only_set() {
        let base = std::env::temp_dir().join(format!("taskhost-scan-wt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (main, work) = (base.join("main"), base.join("work"));
        std::fs::create_dir_all(main.join(".git/worktrees/w")).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let base = base.canonicalize().unwrap();
        let (main, work) = (base.join("main"), base.join("work"));
        std::fs::write(main.join(".git/config"), "").unwrap();
        std::fs::write(main.join(".git/worktrees/w/commondir"), "../..\n").unwrap();
        std::fs::write(work.join(".git"), format!("gitdir: {}\n", main.join(".git/worktrees/w").display())).unwrap();
        let found = Scanner::default().scan(std::slice::from_ref(&work)).unwrap();
        assert_eq!(found.git_dirs, [main.join(".git"), main.join(".git/worktrees/w")]);
        for path in [work.join(".git"), main.join(".git/config"), main.join(".git/hooks"), main.join(".git/info")] {
            assert!(found.read_only.contains(&path), "{} in {:?}", path.display(), found.read_only);
        }
        std::fs::remove_dir_all(&base).unwrap();
    }
}
