//! How bash output reaches the model: pure text formatting, no host calls.
//!
//! Model: the host hands over raw byte chunks per stream with a `dropped`
//! flag and, once a stream outgrew its memory cap, the path of the spill
//! file holding its full output. [`Utf8Carry`] turns chunks into text without
//! ever splitting a character across two reads; [`format_delta`] renders one
//! read: stdout first, then stderr under a `[stderr]` header, each preceded
//! by the notice that applies.
//!
//! The notices are part of the model-facing contract and must stay verbatim:
//! `[some output was dropped from memory; full output: <path>]` (background
//! deltas) and `[output truncated; full output: <path>]` (foreground).

/// One read of one stream, as the host returned it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chunk {
    pub data: Vec<u8>,
    pub dropped: bool,
    pub spill_path: Option<String>,
    pub closed: bool,
}

/// Which notice a dropped chunk gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Consuming deltas of a background task.
    Background,
    /// The whole output of a foreground call, read once at the end.
    Foreground,
}

/// The notice for output that did not fit in memory.
pub fn notice(mode: Mode, path: &str) -> String {
    match mode {
        Mode::Background => format!("[some output was dropped from memory; full output: {path}]"),
        Mode::Foreground => format!("[output truncated; full output: {path}]"),
    }
}

/// Decodes a byte stream read in chunks: an incomplete UTF-8 sequence at the
/// end of a chunk waits for the next one; invalid bytes become U+FFFD.
#[derive(Debug, Default)]
pub struct Utf8Carry {
    carry: Vec<u8>,
}

impl Utf8Carry {
    /// The text of `data` (after whatever the previous chunk left over).
    /// `lost` discards the leftover: bytes in between were dropped.
    /// `closed` flushes everything: no more bytes will come.
    pub fn decode(&mut self, data: &[u8], lost: bool, closed: bool) -> String {
        if lost {
            self.carry.clear();
        }
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(data);
        if !closed {
            let keep = incomplete_tail(&bytes);
            self.carry = bytes.split_off(bytes.len() - keep);
        }
        match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        }
    }
}

/// How many trailing bytes form the start of a character that is not complete yet.
fn incomplete_tail(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: the lead is further back
        }
        let needed = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1, // ASCII or an invalid lead: nothing to wait for
        };
        return if needed > back { back } else { 0 };
    }
    0
}

/// Renders one read of both streams: stdout first, then stderr. Reads of a
/// background task are concatenated by the host into one log, so a section
/// header is written where the stream changes, across reads: `[stderr]`
/// before stderr text that follows stdout (or starts the output), `[stdout]`
/// before stdout text that follows stderr. `in_stderr` carries which stream
/// the output last showed.
pub fn format_delta(
    mode: Mode,
    stdout: &Chunk,
    stdout_carry: &mut Utf8Carry,
    stderr: &Chunk,
    stderr_carry: &mut Utf8Carry,
    in_stderr: &mut bool,
) -> String {
    let mut text = String::new();
    let mut out = String::new();
    append_stream(&mut out, mode, stdout, stdout_carry);
    if !out.is_empty() {
        if *in_stderr {
            text.push_str("[stdout]\n");
            *in_stderr = false;
        }
        text.push_str(&out);
    }
    let mut err = String::new();
    append_stream(&mut err, mode, stderr, stderr_carry);
    if !err.is_empty() {
        if !*in_stderr {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str("[stderr]\n");
            *in_stderr = true;
        }
        text.push_str(&err);
    }
    text
}

fn append_stream(text: &mut String, mode: Mode, chunk: &Chunk, carry: &mut Utf8Carry) {
    // A foreground read comes once, at the end: a drop there means the
    // stream outgrew memory and only its tail is left, i.e. truncation.
    if chunk.dropped {
        if let Some(path) = &chunk.spill_path {
            text.push_str(&notice(mode, path));
        } else {
            text.push_str(match mode {
                Mode::Background => "[some output was dropped from memory]",
                Mode::Foreground => "[output truncated]",
            });
        }
        text.push('\n');
    }
    text.push_str(&carry.decode(&chunk.data, chunk.dropped, chunk.closed));
}

/// The detail of a terminal status line for an exit code.
pub fn exit_code_detail(code: i32) -> String {
    format!("exit code: {code}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(data: &[u8]) -> Chunk {
        Chunk { data: data.to_vec(), ..Chunk::default() }
    }

    #[test]
    fn characters_are_never_split_across_reads() {
        let text = "héllo wörld ✓ 𝄞 end";
        let bytes = text.as_bytes();
        for size in 1..8 {
            let mut carry = Utf8Carry::default();
            let mut out = String::new();
            let chunks: Vec<&[u8]> = bytes.chunks(size).collect();
            for (i, part) in chunks.iter().enumerate() {
                out.push_str(&carry.decode(part, false, i + 1 == chunks.len()));
            }
            assert_eq!(out, text, "chunk size {size}");
        }
    }

    #[test]
    fn invalid_bytes_are_replaced_not_held_back() {
        let mut carry = Utf8Carry::default();
        assert_eq!(carry.decode(b"a\xffb", false, false), "a\u{fffd}b");
        // An incomplete sequence at the end is flushed when the stream closes.
        assert_eq!(carry.decode(b"c\xe2\x9c", false, false), "c");
        assert_eq!(carry.decode(b"", false, true), "\u{fffd}");
    }

    #[test]
    fn a_header_marks_each_change_of_stream_across_reads() {
        let (mut o, mut e, mut in_err) = (Utf8Carry::default(), Utf8Carry::default(), false);
        let text = format_delta(Mode::Background, &chunk(b"out"), &mut o, &chunk(b"err\n"), &mut e, &mut in_err);
        assert_eq!(text, "out\n[stderr]\nerr\n");
        let text = format_delta(Mode::Background, &chunk(b""), &mut o, &chunk(b""), &mut e, &mut in_err);
        assert_eq!(text, "");
        // Still stderr: the header is not repeated, so concatenated reads read right.
        let text = format_delta(Mode::Background, &chunk(b""), &mut o, &chunk(b"more err\n"), &mut e, &mut in_err);
        assert_eq!(text, "more err\n");
        let text = format_delta(Mode::Background, &chunk(b"out again\n"), &mut o, &chunk(b""), &mut e, &mut in_err);
        assert_eq!(text, "[stdout]\nout again\n");
        let (mut o, mut e, mut in_err) = (Utf8Carry::default(), Utf8Carry::default(), false);
        let text = format_delta(Mode::Background, &chunk(b""), &mut o, &chunk(b"only err"), &mut e, &mut in_err);
        assert_eq!(text, "[stderr]\nonly err");
    }

    #[test]
    fn notices_are_verbatim() {
        let (mut o, mut e) = (Utf8Carry::default(), Utf8Carry::default());
        let dropped =
            Chunk { data: b"tail\n".to_vec(), dropped: true, spill_path: Some("/s/out.log".into()), closed: false };
        let text = format_delta(Mode::Background, &dropped, &mut o, &chunk(b""), &mut e, &mut false);
        assert_eq!(text, "[some output was dropped from memory; full output: /s/out.log]\ntail\n");
        let text = format_delta(Mode::Foreground, &dropped, &mut o, &chunk(b""), &mut e, &mut false);
        assert_eq!(text, "[output truncated; full output: /s/out.log]\ntail\n");
        let err_dropped = Chunk { spill_path: Some("/s/err.log".into()), ..dropped };
        let text = format_delta(Mode::Background, &chunk(b"x\n"), &mut o, &err_dropped, &mut e, &mut false);
        assert_eq!(text, "x\n[stderr]\n[some output was dropped from memory; full output: /s/err.log]\ntail\n");
    }
}
