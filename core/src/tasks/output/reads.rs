//! The log's reads: the owner's consuming read (which names what it
//! skips), the dashboard's peek, and what both read of the log file.
//!
//! Invariants: a consuming read returns at most `read_bytes` of new output
//! and moves the cursor to the end; what it skips is announced in one line
//! that names the bytes, their lines, the `lines` view that shows them and,
//! when the file holds them, the file (`full output: <path>`); bytes that
//! were kept nowhere are said to be so. Text read from the file is whole
//! characters.

use std::fmt::Write as _;
use std::os::unix::fs::FileExt as _;

use super::{OutputFile, OutputLog, bytecount_bytes};

/// What a consuming read found kept of `[from, total)`.
struct Kept {
    /// Where the text starts.
    start: u64,
    text: String,
    /// Bytes after the text (up to the end) that were not kept anywhere.
    lost_after: u64,
}

impl OutputLog {
    /// Reads `[from, to)` of the file (which holds it), as whole
    /// characters: `(start, text)`, where `start` is `from` moved past a
    /// character's tail, if `from` fell inside one.
    fn read_file(&self, file: &dyn OutputFile, from: u64, to: u64) -> (u64, String) {
        let mut bytes = vec![0u8; to.saturating_sub(from) as usize];
        let mut done = 0;
        while done < bytes.len() {
            match file.file().read_at(&mut bytes[done..], from + done as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => done += n,
            }
        }
        bytes.truncate(done);
        let tail = bytes.iter().take_while(|&&b| b & 0b1100_0000 == 0b1000_0000).count();
        bytes.drain(..tail);
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            // The file was cut inside a character: keep what is whole.
            Err(error) => {
                let whole = error.utf8_error().valid_up_to();
                let mut bytes = error.into_bytes();
                bytes.truncate(whole);
                String::from_utf8(bytes).unwrap_or_default()
            }
        };
        (from + tail as u64, text)
    }

    /// What is kept of `[from, total)`: from the file, then the window. In
    /// memory, a read begins in the window (the read cap is at most the
    /// window), or in the file when it holds the bytes before the window;
    /// else at the window. Out of memory, the file is all there is.
    fn kept_from(&self, from: u64) -> Kept {
        let file_len = self.file_part().map_or(0, |(_, len, _)| len);
        if self.evicted {
            let end = file_len.min(self.total);
            let (start, text) = match self.file_part() {
                Some((file, _, _)) if from < end => self.read_file(file, from, end),
                _ => (from, String::new()),
            };
            return Kept { start, text, lost_after: self.total - from.max(end) };
        }
        let (start, mut text, at) = match self.file_part() {
            Some((file, _, _)) if from < self.window_start && file_len >= self.window_start => {
                let (start, text) = self.read_file(file, from, self.window_start);
                (start, text, self.window_start)
            }
            _ => (from.max(self.window_start), String::new(), from.max(self.window_start)),
        };
        let mut index = ((at - self.window_start) as usize).min(self.window.len());
        while !self.window.is_char_boundary(index) {
            index += 1;
        }
        let start = if text.is_empty() { self.window_start + index as u64 } else { start };
        text.push_str(&self.window[index..]);
        Kept { start, text, lost_after: 0 }
    }

    /// Bytes of `[from, to)` kept neither in the file nor in the window.
    fn not_kept(&self, from: u64, to: u64) -> u64 {
        let overlap = |a: u64, b: u64| b.saturating_sub(a);
        let file_len = self.file_part().map_or(0, |(_, len, _)| len);
        let window = if self.evicted { 0 } else { overlap(from.max(self.window_start), to.min(self.total)) };
        let file = overlap(from, to.min(file_len));
        let both = if self.evicted { 0 } else { overlap(from.max(self.window_start), to.min(file_len)) };
        (to - from).saturating_sub(file + window - both)
    }

    /// Newlines before offset `at`, when they can be counted from what is
    /// kept (`text` is the kept output from `text_start` to the end).
    fn newlines_before(&self, at: u64, text_start: u64, text: &str) -> Option<u64> {
        if at >= self.window_start && !self.evicted {
            let index = ((at - self.window_start) as usize).min(self.window.len());
            return Some(self.window_start_newlines + bytecount_bytes(&self.window.as_bytes()[..index]));
        }
        if at == self.cursor {
            return Some(self.cursor_newlines);
        }
        // The kept text runs from `text_start` to the end of the log: count back.
        let end = text_start + text.len() as u64;
        (end == self.total && at >= text_start)
            .then(|| self.newlines - bytecount_bytes(&text.as_bytes()[(at - text_start) as usize..]))
    }

    /// Moves the consuming cursor to the end, as a read that took
    /// everything would (a log rebuilt from a replica, read that far).
    pub(crate) fn mark_read(&mut self) {
        self.cursor = self.total;
        self.cursor_newlines = self.newlines;
    }

    /// The owner's consuming read: everything since the previous one, at
    /// most `read_bytes` of it (the latest). What it skips, it names: the
    /// bytes, their lines, the `lines` view that shows them and the file
    /// that holds them. A read that begins inside a labelled part starts
    /// with its label line.
    pub(crate) fn take_new(&mut self) -> String {
        let unread = self.total - self.cursor;
        if unread == 0 {
            return String::new();
        }
        let capped_from = self.cursor.max(self.total.saturating_sub(self.limits.read_bytes as u64));
        if capped_from > self.cursor {
            // The read names where the skipped bytes are: the file, made now
            // if the window still holds everything.
            self.open_file();
        }
        let mut kept = self.kept_from(capped_from);
        // A cut read starts at a whole line when one starts in it.
        if kept.start > self.cursor
            && !self.byte_before_is_newline(kept.start)
            && let Some(newline) = kept.text.bytes().position(|b| b == b'\n').filter(|&at| at + 1 < kept.text.len())
        {
            kept.text.drain(..=newline);
            kept.start += newline as u64 + 1;
        }
        let mut out = String::new();
        if kept.start > self.cursor {
            self.skip_note(&mut out, kept.start, &kept.text, kept.lost_after);
        }
        if let Some(label) = self.sections.label_line_at(kept.start).filter(|_| !kept.text.is_empty()) {
            out.push_str(label);
            out.push('\n');
        }
        out.push_str(&kept.text);
        if kept.lost_after > 0 {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            let _ = writeln!(out, "[{} bytes of output were not kept here]", kept.lost_after);
        }
        self.cursor = self.total;
        self.cursor_newlines = self.newlines;
        out
    }

    /// The line announcing the bytes a read skips: from the cursor to
    /// `resume`, where the read resumes (`text` is what it returns from
    /// there, with `lost_after` bytes after it not kept).
    fn skip_note(&self, out: &mut String, resume: u64, text: &str, lost_after: u64) {
        let skipped = resume - self.cursor;
        let lost = self.not_kept(self.cursor, resume);
        let first = self.cursor_newlines + 1;
        let counted = if lost_after == 0 { self.newlines_before(resume, resume, text) } else { None };
        let lines = counted.map(|before| {
            // The skipped bytes end just before `resume`: with the line that
            // ends there, or inside the line the read resumes in.
            let last = if self.byte_before_is_newline(resume) { before } else { before + 1 };
            (first, last.max(first))
        });
        let _ = write!(out, "[{skipped} bytes of output skipped here");
        if let Some((first, last)) = lines {
            let _ = write!(out, " (lines {first}-{last})");
        }
        if lost >= skipped {
            out.push_str("; they were not kept]\n");
            return;
        }
        match lines {
            Some((first, last)) => {
                let _ = write!(out, "; task_output with view \"lines\", from {first}, to {last} shows them");
            }
            None => out.push_str("; task_output with view \"head\", \"all\" or grep shows what is kept"),
        }
        if let Some(path) = self.path_holding(resume) {
            let _ = write!(out, "; your commands can read them in the full output: {}", path.display());
        }
        if lost > 0 {
            let _ = write!(out, "; {lost} of them were not kept");
        }
        out.push_str("]\n");
    }

    /// Whether the byte before `at` is a newline (the read resumes at a
    /// line start).
    fn byte_before_is_newline(&self, at: u64) -> bool {
        let Some(before) = at.checked_sub(1) else { return true };
        if before >= self.window_start && !self.evicted {
            return self.window.as_bytes()[(before - self.window_start) as usize] == b'\n';
        }
        match self.file_part() {
            Some((file, len, _)) if before < len => {
                let mut byte = [0u8];
                file.file().read_at(&mut byte, before).is_ok_and(|n| n == 1 && byte[0] == b'\n')
            }
            _ => false,
        }
    }

    /// The output after byte offset `since` that is kept near the end, at
    /// most `limit` bytes (the latest): `(text, start)`.
    pub(crate) fn since(&self, since: u64, limit: usize) -> (String, u64) {
        let since = if since > self.total { 0 } else { since };
        let from = since.max(self.total.saturating_sub(limit as u64));
        if self.evicted {
            let Some((file, len, _)) = self.file_part() else { return (String::new(), self.total) };
            let from = from.min(len);
            let to = len.min(from + limit as u64);
            let (start, text) = self.read_file(file, from, to);
            return (text, start);
        }
        let from = from.max(self.window_start);
        let mut index = (from - self.window_start) as usize;
        while !self.window.is_char_boundary(index) {
            index += 1;
        }
        (self.window[index..].to_string(), self.window_start + index as u64)
    }
}
