//! A tree's stdin: the pipe, its bounded queue, closing it, and writes the
//! program can no longer take.

use super::*;

#[tokio::test]
async fn a_stdin_pipe_feeds_a_read_loop_and_closing_it_ends_the_loop() {
    let host = host();
    let mark = marker("stdin-pipe");
    let script = "readlink /proc/self/fd/0 | cut -d: -f1; while read l; do echo \"got $l\"; done; echo end";
    let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash(script, &mark) };
    let process = host.spawn(&bash_grant(), request, &tracing::Span::none()).await.unwrap();
    let mut out = String::new();
    process.write_stdin(b"one\n").unwrap();
    read_until(&process, &mut out, "got one\n").await;
    assert_eq!(out, "pipe\ngot one\n");
    // A line in two writes is one line.
    process.write_stdin(b"tw").unwrap();
    process.write_stdin(b"o\nthree\n").unwrap();
    read_until(&process, &mut out, "got three\n").await;
    process.close_stdin().unwrap();
    let (rest, _, _, status) = drain(&process).await;
    out.push_str(&String::from_utf8(rest).unwrap());
    assert_eq!(out, "pipe\ngot one\ngot two\ngot three\nend\n");
    assert_eq!(status, ExitStatus::Code(0));
    assert_eq!(process.write_stdin(b"late\n"), Err(StdinError::Closed));
    assert_eq!(process.close_stdin(), Err(StdinError::Closed));
    assert_eq!(StdinError::Closed.to_string(), "its stdin is already closed");
    assert_no_marked(&mark).await;
}

#[tokio::test]
async fn without_a_pipe_stdin_writes_are_refused_and_reads_end_at_once() {
    let host = host();
    let mark = marker("stdin-none");
    let process = host.spawn(&bash_grant(), bash("cat; echo eof", &mark), &tracing::Span::none()).await.unwrap();
    assert_eq!(process.write_stdin(b"x\n"), Err(StdinError::NotPiped));
    assert_eq!(process.close_stdin(), Err(StdinError::NotPiped));
    let (out, _, _, status) = drain(&process).await;
    assert_eq!(String::from_utf8(out).unwrap(), "eof\n");
    assert_eq!(status, ExitStatus::Code(0));
    assert_eq!(StdinError::NotPiped.to_string(), "the process was started without a stdin pipe (its stdin is empty)");
}

#[tokio::test]
async fn a_write_after_the_program_exited_is_an_error_not_a_sigpipe() {
    let host = host();
    let mark = marker("stdin-broken");
    // Neither the keeper nor the init holds the read end: once the command
    // is gone, the pipe has no reader.
    let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash("echo bye", &mark) };
    let process = host.spawn(&bash_grant(), request, &tracing::Span::none()).await.unwrap();
    let (out, _, _, status) = drain(&process).await;
    assert_eq!((String::from_utf8(out).unwrap().as_str(), status), ("bye\n", ExitStatus::Code(0)));
    assert_eq!(process.write_stdin(b"anyone?\n"), Err(StdinError::Broken));
    // Still refused, with the same reason, and this process is alive to say so.
    assert_eq!(process.write_stdin(b"x"), Err(StdinError::Broken));
    assert_eq!(process.close_stdin(), Err(StdinError::Broken));
    assert_eq!(StdinError::Broken.to_string(), "the program no longer reads its stdin (it exited or closed it)");
}

#[tokio::test]
async fn writes_never_block_and_the_queue_is_bounded() {
    let host = host();
    let mark = marker("stdin-full");
    // Never reads: the pipe fills, then the host-side queue.
    let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash("sleep 1000", &mark) };
    let process = host.spawn(&bash_grant(), request, &tracing::Span::none()).await.unwrap();
    // Running (marked from its exec): a TERM that lands while the tree is
    // still being set up is not the command's to take.
    await_marked(&mark, 1).await;
    let chunk = vec![b'x'; 16 * 1024];
    let mut accepted = 0usize;
    let refusal = loop {
        match process.write_stdin(&chunk) {
            Ok(()) => accepted += chunk.len(),
            Err(error) => break error,
        }
        assert!(accepted <= 64 << 20, "writes were never refused");
    };
    let StdinError::Full { pending, limit } = refusal.clone() else { panic!("{refusal:?}") };
    assert_eq!(limit, STDIN_BUFFER_BYTES);
    assert!(pending + chunk.len() > STDIN_BUFFER_BYTES, "{pending}");
    assert!(accepted >= STDIN_BUFFER_BYTES, "the pipe took its share and the queue the rest: {accepted}");
    assert!(refusal.to_string().starts_with("its stdin buffer is full ("), "{refusal}");
    // A small write that fits is still accepted; one too big for the whole
    // queue is refused whole.
    assert!(matches!(process.write_stdin(&vec![b'y'; STDIN_BUFFER_BYTES + 1]), Err(StdinError::Full { .. })));
    process.kill();
    let (_, _, _, status) = drain(&process).await;
    assert_eq!(status, ExitStatus::Signal(libc::SIGTERM));
    assert_no_marked(&mark).await;
}

#[tokio::test]
async fn a_close_waits_for_the_queue_then_the_program_reads_end_of_file() {
    let host = host();
    let mark = marker("stdin-drain");
    let grant =
        ProcessGrant { limits: ProcessLimits { memory_cap_bytes: 1 << 20, ..bash_grant().limits }, ..bash_grant() };
    // More than the pipe holds: part of it waits in the queue when the close
    // is asked, and must still arrive before end-of-file.
    let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash("sleep 0.2; wc -c", &mark) };
    let process = host.spawn(&grant, request, &tracing::Span::none()).await.unwrap();
    let data = vec![b'z'; 200 * 1024];
    process.write_stdin(&data).unwrap();
    assert!(process.stdin_pending() > 0, "the pipe cannot take 200 KiB at once");
    process.close_stdin().unwrap();
    assert_eq!(process.write_stdin(b"more"), Err(StdinError::Closed));
    let (out, _, _, status) = drain(&process).await;
    assert_eq!(String::from_utf8(out).unwrap().trim(), (200 * 1024).to_string());
    assert_eq!(status, ExitStatus::Code(0));
}
