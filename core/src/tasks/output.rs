//! The output the host keeps of each stream task, an [`OutputLog`]: everything the task
//! printed, in order, addressed by byte offset from 0, within bounds; every read, view and
//! peek is served from it.
//!
//! Model: a producer hands each byte out once; the registry pulls it into the log on the
//! producer's output signal and before every read. The log has a memory window with the last
//! [`OutputLimits::memory_bytes`] (up to twice that between compactions) while in memory, and
//! a log file ([`files`]) from the first byte, up to [`OutputLimits::spill_bytes`] and the
//! budget it counts against, in the owner's own directory (read-only to the owner's commands),
//! made once the output outgrew the window, when a consuming read skips output (so it can name
//! it), or when the log leaves memory. Under the host-wide
//! [`OutputLimits::memory_total_bytes`] ([`MemoryMeter`]) a log may leave memory for good
//! ([`OutputLog::evict`]); reads, views and peeks then read the file. Output past both is not
//! kept; reads and views say how much is missing. Only the owner's consuming read
//! ([`OutputLog::take_new`]) moves a cursor; views ([`view`]) and the dashboard's peek never do.
//!
//! Invariants:
//! - Memory per task is at most twice the window plus one carried line ([`LINE_LIMIT`]), and
//!   none once evicted; views read the file in bounded chunks.
//! - The file is a prefix of the log: its byte `n` is the log's byte `n`.
//! - A consuming read returns at most [`OutputLimits::read_bytes`] of new output; what it skips
//!   is named exactly (bytes, lines, and the file's path when the file holds them) and stays
//!   readable through the `lines` view. A read that begins inside a labelled section (stderr)
//!   starts with the section's label line.
//! - Line numbers count every line the task printed, from 1, kept or not.
//! - The file is removed when the log is dropped (the record left the registry).

mod files;
mod reads;
#[cfg(test)]
mod tests;
mod view;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use files::{OutputFile, OutputFiles};
pub(crate) use files::{PrivateOutputDir, create_private_dir};
use view::push_capped;
pub use view::{DEFAULT_VIEW_LINES, LINE_LIMIT, MAX_VIEW_LINES, VIEW_LIMIT, ViewKind, ViewRequest};

use crate::ids::{SessionId, TaskId};

/// How much output the host keeps per stream task, and in all.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutputLimits {
    /// The memory window: the last bytes of output, kept in memory.
    pub memory_bytes: usize,
    /// The log file: output from its first byte, once it outgrew memory.
    /// 0 keeps nothing beyond the window.
    pub spill_bytes: u64,
    /// The most one consuming read returns (the rest is skipped, announced).
    pub read_bytes: usize,
    /// Where log files go when no [`OutputFiles`] is set: a private
    /// directory (mode 0700) is made in it. `None` keeps output in memory
    /// only (until the host sets one).
    pub spill_dir: Option<std::path::PathBuf>,
    /// The output every stream task of the registry keeps in memory
    /// together. Beyond it, the logs of the oldest finished tasks (then of
    /// the oldest live ones) leave memory: their output lives in their log
    /// files only (reads and views go on from the file).
    pub memory_total_bytes: usize,
}

/// Default of [`OutputLimits::memory_bytes`].
pub const DEFAULT_OUTPUT_MEMORY_BYTES: usize = 256 * 1024;
/// Default of [`OutputLimits::spill_bytes`].
pub const DEFAULT_OUTPUT_SPILL_BYTES: u64 = 64 << 20;
/// Default of [`OutputLimits::read_bytes`].
pub const DEFAULT_OUTPUT_READ_BYTES: usize = 64 * 1024;
/// Default of [`OutputLimits::memory_total_bytes`].
pub const DEFAULT_OUTPUT_MEMORY_TOTAL_BYTES: usize = 64 << 20;

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            memory_bytes: DEFAULT_OUTPUT_MEMORY_BYTES,
            spill_bytes: DEFAULT_OUTPUT_SPILL_BYTES,
            read_bytes: DEFAULT_OUTPUT_READ_BYTES,
            spill_dir: None,
            memory_total_bytes: DEFAULT_OUTPUT_MEMORY_TOTAL_BYTES,
        }
    }
}

impl OutputLimits {
    /// The defaults with another memory window, file cap and read cap.
    pub fn new(memory_bytes: usize, spill_bytes: u64, read_bytes: usize) -> Self {
        Self { memory_bytes, spill_bytes, read_bytes, ..Self::default() }
    }

    /// With another host-wide bound ([`Self::memory_total_bytes`]).
    pub fn with_memory_total_bytes(mut self, bytes: usize) -> Self {
        self.memory_total_bytes = bytes;
        self
    }

    /// With a directory for the default log files ([`Self::spill_dir`]).
    pub fn with_spill_dir(mut self, dir: Option<std::path::PathBuf>) -> Self {
        self.spill_dir = dir;
        self
    }
}

/// The bytes of output every log of a registry holds in memory: each log
/// adds and takes back what its window's buffer holds.
#[derive(Debug, Default)]
pub(crate) struct MemoryMeter {
    used: AtomicUsize,
}

impl MemoryMeter {
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Where a log's file comes from, and whose it is.
pub(crate) struct FileTarget {
    pub(crate) files: Arc<dyn OutputFiles>,
    pub(crate) owner: Option<SessionId>,
    pub(crate) task: TaskId,
}

/// How far apart a log file's line marks are (see [`LogFile::Open`]).
const LINE_MARK_EVERY: u64 = 256 * 1024;

/// The label a part of the output carries: a read that begins inside a
/// labelled part starts with its label line (`[stderr]`).
pub type SectionLabel = Option<&'static str>;

/// A log's file, once it was needed.
enum LogFile {
    /// Not needed yet (the output fits the window), or not configured.
    None,
    Open {
        file: Box<dyn OutputFile>,
        /// Bytes written: the file holds the log's `[0, len)`.
        len: u64,
        /// Newlines in those bytes.
        newlines: u64,
        /// It stopped growing (its cap or its budget): later output is not in it.
        full: bool,
        /// Where some lines begin, one every [`LINE_MARK_EVERY`] bytes or so:
        /// `(offset, line number)`, so a view of lines far into the file
        /// reads from near them instead of from the start.
        marks: Vec<(u64, u64)>,
    },
    /// Creating or writing it failed once; output beyond memory is lost.
    Failed,
}

/// Where labelled parts of the output begin, as far back as a read may
/// begin (a read begins at or after the later of the cursor and the read
/// cap's reach).
#[derive(Default)]
struct Sections {
    /// The label of the output before the first mark.
    before: SectionLabel,
    /// `(offset, label)`: a part with this label begins at this offset.
    marks: VecDeque<(u64, SectionLabel)>,
}

impl Sections {
    fn current(&self) -> SectionLabel {
        self.marks.back().map_or(self.before, |&(_, label)| label)
    }

    /// Output labelled `label` is appended at `at`.
    fn enter(&mut self, at: u64, label: SectionLabel) {
        if label != self.current() {
            self.marks.push_back((at, label));
        }
    }

    /// Forgets marks no read can begin after any more (before `horizon`).
    fn forget_before(&mut self, horizon: u64) {
        while self.marks.len() > 1 && self.marks[1].0 <= horizon {
            if let Some((_, label)) = self.marks.pop_front() {
                self.before = label;
            }
        }
        if let Some(&(at, label)) = self.marks.front()
            && at < horizon
        {
            self.before = label;
            self.marks.pop_front();
        }
    }

    /// The label line a read beginning at `at` starts with: the label of the
    /// part it begins in, unless it begins where that part (and its own
    /// label line) begins.
    fn label_line_at(&self, at: u64) -> SectionLabel {
        let mut label = self.before;
        for &(start, mark) in &self.marks {
            if start > at {
                break;
            }
            if start == at {
                return None;
            }
            label = mark;
        }
        label
    }
}

/// One task's output (see the module docs).
pub(crate) struct OutputLog {
    limits: Arc<OutputLimits>,
    /// Where its file would come from.
    target: Option<FileTarget>,
    window: String,
    window_start: u64,
    /// Newlines before `window_start`.
    window_start_newlines: u64,
    total: u64,
    newlines: u64,
    /// The consuming read's position, and the newlines before it.
    cursor: u64,
    cursor_newlines: u64,
    file: LogFile,
    /// The line being printed, for patterns (its first [`LINE_LIMIT`] bytes).
    partial_line: String,
    sections: Sections,
    /// The log left memory for good: the window stays empty.
    evicted: bool,
    meter: Arc<MemoryMeter>,
    /// What this log counts in `meter` now.
    metered: usize,
}

impl Drop for OutputLog {
    fn drop(&mut self) {
        self.meter.used.fetch_sub(self.metered, Ordering::AcqRel);
    }
}

impl OutputLog {
    pub(crate) fn new(limits: Arc<OutputLimits>, meter: Arc<MemoryMeter>, target: Option<FileTarget>) -> Self {
        Self {
            limits,
            target,
            window: String::new(),
            window_start: 0,
            window_start_newlines: 0,
            total: 0,
            newlines: 0,
            cursor: 0,
            cursor_newlines: 0,
            file: LogFile::None,
            partial_line: String::new(),
            sections: Sections::default(),
            evicted: false,
            meter,
            metered: 0,
        }
    }

    /// A log of text that exists whole already (a final-output kind's
    /// output), for a view: in memory only, counted nowhere.
    pub(crate) fn of_text(text: &str) -> Self {
        let limits =
            Arc::new(OutputLimits { memory_bytes: text.len().max(1), spill_bytes: 0, ..OutputLimits::default() });
        let mut log = Self::new(limits, Arc::default(), None);
        log.append(text, None, None);
        log
    }

    /// Bytes the task printed so far.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// True once the log left memory for good ([`Self::evict`]).
    pub(crate) fn is_evicted(&self) -> bool {
        self.evicted
    }

    /// Appends output the producer handed out, which belongs to the part
    /// labelled `label`; calls `on_line` with every line it completes (cut to
    /// [`LINE_LIMIT`]) while `on_line` is given.
    pub(crate) fn append(&mut self, fresh: &str, label: SectionLabel, mut on_line: Option<&mut dyn FnMut(&str)>) {
        if fresh.is_empty() {
            return;
        }
        if let Some(on_line) = on_line.as_mut() {
            for piece in fresh.split_inclusive('\n') {
                let (body, ends) = match piece.strip_suffix('\n') {
                    Some(body) => (body, true),
                    None => (piece, false),
                };
                push_capped(&mut self.partial_line, body, LINE_LIMIT);
                if ends {
                    on_line(&self.partial_line);
                    self.partial_line.clear();
                }
            }
        }
        self.sections.enter(self.total, label);
        self.file_append(fresh);
        let fresh_newlines = bytecount(fresh);
        self.total += fresh.len() as u64;
        self.newlines += fresh_newlines;
        if self.evicted {
            self.window_start = self.total;
            self.window_start_newlines = self.newlines;
        } else {
            self.window.push_str(fresh);
            // Compacted only at twice the limit, so a stream costs amortized
            // O(1) per byte instead of a window-sized move per chunk.
            if self.window.len() > 2 * self.limits.memory_bytes {
                let mut cut = self.window.len() - self.limits.memory_bytes;
                while !self.window.is_char_boundary(cut) {
                    cut += 1;
                }
                self.window_start_newlines += bytecount(&self.window[..cut]);
                self.window.drain(..cut);
                self.window_start += cut as u64;
                // One large append must not leave every later window that big.
                if self.window.capacity() > 4 * self.limits.memory_bytes {
                    self.window.shrink_to(2 * self.limits.memory_bytes);
                }
            }
            self.remeter();
        }
        let horizon = self.cursor.max(self.total.saturating_sub(self.limits.read_bytes as u64));
        self.sections.forget_before(horizon);
    }

    /// Counts the window's buffer in the meter.
    fn remeter(&mut self) {
        let now = self.window.capacity();
        if now != self.metered {
            if now > self.metered {
                self.meter.used.fetch_add(now - self.metered, Ordering::AcqRel);
            } else {
                self.meter.used.fetch_sub(self.metered - now, Ordering::AcqRel);
            }
            self.metered = now;
        }
    }

    /// Writes `fresh` to the file, creating it once the output outgrows memory.
    fn file_append(&mut self, fresh: &str) {
        if matches!(self.file, LogFile::None) {
            if self.total + fresh.len() as u64 <= self.limits.memory_bytes as u64 {
                return;
            }
            self.open_file();
        }
        self.write_file(fresh.as_bytes());
    }

    /// Makes the file, with the window's content, while the window still
    /// starts at byte 0 (else the file could not be a prefix of the log).
    /// True when the file exists afterwards.
    fn open_file(&mut self) -> bool {
        if !matches!(self.file, LogFile::None) {
            return matches!(self.file, LogFile::Open { .. });
        }
        let Some(target) = self.target.as_ref().filter(|_| self.limits.spill_bytes > 0 && self.window_start == 0)
        else {
            return false;
        };
        self.file = match target.files.create(target.owner.as_ref(), &target.task) {
            Ok(file) => LogFile::Open { file, len: 0, newlines: 0, full: false, marks: Vec::new() },
            Err(error) => {
                tracing::warn!(task = %target.task, %error, "cannot create the task's output log file; keeping the last output in memory only");
                LogFile::Failed
            }
        };
        let window = std::mem::take(&mut self.window);
        self.write_file(window.as_bytes());
        self.window = window;
        matches!(self.file, LogFile::Open { .. })
    }

    fn write_file(&mut self, bytes: &[u8]) {
        let cap = self.limits.spill_bytes;
        let LogFile::Open { file, len, newlines, full, marks } = &mut self.file else { return };
        if *full || bytes.is_empty() {
            return;
        }
        let want = (bytes.len() as u64).min(cap.saturating_sub(*len));
        let take = file.reserve(want).min(want) as usize;
        if take < bytes.len() {
            *full = true;
        }
        if take == 0 {
            return;
        }
        // Blocking, but into the page cache and bounded by `spill_bytes` per
        // task; a slow disk shows up as a slow read, never as lost order.
        if let Err(error) = std::io::Write::write_all(&mut file.file(), &bytes[..take]) {
            tracing::warn!(path = %file.path().display(), %error, "writing the task's output log file failed; later output is kept in memory only");
            // What was written stays readable (a prefix); nothing more goes in.
            *full = true;
            return;
        }
        let written = &bytes[..take];
        // A mark at the first line start past every LINE_MARK_EVERY bytes.
        loop {
            let next_mark = marks.last().map_or(0, |&(at, _)| at) + LINE_MARK_EVERY;
            let from = next_mark.saturating_sub(*len) as usize;
            let Some(newline) = written.get(from..).and_then(|rest| rest.iter().position(|&b| b == b'\n')) else {
                break;
            };
            let at = from + newline + 1;
            marks.push((*len + at as u64, *newlines + bytecount_bytes(&written[..at]) + 1));
        }
        *len += take as u64;
        *newlines += bytecount_bytes(written);
    }

    /// Where to start reading the file for line `line`: the last mark at or
    /// before it, else the file's start (`(offset, line number)`).
    pub(crate) fn file_start_for(&self, line: u64) -> (u64, u64) {
        match &self.file {
            LogFile::Open { marks, .. } => {
                let at = marks.partition_point(|&(_, number)| number <= line);
                at.checked_sub(1).map_or((0, 1), |i| marks[i])
            }
            _ => (0, 1),
        }
    }

    /// The file and how much of the log it holds, when there is one.
    fn file_part(&self) -> Option<(&dyn OutputFile, u64, u64)> {
        match &self.file {
            LogFile::Open { file, len, newlines, .. } => Some((&**file, *len, *newlines)),
            _ => None,
        }
    }

    /// The file's path while it holds the log's bytes up to `end`.
    fn path_holding(&self, end: u64) -> Option<&std::path::Path> {
        self.file_part().filter(|(_, len, _)| *len >= end).map(|(file, _, _)| file.path())
    }

    /// Frees the window for good: from now on the output lives in the file
    /// only (made now if the window still holds everything). Output not in
    /// the file (past its cap or budget, or with no file) is lost; reads and
    /// views say so. Returns the bytes of memory freed.
    pub(crate) fn evict(&mut self) -> usize {
        if self.evicted {
            return 0;
        }
        self.open_file();
        let lost = self.total - self.file_part().map_or(0, |(_, len, _)| len.min(self.total));
        if lost > 0 {
            tracing::debug!(bytes = lost, "output leaves memory beyond its log file: not kept");
        }
        self.evicted = true;
        self.window = String::new();
        self.window_start = self.total;
        self.window_start_newlines = self.newlines;
        let freed = self.metered;
        self.remeter();
        freed
    }
}

fn bytecount(text: &str) -> u64 {
    bytecount_bytes(text.as_bytes())
}

fn bytecount_bytes(bytes: &[u8]) -> u64 {
    bytecount::count(bytes, b'\n') as u64
}
