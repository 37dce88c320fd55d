//! Where stream tasks' output logs are kept on disk: the [`OutputFiles`] a
//! registry is given, and the default one, a private directory of the
//! registry's own ([`PrivateOutputDir`]).
//!
//! Invariants: a log file is new and empty when made, opened for reading
//! and appending, mode 0600, never through a link; dropping its
//! [`OutputFile`] removes it (and gives its bytes back to whatever budget
//! they were charged to). The registry never writes more than
//! [`OutputFile::reserve`] granted.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::ids::{SessionId, TaskId};

/// Makes the log files of stream tasks (see
/// [`crate::tasks::TaskRegistry::set_output_files`]). The host's makes them
/// in each owner's own directory, which that owner's commands see read-only
/// and whose disk budget they share; the path a skipped read names is then
/// one the owner's later commands can read.
pub trait OutputFiles: Send + Sync + 'static {
    /// A new, empty log file for task `task` of `owner` (`None`: an unowned
    /// task).
    fn create(&self, owner: Option<&SessionId>, task: &TaskId) -> std::io::Result<Box<dyn OutputFile>>;
}

/// One task's log file. Dropping it removes the file.
pub trait OutputFile: Send + Sync + 'static {
    /// The file, opened for reading and appending.
    fn file(&self) -> &File;
    /// Where it is: the path a read names (`full output: <path>`).
    fn path(&self) -> &Path;
    /// Takes room for up to `bytes` more bytes from the budget the file
    /// counts against; returns how many may be written.
    fn reserve(&self, bytes: u64) -> u64;
}

/// The default [`OutputFiles`]: `<task>.log` files in a private directory
/// (mode 0700) of the registry's, with no budget beyond each task's own
/// [`crate::tasks::OutputLimits::spill_bytes`]. The directory goes with the
/// registry.
pub(crate) struct PrivateOutputDir {
    pub(crate) dir: PathBuf,
}

impl OutputFiles for PrivateOutputDir {
    fn create(&self, _owner: Option<&SessionId>, task: &TaskId) -> std::io::Result<Box<dyn OutputFile>> {
        let path = self.dir.join(format!("{task}.log"));
        Ok(Box::new(PrivateFile { file: create_private_file(&path)?, path }))
    }
}

impl Drop for PrivateOutputDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct PrivateFile {
    file: File,
    path: PathBuf,
}

impl OutputFile for PrivateFile {
    fn file(&self) -> &File {
        &self.file
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn reserve(&self, bytes: u64) -> u64 {
        bytes
    }
}

impl Drop for PrivateFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Creates a new file only the server's user can read (0600). `create_new`
/// is `O_CREAT | O_EXCL`, which never follows a link nor reuses a file.
fn create_private_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new().read(true).append(true).create_new(true).mode(0o600).open(path)
}

/// Creates the registry's private output directory (0700) in `parent`.
pub(crate) fn create_private_dir(parent: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(parent)?;
    for attempt in 0u32..100 {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let dir = parent.join(format!("task-output-{}-{nanos:x}{attempt}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
    }
    Err(std::io::Error::other("could not create a fresh output directory"))
}
