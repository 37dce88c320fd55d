//! Output forwarded to the host: a process whose output *is* its task's
//! output hands both streams to the task's [`OutputSink`] as they arrive,
//! instead of keeping them for consuming reads.
//!
//! Model: an [`OutputSink`] is one task's formatted text on its way to the
//! host's output log: appended by the task's forwarded processes (their
//! reader tasks, through a [`Forwarding`]) and by the host itself (text the
//! task's plugin returned), taken whole by the host's drain, which the sink
//! wakes through the signal it was given. The sink also records where the
//! text changes stream (as data: [`StreamSections`]), so the host's log
//! knows which stream any later read begins in. A [`Forwarding`] is one process's
//! formatter: it decodes each stream as UTF-8 (a character split across two
//! reads waits for its end; invalid bytes become U+FFFD) and writes a
//! `[stderr]` line where the output changes to stderr and a `[stdout]` line
//! where it changes back (after a line break, when the change falls
//! mid-line), so the concatenated text reads right.
//!
//! Invariants:
//! - Text is appended in the order it was read: a stream's reader formats
//!   and appends under its stream buffer's lock and the formatter's lock,
//!   and [`crate::Process::forward_output`] moves what was unread before it
//!   under the same locks, so nothing forwarded overtakes earlier output.
//! - Across the two streams, stdout a program wrote before writing to
//!   stderr comes first: whichever reader wakes empties stdout's pipe
//!   before reading stderr's (see `handle::forward_step`), so a `[stderr]`
//!   line never jumps ahead of stdout written before it.
//! - Bounded: a reader waits (and so the program blocks on its next write)
//!   while [`OutputSink::len`] is at the sink's limit, until the host takes
//!   the text; the wait ends when the tree is gone, as every read does. The
//!   host's own appends never wait (they are bounded where they are made).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::Notify;

use crate::Stream;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data behind these locks: a panic elsewhere leaves it usable.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One task's output on its way to the host's log.
pub struct OutputSink {
    text: Mutex<Pending>,
    /// The buffer [`take_with`](Self::take_with) lends out and gets back
    /// cleared: taking costs no allocation once the two have grown.
    spare: Mutex<String>,
    /// Bytes of text at which forwarded readers wait for a take.
    limit: usize,
    /// Woken by every take.
    taken: Notify,
    /// Raised after every append (the host's drain); set once.
    signal: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// A process of the task forwards its output here: every new output
    /// raises the signal, so the host may take the text without asking the
    /// task for a read.
    forwarding: AtomicBool,
    /// The task ended: no buffer is kept for the next take (a finished
    /// task's record may stay for long, and thousands of them with it).
    released: AtomicBool,
    /// The mark of the text the last take took (see [`Self::taken_mark`]).
    taken_mark: Mutex<Option<Arc<str>>>,
}

/// The text waiting in a sink, and where in it the output changes stream.
#[derive(Default)]
struct Pending {
    text: String,
    /// Where a section of one stream begins in `text` (at its header line):
    /// the byte offset and the stream.
    switches: Vec<(usize, Stream)>,
    /// The stream `text` begins in.
    starts_in: Stream,
    /// Where the source of the text appended last stood (a durable tree's
    /// [`crate::durable_follow::TreeCursor`]), taken with the text.
    mark: Option<Arc<str>>,
}

impl Pending {
    /// The stream the text ends in (where the next text continues).
    fn ends_in(&self) -> Stream {
        self.switches.last().map_or(self.starts_in, |&(_, stream)| stream)
    }
}

/// Which stream each part of taken text belongs to: it begins in
/// `starts_in`, and a section of `stream` begins at each `(offset, stream)`
/// (where its header line is).
#[derive(Clone, Copy, Debug)]
pub struct StreamSections<'a> {
    pub starts_in: Stream,
    pub switches: &'a [(usize, Stream)],
}

impl StreamSections<'_> {
    /// Splits `text` (the text these sections describe) into its parts, in
    /// order: each with the stream it belongs to.
    pub fn parts<'t>(&self, text: &'t str) -> impl Iterator<Item = (&'t str, Stream)> + use<'t, '_> {
        let starts = std::iter::once((0, self.starts_in)).chain(self.switches.iter().copied());
        let ends = self.switches.iter().map(|&(at, _)| at).chain(std::iter::once(text.len()));
        starts.zip(ends).filter(|((from, _), to)| from < to).map(|((from, stream), to)| (&text[from..to], stream))
    }
}

impl std::fmt::Debug for OutputSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputSink").field("len", &self.len()).field("limit", &self.limit).finish()
    }
}

impl OutputSink {
    /// A sink whose forwarded readers wait once `limit` bytes are waiting.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            text: Mutex::new(Pending::default()),
            spare: Mutex::new(String::new()),
            limit: limit.max(1),
            taken: Notify::new(),
            signal: OnceLock::new(),
            forwarding: AtomicBool::new(false),
            released: AtomicBool::new(false),
            taken_mark: Mutex::new(None),
        })
    }

    /// Appends `text` and raises the signal. Never waits.
    pub fn append(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        lock(&self.text).text.push_str(text);
        self.raise();
    }

    /// Takes everything waiting, and lets waiting readers go on.
    pub fn take(&self) -> String {
        let text = {
            let mut pending = lock(&self.text);
            pending.starts_in = pending.ends_in();
            pending.switches.clear();
            *lock(&self.taken_mark) = pending.mark.clone();
            std::mem::take(&mut pending.text)
        };
        self.taken.notify_waiters();
        text
    }

    /// Takes everything waiting and lends it to `f` (without holding the
    /// sink: appends go on meanwhile), then keeps the buffer for the next
    /// take. Lets waiting readers go on.
    pub fn take_with<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        self.take_sections_with(|text, _| f(text))
    }

    /// As [`take_with`](Self::take_with), lending also which stream each
    /// part of the text belongs to (see [`StreamSections::parts`]).
    pub fn take_sections_with<R>(&self, f: impl FnOnce(&str, StreamSections<'_>) -> R) -> R {
        let mut lent = std::mem::take(&mut *lock(&self.spare));
        let (starts_in, switches) = {
            let mut pending = lock(&self.text);
            std::mem::swap(&mut lent, &mut pending.text);
            let starts_in = pending.starts_in;
            pending.starts_in = pending.ends_in();
            *lock(&self.taken_mark) = pending.mark.clone();
            (starts_in, std::mem::take(&mut pending.switches))
        };
        self.taken.notify_waiters();
        let result = f(&lent, StreamSections { starts_in, switches: &switches });
        if !self.released.load(Ordering::Acquire) {
            lent.clear();
            *lock(&self.spare) = lent;
        }
        result
    }

    /// Frees the buffers' memory, now and after every later take (the task
    /// ended: what is left is taken once more, at most).
    pub fn release(&self) {
        self.released.store(true, Ordering::Release);
        *lock(&self.spare) = String::new();
        let mut pending = lock(&self.text);
        pending.text.shrink_to_fit();
        pending.switches.shrink_to_fit();
    }

    /// Where the source stood after the text taken last (everything taken
    /// so far came from before it): set by a durable tree's follower, so a
    /// later server resumes the tree's output right after what was taken.
    pub fn taken_mark(&self) -> Option<Arc<str>> {
        lock(&self.taken_mark).clone()
    }

    /// Bytes waiting to be taken.
    pub fn len(&self) -> usize {
        lock(&self.text).text.len()
    }

    /// True when nothing waits to be taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once a process forwards its output here.
    pub fn is_forwarding(&self) -> bool {
        self.forwarding.load(Ordering::Acquire)
    }

    /// Sets the signal raised after every append (once; later calls do
    /// nothing), and raises it at once when text is already waiting.
    pub fn set_signal(&self, signal: Box<dyn Fn() + Send + Sync>) {
        if self.signal.set(signal).is_ok() && !self.is_empty() {
            self.raise();
        }
    }

    fn raise(&self) {
        if let Some(signal) = self.signal.get() {
            signal();
        }
    }

    /// True when `limit` bytes or more wait.
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.limit
    }

    /// Returns once fewer than `limit` bytes wait.
    pub(crate) async fn room(&self) {
        loop {
            let taken = self.taken.notified();
            tokio::pin!(taken);
            taken.as_mut().enable();
            if !self.is_full() {
                return;
            }
            taken.await;
        }
    }
}

/// One forwarded process: where its output goes and how far it got.
pub(crate) struct Forwarding {
    pub(crate) sink: Arc<OutputSink>,
    format: Mutex<Format>,
    /// Held by a forwarding reader across its reads of both pipes.
    pub(crate) order: Mutex<()>,
}

#[derive(Default)]
struct Format {
    /// The output last showed stderr.
    in_stderr: bool,
    /// The text forwarded so far does not end with a line break.
    mid_line: bool,
    /// The start of a character split by a read: stdout's, stderr's.
    carry: [Vec<u8>; 2],
}

impl Forwarding {
    pub(crate) fn new(sink: Arc<OutputSink>) -> Self {
        sink.forwarding.store(true, Ordering::Release);
        Self { sink, format: Mutex::new(Format::default()), order: Mutex::new(()) }
    }

    /// Formats `data` read from stdout (or with `to_stderr`, stderr) and
    /// appends it to the sink. `closed`: the stream ended, so a split
    /// character left over is flushed (as U+FFFD).
    pub(crate) fn push(&self, to_stderr: bool, data: &[u8], closed: bool) {
        self.push_marked(to_stderr, data, closed, None);
    }

    /// Starts from a state a mark reported (no carried bytes).
    pub(crate) fn resume(&self, in_stderr: bool, mid_line: bool) {
        let mut format = lock(&self.format);
        format.in_stderr = in_stderr;
        format.mid_line = mid_line;
    }

    /// As [`Self::push`]; `mark` (given the state after the push) is set as
    /// the sink's mark together with the text (see [`OutputSink::taken_mark`]).
    pub(crate) fn push_marked(
        &self,
        to_stderr: bool,
        data: &[u8],
        closed: bool,
        mark: Option<&dyn Fn(bool, bool, [usize; 2]) -> String>,
    ) {
        let mut format = lock(&self.format);
        let format = &mut *format;
        let index = usize::from(to_stderr);
        let carried;
        let bytes: &[u8] = if format.carry[index].is_empty() {
            data
        } else {
            let mut joined = std::mem::take(&mut format.carry[index]);
            joined.extend_from_slice(data);
            carried = joined;
            &carried
        };
        let keep = if closed { 0 } else { incomplete_tail(bytes) };
        let (complete, tail) = bytes.split_at(bytes.len() - keep);
        format.carry[index] = tail.to_vec();
        if complete.is_empty() {
            if let Some(mark) = mark {
                let carry = [format.carry[0].len(), format.carry[1].len()];
                lock(&self.sink.text).mark = Some(mark(format.in_stderr, format.mid_line, carry).into());
            }
            return;
        }
        // The strict check first: it is several times faster than the
        // lossy decoder on valid text (measured: the lossy one alone was 30 %
        // of a forwarded stream's profile), which is what output almost
        // always is.
        let decoded = match std::str::from_utf8(complete) {
            Ok(text) => std::borrow::Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(complete),
        };
        {
            let mut pending = lock(&self.sink.text);
            if to_stderr != format.in_stderr {
                if format.mid_line {
                    pending.text.push('\n');
                }
                let stream = if to_stderr { Stream::Stderr } else { Stream::Stdout };
                let at = pending.text.len();
                pending.switches.push((at, stream));
                pending.text.push_str(if to_stderr { "[stderr]\n" } else { "[stdout]\n" });
                format.in_stderr = to_stderr;
            }
            pending.text.push_str(&decoded);
            format.mid_line = !decoded.ends_with('\n');
            if let Some(mark) = mark {
                let carry = [format.carry[0].len(), format.carry[1].len()];
                pending.mark = Some(mark(format.in_stderr, format.mid_line, carry).into());
            }
        }
        self.sink.raise();
    }
}

/// How many trailing bytes are the start of a character not complete yet
/// (0 to 3): the bytes std's UTF-8 check reports as an unexpected end
/// ([`std::str::Utf8Error::error_len`] is `None`). Only the last four bytes
/// are looked at: an unfinished character has at most three, and invalid
/// bytes before it (a continuation cut off from its lead) are skipped.
fn incomplete_tail(bytes: &[u8]) -> usize {
    let mut rest = &bytes[bytes.len().saturating_sub(4)..];
    loop {
        match std::str::from_utf8(rest) {
            Ok(_) => return 0,
            Err(error) => match error.error_len() {
                None => return rest.len() - error.valid_up_to(),
                Some(invalid) => rest = &rest[error.valid_up_to() + invalid..],
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unfinished_character_is_held_back_and_nothing_else() {
        let check = "✓".as_bytes(); // three bytes
        let emoji = "🦀".as_bytes(); // four bytes
        assert_eq!(incomplete_tail(b""), 0);
        assert_eq!(incomplete_tail(b"plain"), 0);
        assert_eq!(incomplete_tail(&[b"a ", &check[..1]].concat()), 1);
        assert_eq!(incomplete_tail(&[b"a ", &check[..2]].concat()), 2);
        assert_eq!(incomplete_tail(&[b"a ", check].concat()), 0);
        assert_eq!(incomplete_tail(&[b"ab", &emoji[..3]].concat()), 3);
        assert_eq!(incomplete_tail(emoji), 0);
        // Invalid bytes are not waited for: an overlong lead, a stray
        // continuation, a lead whose next byte cannot follow it.
        assert_eq!(incomplete_tail(b"x\xC0"), 0);
        assert_eq!(incomplete_tail(b"x\x80"), 0);
        assert_eq!(incomplete_tail(b"x\xE0\x41"), 0);
        // A cut-off continuation before an unfinished character.
        assert_eq!(incomplete_tail(&[&emoji[1..], &check[..2]].concat()), 2);
    }

    #[test]
    fn streams_interleave_under_headers_and_characters_are_never_split() {
        let sink = OutputSink::new(1 << 20);
        let forwarding = Forwarding::new(sink.clone());
        assert!(sink.is_forwarding());
        forwarding.push(false, "out é".as_bytes(), false);
        // A character split between two reads waits for its end.
        let check = "✓".as_bytes();
        forwarding.push(false, &check[..1], false);
        assert_eq!(sink.take(), "out é");
        forwarding.push(false, &check[1..], false);
        forwarding.push(true, b"err\n", false);
        forwarding.push(true, b"more err\n", false);
        forwarding.push(false, b"back\n", false);
        forwarding.push(true, b"again", false);
        let parts = sink.take_sections_with(|text, sections| {
            sections.parts(text).map(|(part, stream)| (part.to_string(), stream)).collect::<Vec<_>>()
        });
        assert_eq!(
            parts,
            [
                ("✓\n".to_string(), Stream::Stdout),
                ("[stderr]\nerr\nmore err\n".to_string(), Stream::Stderr),
                ("[stdout]\nback\n".to_string(), Stream::Stdout),
                ("[stderr]\nagain".to_string(), Stream::Stderr),
            ],
            "each part with its stream, as data"
        );
        // The next take begins where the last one ended: in stderr.
        forwarding.push(true, b" more\n", false);
        sink.take_sections_with(|text, sections| {
            assert_eq!(sections.parts(text).collect::<Vec<_>>(), [(" more\n", Stream::Stderr)]);
        });
        forwarding.push(false, b"out\n", false);
        assert_eq!(sink.take(), "[stdout]\nout\n");
        // Invalid bytes become U+FFFD; a split character at the end is flushed.
        forwarding.push(false, b"a\xffb\xe2\x9c", false);
        forwarding.push(false, b"", true);
        assert_eq!(sink.take(), "a\u{fffd}b\u{fffd}");
        // Output that starts on stderr starts with the header.
        let sink = OutputSink::new(1 << 20);
        Forwarding::new(sink.clone()).push(true, b"only err", false);
        assert_eq!(sink.take(), "[stderr]\nonly err");
    }

    #[test]
    fn the_signal_is_raised_on_every_append_and_once_when_set_late() {
        let sink = OutputSink::new(8);
        sink.append("early");
        let raised = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = raised.clone();
        sink.set_signal(Box::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(raised.load(Ordering::SeqCst), 1, "text was waiting: raised at once");
        sink.append("");
        assert_eq!(raised.load(Ordering::SeqCst), 1, "nothing appended: not raised");
        sink.append("x");
        assert_eq!(raised.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_full_sink_holds_its_readers_until_the_host_takes() {
        let sink = OutputSink::new(4);
        sink.append("12345");
        let waiting = tokio::spawn({
            let sink = sink.clone();
            async move { sink.room().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the sink is at its limit");
        assert_eq!(sink.take(), "12345");
        waiting.await.unwrap();
        sink.room().await; // room now: returns at once
    }
}
