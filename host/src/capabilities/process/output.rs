//! Bounded, consuming output buffers with spill files.
//!
//! Model: each stream (stdout, stderr) of a process has one [`StreamBuffer`]
//! shared between its reader task (which appends) and the consumer (which
//! takes everything unread). At most `memory_cap` unread bytes stay in
//! memory: when more arrive, the oldest unread bytes are dropped and the next
//! read says so. Once a stream has produced more than `memory_cap` bytes in
//! total, everything it ever produced goes to a spill file (the first
//! `memory_cap` bytes are kept aside until then), up to `spill_cap` bytes, so
//! the notice can point at a file that holds the full output.
//!
//! Invariants: reads never return a byte twice; bytes are only ever lost from
//! memory together with a `dropped` flag on the next read; the spill file is
//! a prefix of the stream (a marker line is appended when the cap cut it);
//! memory per stream stays below `2 * memory_cap` plus one read chunk.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A spill file, removed from disk when the last holder drops it.
#[derive(Debug)]
pub struct SpillFile {
    path: PathBuf,
}

impl SpillFile {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove spill file");
        }
    }
}

/// What a consuming read of one stream returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamChunk {
    /// Every byte kept in memory since the previous read, in order.
    pub data: Vec<u8>,
    /// Some bytes produced since the previous read were dropped from memory
    /// before this read (they are in the spill file, up to its cap).
    pub dropped: bool,
    /// Set once the stream outgrew its memory cap: the file that holds its
    /// full output (up to the spill cap).
    pub spill_path: Option<PathBuf>,
    /// The stream reached its end and this read returned the last of it.
    pub closed: bool,
}

/// The consumer-visible half of a stream: unread bytes and flags.
#[derive(Debug)]
pub(crate) struct StreamBuffer {
    /// Unread bytes; handed over whole on `take` (no copy).
    pending: Vec<u8>,
    memory_cap: usize,
    dropped: bool,
    total: u64,
    eof: bool,
    spill: Option<Arc<SpillFile>>,
    last_take: Option<Instant>,
}

impl StreamBuffer {
    pub(crate) fn new(memory_cap: usize) -> Self {
        Self { pending: Vec::new(), memory_cap, dropped: false, total: 0, eof: false, spill: None, last_take: None }
    }

    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    pub(crate) fn memory_cap(&self) -> usize {
        self.memory_cap
    }

    /// True when a consumer took from this stream within `window`.
    pub(crate) fn reader_active(&self, window: Duration) -> bool {
        self.last_take.is_some_and(|t| t.elapsed() < window)
    }

    /// Appends bytes the process wrote; drops the oldest unread bytes beyond the cap.
    pub(crate) fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        if data.len() >= self.memory_cap {
            // The chunk alone fills the cap: everything unread before it goes.
            self.dropped |= !self.pending.is_empty() || data.len() > self.memory_cap;
            self.pending.clear();
            self.pending.extend(&data[data.len() - self.memory_cap..]);
            return;
        }
        let overflow = (self.pending.len() + data.len()).saturating_sub(self.memory_cap);
        if overflow > 0 {
            self.pending.drain(..overflow);
            self.dropped = true;
        }
        self.pending.extend(data);
    }

    pub(crate) fn set_spill(&mut self, spill: Arc<SpillFile>) {
        self.spill = Some(spill);
    }

    pub(crate) fn set_eof(&mut self) {
        self.eof = true;
    }

    pub(crate) fn is_eof(&self) -> bool {
        self.eof
    }

    /// True when a read would return something new (bytes or a drop notice).
    pub(crate) fn has_unread(&self) -> bool {
        !self.pending.is_empty() || self.dropped
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    pub(crate) fn spill(&self) -> Option<Arc<SpillFile>> {
        self.spill.clone()
    }

    /// Takes everything unread.
    pub(crate) fn take(&mut self) -> StreamChunk {
        let data = std::mem::take(&mut self.pending);
        self.last_take = Some(Instant::now());
        let dropped = std::mem::take(&mut self.dropped);
        StreamChunk { data, dropped, spill_path: self.spill.as_ref().map(|s| s.path().to_path_buf()), closed: self.eof }
    }
}

/// The writer half of a stream's spill file, owned by its reader task so that
/// file I/O never happens under the buffer's lock.
pub(crate) struct SpillWriter {
    path: PathBuf,
    memory_cap: usize,
    spill_cap: u64,
    /// The stream's first bytes, kept until the stream outgrows the memory
    /// cap (then they open the spill file). `None` once spilled.
    head: Option<Vec<u8>>,
    file: Option<File>,
    written: u64,
    capped: bool,
}

impl SpillWriter {
    pub(crate) fn new(path: PathBuf, memory_cap: usize, spill_cap: u64) -> Self {
        Self { path, memory_cap, spill_cap, head: Some(Vec::new()), file: None, written: 0, capped: false }
    }

    /// Records a chunk. Returns the spill file when this chunk created it.
    pub(crate) fn write(&mut self, data: &[u8]) -> std::io::Result<Option<Arc<SpillFile>>> {
        if let Some(head) = &mut self.head {
            if head.len() + data.len() <= self.memory_cap {
                head.extend_from_slice(data);
                return Ok(None);
            }
            let head = self.head.take().unwrap_or_default();
            let file = std::fs::OpenOptions::new().write(true).create_new(true).mode_private().open(&self.path)?;
            // The guard exists before any write, so even a failed write
            // leaves no file behind once the process is dropped.
            let guard = Arc::new(SpillFile { path: self.path.clone() });
            self.file = Some(file);
            self.append(&head)?;
            self.append(data)?;
            return Ok(Some(guard));
        }
        self.append(data)?;
        Ok(None)
    }

    fn append(&mut self, data: &[u8]) -> std::io::Result<()> {
        if self.capped || data.is_empty() {
            return Ok(());
        }
        let Some(file) = &mut self.file else {
            return Ok(());
        };
        let room = self.spill_cap.saturating_sub(self.written);
        let take = (data.len() as u64).min(room) as usize;
        file.write_all(&data[..take])?;
        self.written += take as u64;
        if take < data.len() {
            self.capped = true;
            writeln!(file, "\n[spill file capped at {} bytes; later output was not saved]", self.spill_cap)?;
        }
        Ok(())
    }
}

/// `OpenOptions` with mode 0600: spill files may hold secrets a command printed.
trait PrivateMode {
    fn mode_private(&mut self) -> &mut Self;
}

impl PrivateMode for std::fs::OpenOptions {
    fn mode_private(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_consuming_and_in_order() {
        let mut b = StreamBuffer::new(10);
        b.push(b"abc");
        b.push(b"de");
        assert_eq!(b.take().data, b"abcde");
        assert_eq!(b.take().data, b"");
        b.push(b"f");
        let chunk = b.take();
        assert_eq!(chunk.data, b"f");
        assert!(!chunk.dropped);
    }

    #[test]
    fn overflow_drops_oldest_and_flags_once() {
        let mut b = StreamBuffer::new(4);
        b.push(b"abc");
        b.push(b"def");
        let chunk = b.take();
        assert_eq!(chunk.data, b"cdef");
        assert!(chunk.dropped);
        b.push(b"g");
        assert!(!b.take().dropped);
        b.push(b"0123456789");
        let chunk = b.take();
        assert_eq!(chunk.data, b"6789");
        assert!(chunk.dropped);
        // Exactly the cap in one chunk, nothing unread before it: no loss.
        b.push(b"wxyz");
        assert!(!b.take().dropped);
    }

    #[test]
    fn spill_file_holds_the_full_prefix_and_is_removed_on_drop() {
        let dir = std::env::temp_dir().join(format!("taskhost-output-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.log");
        let mut w = SpillWriter::new(path.clone(), 4, 8);
        assert!(w.write(b"ab").unwrap().is_none());
        assert!(!path.exists());
        let guard = w.write(b"cde").unwrap().expect("the stream outgrew the memory cap");
        w.write(b"fghij").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("abcdefgh\n[spill file capped at 8 bytes"), "{text:?}");
        drop(guard);
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
