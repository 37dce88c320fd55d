//! Watching a plugin file and reloading it when it changes. The parent directory is watched
//! (build tools and `cp` replace files by rename, which would end a watch on the old inode);
//! a notify callback classifies each event and a task turns them into loads.
//!
//! - *Complete* writes reload after [`WatchOptions::complete_quiet`] of coalescing, with no
//!   settle check: `IN_CLOSE_WRITE`, `IN_MOVED_TO` (a rename onto the name) and an
//!   `IN_CREATE` of a file with another link (cargo uplifts artifacts by hard link).
//! - *Partial* writes (`IN_MODIFY`, a plain create, anything unknown) wait until the directory
//!   was quiet for [`WatchOptions::debounce`], then until size and mtime hold over
//!   [`WatchOptions::settle`]. A complete write during that wait makes it a complete one.
//! - Metadata changes (`IN_ATTRIB`) extend the current wait without changing its kind.
//! - With `complete_quiet: None` every change takes the partial-write path.
//!
//! Invariants:
//! - A half-written file is never served: it is waited for, or fails to compile or validate
//!   while the previous version keeps serving. A load that fails after a complete write is
//!   waited for as after a partial one and reported only if the content is still the one that
//!   failed; a reported failure waits for the next change. No failure ends the watch.
//! - One reload per complete write: a write's events (truncate, chunks, close; a rename pair;
//!   a rename then `touch`) coalesce. Each close followed by `complete_quiet` without another
//!   event is a finished write: served if the content is a valid plugin (so closes more than
//!   a few ms apart make two versions), else nothing is reported and the last close serves.
//!   A writer that wants one reload for several steps writes elsewhere and renames.
//! - Content identical to the serving version (a `touch`, a no-op rebuild) is no new version.
//! - The bytes read are the bytes hashed, admitted by the trust policy
//!   ([`ReloadablePlugin::admit_file`]) and loaded; bytes not admitted fail the reload at once.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{EventKind, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

use super::ReloadablePlugin;
use crate::plugin::component::content_hash;

/// Debounce settings.
#[derive(Clone, Copy, Debug)]
pub struct WatchOptions {
    /// Quiet time after the last partial-write event before the file is
    /// looked at.
    pub debounce: Duration,
    /// After a partial write, the size and mtime must not change over this
    /// long before loading.
    pub settle: Duration,
    /// Quiet time after a complete write (close after writing, rename onto
    /// the file, hard link) before loading, with no settle check. `None`
    /// treats every change as a partial write.
    pub complete_quiet: Option<Duration>,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            debounce: Duration::from_millis(40),
            settle: Duration::from_millis(20),
            complete_quiet: Some(Duration::from_millis(5)),
        }
    }
}

impl WatchOptions {
    /// Every change waits for the debounce and the settle check, as before
    /// complete writes were recognized (for comparison).
    pub fn debounce_only() -> Self {
        Self { complete_quiet: None, ..Self::default() }
    }
}

/// What an event on the plugin file says about its content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// The writer is done: the content is whole.
    Complete,
    /// Content may still be changing.
    Partial,
    /// Metadata only (`IN_ATTRIB`): the content did not change.
    Metadata,
    /// The trust records were rewritten (`taskhost trust`): content refused
    /// as untrusted may be admitted now.
    Trust,
}

/// Keeps the watch alive; dropping it stops watching.
pub struct WatchHandle {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
    path: PathBuf,
}

impl WatchHandle {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reloads `plugin` from `path` whenever the file changes, until the handle
/// is dropped. Results are reported through [`ReloadablePlugin::subscribe`].
pub fn watch(plugin: Arc<ReloadablePlugin>, path: &Path, options: WatchOptions) -> anyhow::Result<WatchHandle> {
    let path = std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"));
    let file_name = path.file_name().map(|n| n.to_os_string()).context("the plugin path names no file")?;
    let (tx, rx) = mpsc::unbounded_channel();
    let trust_records = plugin.trust_records_file().map(Path::to_path_buf);
    let mut watcher = notify::recommended_watcher({
        let file_name = file_name.clone();
        let trust_records = trust_records.clone();
        move |event: notify::Result<notify::Event>| match event {
            Ok(event) => {
                let change = match &trust_records {
                    Some(records) if records_rewritten(&event, records) => Some(Change::Trust),
                    _ => classify(&event, &file_name),
                };
                if let Some(change) = change {
                    let _ = tx.send(change);
                }
            }
            Err(error) => tracing::warn!(%error, "file watch error"),
        }
    })
    .context("cannot create a file watcher")?;
    watcher.watch(&dir, RecursiveMode::NonRecursive).with_context(|| format!("cannot watch {}", dir.display()))?;
    // A refused build is retried when `taskhost trust` records it, without
    // another touch of the plugin file. Without the records' directory (no
    // trust recorded yet on this machine) only a change of the file retries.
    if let Some(records_dir) = trust_records.as_deref().and_then(Path::parent).filter(|d| *d != dir)
        && let Err(error) = watcher.watch(records_dir, RecursiveMode::NonRecursive)
    {
        tracing::warn!(dir = %records_dir.display(), %error, "cannot watch the trust records; a trusted build loads at its next change");
    }
    tracing::info!(tool = plugin.tool(), path = %path.display(), "watching the plugin file");
    let task = tokio::spawn(run(plugin, path.clone(), options, rx));
    Ok(WatchHandle { _watcher: watcher, task, path })
}

/// What `event` says about the file named `file_name`, or `None` when it is
/// about another file or cannot mean new content under that name (opens,
/// reads, our own reads among them; a removal; a rename away).
fn classify(event: &notify::Event, file_name: &OsStr) -> Option<Change> {
    let ours = |p: &PathBuf| p.file_name() == Some(file_name);
    match event.kind {
        // `[from, to]`: only a rename onto our name brings content.
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
            event.paths.last().filter(|p| ours(p)).map(|_| Change::Complete)
        }
        _ if !event.paths.iter().any(ours) => None,
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => Some(Change::Complete),
        EventKind::Modify(ModifyKind::Name(RenameMode::To)) => Some(Change::Complete),
        EventKind::Modify(ModifyKind::Name(RenameMode::From)) => None,
        EventKind::Modify(ModifyKind::Metadata(_)) => Some(Change::Metadata),
        EventKind::Create(_) => Some(if event.paths.iter().find(|p| ours(p)).is_some_and(|p| linked_elsewhere(p)) {
            Change::Complete
        } else {
            Change::Partial
        }),
        EventKind::Modify(_) | EventKind::Any | EventKind::Other => Some(Change::Partial),
        EventKind::Access(_) | EventKind::Remove(_) => None,
    }
}

/// Whether `event` put new trust records in place (they are written to a
/// temporary file and renamed onto `records`).
fn records_rewritten(event: &notify::Event, records: &Path) -> bool {
    match event.kind {
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => event.paths.last().is_some_and(|p| p == records),
        EventKind::Modify(ModifyKind::Name(RenameMode::To))
        | EventKind::Access(AccessKind::Close(AccessMode::Write)) => event.paths.iter().any(|p| p == records),
        _ => false,
    }
}

/// A file that has another link was created by `link(2)` from existing
/// content, not opened empty by a writer.
#[cfg(unix)]
fn linked_elsewhere(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_file() && meta.nlink() > 1)
}

#[cfg(not(unix))]
fn linked_elsewhere(_path: &Path) -> bool {
    false
}

/// Waits until the events starting with `first` say the file can be read:
/// `Some(true)` after a complete write, `Some(false)` after a partial one
/// (debounced and settled), `None` when the watch ended.
async fn quiet(first: Change, options: &WatchOptions, rx: &mut mpsc::UnboundedReceiver<Change>) -> Option<bool> {
    let fast = |change: Change, was: bool| match change {
        Change::Complete => options.complete_quiet.is_some(),
        Change::Partial => false,
        Change::Metadata | Change::Trust => was,
    };
    let mut complete = fast(first, false);
    loop {
        let wait = match (complete, options.complete_quiet) {
            (true, Some(quiet)) => quiet,
            _ => options.debounce,
        };
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(Some(change)) => complete = fast(change, complete),
            Ok(None) => return None,
            Err(_) if complete => return Some(true),
            Err(_) => return Some(false),
        }
    }
}

async fn run(
    plugin: Arc<ReloadablePlugin>,
    path: PathBuf,
    options: WatchOptions,
    mut rx: mpsc::UnboundedReceiver<Change>,
) {
    // A load that failed after a complete write and was not reported yet:
    // the content's hash and the error.
    let mut unreported: Option<(String, anyhow::Error)> = None;
    // The hash of the content last refused as untrusted: a rewrite of the
    // trust records retries it (once admitted, it loads like any change).
    let mut refused: Option<String> = None;
    let mut next = rx.recv().await;
    while let Some(first) = next.take() {
        if first == Change::Trust {
            if let Some(hash) = refused.clone()
                && let Ok(bytes) = tokio::fs::read(&path).await
                && content_hash(&bytes) == hash
                && plugin.admit_file(&path, &hash).is_ok()
            {
                tracing::info!(tool = plugin.tool(), "a refused plugin build is trusted now; loading it");
                refused = None;
                let started = Instant::now();
                let loaded = plugin.engine().load_file_bytes(&path, bytes).await;
                let _ = plugin.serve_loaded(started, loaded).await;
            }
            next = rx.recv().await;
            continue;
        }
        let Some(complete) = quiet(first, &options, &mut rx).await else { return };
        if !complete {
            // Wait until the file stopped changing; a change meanwhile
            // starts the wait over (and may make it a complete write).
            match stable(&path, options.settle).await {
                Some(true) => {}
                Some(false) => {
                    next = Some(Change::Partial);
                    continue;
                }
                // Gone (mid-replace, or deleted): the next event retries.
                None => {
                    next = rx.recv().await;
                    continue;
                }
            }
        }
        let started = Instant::now();
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::debug!(path = %path.display(), %error, "plugin file unreadable; waiting for the next change");
                next = rx.recv().await;
                continue;
            }
        };
        let hash = content_hash(&bytes);
        if hash == plugin.serving().version.content_hash() {
            tracing::debug!(tool = plugin.tool(), "plugin file changed but its content is the serving version's");
            unreported = None;
            next = rx.recv().await;
            continue;
        }
        // Bytes that are not trusted are refused at once, whoever wrote them
        // and however: the serving version stays.
        if let Err(untrusted) = plugin.admit_file(&path, &hash) {
            unreported = None;
            refused = Some(hash);
            let _ = plugin.serve_loaded(started, Err(untrusted)).await;
            next = rx.recv().await;
            continue;
        }
        refused = None;
        let loaded = match unreported.take() {
            // Settled on the content that failed: report that failure.
            Some((failed, error)) if !complete && failed == hash => Err(error),
            _ => plugin.engine().load_file_bytes(&path, bytes).await,
        };
        match loaded {
            Err(error) if complete => {
                tracing::debug!(
                    tool = plugin.tool(),
                    error = %format!("{error:#}"),
                    "a completed write did not load; waiting for the file to settle before reporting"
                );
                unreported = Some((hash, error));
                next = Some(Change::Partial);
            }
            // The outcome is broadcast (and logged) by the reload itself; a
            // failure only waits for the next change.
            loaded => {
                let _ = plugin.serve_loaded(started, loaded).await;
                next = rx.recv().await;
            }
        }
    }
}

/// `Some(true)` when size and mtime are the same before and after `settle`,
/// `Some(false)` when they changed, `None` when the file is missing.
async fn stable(path: &Path, settle: Duration) -> Option<bool> {
    let before = stamp(path).await?;
    tokio::time::sleep(settle).await;
    let after = stamp(path).await?;
    Some(before == after)
}

async fn stamp(path: &Path) -> Option<(u64, Option<SystemTime>)> {
    let meta = tokio::fs::metadata(path).await.ok()?;
    Some((meta.len(), meta.modified().ok()))
}
