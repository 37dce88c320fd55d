//! A consuming output buffer for stream kinds.
//!
//! `read-output` must return everything produced since the previous call and
//! never the same output twice. [`OutputBuffer`] holds what was produced and
//! not yet read; [`OutputBuffer::take`] hands it over and leaves it empty.

use core::fmt;

/// Output produced but not yet read by the host.
///
/// Implements [`fmt::Write`], so `writeln!(buffer, "...")` works. Keep it in a
/// `RefCell` inside the task: exports take `&self`.
#[derive(Debug, Default)]
pub struct OutputBuffer {
    pending: String,
}

impl OutputBuffer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `text` as is.
    pub fn push_str(&mut self, text: &str) {
        self.pending.push_str(text);
    }

    /// Appends `line` and a newline.
    pub fn push_line(&mut self, line: &str) {
        self.pending.push_str(line);
        self.pending.push('\n');
    }

    /// Everything appended since the previous `take`, leaving the buffer
    /// empty. This is what `read-output` returns.
    pub fn take(&mut self) -> String {
        core::mem::take(&mut self.pending)
    }

    /// Whether nothing is waiting to be read.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Bytes waiting to be read (for a plugin that caps its memory use).
    pub fn len(&self) -> usize {
        self.pending.len()
    }
}

impl fmt::Write for OutputBuffer {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        self.pending.push_str(text);
        Ok(())
    }
}
