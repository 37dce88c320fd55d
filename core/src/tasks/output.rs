//! The output the host keeps of each stream task: every read, view and peek
//! is served from it.
//!
//! Model: a producer hands each byte of output out once. The registry pulls
//! it into the task's [`OutputLog`] as it appears (on the producer's output
//! signal) and before every read, so the log holds everything the task
//! printed, in order:
//! - a memory window with the last [`OutputLimits::memory_bytes`] bytes (up
//!   to twice that between compactions);
//! - once the output outgrew the window, a spill file (in the registry's
//!   private output directory, mode 0600) with the output from its first
//!   byte, up to [`OutputLimits::spill_bytes`]. Output past both bounds is
//!   not kept, and views say how much is missing.
//!
//! The owner's consuming read ([`OutputLog::take_new`]) moves a cursor; the
//! views ([`OutputLog::view`]) and the dashboard's peek never do.
//!
//! Invariants:
//! - Memory per task is bounded by twice the window plus one carried line
//!   ([`LINE_LIMIT`]); views read the spill file in bounded chunks.
//! - A consuming read returns at most [`OutputLimits::read_bytes`]; what it
//!   skips stays in the log for the views and is announced in the read.
//! - Line numbers count every line the task printed, from 1, whether or not
//!   the line is still kept.
//! - The spill file is removed when the log is dropped (the record left the
//!   registry).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;

/// Bytes of one line a view shows and a pattern is matched against.
pub const LINE_LIMIT: usize = 4 * 1024;

/// Bytes one view returns at most.
pub const VIEW_LIMIT: usize = 64 * 1024;

/// `lines` of `tail` and `head` when the call gives none, and their cap.
pub const DEFAULT_VIEW_LINES: usize = 40;
pub const MAX_VIEW_LINES: usize = 2_000;

/// How much output the host keeps per stream task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputLimits {
    /// The memory window: the last bytes of output, kept in memory.
    pub memory_bytes: usize,
    /// The spill file: output from its first byte, once it outgrew memory.
    /// 0 keeps nothing beyond the window.
    pub spill_bytes: u64,
    /// The most one consuming read returns (the rest is skipped, announced).
    pub read_bytes: usize,
    /// Where spill files go: a private directory (mode 0700) is made in it.
    /// `None` keeps output in memory only.
    pub spill_dir: Option<PathBuf>,
}

/// Default of [`OutputLimits::memory_bytes`].
pub const DEFAULT_OUTPUT_MEMORY_BYTES: usize = 256 * 1024;
/// Default of [`OutputLimits::spill_bytes`].
pub const DEFAULT_OUTPUT_SPILL_BYTES: u64 = 64 << 20;
/// Default of [`OutputLimits::read_bytes`].
pub const DEFAULT_OUTPUT_READ_BYTES: usize = 64 * 1024;

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            memory_bytes: DEFAULT_OUTPUT_MEMORY_BYTES,
            spill_bytes: DEFAULT_OUTPUT_SPILL_BYTES,
            read_bytes: DEFAULT_OUTPUT_READ_BYTES,
            spill_dir: None,
        }
    }
}

/// A non-consuming view of a task's output (`task_output` `view`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewKind {
    /// The last `lines` lines (of the matching ones, with a pattern).
    Tail,
    /// The first `lines` lines.
    Head,
    /// Everything kept, up to [`VIEW_LIMIT`] bytes.
    All,
}

/// What a view asks for.
#[derive(Clone, Debug)]
pub struct ViewRequest {
    pub kind: ViewKind,
    pub lines: usize,
    /// Only lines matching it, each prefixed `<line number>: `.
    pub grep: Option<regex::Regex>,
}

enum Spill {
    /// Not needed yet (the output fits the window), or not configured.
    None,
    File {
        file: File,
        path: PathBuf,
        len: u64,
    },
    /// Creating or writing it failed once; output beyond memory is lost.
    Failed,
}

/// One task's output (see the module docs).
pub(crate) struct OutputLog {
    limits: std::sync::Arc<OutputLimits>,
    /// Where this task's spill file would go.
    spill_path: Option<PathBuf>,
    window: String,
    window_start: u64,
    /// Newlines before `window_start`.
    window_start_newlines: u64,
    total: u64,
    newlines: u64,
    /// The consuming read's position.
    cursor: u64,
    spill: Spill,
    /// The line being printed, for patterns (its first [`LINE_LIMIT`] bytes).
    partial_line: String,
}

impl Drop for OutputLog {
    fn drop(&mut self) {
        if let Spill::File { path, .. } = &self.spill {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl OutputLog {
    pub(crate) fn new(limits: std::sync::Arc<OutputLimits>, spill_path: Option<PathBuf>) -> Self {
        Self {
            limits,
            spill_path,
            window: String::new(),
            window_start: 0,
            window_start_newlines: 0,
            total: 0,
            newlines: 0,
            cursor: 0,
            spill: Spill::None,
            partial_line: String::new(),
        }
    }

    /// Bytes the task printed so far.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Appends output the producer handed out; calls `on_line` with every
    /// line it completes (cut to [`LINE_LIMIT`]) while `on_line` is given.
    pub(crate) fn append(&mut self, fresh: &str, mut on_line: Option<&mut dyn FnMut(&str)>) {
        if fresh.is_empty() {
            return;
        }
        if let Some(on_line) = on_line.as_mut() {
            for piece in fresh.split_inclusive('\n') {
                let (body, ends) = match piece.strip_suffix('\n') {
                    Some(body) => (body, true),
                    None => (piece, false),
                };
                push_capped(&mut self.partial_line, body);
                if ends {
                    on_line(&self.partial_line);
                    self.partial_line.clear();
                }
            }
        }
        self.spill_append(fresh);
        self.total += fresh.len() as u64;
        self.newlines += bytecount(fresh);
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
    }

    /// Writes `fresh` to the spill file, creating it (with the window's
    /// content, which then still starts at byte 0) when the output first
    /// outgrows memory.
    fn spill_append(&mut self, fresh: &str) {
        let limit = self.limits.spill_bytes;
        if matches!(self.spill, Spill::None) {
            let outgrows = self.total + fresh.len() as u64 > self.limits.memory_bytes as u64;
            let Some(path) = self.spill_path.as_ref().filter(|_| outgrows && limit > 0 && self.window_start == 0)
            else {
                return;
            };
            self.spill = match create_private_file(path) {
                Ok(file) => Spill::File { file, path: path.clone(), len: 0 },
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "cannot create the task's output spill file; keeping the last output in memory only");
                    Spill::Failed
                }
            };
            let window = std::mem::take(&mut self.window);
            self.write_spill(window.as_bytes());
            self.window = window;
        }
        self.write_spill(fresh.as_bytes());
    }

    fn write_spill(&mut self, bytes: &[u8]) {
        let limit = self.limits.spill_bytes;
        let Spill::File { file, len, path } = &mut self.spill else { return };
        let room = limit.saturating_sub(*len) as usize;
        let take = bytes.len().min(room);
        if take == 0 {
            return;
        }
        // Blocking, but into the page cache and bounded by `spill_bytes` per
        // task; a slow disk shows up as a slow read, never as lost order.
        if let Err(error) = file.write_all(&bytes[..take]) {
            tracing::warn!(path = %path.display(), %error, "writing the task's output spill file failed; later output is kept in memory only");
            let _ = std::fs::remove_file(&*path);
            self.spill = Spill::Failed;
            return;
        }
        *len += take as u64;
    }

    /// The owner's consuming read: everything since the previous one, at
    /// most `read_bytes` of it (the latest), with a note of what it skipped.
    pub(crate) fn take_new(&mut self) -> String {
        let unread = self.total - self.cursor;
        if unread == 0 {
            return String::new();
        }
        let from = self.cursor.max(self.window_start).max(self.total.saturating_sub(self.limits.read_bytes as u64));
        let mut index = (from - self.window_start) as usize;
        while !self.window.is_char_boundary(index) {
            index += 1;
        }
        // A cut read starts at a whole line when one starts in it.
        let cut = self.window_start + (index as u64) > self.cursor;
        if cut
            && index > 0
            && self.window.as_bytes()[index - 1] != b'\n'
            && let Some(newline) = self.window[index..].find('\n').filter(|&at| index + at + 1 < self.window.len())
        {
            index += newline + 1;
        }
        let skipped = self.window_start + index as u64 - self.cursor;
        self.cursor = self.total;
        let text = &self.window[index..];
        if skipped == 0 {
            return text.to_string();
        }
        format!(
            "[{skipped} bytes of output skipped here; task_output with view \"head\", \"all\" or grep shows what is kept]\n{text}"
        )
    }

    /// The output after byte offset `since` that the window still has, at
    /// most `limit` bytes (the latest): `(text, start)`.
    pub(crate) fn since(&self, since: u64, limit: usize) -> (&str, u64) {
        let since = if since > self.total { 0 } else { since };
        let from = since.max(self.window_start).max(self.total.saturating_sub(limit as u64));
        let mut index = (from - self.window_start) as usize;
        while !self.window.is_char_boundary(index) {
            index += 1;
        }
        (&self.window[index..], self.window_start + index as u64)
    }

    /// A view of the whole kept output; never moves the cursor.
    pub(crate) fn view(&self, request: &ViewRequest) -> String {
        let mut view = View::new(request);
        if request.kind == ViewKind::Tail && request.grep.is_none() && self.window_has_tail(request.lines) {
            self.window_lines(&mut |number, line| view.line(number, line));
        } else {
            self.each_line(&mut view);
        }
        view.finish()
    }

    /// Whether the window alone holds the last `lines` whole lines.
    fn window_has_tail(&self, lines: usize) -> bool {
        if self.window_start == 0 {
            return true;
        }
        let newlines = (self.newlines - self.window_start_newlines) as usize;
        // The window's first line may be cut; the lines after it are whole.
        newlines > lines
    }

    /// The lines of the window, the first one possibly cut at its start.
    fn window_lines(&self, each: &mut dyn FnMut(u64, &str) -> ControlFlow<()>) {
        for (number, line) in (self.window_start_newlines + 1..).zip(lines_of(&self.window)) {
            if each(number, cap_line(line)).is_break() {
                return;
            }
        }
    }

    /// Every kept line in order: the spill file's, then the window's after
    /// it, with a gap line where output was not kept.
    fn each_line(&self, view: &mut View) {
        let mut number = 1u64;
        let mut covered = 0u64;
        if let Spill::File { file, len, .. } = &self.spill {
            let mut carry = String::new();
            let mut carry_cut = false;
            let mut buffer = vec![0u8; 1 << 20];
            let mut offset = 0u64;
            let end = *len;
            'file: while offset < end {
                let want = buffer.len().min((end - offset) as usize);
                let Ok(n) = file.read_at(&mut buffer[..want], offset) else { break };
                if n == 0 {
                    break;
                }
                offset += n as u64;
                let mut chunk = &buffer[..n];
                while let Some(at) = chunk.iter().position(|&b| b == b'\n') {
                    let flow = if carry.is_empty() {
                        // The common case: a whole line in this chunk, shown
                        // without a copy when it is valid UTF-8.
                        let line = &chunk[..at.min(LINE_LIMIT)];
                        view.line(number, &String::from_utf8_lossy(line))
                    } else {
                        if !carry_cut {
                            push_capped_bytes(&mut carry, &chunk[..at]);
                        }
                        view.line(number, &carry)
                    };
                    if flow.is_break() {
                        return;
                    }
                    number += 1;
                    carry.clear();
                    carry_cut = false;
                    chunk = &chunk[at + 1..];
                }
                if !carry_cut {
                    push_capped_bytes(&mut carry, chunk);
                    carry_cut = carry.len() >= LINE_LIMIT;
                }
                if offset >= end {
                    break 'file;
                }
            }
            covered = offset;
            // A line the file ends inside continues in the window (or was cut).
            if !carry.is_empty() && covered < self.window_start {
                if view.line(number, &carry).is_break() {
                    return;
                }
            } else if !carry.is_empty() {
                // The window holds the rest of this line: show it whole there.
                let rest_start = ((covered - self.window_start) as usize).min(self.window.len());
                let rest = &self.window.as_bytes()[rest_start..];
                let line_rest = rest.split(|&b| b == b'\n').next().unwrap_or(&[]);
                if !carry_cut {
                    push_capped_bytes(&mut carry, line_rest);
                }
                if view.line(number, &carry).is_break() {
                    return;
                }
                covered += line_rest.len() as u64 + u64::from(rest.len() > line_rest.len());
                number += 1;
                if covered >= self.total {
                    return;
                }
            }
        }
        if covered < self.window_start {
            let missing = self.window_start - covered;
            view.gap(missing);
            self.window_lines(&mut |n, line| view.line(n, line));
            return;
        }
        let start = (covered - self.window_start) as usize;
        let mut index = start.min(self.window.len());
        while !self.window.is_char_boundary(index) {
            index += 1;
        }
        for line in lines_of(&self.window[index..]) {
            if view.line(number, cap_line(line)).is_break() {
                return;
            }
            number += 1;
        }
    }
}

/// Builds a view's text line by line.
struct View<'a> {
    request: &'a ViewRequest,
    text: String,
    /// Tail: the last lines seen, with their numbers.
    ring: VecDeque<(u64, String)>,
    shown: usize,
    matched: usize,
    cut: bool,
    gap: Option<u64>,
}

impl<'a> View<'a> {
    fn new(request: &'a ViewRequest) -> Self {
        Self { request, text: String::new(), ring: VecDeque::new(), shown: 0, matched: 0, cut: false, gap: None }
    }

    fn gap(&mut self, missing: u64) {
        self.gap = Some(missing);
        if self.request.kind != ViewKind::Tail {
            self.emit(None, &format!("[{missing} bytes of output were not kept here]"));
        }
    }

    fn line(&mut self, number: u64, line: &str) -> ControlFlow<()> {
        if let Some(grep) = &self.request.grep {
            if !grep.is_match(line) {
                return ControlFlow::Continue(());
            }
            self.matched += 1;
        }
        match self.request.kind {
            ViewKind::Tail => {
                self.ring.push_back((number, line.to_string()));
                if self.ring.len() > self.request.lines {
                    self.ring.pop_front();
                }
                ControlFlow::Continue(())
            }
            ViewKind::Head => {
                self.emit(Some(number), line);
                if self.shown >= self.request.lines || self.cut {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            }
            ViewKind::All => {
                self.emit(Some(number), line);
                if self.cut { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
            }
        }
    }

    fn emit(&mut self, number: Option<u64>, line: &str) {
        if self.cut {
            return;
        }
        let numbered = self.request.grep.is_some();
        let extra = line.len() + 24;
        if self.text.len() + extra > VIEW_LIMIT {
            self.cut = true;
            let _ = writeln!(self.text, "[view cut at {VIEW_LIMIT} bytes: ask for fewer lines, or narrow grep]");
            return;
        }
        match number {
            Some(number) if numbered => {
                let _ = writeln!(self.text, "{number}: {line}");
            }
            _ => {
                self.text.push_str(line);
                self.text.push('\n');
            }
        }
        if number.is_some() {
            self.shown += 1;
        }
    }

    fn finish(mut self) -> String {
        if self.request.kind == ViewKind::Tail {
            let ring = std::mem::take(&mut self.ring);
            for (number, line) in ring {
                self.emit(Some(number), &line);
            }
        }
        if self.request.grep.is_some() && self.matched == 0 {
            return "(no matching lines)".to_string();
        }
        if self.text.is_empty() {
            return "(no output)".to_string();
        }
        self.text.truncate(self.text.trim_end_matches('\n').len());
        self.text
    }
}

/// Lines of `text` without their newline; no empty line after a final one.
fn lines_of(text: &str) -> impl Iterator<Item = &str> {
    let text = text.strip_suffix('\n').unwrap_or(text);
    text.split('\n').filter({
        let empty = text.is_empty();
        move |_| !empty
    })
}

fn cap_line(line: &str) -> &str {
    if line.len() <= LINE_LIMIT {
        return line;
    }
    let mut end = LINE_LIMIT;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

fn push_capped(into: &mut String, more: &str) {
    let room = LINE_LIMIT.saturating_sub(into.len());
    into.push_str(cap_line_at(more, room));
}

fn push_capped_bytes(into: &mut String, more: &[u8]) {
    let room = LINE_LIMIT.saturating_sub(into.len());
    let more = &more[..more.len().min(room)];
    into.push_str(&String::from_utf8_lossy(more));
}

fn cap_line_at(line: &str, room: usize) -> &str {
    if line.len() <= room {
        return line;
    }
    let mut end = room;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

fn bytecount(text: &str) -> u64 {
    bytecount::count(text.as_bytes(), b'\n') as u64
}

/// Creates a new file only the server's user can read (0600), refusing to
/// follow or reuse anything already at `path`.
fn create_private_file(path: &std::path::Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new().read(true).append(true).create_new(true).mode(0o600).open(path)
}

/// Creates the registry's private output directory (0700) in `parent`.
pub(crate) fn create_private_dir(parent: &std::path::Path) -> std::io::Result<PathBuf> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn limits(memory: usize, spill: u64, dir: Option<PathBuf>) -> Arc<OutputLimits> {
        Arc::new(OutputLimits { memory_bytes: memory, spill_bytes: spill, read_bytes: 1 << 20, spill_dir: dir })
    }

    fn view(log: &OutputLog, kind: ViewKind, lines: usize, grep: Option<&str>) -> String {
        log.view(&ViewRequest { kind, lines, grep: grep.map(|g| regex::Regex::new(g).unwrap()) })
    }

    fn numbered(from: usize, to: usize) -> String {
        (from..=to).map(|n| format!("line {n}\n")).collect()
    }

    #[test]
    fn views_in_memory_never_move_the_cursor() {
        let mut log = OutputLog::new(limits(1 << 20, 0, None), None);
        log.append(&numbered(1, 100), None);
        assert_eq!(view(&log, ViewKind::Tail, 2, None), "line 99\nline 100");
        assert_eq!(view(&log, ViewKind::Head, 2, None), "line 1\nline 2");
        assert_eq!(
            view(&log, ViewKind::All, 0, Some("^line 5")),
            "5: line 5\n50: line 50\n51: line 51\n52: line 52\n53: line 53\n54: line 54\n55: line 55\n56: line 56\n57: line 57\n58: line 58\n59: line 59"
        );
        assert_eq!(view(&log, ViewKind::Tail, 1, Some("^line 5")), "59: line 59");
        assert_eq!(view(&log, ViewKind::Tail, 3, Some("nothing")), "(no matching lines)");
        assert_eq!(log.take_new(), numbered(1, 100));
        assert_eq!(log.take_new(), "");
        log.append("partial", None);
        assert_eq!(view(&log, ViewKind::Tail, 1, None), "partial");
        assert_eq!(log.take_new(), "partial");
    }

    #[test]
    fn the_spill_file_keeps_what_the_window_lost() {
        let dir = std::env::temp_dir().join(format!("taskhost-output-test-{}", std::process::id()));
        let dir = create_private_dir(&dir).unwrap();
        let path = dir.join("t-1.out");
        {
            let mut log = OutputLog::new(limits(100, 1 << 20, Some(dir.clone())), Some(path.clone()));
            for n in 1..=1000 {
                log.append(&format!("line {n}\n"), None);
            }
            assert!(path.exists());
            assert_eq!(view(&log, ViewKind::Head, 3, None), "line 1\nline 2\nline 3");
            assert_eq!(view(&log, ViewKind::Tail, 2, None), "line 999\nline 1000");
            // More lines than the window holds: read through the file.
            assert_eq!(view(&log, ViewKind::Tail, 30, None).lines().next(), Some("line 971"));
            assert_eq!(view(&log, ViewKind::All, 0, Some("^line 77$")), "77: line 77");
            assert_eq!(view(&log, ViewKind::All, 0, Some("^line 999$")), "999: line 999");
            let read = log.take_new();
            assert!(read.starts_with("["), "{read}");
            assert!(read.ends_with("line 1000\n"));
        }
        assert!(!path.exists(), "the spill file goes with the log");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_a_spill_file_views_name_the_gap_and_number_lines_truly() {
        let mut log = OutputLog::new(limits(64, 0, None), None);
        log.append(&numbered(1, 50), None);
        let all = view(&log, ViewKind::All, 0, Some("line"));
        assert!(all.starts_with("[") && all.contains("not kept"), "{all}");
        assert!(all.ends_with("50: line 50"), "{all}");
        assert_eq!(view(&log, ViewKind::Tail, 1, Some("line")), "50: line 50");
    }

    #[test]
    fn lines_are_reported_to_the_pattern_whole_and_capped() {
        let mut log = OutputLog::new(limits(1 << 20, 0, None), None);
        let mut seen = Vec::new();
        log.append("ab", Some(&mut |line: &str| seen.push(line.to_string())));
        log.append("c\nd\n", Some(&mut |line: &str| seen.push(line.to_string())));
        log.append(&"x".repeat(10_000), Some(&mut |line: &str| seen.push(line.to_string())));
        log.append("\n", Some(&mut |line: &str| seen.push(line.len().to_string())));
        assert_eq!(seen, vec!["abc".to_string(), "d".to_string(), LINE_LIMIT.to_string()]);
    }

    #[test]
    fn a_read_past_its_limit_keeps_the_latest_and_says_so() {
        let mut log = OutputLog::new(
            Arc::new(OutputLimits { memory_bytes: 1 << 20, spill_bytes: 0, read_bytes: 10, spill_dir: None }),
            None,
        );
        log.append("0123456789abcdefghij", None);
        assert_eq!(
            log.take_new(),
            "[10 bytes of output skipped here; task_output with view \"head\", \"all\" or grep shows what is kept]\nabcdefghij"
        );
        assert_eq!(view(&log, ViewKind::All, 0, None), "0123456789abcdefghij");
    }
}
