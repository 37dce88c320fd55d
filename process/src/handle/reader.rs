//! The readers of a tree's streams: one task per stream moves output into
//! its buffer (paced while a consumer is active), or, for a forwarded tree,
//! formats it into the host's sink; and the backfill of what a spill file
//! holds when forwarding begins.

use super::*;

/// The size of the next read: a quarter of the cap, or while a consumer is
/// active the room left under it (at most [`MAX_READ`]).
pub(super) fn next_read(buffer: &StreamBuffer, active: bool, chunk: usize) -> usize {
    let room = buffer.memory_cap().saturating_sub(buffer.len());
    if active { room.clamp(chunk, MAX_READ.max(chunk)) } else { chunk }
}

/// The most output [`Process::forward_output`] copies from a spill file into
/// the sink at once (it holds the buffer locks, and the sink holds the copy
/// until the host's log takes it).
pub(super) const MAX_BACKFILL: u64 = 8 << 20;

/// The bytes `range` of the stream `spill` holds, when the file holds all of
/// them (not past its cap) and they are at most [`MAX_BACKFILL`].
pub(super) fn backfill(spill: &crate::output::SpillFile, range: std::ops::Range<u64>) -> Option<Vec<u8>> {
    use std::io::{Read as _, Seek as _};
    use std::os::unix::fs::OpenOptionsExt as _;
    let len = range.end.checked_sub(range.start)?;
    if len > MAX_BACKFILL || range.end > spill.output_bytes() {
        return None;
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(spill.path())
        .ok()?;
    file.seek(std::io::SeekFrom::Start(range.start)).ok()?;
    let mut bytes = vec![0; len as usize];
    file.read_exact(&mut bytes).ok()?;
    Some(bytes)
}

/// Moves one stream's output into its buffer (and spill file) until it ends.
///
/// Each read takes at most `chunk` (a quarter of the memory cap) while
/// nobody is reading the stream, so the buffer keeps the latest output in
/// several reads' worth; while a consumer is active it takes up to the room
/// left under the cap (at most [`MAX_READ`]): nothing unread is pushed out,
/// and a fast stream costs the consumer one wake-up per pipe-full instead of
/// one per quarter cap. Once the output is forwarded, see [`forward_step`].
pub(super) async fn read_stream(
    shared: Arc<Shared>,
    stream: Stream,
    pipes: [Arc<pipe::Receiver>; 2],
    mut spill: SpillWriter,
    chunk: usize,
    mut exited: watch::Receiver<bool>,
) {
    let rx = pipes[stream as usize].clone();
    let mut buf = vec![0u8; chunk.max(MAX_READ)];
    let mut want = chunk;
    let mut spill_ok = true;
    let mut exited_too = exited.clone();
    let linger = async {
        let _ = exited.wait_for(|e| *e).await;
        tokio::time::sleep(OUTPUT_LINGER).await;
    };
    tokio::pin!(linger);
    // Forwarded output waits for the host's log to take it as long as that
    // may take on a loaded host (each wait ends at the next take), bounded
    // only for a sink nobody takes from any more.
    let forward_linger = async {
        let _ = exited_too.wait_for(|e| *e).await;
        tokio::time::sleep(FORWARD_LINGER).await;
    };
    tokio::pin!(forward_linger);
    loop {
        tokio::select! {
            biased;
            ready = rx.readable() => {
                if let Err(e) = ready {
                    tracing::warn!(?stream, error = %e, "waiting for process output failed");
                    break;
                }
                if let Some(forwarding) = shared.forward.get() {
                    // The sink is bounded: wait for the host to take from it.
                    let sink = forwarding.sink.clone();
                    tokio::select! {
                        biased;
                        () = sink.room() => {}
                        _ = &mut forward_linger => {
                            tracing::warn!(
                                ?stream,
                                linger_s = FORWARD_LINGER.as_secs(),
                                "the task's output was not taken after the process exited; stopped reading"
                            );
                            break;
                        }
                    }
                    match forward_step(&shared, forwarding, stream, &pipes, &mut buf) {
                        Ok(Got::End) => break,
                        Ok(Got::Data | Got::Nothing) => continue,
                        Err(e) => {
                            tracing::warn!(?stream, error = %e, "reading process output failed");
                            break;
                        }
                    }
                }
                // Read and recorded under the stream's read lock, so a
                // forwarding reader of the other stream, which may read this
                // pipe too, never overtakes it.
                let reading = lock(&shared.reading[stream as usize]);
                let n = match rx.try_read(&mut buf[..want]) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => continue,
                    Err(e) => {
                        tracing::warn!(?stream, error = %e, "reading process output failed");
                        break;
                    }
                };
                let data = &buf[..n];
                let created = if spill_ok && shared.forward.get().is_none() {
                    spill.write(data).unwrap_or_else(|e| {
                        tracing::warn!(?stream, error = %e, "spill file write failed; output beyond the memory cap is lost");
                        spill_ok = false;
                        None
                    })
                } else {
                    None
                };
                let drained = shared.drained.notified();
                tokio::pin!(drained);
                let pace = {
                    let mut buffer = shared.append(stream, data);
                    if let Some(file) = created {
                        buffer.set_spill(file);
                    }
                    let active = buffer.reader_active(READER_ACTIVE);
                    want = next_read(&buffer, active, chunk);
                    let pace = active && buffer.len() > buffer.memory_cap() / 4 * 3;
                    if pace {
                        // Registered under the lock, so a read right
                        // after it is not missed.
                        drained.as_mut().enable();
                    }
                    pace
                };
                drop(reading);
                shared.notify.notify_waiters();
                if pace {
                    // Someone is reading this stream right now: give them
                    // a moment to take what is there before more arrives
                    // and pushes unread bytes out of memory. A stream
                    // nobody reads is never slowed down.
                    let _ = tokio::time::timeout(PACE_WAIT, drained).await;
                    let buffer = lock(shared.buffer(stream));
                    want = next_read(&buffer, buffer.reader_active(READER_ACTIVE), chunk);
                }
            }
            _ = &mut linger => {
                tracing::warn!(
                    ?stream,
                    "output still open after the process exited: a descendant that left its process \
                     group holds it (no PID namespace); stopped reading"
                );
                break;
            }
        }
    }
    shared.end_stream(stream);
    shared.notify.notify_waiters();
}

/// What one round of forwarded reads got from the reader's own stream.
pub(super) enum Got {
    Data,
    /// The stream ended.
    End,
    /// Nothing (after all, or the sink filled first).
    Nothing,
}

/// One round of reads of a forwarded process, on behalf of `own`'s
/// reader: under the forwarding's order lock, stdout's pipe is read until
/// it is empty, then stderr's, whichever reader woke. So stdout a program
/// wrote before writing to stderr always comes first (and of output written
/// to both in between two rounds, stdout's: as the plugin's own format has
/// it). Each pipe is read and recorded under its read lock, as the plain
/// reads are, so neither reader overtakes the other on one pipe. Each pipe's
/// end is its own reader's to see; a round stops early once the sink is full.
pub(super) fn forward_step(
    shared: &Shared,
    forwarding: &Forwarding,
    own: Stream,
    pipes: &[Arc<pipe::Receiver>; 2],
    buf: &mut [u8],
) -> std::io::Result<Got> {
    let _order = lock(&forwarding.order);
    let mut got = Got::Nothing;
    for stream in [Stream::Stdout, Stream::Stderr] {
        let _reading = lock(&shared.reading[stream as usize]);
        while !forwarding.sink.is_full() {
            match pipes[stream as usize].try_read(buf) {
                Ok(0) => {
                    if stream == own {
                        got = Got::End;
                    }
                    break;
                }
                Ok(n) => {
                    drop(shared.append(stream, &buf[..n]));
                    if stream == own {
                        got = Got::Data;
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => break,
                Err(e) if stream == own => return Err(e),
                Err(_) => break,
            }
        }
    }
    Ok(got)
}
