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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The private spill directory of one owner session (mode 0700), with the
/// bytes its spill files hold against the owner's cap. Removed from disk
/// when the last holder (the host's table holds it weakly; each spill file,
/// each store of the owner, and the host while the owner is among its
/// recent ones strongly) drops it.
#[derive(Debug)]
pub struct OwnerSpill {
    dir: PathBuf,
    used: AtomicU64,
    cap: u64,
}

impl OwnerSpill {
    /// Creates `dir` (mode 0700, which must not exist yet).
    pub(crate) fn create(dir: PathBuf, cap: u64) -> std::io::Result<Arc<Self>> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(Arc::new(Self { dir, used: AtomicU64::new(0), cap }))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes the owner's spill files hold now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The bytes its files may hold together.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Creates a new file `<name>.log` here (`<name>-<n>.log` when that
    /// name is taken), mode 0600, opened for reading and appending, never
    /// through a link. Its bytes count against the owner's cap as they are
    /// reserved ([`SpillFile::reserve`]); dropping the returned guard (its
    /// last holder) removes the file and gives them back. The host's task
    /// output logs are made here, so they show where the owner's spill files
    /// do (read-only to the owner's own trees) and share the owner's cap.
    pub fn create_file(self: &Arc<Self>, name: &str) -> std::io::Result<(File, Arc<SpillFile>)> {
        let (file, path) = create_new_file(&self.dir, name, true)?;
        Ok((file, Arc::new(SpillFile { path, bytes: AtomicU64::new(0), owner: self.clone() })))
    }

    /// Takes up to `want` bytes of the owner's cap; returns how many.
    fn reserve(&self, want: u64) -> u64 {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let take = want.min(self.cap.saturating_sub(used));
            match self.used.compare_exchange_weak(used, used + take, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return take,
                Err(now) => used = now,
            }
        }
    }
}

impl Drop for OwnerSpill {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not remove an owner's spill directory");
        }
    }
}

/// A spill file, removed from disk when the last holder drops it (and its
/// bytes then given back to its owner's cap).
#[derive(Debug)]
pub struct SpillFile {
    path: PathBuf,
    bytes: AtomicU64,
    owner: Arc<OwnerSpill>,
}

impl SpillFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of output the file holds (or is about to: reserved before each
    /// write); a note that the file was capped comes after them.
    pub(crate) fn output_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// Takes up to `want` bytes of its owner's cap for this file (they go
    /// back when the file is dropped); returns how many. Write no more.
    pub fn reserve(&self, want: u64) -> u64 {
        let take = self.owner.reserve(want);
        self.bytes.fetch_add(take, Ordering::AcqRel);
        take
    }
}

/// Creates `<dir>/<name>.log` (or `<name>-<n>.log` when a name is taken by
/// anything else): mode 0600, never through a link, never an existing file;
/// for writing, or with `read_append` for reading and appending.
fn create_new_file(dir: &Path, name: &str, read_append: bool) -> std::io::Result<(File, PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    for attempt in 0..100u32 {
        let file_name = if attempt == 0 { format!("{name}.log") } else { format!("{name}-{attempt}.log") };
        let path = dir.join(file_name);
        let mut options = std::fs::OpenOptions::new();
        if read_append {
            options.read(true).append(true);
        } else {
            options.write(true);
        }
        match options.create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&path) {
            Ok(file) => return Ok((file, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!("no free file name in {}", dir.display())))
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove spill file");
        }
        self.owner.used.fetch_sub(self.bytes.load(Ordering::Acquire), Ordering::AcqRel);
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
    /// `total` at the last take: where the bytes not taken yet begin.
    taken_to: u64,
}

impl StreamBuffer {
    pub(crate) fn new(memory_cap: usize) -> Self {
        Self {
            pending: Vec::new(),
            memory_cap,
            dropped: false,
            total: 0,
            eof: false,
            spill: None,
            last_take: None,
            taken_to: 0,
        }
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

    /// Counts bytes that went elsewhere (forwarded output).
    pub(crate) fn count(&mut self, bytes: usize) {
        self.total += bytes as u64;
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

    /// The bytes dropped from memory since the last take, as offsets into
    /// the stream (which are its spill file's: the file holds the stream
    /// from its first byte, up to the spill cap); `None` when none were.
    pub(crate) fn dropped_range(&self) -> Option<std::ops::Range<u64>> {
        self.dropped.then(|| self.taken_to..self.total - self.pending.len() as u64)
    }

    /// Takes everything unread.
    pub(crate) fn take(&mut self) -> StreamChunk {
        self.taken_to = self.total;
        let data = std::mem::take(&mut self.pending);
        self.last_take = Some(Instant::now());
        let dropped = std::mem::take(&mut self.dropped);
        StreamChunk { data, dropped, spill_path: self.spill.as_ref().map(|s| s.path().to_path_buf()), closed: self.eof }
    }
}

/// The writer half of a stream's spill file, owned by its reader task so that
/// file I/O never happens under the buffer's lock.
pub(crate) struct SpillWriter {
    owner: Arc<OwnerSpill>,
    name: String,
    memory_cap: usize,
    spill_cap: u64,
    /// The stream's first bytes, kept until the stream outgrows the memory
    /// cap (then they open the spill file). `None` once spilled.
    head: Option<Vec<u8>>,
    file: Option<(File, Arc<SpillFile>)>,
    written: u64,
    capped: bool,
}

impl SpillWriter {
    /// A writer that will create `<owner dir>/<name>` when the stream
    /// outgrows `memory_cap`.
    pub(crate) fn new(owner: Arc<OwnerSpill>, name: String, memory_cap: usize, spill_cap: u64) -> Self {
        Self { owner, name, memory_cap, spill_cap, head: Some(Vec::new()), file: None, written: 0, capped: false }
    }

    /// Records a chunk. Returns the spill file when this chunk created it.
    pub(crate) fn write(&mut self, data: &[u8]) -> std::io::Result<Option<Arc<SpillFile>>> {
        if let Some(head) = &mut self.head {
            if head.len() + data.len() <= self.memory_cap {
                head.extend_from_slice(data);
                return Ok(None);
            }
            let head = self.head.take().unwrap_or_default();
            let (file, path) = self.create()?;
            // The guard exists before any write, so even a failed write
            // leaves no file behind once the process is dropped.
            let guard = Arc::new(SpillFile { path, bytes: AtomicU64::new(0), owner: self.owner.clone() });
            self.file = Some((file, guard.clone()));
            self.append(&head)?;
            self.append(data)?;
            return Ok(Some(guard));
        }
        self.append(data)?;
        Ok(None)
    }

    /// Creates the file: never through a link, never an existing name (a
    /// name taken by anything else gets a suffix instead of failing).
    fn create(&self) -> std::io::Result<(File, PathBuf)> {
        create_new_file(&self.owner.dir, &self.name, false)
    }

    fn append(&mut self, data: &[u8]) -> std::io::Result<()> {
        if self.capped || data.is_empty() {
            return Ok(());
        }
        let Some((file, guard)) = &mut self.file else {
            return Ok(());
        };
        let room = self.spill_cap.saturating_sub(self.written);
        let want = (data.len() as u64).min(room);
        let take = guard.reserve(want) as usize;
        file.write_all(&data[..take])?;
        self.written += take as u64;
        if take < data.len() {
            self.capped = true;
            if (take as u64) < want {
                writeln!(
                    file,
                    "\n[spill file cut: this session's spill files hold {} bytes, its cap; later output was not saved]",
                    self.owner.cap
                )?;
            } else {
                writeln!(file, "\n[spill file capped at {} bytes; later output was not saved]", self.spill_cap)?;
            }
        }
        Ok(())
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
        let _ = std::fs::remove_dir_all(&dir);
        let owner = OwnerSpill::create(dir.clone(), 1 << 20).unwrap();
        let path = dir.join("s.log");
        let mut w = SpillWriter::new(owner.clone(), "s".into(), 4, 8);
        assert!(w.write(b"ab").unwrap().is_none());
        assert!(!path.exists());
        let guard = w.write(b"cde").unwrap().expect("the stream outgrew the memory cap");
        w.write(b"fghij").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("abcdefgh\n[spill file capped at 8 bytes"), "{text:?}");
        assert_eq!(owner.used(), 8);
        drop((guard, w));
        assert!(!path.exists());
        assert_eq!(owner.used(), 0, "the bytes go back to the owner's cap");
        drop(owner);
        assert!(!dir.exists(), "the owner's directory goes with its last holder");
    }

    /// The host's task logs: files of the owner's directory, readable and
    /// appendable, charged to the owner's cap as they reserve, removed (and
    /// the bytes given back) with their last holder.
    #[test]
    fn files_made_for_the_host_share_the_owner_cap() {
        use std::io::Read;
        let dir = std::env::temp_dir().join(format!("taskhost-output-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let owner = OwnerSpill::create(dir.clone(), 10).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("task-bash-1.log")).unwrap();
        let (mut file, guard) = owner.create_file("task-bash-1").unwrap();
        assert_eq!(guard.path(), dir.join("task-bash-1-1.log"), "never through a planted link");
        assert_eq!(guard.reserve(6), 6);
        file.write_all(b"123456").unwrap();
        let mut read = String::new();
        std::fs::File::open(guard.path()).unwrap().read_to_string(&mut read).unwrap();
        assert_eq!(read, "123456");
        let (_other, other) = owner.create_file("task-bash-2").unwrap();
        assert_eq!(other.reserve(6), 4, "the owner's cap is shared: 10 bytes in all");
        assert_eq!(owner.used(), 10);
        let path = guard.path().to_path_buf();
        drop((file, guard));
        assert!(!path.exists());
        assert_eq!(owner.used(), 4, "its bytes went back");
        drop((other, owner));
        assert!(!dir.exists());
    }

    #[test]
    fn planted_names_and_links_cannot_take_output_and_the_owner_cap_holds() {
        let dir = std::env::temp_dir().join(format!("taskhost-output-plant-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let owner = OwnerSpill::create(dir.clone(), 10).unwrap();
        // Planted: a file and a symlink under the names the writers want.
        std::fs::write(dir.join("a.log"), "planted").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("b.log")).unwrap();
        let mut a = SpillWriter::new(owner.clone(), "a".into(), 2, 100);
        let mut b = SpillWriter::new(owner.clone(), "b".into(), 2, 100);
        let fa = a.write(b"123456").unwrap().unwrap();
        let fb = b.write(b"abcdefgh").unwrap().unwrap();
        assert_eq!(fa.path(), dir.join("a-1.log"));
        assert_eq!(fb.path(), dir.join("b-1.log"));
        assert_eq!(std::fs::read_to_string(dir.join("a.log")).unwrap(), "planted");
        assert_eq!(std::fs::read_to_string(fa.path()).unwrap(), "123456");
        // 6 + 8 > 10: the second stream is cut at the owner's cap, and says so.
        let text = std::fs::read_to_string(fb.path()).unwrap();
        assert!(text.starts_with("abcd\n[spill file cut: this session's spill files hold 10 bytes"), "{text:?}");
        assert_eq!(owner.used(), 10);
        drop((fa, fb, a, b, owner));
        assert!(!dir.exists());
    }
}
