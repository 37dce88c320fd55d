//! The tree's private, minimal `/dev`: a small sealed `tmpfs` holding the
//! host's `null zero full random urandom tty` nodes (bound: a user namespace
//! cannot `mknod`), a fresh `devpts` instance with `/dev/ptmx` pointing into
//! it, a private `/dev/shm`, and the `fd`, `stdin`, `stdout`, `stderr`
//! links. No host terminal, pty or block device is in it.
//!
//! Invariant: `/dev/tty` is the host's node, but it opens the caller's
//! *controlling* terminal, and a tree has none of the host's (its keeper
//! leads a session of its own): it opens only a pty the tree made its own.

use std::path::Path;

use super::{Over, ViewBuilder};

/// The host's character devices every tree gets.
pub(crate) const DEVICE_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Ptys one tree may hold at once (its `devpts` instance's `max`): enough
/// for `script`, an `expect` session or a test runner's few, never a
/// dent in the host's `kernel.pty.max` (4 096 by default, of which the
/// trees' instances share what `kernel.pty.reserve`, 1 024, leaves): one
/// tree cannot hold more than this, and trees are bounded by the tasks the
/// host allows.
pub const PTYS_PER_TREE: u32 = 16;

/// The `/dev` of every tree; `shm_options`: its private `/dev/shm`'s
/// `tmpfs` options (size included).
pub(crate) fn private_dev(view: &mut ViewBuilder, shm_options: String) {
    let dev = Path::new("/dev");
    view.tmpfs(dev, "mode=0755,size=64k,nr_inodes=64".into(), libc::MS_NOSUID | libc::MS_NOEXEC, true, false);
    for node in DEVICE_NODES {
        view.bind(&dev.join(node), false, Over::Anything);
    }
    view.devpts(&dev.join("pts"), format!("newinstance,ptmxmode=0666,mode=0620,max={PTYS_PER_TREE}"));
    view.symlink(&dev.join("ptmx"), Path::new("pts/ptmx"));
    view.tmpfs(&dev.join("shm"), shm_options, libc::MS_NOSUID | libc::MS_NODEV, false, true);
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        view.symlink(&dev.join(link), Path::new(target));
    }
}
