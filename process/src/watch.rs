//! Change notices for the host paths a cached result was computed from:
//! one `inotify` instance that reports when a directory entry along any
//! watched path is created, removed, renamed or replaced.
//!
//! Model: watching a path adds, for each directory its resolution passes
//! through (every symlink followed, hop by hop), that directory and the
//! name looked up in it. Whatever changes what the path resolves to (an
//! entry created, removed, renamed in or out, a symlink replaced, at any
//! level) is an event in one of those directories for one of those names.
//! [`PathWatch::changed`] reads the queued events without blocking and
//! reports whether one of them touched a watched name (or the queue
//! overflowed, or a watched directory went away).
//!
//! Invariants:
//! - Watch *before* computing what is cached: [`PathWatch::watch`] the
//!   paths a first computation read, compute again, and keep the second
//!   result only if it read the same paths. Every change after the watch is
//!   reported; every change before it is in the second result.
//! - What inotify cannot report (a mount or unmount on the host) is the
//!   caller's to bound by time (the caches recheck at least every
//!   [`crate::spawn_cache::RECHECK_EVERY`]).
//! - A path that cannot be watched (inotify unavailable, no watch left, a
//!   directory this user cannot read, more than [`MAX_HOPS`] symlinks)
//!   makes [`PathWatch::watch`] fail: the caller then does not cache.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::inotify;

/// Symlinks followed while watching one path at most (the kernel's own
/// resolution gives up at 40).
pub(crate) const MAX_HOPS: usize = 40;

/// Events that change which file a name in a directory is.
const ENTRY_EVENTS: inotify::WatchFlags = inotify::WatchFlags::CREATE
    .union(inotify::WatchFlags::DELETE)
    .union(inotify::WatchFlags::MOVED_FROM)
    .union(inotify::WatchFlags::MOVED_TO)
    .union(inotify::WatchFlags::DELETE_SELF)
    .union(inotify::WatchFlags::MOVE_SELF)
    .union(inotify::WatchFlags::ONLYDIR)
    .union(inotify::WatchFlags::DONT_FOLLOW);

/// What one step of a path's resolution found at `dir/name`.
#[derive(Clone, Debug)]
enum Step {
    /// A directory: the walk goes on inside it.
    Dir,
    /// A symlink to this target.
    Link(PathBuf),
    /// Anything else, or nothing: the walk ends here.
    End,
}

/// One inotify instance and the names it watches (see the module doc).
#[derive(Debug)]
pub(crate) struct PathWatch {
    fd: OwnedFd,
    /// Watch descriptor → the names looked up in its directory.
    names: HashMap<i32, HashSet<OsString>>,
    /// Directory → its watch descriptor.
    dirs: HashMap<PathBuf, i32>,
    /// What each `dir/name` was when it was first walked (the walk of many
    /// paths below one home looks each shared prefix up once).
    steps: HashMap<PathBuf, Step>,
    changed: bool,
}

impl PathWatch {
    /// A new, empty watch; `None` where inotify is unavailable (or the
    /// user's instances are used up).
    pub(crate) fn new() -> Option<Self> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).ok()?;
        Some(Self { fd, names: HashMap::new(), dirs: HashMap::new(), steps: HashMap::new(), changed: false })
    }

    /// Watches every path (absolute; see the module doc). `false` when one
    /// of them cannot be watched: do not cache what was computed from it.
    pub(crate) fn watch<'a>(&mut self, paths: impl IntoIterator<Item = &'a Path>) -> bool {
        paths.into_iter().all(|path| self.watch_path(path))
    }

    fn watch_path(&mut self, path: &Path) -> bool {
        if !path.is_absolute() {
            return false;
        }
        let mut dir = PathBuf::from("/");
        // The components still to resolve, next first (reversed, so a
        // symlink's target is pushed in front of the rest).
        let mut rest: Vec<OsString> = Vec::new();
        push_components(&mut rest, path);
        let mut hops = 0;
        while let Some(name) = rest.pop() {
            if name == ".." {
                dir.pop();
                continue;
            }
            if !self.add(&dir, &name) {
                return false;
            }
            let next = dir.join(&name);
            let step = match self.steps.get(&next) {
                Some(step) => step.clone(),
                None => {
                    let step = match std::fs::symlink_metadata(&next) {
                        Ok(meta) if meta.file_type().is_symlink() => match std::fs::read_link(&next) {
                            Ok(target) => Step::Link(target),
                            Err(_) => return false,
                        },
                        Ok(meta) if meta.is_dir() => Step::Dir,
                        Ok(_) => Step::End,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Step::End,
                        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Step::End,
                        Err(_) => return false,
                    };
                    self.steps.insert(next.clone(), step.clone());
                    step
                }
            };
            match step {
                Step::Dir => dir = next,
                Step::End => return true,
                Step::Link(target) => {
                    hops += 1;
                    if hops > MAX_HOPS {
                        return false;
                    }
                    if target.is_absolute() {
                        dir = PathBuf::from("/");
                    }
                    push_components(&mut rest, &target);
                }
            }
        }
        true
    }

    /// Watches `name` in `dir` (a physical directory: every symlink on the
    /// way was followed by the walk).
    fn add(&mut self, dir: &Path, name: &OsStr) -> bool {
        let wd = match self.dirs.get(dir) {
            Some(&wd) => wd,
            None => match inotify::add_watch(&self.fd, dir, ENTRY_EVENTS) {
                Ok(wd) => {
                    self.dirs.insert(dir.to_path_buf(), wd);
                    wd
                }
                Err(_) => return false,
            },
        };
        self.names.entry(wd).or_default().insert(name.to_os_string());
        true
    }

    /// Whether anything watched changed since the watch began (reads the
    /// queued events; once `true`, always `true`).
    pub(crate) fn changed(&mut self) -> bool {
        if self.changed {
            return true;
        }
        let mut buffer = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(&self.fd, &mut buffer);
        loop {
            let event = match reader.next() {
                Ok(event) => event,
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => continue,
                // Unreadable events: assume the worst.
                Err(_) => {
                    self.changed = true;
                    break;
                }
            };
            let flags = event.events();
            let touched = if flags.intersects(
                inotify::ReadFlags::QUEUE_OVERFLOW
                    | inotify::ReadFlags::IGNORED
                    | inotify::ReadFlags::DELETE_SELF
                    | inotify::ReadFlags::MOVE_SELF
                    | inotify::ReadFlags::UNMOUNT,
            ) {
                true
            } else {
                match event.file_name() {
                    Some(name) => self
                        .names
                        .get(&event.wd())
                        .is_some_and(|names| names.contains(OsStr::from_bytes(name.to_bytes()))),
                    None => true,
                }
            };
            if touched {
                self.changed = true;
                break;
            }
        }
        self.changed
    }

    /// Directories watched.
    #[cfg(test)]
    pub(crate) fn directories(&self) -> usize {
        self.dirs.len()
    }
}

/// Pushes `path`'s components onto `stack` so the first is popped first.
fn push_components(stack: &mut Vec<OsString>, path: &Path) {
    let mut parts: Vec<OsString> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => parts.push(name.to_os_string()),
            Component::ParentDir => parts.push(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    stack.extend(parts.into_iter().rev());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("taskhost-watch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.canonicalize().unwrap()
    }

    fn watching(path: &Path) -> PathWatch {
        let mut watch = PathWatch::new().expect("inotify");
        assert!(watch.watch([path]));
        assert!(!watch.changed());
        watch
    }

    #[test]
    fn a_path_created_removed_or_renamed_at_any_level_is_a_change() {
        let dir = scratch("levels");
        let deep = dir.join("a/b/c");
        // Missing at the first level: creating it is a change.
        let mut watch = watching(&deep);
        std::fs::create_dir(dir.join("a")).unwrap();
        assert!(watch.changed());
        // Unrelated names in a watched directory are not.
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        let mut watch = watching(&deep);
        std::fs::write(dir.join("a/other"), "x").unwrap();
        std::fs::write(dir.join("unrelated"), "x").unwrap();
        assert!(!watch.changed(), "a name the path does not pass through");
        std::fs::write(dir.join("a/b/c"), "x").unwrap();
        assert!(watch.changed(), "the path itself created");
        let mut watch = watching(&deep);
        std::fs::write(dir.join("a/b/c"), "changed content").unwrap();
        assert!(!watch.changed(), "content is not what a path resolves to");
        std::fs::rename(dir.join("a"), dir.join("moved")).unwrap();
        assert!(watch.changed(), "an ancestor renamed away");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_symlink_hop_is_watched() {
        let dir = scratch("hops");
        std::fs::create_dir_all(dir.join("real/x")).unwrap();
        std::fs::create_dir_all(dir.join("other/x")).unwrap();
        // link1 → hop/x, hop → real: the path passes through both links.
        std::os::unix::fs::symlink(dir.join("real"), dir.join("hop")).unwrap();
        std::os::unix::fs::symlink("hop/x", dir.join("link1")).unwrap();
        let path = dir.join("link1/secret");
        let mut watch = watching(&path);
        std::fs::remove_file(dir.join("hop")).unwrap();
        std::os::unix::fs::symlink(dir.join("other"), dir.join("hop")).unwrap();
        assert!(watch.changed(), "the second hop re-pointed");
        let mut watch = watching(&path);
        std::fs::write(dir.join("other/x/secret"), "x").unwrap();
        assert!(watch.changed(), "the target created where the links now lead");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_symlink_loop_cannot_be_watched() {
        let dir = scratch("loop");
        std::os::unix::fs::symlink("b", dir.join("a")).unwrap();
        std::os::unix::fs::symlink("a", dir.join("b")).unwrap();
        let mut watch = PathWatch::new().expect("inotify");
        assert!(!watch.watch([dir.join("a/file").as_path()]));
        assert!(!watch.watch([Path::new("relative")]), "a relative path has no fixed resolution");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shared_prefixes_are_watched_once() {
        let dir = scratch("shared");
        let mut watch = PathWatch::new().expect("inotify");
        let paths: Vec<PathBuf> = (0..50).map(|i| dir.join(format!("missing-{i}"))).collect();
        assert!(watch.watch(paths.iter().map(PathBuf::as_path)));
        assert_eq!(watch.directories(), dir.components().count(), "each ancestor directory once");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
