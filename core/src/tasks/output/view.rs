//! The non-consuming views of a task's output (`task_output` with `view`):
//! what they ask for and how their text is built, line by line.
//!
//! Also the log's side of a view ([`OutputLog::view`]): every kept line in
//! order, from the file then the window; a `lines` view starts reading the
//! file at the line mark nearest before its first line.
//!
//! Invariants: a view's text is at most [`VIEW_LIMIT`] bytes, cut with a
//! line that says how to see the rest; each line of a `tail`, `head` or
//! `all` view (and each line a pattern sees) is at most [`LINE_LIMIT`]
//! bytes; a `lines` view shows lines exactly as printed.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt as _;

use super::OutputLog;

/// Bytes of one line a view shows and a pattern is matched against.
pub const LINE_LIMIT: usize = 4 * 1024;

/// Bytes one view returns at most.
pub const VIEW_LIMIT: usize = 64 * 1024;

/// `lines` of `tail` and `head` when the call gives none, and their cap.
pub const DEFAULT_VIEW_LINES: usize = 40;
pub const MAX_VIEW_LINES: usize = 2_000;

/// A non-consuming view of a task's output (`task_output` `view`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ViewKind {
    /// The last `lines` lines (of the matching ones, with a pattern).
    Tail,
    /// The first `lines` lines.
    Head,
    /// Everything kept, up to [`VIEW_LIMIT`] bytes.
    All,
    /// Lines `from` to `to` (numbered from 1, both included), exactly as
    /// printed, as many as fit in [`VIEW_LIMIT`] bytes: what a read skipped.
    Lines { from: u64, to: u64 },
}

/// What a view asks for.
#[derive(Clone, Debug)]
pub struct ViewRequest {
    pub kind: ViewKind,
    pub lines: usize,
    /// Only lines matching it, each prefixed `<line number>: `.
    pub grep: Option<regex::Regex>,
}

impl ViewRequest {
    /// The longest line this view shows whole.
    pub(crate) fn line_limit(&self) -> usize {
        match self.kind {
            ViewKind::Lines { .. } if self.grep.is_none() => VIEW_LIMIT,
            _ => LINE_LIMIT,
        }
    }
}

/// Builds a view's text line by line.
pub(crate) struct View<'a> {
    request: &'a ViewRequest,
    text: String,
    /// Tail: the last lines seen, with their numbers.
    ring: VecDeque<(u64, String)>,
    shown: usize,
    /// The number of the last line shown.
    last_shown: Option<u64>,
    matched: usize,
    cut: bool,
}

impl<'a> View<'a> {
    pub(crate) fn new(request: &'a ViewRequest) -> Self {
        Self { request, text: String::new(), ring: VecDeque::new(), shown: 0, last_shown: None, matched: 0, cut: false }
    }

    /// The first line this view may show, when it is not the first line.
    pub(crate) fn first_line(&self) -> Option<u64> {
        match self.request.kind {
            ViewKind::Lines { from, .. } => Some(from),
            _ => None,
        }
    }

    /// Output that is not kept lies here (before line `next`).
    pub(crate) fn gap(&mut self, missing: u64, next: u64) {
        let shows = match self.request.kind {
            ViewKind::Tail => false,
            ViewKind::Lines { from, to } => next > from && next <= to.saturating_add(1),
            _ => true,
        };
        if shows {
            self.emit(None, &format!("[{missing} bytes of output were not kept here]"));
        }
    }

    pub(crate) fn line(&mut self, number: u64, line: &str) -> ControlFlow<()> {
        if let ViewKind::Lines { from, to } = self.request.kind {
            if number < from {
                return ControlFlow::Continue(());
            }
            if number > to {
                return ControlFlow::Break(());
            }
        }
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
            ViewKind::All | ViewKind::Lines { .. } => {
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
            let _ = match (self.request.kind, number, self.last_shown) {
                (ViewKind::Lines { .. }, Some(number), Some(_)) => {
                    writeln!(self.text, "[view cut at {VIEW_LIMIT} bytes: continue with view \"lines\" from {number}]")
                }
                (ViewKind::Lines { .. }, Some(number), None) => {
                    // Even its first line does not fit: show what does.
                    let room = VIEW_LIMIT.saturating_sub(self.text.len() + 200);
                    self.text.push_str(cut_at(line, room));
                    writeln!(
                        self.text,
                        "\n[line {number} is {} bytes, longer than a view ({VIEW_LIMIT} bytes): read the rest of it \
                         from the full output file; continue with view \"lines\" from {}]",
                        line.len(),
                        number + 1
                    )
                }
                _ => writeln!(self.text, "[view cut at {VIEW_LIMIT} bytes: ask for fewer lines, or narrow grep]"),
            };
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
        if let Some(number) = number {
            self.shown += 1;
            self.last_shown = Some(number);
        }
    }

    pub(crate) fn finish(mut self) -> String {
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
            return match self.request.kind {
                ViewKind::Lines { from, .. } => format!("(no line {from} yet)"),
                _ => "(no output)".to_string(),
            };
        }
        self.text.truncate(self.text.trim_end_matches('\n').len());
        self.text
    }
}

/// Lines of `text` without their newline; no empty line after a final one.
pub(crate) fn lines_of(text: &str) -> impl Iterator<Item = &str> {
    let text = text.strip_suffix('\n').unwrap_or(text);
    text.split('\n').filter({
        let empty = text.is_empty();
        move |_| !empty
    })
}

/// `line`, cut to at most `limit` bytes (at a character boundary).
pub(crate) fn cut_at(line: &str, limit: usize) -> &str {
    if line.len() <= limit {
        return line;
    }
    let mut end = limit;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

/// Appends `more` to `into`, keeping `into` at most `limit` bytes.
pub(crate) fn push_capped(into: &mut String, more: &str, limit: usize) {
    let room = limit.saturating_sub(into.len());
    into.push_str(cut_at(more, room));
}

/// As [`push_capped`], for bytes (invalid UTF-8 becomes U+FFFD).
pub(crate) fn push_capped_bytes(into: &mut String, more: &[u8], limit: usize) {
    let room = limit.saturating_sub(into.len());
    let more = &more[..more.len().min(room)];
    into.push_str(&String::from_utf8_lossy(more));
}

impl OutputLog {
    /// A view of the whole kept output; never moves the cursor.
    pub(crate) fn view(&self, request: &ViewRequest) -> String {
        let mut view = View::new(request);
        if request.kind == ViewKind::Tail && request.grep.is_none() && self.window_has_tail(request.lines) {
            self.window_lines(request.line_limit(), &mut |number, line| view.line(number, line));
        } else {
            self.each_line(&mut view, request.line_limit());
        }
        view.finish()
    }

    /// Whether the window alone holds the last `lines` whole lines.
    fn window_has_tail(&self, lines: usize) -> bool {
        if self.evicted {
            return false;
        }
        if self.window_start == 0 {
            return true;
        }
        let newlines = (self.newlines - self.window_start_newlines) as usize;
        // The window's first line may be cut; the lines after it are whole.
        newlines > lines
    }

    /// The lines of the window, the first one possibly cut at its start.
    fn window_lines(&self, limit: usize, each: &mut dyn FnMut(u64, &str) -> ControlFlow<()>) {
        for (number, line) in (self.window_start_newlines + 1..).zip(lines_of(&self.window)) {
            if each(number, cut_at(line, limit)).is_break() {
                return;
            }
        }
    }

    /// Every kept line in order: the file's, then the window's after it,
    /// with a gap line where output was not kept. Lines are cut to `limit`.
    fn each_line(&self, view: &mut View, limit: usize) {
        // A range of lines starts reading the file near its first line.
        let (start, first_number) = match view.first_line() {
            Some(line) => self.file_start_for(line),
            None => (0, 1),
        };
        let mut number = first_number;
        let mut covered = 0u64;
        if let Some((file, end, _)) = self.file_part() {
            let mut carry = String::new();
            let mut carry_cut = false;
            let mut buffer = vec![0u8; 1 << 20];
            let mut offset = start;
            while offset < end {
                let want = buffer.len().min((end - offset) as usize);
                let Ok(n) = file.file().read_at(&mut buffer[..want], offset) else { break };
                if n == 0 {
                    break;
                }
                offset += n as u64;
                let mut chunk = &buffer[..n];
                while let Some(at) = chunk.iter().position(|&b| b == b'\n') {
                    let flow = if carry.is_empty() {
                        // The common case: a whole line in this chunk, shown
                        // without a copy when it is valid UTF-8.
                        let line = &chunk[..at.min(limit)];
                        view.line(number, &String::from_utf8_lossy(line))
                    } else {
                        if !carry_cut {
                            push_capped_bytes(&mut carry, &chunk[..at], limit);
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
                    push_capped_bytes(&mut carry, chunk, limit);
                    carry_cut = carry.len() >= limit;
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
                    push_capped_bytes(&mut carry, line_rest, limit);
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
            view.gap(missing, self.window_start_newlines + 1);
            self.window_lines(limit, &mut |n, line| view.line(n, line));
            return;
        }
        let start = (covered - self.window_start) as usize;
        let mut index = start.min(self.window.len());
        while !self.window.is_char_boundary(index) {
            index += 1;
        }
        for line in lines_of(&self.window[index..]) {
            if view.line(number, cut_at(line, limit)).is_break() {
                return;
            }
            number += 1;
        }
    }
}
