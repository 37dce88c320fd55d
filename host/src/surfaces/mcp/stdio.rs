//! MCP over a byte stream (stdio): one connection, one owner.
//!
//! A connection gets its own agent (`stdio-N`) at connect; every call on it
//! runs as that agent, and when the client disconnects the agent is disposed:
//! its tasks are cancelled and awaited before [`serve_connection`] returns.
//!
//! Between the client and rmcp sits a line guard. rmcp silently drops lines
//! that are not JSON (so a client bug would look like a hang); the guard
//! answers each with a JSON-RPC parse error (`-32700`, `id: null`) instead,
//! and does the same for a line over [`MAX_LINE_BYTES`]. Well-formed JSON
//! goes to rmcp unchanged, which answers invalid JSON-RPC shapes itself.
//! Every line written to the client is written whole, so the guard's
//! answers never interleave with rmcp's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::ServiceExt;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{McpHandler, McpServer};

/// The longest line accepted from a client (rmcp's own default).
pub const MAX_LINE_BYTES: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// Buffer between the guard and rmcp, each way.
const PIPE_BYTES: usize = 256 * 1024;

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// Serves one MCP connection over `reader`/`writer` until the client
/// disconnects or `shutdown` is cancelled, then disposes its owner.
pub async fn serve_connection<R, W>(
    server: Arc<McpServer>,
    reader: R,
    writer: W,
    shutdown: CancellationToken,
) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let name = format!("stdio-{}", NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed));
    let owner = server.host().create_agent(name.as_str(), name.as_str())?;
    let span = tracing::info_span!("mcp_connection", owner = %name);
    async move {
        let guard = LineGuard::start(reader, writer);
        let handler = McpHandler::for_connection(server.clone(), owner.clone());
        let served = match handler.serve_with_ct((guard.from_client, guard.to_client), shutdown.child_token()).await {
            Ok(running) => {
                let reason = running.waiting().await;
                tracing::info!(?reason, "connection closed");
                Ok(())
            }
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(during)) => {
                tracing::info!(%during, "client left before initializing");
                Ok(())
            }
            Err(rmcp::service::ServerInitializeError::Cancelled) => Ok(()),
            Err(error) => Err(anyhow::Error::new(error).context(format!("initializing MCP connection {name}"))),
        };
        // The owner's tasks die with the connection.
        owner.dispose().await;
        tracing::info!("owner disposed");
        // The inbound side may sit in a blocking stdin read that nothing can
        // interrupt; the connection is over, so stop waiting for it.
        guard.inbound.abort();
        if let Err(error) = guard.outbound.await {
            tracing::debug!(%error, "outbound pump ended abnormally");
        }
        served
    }
    .instrument(span)
    .await
}

/// The two pumps between a client stream and rmcp.
struct LineGuard {
    /// What rmcp reads: the client's well-formed lines.
    from_client: DuplexStream,
    /// What rmcp writes: forwarded to the client line by line.
    to_client: DuplexStream,
    inbound: JoinHandle<()>,
    outbound: JoinHandle<()>,
}

impl LineGuard {
    fn start<R, W>(reader: R, writer: W) -> Self
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (from_client, feed) = tokio::io::duplex(PIPE_BYTES);
        let (to_client, drain) = tokio::io::duplex(PIPE_BYTES);
        let (errors_tx, errors_rx) = mpsc::unbounded_channel();
        let inbound = tokio::spawn(pump_inbound(reader, feed, errors_tx).in_current_span());
        let outbound = tokio::spawn(pump_outbound(drain, writer, errors_rx).in_current_span());
        Self { from_client, to_client, inbound, outbound }
    }
}

/// A JSON-RPC error answer to a line that carried no readable request.
fn parse_error(message: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32700, "message": message},
    }))
    .expect("a JSON literal serializes");
    line.push(b'\n');
    line
}

async fn pump_inbound<R>(reader: R, mut feed: DuplexStream, errors: mpsc::UnboundedSender<Vec<u8>>)
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        match read_bounded_line(&mut reader, &mut line, MAX_LINE_BYTES).await {
            Ok(LineRead::Eof) => break,
            Ok(LineRead::Oversized(length)) => {
                tracing::warn!(length, "dropping an oversized line from the client");
                let _ = errors.send(parse_error(&format!(
                    "Parse error: a message of {length} bytes or more exceeds the limit of {MAX_LINE_BYTES} bytes; \
                     it was ignored"
                )));
            }
            Ok(LineRead::Line) => {
                let content = line.strip_suffix(b"\n").unwrap_or(&line);
                let content = content.strip_suffix(b"\r").unwrap_or(content);
                if content.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                if let Err(error) = serde_json::from_slice::<serde::de::IgnoredAny>(content) {
                    tracing::info!(%error, "answering a line that is not JSON");
                    let _ = errors.send(parse_error(&format!(
                        "Parse error: the message is not valid JSON ({error}); it was ignored. \
                         Send one JSON-RPC message per line."
                    )));
                    continue;
                }
                let forwarded = async {
                    feed.write_all(content).await?;
                    feed.write_all(b"\n").await
                };
                if forwarded.await.is_err() {
                    // rmcp closed its side: the connection is over.
                    break;
                }
            }
            Err(error) => {
                tracing::info!(%error, "reading from the client failed");
                break;
            }
        }
    }
    // Dropping the feed is the end of input rmcp sees.
    let _ = feed.shutdown().await;
}

enum LineRead {
    Line,
    Eof,
    /// The line was longer than the limit and was skipped up to its end.
    Oversized(usize),
}

/// Reads one `\n`-terminated line into `line`, never buffering more than
/// `limit` bytes of it. A final unterminated line counts as a line.
async fn read_bounded_line<R: AsyncRead + Unpin>(
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

async fn pump_outbound<W>(drain: DuplexStream, mut writer: W, mut errors: mpsc::UnboundedReceiver<Vec<u8>>)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut drain = BufReader::with_capacity(64 * 1024, drain);
    let mut line = Vec::new();
    let mut errors_open = true;
    loop {
        tokio::select! {
            read = drain.read_until(b'\n', &mut line) => {
                match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if writer.write_all(&line).await.is_err() || writer.flush().await.is_err() {
                            break;
                        }
                        line.clear();
                    }
                }
            }
            error = errors.recv(), if errors_open => {
                match error {
                    Some(answer) => {
                        // rmcp's partial line (if any) stays buffered in `line`
                        // until it is complete; the answer goes out whole.
                        if writer.write_all(&answer).await.is_err() || writer.flush().await.is_err() {
                            break;
                        }
                    }
                    None => errors_open = false,
                }
            }
        }
    }
    let _ = writer.flush().await;
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

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

    /// Non-JSON and oversized lines get -32700 answers; JSON passes unchanged.
    #[tokio::test]
    async fn the_guard_answers_what_rmcp_would_drop() {
        let (client, server_in) = tokio::io::duplex(1 << 20);
        let (server_out, mut client_out) = tokio::io::duplex(1 << 20);
        let mut guard = LineGuard::start(server_in, server_out);
        let (_client_read, mut client_write) = tokio::io::split(client);
        client_write.write_all(b"not json\n{\"jsonrpc\":\"2.0\"}\r\n").await.unwrap();
        client_write.shutdown().await.unwrap();
        let mut forwarded = String::new();
        guard.from_client.read_to_string(&mut forwarded).await.unwrap();
        assert_eq!(forwarded, "{\"jsonrpc\":\"2.0\"}\n");
        // rmcp's side closes; the pump flushes and ends.
        drop(guard.to_client);
        guard.outbound.await.unwrap();
        let mut answers = BufReader::new(&mut client_out).lines();
        let answer: serde_json::Value = serde_json::from_str(&answers.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(answer["id"], serde_json::Value::Null);
        assert_eq!(answer["error"]["code"], -32700);
        assert!(answer["error"]["message"].as_str().unwrap().starts_with("Parse error: the message is not valid JSON"));
        assert!(answers.next_line().await.unwrap().is_none());
    }
}
