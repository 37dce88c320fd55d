//! Watching a plugin file and reloading it when it changes.
//!
//! Invariants:
//! - A rebuild that writes the file in several steps (truncate, write in
//!   chunks, rename over it, touch) reloads once: events are debounced until
//!   the directory has been quiet for [`WatchOptions::debounce`], and then the
//!   file's size and mtime must stay the same over [`WatchOptions::settle`].
//! - A half-written file is never served: it either is still changing (and
//!   is waited for) or fails to compile or validate, which is reported as a
//!   failed reload while the previous version keeps serving; the next change
//!   of the file retries. A failure never ends the watch.
//! - Content identical to the serving version (a `touch`, a no-op rebuild)
//!   does not make a new version.
//!
//! The parent directory is watched, not the file: build tools and `cp`
//! replace files by rename, which would end a watch on the old inode.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use notify::{EventKind, RecursiveMode, Watcher as _};
use sha2::Digest as _;
use tokio::sync::mpsc;

use super::ReloadablePlugin;

/// Debounce settings.
#[derive(Clone, Copy, Debug)]
pub struct WatchOptions {
    /// Quiet time after the last event before the file is looked at.
    pub debounce: Duration,
    /// The size and mtime must not change over this long before loading.
    pub settle: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self { debounce: Duration::from_millis(40), settle: Duration::from_millis(20) }
    }
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
    let mut watcher = notify::recommended_watcher({
        let file_name = file_name.clone();
        move |event: notify::Result<notify::Event>| match event {
            Ok(event) => {
                let ours = event.paths.iter().any(|p| p.file_name() == Some(file_name.as_os_str()));
                if ours && is_change(&event.kind) {
                    let _ = tx.send(());
                }
            }
            Err(error) => tracing::warn!(%error, "file watch error"),
        }
    })
    .context("cannot create a file watcher")?;
    watcher.watch(&dir, RecursiveMode::NonRecursive).with_context(|| format!("cannot watch {}", dir.display()))?;
    tracing::info!(tool = plugin.tool(), path = %path.display(), "watching the plugin file");
    let task = tokio::spawn(run(plugin, path.clone(), options, rx));
    Ok(WatchHandle { _watcher: watcher, task, path })
}

/// Events that can mean new content. Opens and reads (our own reads among
/// them) are not changes.
fn is_change(kind: &EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Any | EventKind::Other => true,
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) | EventKind::Remove(_) => false,
    }
}

async fn run(plugin: Arc<ReloadablePlugin>, path: PathBuf, options: WatchOptions, mut rx: mpsc::UnboundedReceiver<()>) {
    while rx.recv().await.is_some() {
        // Debounce: wait until no event came for `debounce`, then until the
        // file stopped changing.
        loop {
            while let Ok(Some(())) = tokio::time::timeout(options.debounce, rx.recv()).await {}
            match stable(&path, options.settle).await {
                Some(true) => break,
                Some(false) => continue,
                // Gone (mid-replace, or deleted): the next event retries.
                None => break,
            }
        }
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::debug!(path = %path.display(), %error, "plugin file unreadable; waiting for the next change");
                continue;
            }
        };
        let hash = hex(&sha2::Sha256::digest(&bytes));
        if hash == plugin.serving().version.content_hash() {
            tracing::debug!(tool = plugin.tool(), "plugin file changed but its content is the serving version's");
            continue;
        }
        // The outcome is broadcast (and logged) by the reload itself; a
        // failure only waits for the next change.
        let _ = plugin.reload_file(&path).await;
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

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}
