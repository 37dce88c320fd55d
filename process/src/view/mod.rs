//! A tree's filesystem view as the mount operations that build it: a new
//! root (an empty `tmpfs`) into which only what the plan names is put;
//! whatever it does not name does not exist for the tree.
//!
//! Model: a [`ViewBuilder`] collects what the view holds (host paths bound
//! at their own paths, read-only or not; fresh `tmpfs`es; symlinks; a
//! `devpts`), each with the host path it is *over*; [`ViewBuilder::finish`]
//! orders them (every path after its parents; at one path, in the order
//! added) and adds the directories and empty files that mount points need
//! where they lie in a `tmpfs` of the view. The result, a [`MountPlan`], is
//! prepared before the fork and applied by [`crate::child`]:
//!
//! 1. K mounts the new root's `tmpfs` over `/tmp` and `pivot_root`s into it,
//!    the host's root then at [`OLD_ROOT`] (as bubblewrap does), and runs
//!    every [`MountOp`] in order, sources below [`OLD_ROOT`].
//! 2. I (with a fresh `/proc`) or K (without one) mounts `/proc`, detaches
//!    the old root, and seals the view: the root and every `tmpfs` marked
//!    so become read-only.
//!
//! Invariants:
//! - Targets are absolute and canonical: a host path is bound at its own
//!   path, so a path below a bind exists in the view exactly when it exists
//!   on the host, and a path below a `tmpfs` of the view only when the plan
//!   created it.
//! - An entry that only narrows what the host shows ([`Over::HostOnly`]:
//!   hiding a path, making one read-only) is dropped where its path lies in
//!   a `tmpfs` of the view: there is nothing of the host's there to narrow,
//!   and binding it would show it.
//! - Every bind is recursive: a host mount below a bound path comes along
//!   (a non-recursive bind of a directory with mounts below it fails in a
//!   user namespace).

mod dev;
mod layout;
pub mod system;
pub mod workspace;

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

pub use dev::PTYS_PER_TREE;
pub(crate) use dev::private_dev;
pub(crate) use layout::plan;
pub use layout::{FALLBACK_TMPFS_BUDGET_BYTES, PRIVATE_TMP_BYTES, TmpfsSizes};

/// Where the host's root is while K builds the view (detached before the
/// command starts).
pub(crate) const OLD_ROOT: &str = "/.oldroot";

/// The spill directories a tree's mount namespace arranges: the host's
/// (hidden) and its owner's (shown read-only).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpillView<'a> {
    pub hidden: &'a std::path::Path,
    pub owner: &'a std::path::Path,
}

/// One step of a view's set-up, as applied in the child (C strings only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MountOp {
    /// `mkdir` (an existing directory is fine).
    Dir { path: CString },
    /// An empty file: the mount point of a file's bind.
    File { path: CString },
    /// `link` → `target`.
    Symlink { target: CString, link: CString },
    /// A fresh `tmpfs`.
    Tmpfs { path: CString, options: CString, flags: libc::c_ulong },
    /// The host's `source` (a path below [`OLD_ROOT`]) at `target`, with
    /// every mount below it; `read_only`: all of them read-only;
    /// `optional`: a source gone since planning is skipped.
    Bind { source: CString, target: CString, read_only: bool, optional: bool },
    /// A fresh `devpts` instance.
    Devpts { path: CString, options: CString },
}

/// A view, ready to apply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MountPlan {
    /// In order.
    pub ops: Vec<MountOp>,
    /// `tmpfs`es made read-only once every step ran (the root always is).
    pub sealed: Vec<CString>,
    /// Directories of the view the tree writes that are not the host's
    /// (private `tmpfs`es, `/dev/pts`): K adds a Landlock rule for each, as
    /// a rule on a host directory does not reach a mount over it.
    pub writable: Vec<CString>,
    /// I mounts a fresh `/proc` (else the plan binds the host's).
    pub fresh_proc: bool,
    /// Landlock's read rule goes on the view's root (a rule on the host's
    /// root does not reach the view's).
    pub read_root: bool,
}

/// What a view entry lies over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Over {
    /// Anything: an entry that adds to the view.
    Anything,
    /// Only a host path the view shows: an entry that narrows it (hides it,
    /// makes it read-only), dropped elsewhere.
    HostOnly,
    /// Only where the view shows nothing of the host: an entry that adds a
    /// path the view would not show otherwise (a granted program's file),
    /// dropped where a host bind shows it already.
    ViewOnly,
}

#[derive(Clone, Debug)]
enum Kind {
    Tmpfs { options: String, flags: libc::c_ulong, seal: bool, writable: bool },
    Bind { source: PathBuf, read_only: bool, optional: bool, dir: bool },
    Devpts { options: String },
    Symlink { target: PathBuf },
}

impl Kind {
    fn is_mount(&self) -> bool {
        !matches!(self, Kind::Symlink { .. })
    }
}

#[derive(Clone, Debug)]
struct Entry {
    target: PathBuf,
    kind: Kind,
    over: Over,
}

/// Collects a view's entries (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct ViewBuilder {
    entries: Vec<Entry>,
    /// Every host path the plan looked at (whether it exists, what it is):
    /// a cached plan holds while none of them changed.
    consulted: Vec<PathBuf>,
}

impl ViewBuilder {
    /// A fresh `tmpfs` at `path`; `seal`: read-only once the view is built;
    /// `writable`: the tree writes it (a Landlock rule is added for it).
    pub(crate) fn tmpfs(&mut self, path: &Path, options: String, flags: libc::c_ulong, seal: bool, writable: bool) {
        self.push(path, Kind::Tmpfs { options, flags, seal, writable }, Over::Anything);
    }

    /// As [`Self::tmpfs`], only where the view shows the host's `path`
    /// (covering it).
    pub(crate) fn tmpfs_over_host(&mut self, path: &Path, options: String, flags: libc::c_ulong, seal: bool) {
        self.push(path, Kind::Tmpfs { options, flags, seal, writable: false }, Over::HostOnly);
    }

    /// The host's `source` at another path `target` (a home allow-list
    /// entry reached through a symlink), read-only; skipped if gone.
    pub(crate) fn bind_at(&mut self, source: &Path, target: &Path, read_only: bool) {
        let Ok(meta) = self.metadata(source) else { return };
        let kind = Kind::Bind { source: source.to_path_buf(), read_only, optional: true, dir: meta.is_dir() };
        self.push(target, kind, Over::Anything);
    }

    /// The host's `path` at the same path, if it exists now (a directory or
    /// a file); `read_only`; `over`: see [`Over`]. A path that vanishes
    /// before the tree is set up is skipped.
    pub(crate) fn bind(&mut self, path: &Path, read_only: bool, over: Over) {
        let Ok(meta) = self.metadata(path) else { return };
        let kind = Kind::Bind { source: path.to_path_buf(), read_only, optional: true, dir: meta.is_dir() };
        self.push(path, kind, over);
    }

    /// As [`Self::bind`], for a path that must be there (the set-up fails
    /// without it).
    pub(crate) fn bind_required(&mut self, path: &Path, read_only: bool) {
        let dir = self.metadata(path).map(|m| m.is_dir()).unwrap_or(true);
        let kind = Kind::Bind { source: path.to_path_buf(), read_only, optional: false, dir };
        self.push(path, kind, Over::Anything);
    }

    /// The host's `source` file at `target` (a different path), e.g.
    /// `/dev/null` over a hidden file.
    fn bind_file_at(&mut self, source: &Path, target: &Path, over: Over) {
        let kind = Kind::Bind { source: source.to_path_buf(), read_only: false, optional: true, dir: false };
        self.push(target, kind, over);
    }

    /// Hides the host's `path` where the view shows it: an empty directory
    /// nobody can list, or an empty file (`/dev/null`).
    pub(crate) fn hide(&mut self, path: &Path) {
        let Ok(meta) = self.metadata(path) else { return };
        if meta.is_dir() {
            let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            let kind =
                Kind::Tmpfs { options: "mode=000,size=4k,nr_inodes=1".into(), flags, seal: false, writable: false };
            self.push(path, kind, Over::HostOnly);
        } else {
            self.bind_file_at(Path::new("/dev/null"), path, Over::HostOnly);
        }
    }

    /// `link` → `target`.
    pub(crate) fn symlink(&mut self, link: &Path, target: &Path) {
        self.push(link, Kind::Symlink { target: target.to_path_buf() }, Over::Anything);
    }

    /// A fresh `devpts` instance at `path`.
    pub(crate) fn devpts(&mut self, path: &Path, options: String) {
        self.push(path, Kind::Devpts { options }, Over::Anything);
    }

    /// `stat` of a host path the plan depends on (recorded).
    fn metadata(&mut self, path: &Path) -> io::Result<std::fs::Metadata> {
        self.consult(path);
        std::fs::metadata(path)
    }

    /// Records that the plan depends on what `path` is.
    pub(crate) fn consult(&mut self, path: &Path) {
        self.consulted.push(path.to_path_buf());
    }

    /// The host paths looked at so far (see [`Self::consult`]).
    pub(crate) fn take_consulted(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.consulted)
    }

    fn push(&mut self, target: &Path, kind: Kind, over: Over) {
        self.entries.push(Entry { target: target.to_path_buf(), kind, over });
    }

    /// Orders the entries and adds what their mount points need (see the
    /// module doc). `fresh_proc`: I mounts `/proc` (else the caller binds
    /// the host's); `read_root`: Landlock reads below the view's root.
    pub(crate) fn finish(self, fresh_proc: bool, read_root: bool) -> io::Result<MountPlan> {
        // Where a path lies: in a tmpfs of the view (`true`) or a host bind;
        // the mounts kept so far (entries are visited parents first).
        let mut mounts: Vec<(PathBuf, bool)> = Vec::new();
        let container = |mounts: &[(PathBuf, bool)], path: &Path| -> (PathBuf, bool) {
            mounts
                .iter()
                .filter(|(m, _)| path != m.as_path() && path.starts_with(m))
                .max_by_key(|(m, _)| m.components().count())
                .cloned()
                .unwrap_or_else(|| (PathBuf::from("/"), true))
        };
        let mut by_depth: Vec<usize> = (0..self.entries.len()).collect();
        by_depth.sort_by_key(|&i| self.entries[i].target.components().count());
        // (target, rank, index, op): creations before mounts at one path.
        let mut ordered: Vec<(Vec<Vec<u8>>, u8, usize, MountOp)> = Vec::new();
        let mut created = std::collections::BTreeSet::new();
        let mut plan = MountPlan { fresh_proc, read_root, ..MountPlan::default() };
        let key = |p: &Path| -> Vec<Vec<u8>> {
            p.components()
                .filter_map(|c| match c {
                    Component::Normal(n) => Some(n.as_bytes().to_vec()),
                    _ => None,
                })
                .collect()
        };
        let mut create = |ordered: &mut Vec<_>, path: &Path, dir: bool| -> io::Result<()> {
            if created.insert(path.to_path_buf()) {
                let path_c = c_path(path)?;
                let op = if dir { MountOp::Dir { path: path_c } } else { MountOp::File { path: path_c } };
                ordered.push((key(path), 0, 0, op));
            }
            Ok(())
        };
        if fresh_proc {
            create(&mut ordered, Path::new("/proc"), true)?;
        }
        for index in by_depth {
            let entry = &self.entries[index];
            let (outer, in_tmpfs) = container(&mounts, &entry.target);
            match entry.over {
                Over::HostOnly if in_tmpfs => continue,
                Over::ViewOnly if !in_tmpfs => continue,
                _ => {}
            }
            if entry.kind.is_mount() {
                mounts.push((entry.target.clone(), matches!(entry.kind, Kind::Tmpfs { .. } | Kind::Devpts { .. })));
            }
            if in_tmpfs {
                // Every directory between the tmpfs and the target, then the
                // mount point itself.
                let below: Vec<&Path> =
                    entry.target.ancestors().skip(1).take_while(|a| *a != outer.as_path()).collect();
                for dir in below.into_iter().rev() {
                    create(&mut ordered, dir, true)?;
                }
                match &entry.kind {
                    Kind::Bind { dir: false, .. } => create(&mut ordered, &entry.target, false)?,
                    Kind::Symlink { .. } => {}
                    _ => create(&mut ordered, &entry.target, true)?,
                }
            }
            let target = c_path(&entry.target)?;
            let (rank, op) = match &entry.kind {
                Kind::Tmpfs { options, flags, seal, writable } => {
                    if *seal {
                        plan.sealed.push(target.clone());
                    }
                    if *writable {
                        plan.writable.push(target.clone());
                    }
                    (2, MountOp::Tmpfs { path: target, options: c_string(options)?, flags: *flags })
                }
                Kind::Bind { source, read_only, optional, .. } => {
                    let source = c_path(&Path::new(OLD_ROOT).join(source.strip_prefix("/").unwrap_or(source)))?;
                    (2, MountOp::Bind { source, target, read_only: *read_only, optional: *optional })
                }
                Kind::Devpts { options } => {
                    plan.writable.push(target.clone());
                    (2, MountOp::Devpts { path: target, options: c_string(options)? })
                }
                Kind::Symlink { target: to } => (1, MountOp::Symlink { target: c_path(to)?, link: target }),
            };
            ordered.push((key(&entry.target), rank, index + 1, op));
        }
        ordered.sort_by(|a, b| (&a.0, a.1, a.2).cmp(&(&b.0, b.1, b.2)));
        plan.ops = ordered.into_iter().map(|(_, _, _, op)| op).collect();
        Ok(plan)
    }
}

pub(crate) fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{} holds a NUL byte", path.display())))
}

fn c_string(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a mount option holds a NUL byte"))
}

impl MountPlan {
    /// The plan as keeper arguments (see [`crate::keeper`]): a header
    /// (`fresh_proc`, `read_root`, the counts), then each step as its kind
    /// letter and its fields, one argument each.
    pub(crate) fn to_args(&self) -> Vec<CString> {
        let flag = |on: bool| CString::from(if on { c"1" } else { c"0" });
        let number = |n: u64| CString::new(n.to_string()).expect("digits");
        let mut args = vec![
            flag(self.fresh_proc),
            flag(self.read_root),
            number(self.ops.len() as u64),
            number(self.sealed.len() as u64),
            number(self.writable.len() as u64),
        ];
        for op in &self.ops {
            match op {
                MountOp::Dir { path } => args.extend([c"d".into(), path.clone()]),
                MountOp::File { path } => args.extend([c"f".into(), path.clone()]),
                MountOp::Symlink { target, link } => args.extend([c"l".into(), target.clone(), link.clone()]),
                MountOp::Tmpfs { path, options, flags } => {
                    args.extend([c"t".into(), path.clone(), options.clone(), number(*flags)])
                }
                MountOp::Bind { source, target, read_only, optional } => {
                    args.extend([c"b".into(), source.clone(), target.clone(), flag(*read_only), flag(*optional)])
                }
                MountOp::Devpts { path, options } => args.extend([c"p".into(), path.clone(), options.clone()]),
            }
        }
        args.extend(self.sealed.iter().cloned());
        args.extend(self.writable.iter().cloned());
        args
    }

    /// Rebuilds a plan from [`Self::to_args`]; returns it and how many
    /// arguments it took.
    pub(crate) fn from_args(args: &[&[u8]]) -> io::Result<(Self, usize)> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("bad keeper argument: {what}"));
        let mut at = 0;
        let mut next = || -> io::Result<&[u8]> {
            let arg = args.get(at).copied().ok_or_else(|| bad("the view ends early"))?;
            at += 1;
            Ok(arg)
        };
        let c = |bytes: &[u8]| CString::new(bytes).map_err(|_| bad("a NUL byte in the view"));
        let number = |bytes: &[u8]| -> io::Result<u64> {
            std::str::from_utf8(bytes).ok().and_then(|t| t.parse().ok()).ok_or_else(|| bad("not a number in the view"))
        };
        let flag = |bytes: &[u8]| bytes == b"1";
        let fresh_proc = flag(next()?);
        let read_root = flag(next()?);
        let (n_ops, n_sealed, n_writable) = (number(next()?)?, number(next()?)?, number(next()?)?);
        let mut plan = MountPlan { fresh_proc, read_root, ..MountPlan::default() };
        for _ in 0..n_ops {
            let op = match next()? {
                b"d" => MountOp::Dir { path: c(next()?)? },
                b"f" => MountOp::File { path: c(next()?)? },
                b"l" => MountOp::Symlink { target: c(next()?)?, link: c(next()?)? },
                b"t" => MountOp::Tmpfs { path: c(next()?)?, options: c(next()?)?, flags: number(next()?)? as _ },
                b"b" => MountOp::Bind {
                    source: c(next()?)?,
                    target: c(next()?)?,
                    read_only: flag(next()?),
                    optional: flag(next()?),
                },
                b"p" => MountOp::Devpts { path: c(next()?)?, options: c(next()?)? },
                _ => return Err(bad("an unknown step in the view")),
            };
            plan.ops.push(op);
        }
        for _ in 0..n_sealed {
            plan.sealed.push(c(next()?)?);
        }
        for _ in 0..n_writable {
            plan.writable.push(c(next()?)?);
        }
        Ok((plan, at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(plan: &MountPlan) -> Vec<String> {
        plan.ops
            .iter()
            .map(|op| match op {
                MountOp::Dir { path } => format!("dir {}", path.to_str().unwrap()),
                MountOp::File { path } => format!("file {}", path.to_str().unwrap()),
                MountOp::Symlink { link, .. } => format!("link {}", link.to_str().unwrap()),
                MountOp::Tmpfs { path, .. } => format!("tmpfs {}", path.to_str().unwrap()),
                MountOp::Bind { target, .. } => format!("bind {}", target.to_str().unwrap()),
                MountOp::Devpts { path, .. } => format!("devpts {}", path.to_str().unwrap()),
            })
            .collect()
    }

    /// Parents before children, mount points created only inside the view's
    /// own tmpfses, narrowing entries dropped there, and the plan survives
    /// the keeper's argument list.
    #[test]
    fn the_plan_orders_entries_and_creates_mount_points_only_in_its_own_tmpfs() {
        let dir = std::env::temp_dir().join(format!("taskhost-view-{}", std::process::id()));
        let (work, file) = (dir.join("a/work"), dir.join("a/work/conf.toml"));
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(&file, "x").unwrap();
        let mut view = ViewBuilder::default();
        view.hide(&dir.join("a"));
        view.bind(&file, true, Over::HostOnly);
        view.bind(&work, false, Over::Anything);
        view.tmpfs(Path::new("/tmp"), "mode=1777".into(), 0, false, true);
        view.bind(Path::new("/usr"), true, Over::Anything);
        view.symlink(Path::new("/bin"), Path::new("usr/bin"));
        let plan = view.finish(true, true).unwrap();
        let (w, f) = (work.display().to_string(), file.display().to_string());
        // Mount points in the root's tmpfs are created; parents come first.
        let mut want = vec!["link /bin".to_string(), "dir /proc".into(), "dir /tmp".into(), "tmpfs /tmp".into()];
        // The workspace's parents are created in the private /tmp (when the
        // temporary directory is /tmp); the hide over `a` lies in the view's
        // tmpfs, so it is dropped; the read-only file is over the bind.
        let parents: Vec<String> = work
            .ancestors()
            .skip(1)
            .take_while(|a| *a != Path::new("/tmp"))
            .map(|a| format!("dir {}", a.display()))
            .collect();
        want.extend(parents.into_iter().rev());
        want.extend([format!("dir {w}"), format!("bind {w}"), format!("bind {f}")]);
        want.extend(["dir /usr".to_string(), "bind /usr".into()]);
        if std::env::temp_dir() == Path::new("/tmp") {
            assert_eq!(targets(&plan), want);
        }
        assert_eq!(plan.writable, [c"/tmp".to_owned()]);
        let args = plan.to_args();
        let refs: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let (back, used) = MountPlan::from_args(&refs).unwrap();
        assert_eq!((back, used), (plan, args.len()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
