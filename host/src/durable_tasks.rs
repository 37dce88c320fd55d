//! Tasks whose outcome is a durable tree a plugin handed over
//! (`process.spawn-handed-over` for a stable owner), carried across a
//! restart of the server: what the store keeps of such a tree
//! ([`HandedOverTree`]) and the [`TreeAdopter`] that re-adopts it.
//!
//! Model: after a restart no guest holds the tree any more (its state died
//! with the server), so the host finishes the task: its output is the
//! tree's logs, followed from where the owner last read them
//! ([`taskhost_process::TreeCursor`]), and its outcome is worded from the
//! exit status as the built-in bash words a background command's:
//! `completed` + `exit code: N`; after a kill, `killed` + `signal: <NAME>`
//! (or `exit code: N`); at the tree's deadline, `killed` as after a timeout.
//!
//! Invariants:
//! - A tree is adopted only by its proof ([`DurableProcess::adopt`]: the
//!   recorded keeper pid and start time, and the secret); anything else is
//!   an error, which the registry reports as the task lost, once.
//! - A kill requested before the restart is carried out before the task
//!   runs on; it ends `killed`, never `running` again.
//! - The record holds the secret: the store keeps it in its 0600 file in
//!   the 0700 state directory, never in a tree's reach.
//! - The launch fence: right after its spawn, before the guest hears of it,
//!   a tree's directory gets a `launch` file naming the server that spawned
//!   it (pid and start time) and its record; a spawn that cannot write it is
//!   killed and refused. A server that dies before its start was recorded
//!   in the store leaves a tree no record names: the next server's
//!   [`DurableTreeAdopter::sweep`] kills it (its spawner is gone), so no
//!   command runs on that nobody can see or stop. The window left is from
//!   the command's start to the file's rename (the spawn's return to the
//!   host: well under a millisecond unloaded): a tree started there runs
//!   to its deadline. Closing it needs the command held until the fence
//!   is written (a "go" from the host to the keeper).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use taskhost_core::tasks::{OutputSignal, SectionLabel, TaskControl, TaskHooks, TaskOutcome, TreeAdopter};
use taskhost_process::{
    DurableProcess, DurableRecord, ExitStatus, FollowedTree, LogRelease, OutputSink, Stream, TreeCursor, TreeEnd,
    signal_name,
};

/// The bytes of a re-adopted tree's output waiting for the registry at most
/// (its follower waits meanwhile; the rest stays in the logs).
const WAITING_BYTES: usize = 1 << 20;

/// What the store keeps of a handed-over tree.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandedOverTree {
    pub record: DurableRecord,
    /// Milliseconds between SIGTERM and SIGKILL on a kill.
    pub grace_ms: u64,
}

impl HandedOverTree {
    pub fn new(record: DurableRecord, grace: Duration) -> Self {
        Self { record, grace_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX) }
    }

    /// The text the store keeps.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("a record serializes")
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|error| format!("its stored record is unreadable ({error})"))
    }
}

/// The outcome of a handed-over tree, in the built-in bash's words.
pub fn outcome(end: &TreeEnd, cancelled: bool) -> TaskOutcome {
    match end {
        TreeEnd::Exited(exit) => match exit.status {
            ExitStatus::Signal(signal) => TaskOutcome::killed(format!("signal: {}", signal_name(signal))),
            ExitStatus::Code(code) if cancelled || exit.deadline => TaskOutcome::killed(format!("exit code: {code}")),
            ExitStatus::Code(code) => TaskOutcome::completed(format!("exit code: {code}")),
        },
        TreeEnd::Lost(why) => TaskOutcome::failed(format!("its process tree's end is unknown: {why}")),
    }
}

/// The file in a tree's directory that fences its launch (see the module's
/// invariants): `<spawner pid> <spawner start time>`, then the record.
const LAUNCH_FILE: &str = "launch";

/// Writes the launch fence of a tree spawned by this process into its
/// directory: whole or not at all (written aside, new, 0600, never through
/// a link, then renamed in), so a crash in the middle leaves no fence
/// rather than an unreadable one.
pub fn record_launch(dir: &Path, kept: &HandedOverTree) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let pid = std::process::id();
    let started = taskhost_process::durable::start_time(pid).unwrap_or(0);
    let aside = dir.join(format!("{LAUNCH_FILE}.tmp"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&aside)?;
    file.write_all(format!("{pid} {started}\n{}\n", kept.to_text()).as_bytes())?;
    std::fs::rename(&aside, dir.join(LAUNCH_FILE))
}

/// The record of a tree in `dir` whose spawner is gone, from its launch
/// fence; `None` when its spawner still runs (its start may be in flight) or
/// the fence is missing or unreadable.
fn orphaned_launch(dir: &Path) -> Option<HandedOverTree> {
    let (pid, started, kept) = read_launch(dir)?;
    let alive = u32::try_from(pid).is_ok_and(|pid| taskhost_process::durable::start_time(pid) == Some(started));
    (!alive).then_some(kept)
}

/// Kills every tree under `root` that has not ended and whose launch fence
/// is readable, whoever spawned it (a cluster node declared gone: none of
/// its trees may run on). Returns how many it killed.
pub fn kill_every_tree(root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else { return 0 };
    let mut killed = 0;
    for entry in entries.flatten() {
        let dir = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) || dir.join("status").exists() {
            continue;
        }
        let Some(kept) = launched_tree(&dir) else { continue };
        match kill_tree(&kept) {
            Ok(()) => killed += 1,
            Err(error) => tracing::debug!(dir = %dir.display(), %error, "a durable tree cannot be reached to kill it"),
        }
    }
    killed
}

/// Kills the tree `kept` records, through its keeper.
fn kill_tree(kept: &HandedOverTree) -> Result<(), String> {
    DurableProcess::adopt(&kept.record)
        .map_err(|error| error.to_string())
        .and_then(|process| process.kill().map_err(|error| error.to_string()))
}

/// The record in a tree's launch fence, with its spawner's pid and start
/// time; `None` when the fence is missing or unreadable.
fn read_launch(dir: &Path) -> Option<(u64, u64, HandedOverTree)> {
    let text = std::fs::read_to_string(dir.join(LAUNCH_FILE)).ok()?;
    let (spawner, record) = text.split_once('\n')?;
    let mut words = spawner.split_whitespace().map(str::parse::<u64>);
    let (Some(Ok(pid)), Some(Ok(started))) = (words.next(), words.next()) else { return None };
    Some((pid, started, HandedOverTree::parse(record.trim_end()).ok()?))
}

fn launched_tree(dir: &Path) -> Option<HandedOverTree> {
    read_launch(dir).map(|(_, _, kept)| kept)
}

/// A handed-over tree's directory, as its task's control holds it: lets go
/// of the log bytes the owner read for good ([`LogRelease`]), and removes
/// the directory once the tree ended, when dropped (the record holds the
/// control until it leaves the history, long after its end was recorded).
#[derive(Debug)]
pub struct TreeDir {
    record: DurableRecord,
    release: LogRelease,
    /// The cursor the store holds, as this process last stored it.
    stored: std::sync::Mutex<Option<Arc<str>>>,
}

impl TreeDir {
    /// The directory of the tree a store keeps as `text`.
    pub fn of(text: &str) -> Option<Self> {
        HandedOverTree::parse(text).ok().map(|kept| Self::new(kept.record))
    }

    fn new(record: DurableRecord) -> Self {
        Self { release: LogRelease::new(&record), record, stored: Default::default() }
    }

    /// `cursor` when the store does not hold it yet: a read that took
    /// nothing new costs the store no write.
    pub fn unstored(&self, cursor: Option<Arc<str>>) -> Option<Arc<str>> {
        let stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        cursor.filter(|cursor| stored.as_ref() != Some(cursor))
    }

    /// The store holds `cursor`: the logs let go of what lies before it.
    pub fn cursor_stored(&self, cursor: &str) {
        *self.stored.lock().unwrap_or_else(|e| e.into_inner()) = Some(cursor.into());
        self.release.release_before(cursor);
    }
}

impl Drop for TreeDir {
    fn drop(&mut self) {
        taskhost_process::durable_follow::remove_ended(&self.record);
    }
}

/// Re-adopts handed-over trees for the registry.
#[derive(Debug, Default)]
pub struct DurableTreeAdopter {
    /// The directories of the trees it was asked about.
    asked: std::sync::Mutex<Vec<std::path::PathBuf>>,
}

impl DurableTreeAdopter {
    /// Called once after [`TaskRegistry::readopt`](taskhost_core::tasks::TaskRegistry::readopt):
    /// removes the directories under `root` of ended trees no re-adopted
    /// task holds (records released at a shutdown leave theirs behind), and
    /// kills each running tree no task holds whose spawner is gone (a server
    /// that died between the tree's spawn and its record: see the launch
    /// fence). Its directory goes at the next start-up, once it ended.
    /// Returns how many trees it killed.
    pub fn sweep(&self, root: &Path) -> usize {
        let asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(entries) = std::fs::read_dir(root) else { return 0 };
        let mut killed = 0;
        for entry in entries.flatten() {
            let dir = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) || asked.contains(&dir) {
                continue;
            }
            if dir.join("status").exists() {
                tracing::debug!(dir = %dir.display(), "an ended durable tree's directory is removed");
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            }
            let Some(orphan) = orphaned_launch(&dir) else { continue };
            match kill_tree(&orphan) {
                Ok(()) => {
                    killed += 1;
                    tracing::warn!(
                        dir = %dir.display(),
                        "a durable tree no task record names (its server stopped before its start was recorded) is killed"
                    );
                }
                Err(error) => {
                    tracing::debug!(dir = %dir.display(), %error, "an unrecorded durable tree cannot be reached");
                }
            }
        }
        killed
    }
}

impl TreeAdopter for DurableTreeAdopter {
    fn adopt(&self, tree: &str, cursor: Option<&str>, kill: bool) -> Result<TaskHooks, String> {
        let kept = HandedOverTree::parse(tree)?;
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).push(kept.record.dir.clone());
        let cursor = match cursor {
            None => TreeCursor::default(),
            Some(text) => {
                TreeCursor::parse(text).ok_or_else(|| format!("its stored read cursor {text:?} is unreadable"))?
            }
        };
        let process = DurableProcess::adopt(&kept.record).map_err(|error| error.to_string())?;
        if kill && process.exit().is_none() {
            process.kill().map_err(|error| format!("its stop could not be carried out: {error}"))?;
        }
        let sink = OutputSink::new(WAITING_BYTES);
        let tree = Arc::new(FollowedTree::follow(process, sink.clone(), cursor, Duration::from_millis(kept.grace_ms)));
        let cancelled = Arc::new(AtomicBool::new(kill));
        let dir = TreeDir::new(kept.record.clone());
        let control = Arc::new(AdoptedTree { tree: tree.clone(), sink, cancelled: cancelled.clone(), dir });
        let done = Box::pin(async move {
            tree.ended().await;
            let end = tree.end().expect("ended");
            Ok(outcome(&end, cancelled.load(Ordering::Acquire)))
        });
        Ok(TaskHooks::new(control, done))
    }
}

/// The control of a re-adopted task.
struct AdoptedTree {
    tree: Arc<FollowedTree>,
    sink: Arc<OutputSink>,
    /// A kill was asked for (the end is then `killed`).
    cancelled: Arc<AtomicBool>,
    dir: TreeDir,
}

#[async_trait::async_trait]
impl TaskControl for AdoptedTree {
    async fn cancel(&self, _reason: Option<&str>) -> anyhow::Result<()> {
        self.cancelled.store(true, Ordering::Release);
        self.tree.kill();
        Ok(())
    }

    fn streams_output(&self) -> bool {
        true
    }

    fn take_pulled_sections(&self, into: &mut dyn FnMut(&str, SectionLabel)) -> bool {
        self.sink.take_sections_with(|text, sections| {
            for (part, stream) in sections.parts(text) {
                into(
                    part,
                    match stream {
                        Stream::Stderr => Some("[stderr]"),
                        Stream::Stdout => None,
                    },
                );
            }
        });
        true
    }

    fn watch_output(&self, signal: OutputSignal) {
        self.sink.set_signal(Box::new(move || signal.raise()));
    }

    async fn write_input(&self, data: &[u8], close: bool) -> anyhow::Result<()> {
        let mut written = 0;
        while written < data.len() {
            match self.tree.process().write_stdin(&data[written..])? {
                0 => anyhow::bail!("its stdin buffer is full ({written} of {} bytes were taken)", data.len()),
                n => written += n,
            }
        }
        if close {
            self.tree.process().close_stdin()?;
        }
        Ok(())
    }

    fn tree_cursor(&self) -> Option<Arc<str>> {
        self.dir.unstored(self.sink.taken_mark())
    }

    fn tree_cursor_stored(&self, cursor: &str) {
        self.dir.cursor_stored(cursor);
    }
}
