//! Running a test's binary as another user, the way the security suites run
//! an unprivileged server: `setpriv` (no capabilities, no supplementary
//! groups), never sudo, from a copy of the binary that user can run.
//!
//! Invariants: the copy is written once per build (named by the binary's
//! size and mtime), beside its name and renamed in, so concurrent tests never
//! see half a copy; it is owned by the test's user, so the user it runs as
//! cannot replace it; copies a day old go.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A command running `binary` as this user, or, with `uid`, as that user
/// through `setpriv` from a copy it can run ([`shared_binary`]): the build's
/// binary may sit below a directory only root can enter (CI checks out below
/// /root). The caller makes whatever the command needs the user's own.
pub fn command(binary: &Path, uid: Option<u32>) -> tokio::process::Command {
    let Some(uid) = uid else { return tokio::process::Command::new(binary) };
    let mut command = tokio::process::Command::new("setpriv");
    command.args([&format!("--reuid={uid}"), &format!("--regid={uid}"), "--clear-groups", "--inh-caps=-all"]);
    command.arg(shared_binary(binary));
    command
}

/// A copy of `binary` another user can run (the build's own may sit below a
/// home only its owner can enter): one per build, shared by every test and
/// run, never changed once in place (a server's keeper may still run it).
pub fn shared_binary(binary: &Path) -> PathBuf {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let meta = std::fs::metadata(binary).unwrap();
    // SAFETY: getuid cannot fail.
    let owner = unsafe { libc::getuid() };
    let dir = std::env::temp_dir().join(format!("taskhost-test-bin-{owner}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir_meta = std::fs::symlink_metadata(&dir).unwrap();
    assert!(dir_meta.is_dir() && dir_meta.uid() == owner, "{} is not this user's directory", dir.display());
    let name = binary.file_name().and_then(|n| n.to_str()).unwrap_or("binary");
    let copy = dir.join(format!("{name}-{}-{}.{}", meta.len(), meta.mtime(), meta.mtime_nsec()));
    if !copy.exists() {
        let partial = tempfile::Builder::new().prefix(".partial-").tempfile_in(&dir).unwrap();
        std::fs::copy(binary, partial.path()).unwrap();
        std::fs::set_permissions(partial.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        partial.persist(&copy).unwrap();
        // Copies of builds a day old go (another checkout's tests may still
        // run a newer one): a day of builds is the most this directory holds.
        let day_ago = std::time::SystemTime::now() - Duration::from_secs(24 * 3600);
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            if entry.metadata().is_ok_and(|m| m.modified().is_ok_and(|at| at < day_ago)) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    copy
}
