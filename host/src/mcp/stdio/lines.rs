//! The stdio connection's lines: the one writer of everything sent to the
//! client ([`pump_outbound`]) and the bounded reader of what it sends
//! ([`read_bounded_line`]).
//!
//! Invariants: a line is written whole and flushed when nothing else waits
//! (a burst costs one flush); a line read never buffers more than its
//! limit, and a longer one is skipped up to its end and reported with its
//! length.

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Outbound;

pub(super) async fn pump_outbound<W>(mut queued: mpsc::Receiver<Outbound>, mut writer: W, closing: CancellationToken)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    loop {
        let outbound = tokio::select! {
            outbound = queued.recv() => outbound,
            // The connection is over: write what is queued, then stop.
            _ = closing.cancelled() => queued.try_recv().ok(),
        };
        let Some(Outbound { line, then_open }) = outbound else { break };
        if writer.write_all(&line).await.is_err() {
            break;
        }
        // Flush when nothing else waits, so a burst costs one flush; a line
        // that opens the load gate is flushed at once, then opens it.
        if (queued.is_empty() || then_open.is_some()) && writer.flush().await.is_err() {
            break;
        }
        if let Some(gate) = then_open {
            gate.open();
        }
    }
    let _ = writer.flush().await;
}

pub(super) enum LineRead {
    Line,
    Eof,
    /// The line was longer than the limit and was skipped up to its end.
    Oversized(usize),
}

/// Reads one `\n`-terminated line into `line`, never buffering more than
/// `limit` bytes of it. A final unterminated line counts as a line.
pub(super) async fn read_bounded_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
    limit: usize,
) -> std::io::Result<LineRead> {
    let mut length = 0usize;
    let mut oversized = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(if oversized {
                LineRead::Oversized(length)
            } else if line.is_empty() {
                LineRead::Eof
            } else {
                LineRead::Line
            });
        }
        let (chunk, complete) = match available.iter().position(|&b| b == b'\n') {
            Some(at) => (&available[..=at], true),
            None => (available, false),
        };
        let taken = chunk.len();
        length += taken;
        if !oversized && length > limit {
            oversized = true;
            line.clear();
            line.shrink_to(64 * 1024);
        }
        if !oversized {
            line.extend_from_slice(chunk);
        }
        reader.consume(taken);
        if complete {
            return Ok(if oversized { LineRead::Oversized(length) } else { LineRead::Line });
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::BufReader;

    use super::*;

    async fn lines_of(input: &[u8], limit: usize) -> Vec<Result<String, usize>> {
        let mut reader = BufReader::with_capacity(4, input);
        let mut out = Vec::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            match read_bounded_line(&mut reader, &mut line, limit).await.unwrap() {
                LineRead::Eof => return out,
                LineRead::Line => out.push(Ok(String::from_utf8(line.clone()).unwrap())),
                LineRead::Oversized(length) => out.push(Err(length)),
            }
        }
    }

    #[tokio::test]
    async fn lines_are_bounded_and_an_oversized_one_is_skipped_whole() {
        let lines = lines_of(b"short\n0123456789abcdef\nok\nlast", 10).await;
        assert_eq!(lines, [Ok("short\n".into()), Err(17), Ok("ok\n".into()), Ok("last".into())]);
    }
}
