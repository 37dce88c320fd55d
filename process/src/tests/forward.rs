//! Forwarded trees: output goes to the host's sink in order, with stream
//! headers, held while the sink is full, and never lost to the spill.

use std::sync::Arc;
use std::time::Duration;

use super::*;

/// Follows a forwarded process through its sink: waits for each append
/// (the sink's signal) until `until` holds for everything taken so far.
struct SinkReader {
    sink: Arc<OutputSink>,
    raised: Arc<tokio::sync::Notify>,
    text: String,
    /// The most the sink held at any signal.
    peak: usize,
}

impl SinkReader {
    fn new(limit: usize) -> Self {
        let sink = OutputSink::new(limit);
        let raised = Arc::new(tokio::sync::Notify::new());
        let signal = raised.clone();
        sink.set_signal(Box::new(move || signal.notify_one()));
        Self { sink, raised, text: String::new(), peak: 0 }
    }

    /// Takes until `until(text)` holds (20 s at most).
    async fn until(&mut self, what: &str, until: impl Fn(&str) -> bool) {
        let wait = async {
            loop {
                self.peak = self.peak.max(self.sink.len());
                self.text.push_str(&self.sink.take());
                if until(&self.text) {
                    return;
                }
                self.raised.notified().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), wait)
            .await
            .unwrap_or_else(|_| panic!("no {what} in the forwarded output: {:?}", self.text));
    }

    /// Takes until the process finished, then what is left.
    async fn follow_to_end(&mut self, process: &Process) -> ExitStatus {
        let finished = process.finished();
        tokio::pin!(finished);
        let wait = async {
            loop {
                self.peak = self.peak.max(self.sink.len());
                self.text.push_str(&self.sink.take());
                tokio::select! {
                    () = &mut finished => break,
                    () = self.raised.notified() => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), wait).await.expect("the forwarded process got stuck");
        self.text.push_str(&self.sink.take());
        process.exit_status().expect("finished")
    }
}

#[tokio::test]
async fn forwarded_output_goes_to_the_sink_in_order_with_stream_headers() {
    let host = host();
    let mark = marker("forward-order");
    // Unread output before forwarding goes first; each later step waits for
    // the test, so the order across the two streams is the program's.
    let script = "echo early; read a; echo 'late é' >&2; read b; printf 'mid-'; printf 'line' >&2; read c; echo back";
    let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash(script, &mark) };
    let process = host.spawn(&bash_grant(), request, &tracing::Span::none()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), process.ready()).await.expect("the first line");
    let mut reader = SinkReader::new(1 << 20);
    process.forward_output(reader.sink.clone()).unwrap();
    assert_eq!(process.forward_output(reader.sink.clone()), Err("its output is already forwarded"));
    assert!(reader.sink.is_forwarding());
    reader.until("early", |t| t == "early\n").await;
    process.write_stdin(b"go\n").unwrap();
    reader.until("the stderr line", |t| t.ends_with("late é\n")).await;
    process.write_stdin(b"go\n").unwrap();
    reader.until("the mid-line change", |t| t.ends_with("line")).await;
    process.write_stdin(b"go\n").unwrap();
    let status = reader.follow_to_end(&process).await;
    assert_eq!(status, ExitStatus::Code(0));
    assert_eq!(reader.text, "early\n[stderr]\nlate é\n[stdout]\nmid-\n[stderr]\nline\n[stdout]\nback\n");
    // Nothing is left for consuming reads, and the byte counts still add up.
    assert!(process.read(Stream::Stdout).data.is_empty() && process.read(Stream::Stderr).data.is_empty());
    assert_eq!(process.total(Stream::Stdout), "early\nmid-back\n".len() as u64);
    assert_no_marked(&mark).await;
}

#[tokio::test]
async fn forwarded_stdout_written_before_stderr_always_comes_first() {
    let host = host();
    let mark = marker("forward-stdout-first");
    // No synchronisation at all: 20 000 lines on stdout, then one on stderr
    // right after the last, as a failing build prints its error.
    let script = "for i in $(seq 1 20000); do echo \"line $i\"; done; echo warn >&2; exit 3";
    let process = host.spawn(&bash_grant(), bash(script, &mark), &tracing::Span::none()).await.unwrap();
    let mut reader = SinkReader::new(1 << 20);
    process.forward_output(reader.sink.clone()).unwrap();
    assert_eq!(reader.follow_to_end(&process).await, ExitStatus::Code(3));
    let expected: String = (1..=20000).map(|i| format!("line {i}\n")).collect();
    assert_eq!(reader.text, format!("{expected}[stderr]\nwarn\n"));
}

#[tokio::test]
async fn a_full_sink_holds_the_program_until_the_host_takes() {
    let host = host();
    let mark = marker("forward-bound");
    let limit = 64 * 1024;
    let total = 4 << 20;
    let script = format!("head -c {total} /dev/zero | tr '\\0' a; echo; echo done >&2");
    let process = host.spawn(&bash_grant(), bash(&script, &mark), &tracing::Span::none()).await.unwrap();
    let mut reader = SinkReader::new(limit);
    process.forward_output(reader.sink.clone()).unwrap();
    // Wait, taking nothing, until the sink is full: the program must then
    // be held (not finished), however long it is given.
    let full = async {
        loop {
            let raised = reader.raised.notified();
            tokio::pin!(raised);
            raised.as_mut().enable();
            if reader.sink.len() >= limit {
                return;
            }
            raised.await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), full).await.expect("the sink filled");
    assert!(process.exit_status().is_none(), "4 MiB cannot have gone through a 64 KiB sink nobody took from");
    let status = reader.follow_to_end(&process).await;
    assert_eq!(status, ExitStatus::Code(0));
    assert_eq!(reader.text.len(), total + "\n[stderr]\ndone\n".len());
    assert!(reader.text.ends_with("a\n[stderr]\ndone\n"));
    // One round of reads past the limit at most (stdout's pipe, then stderr's).
    assert!(reader.peak <= limit + 2 * 64 * 1024, "the sink held {} bytes", reader.peak);
    assert_no_marked(&mark).await;
}

/// A command that outruns its memory cap before forwarding begins (a fast
/// command while the plugin's next step waits for a core): the bytes that
/// left memory come back from the spill file, so the sink gets the whole
/// output in order, not a pointer to the file in the middle of it.
#[tokio::test]
async fn output_dropped_from_memory_before_forwarding_is_forwarded_from_the_spill_file() {
    let host = host();
    let mark = marker("forward-backfill");
    let script = "seq 1 20000; echo warn >&2; seq 20001 20100";
    let request = SpawnRequest { memory_cap: Some(4096), ..bash(script, &mark) };
    let process = host.spawn(&bash_grant(), request, &tracing::Span::none()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), process.finished()).await.expect("the command ended");
    let mut reader = SinkReader::new(1 << 20);
    process.forward_output(reader.sink.clone()).unwrap();
    assert_eq!(reader.follow_to_end(&process).await, ExitStatus::Code(0));
    let stdout: String = (1..=20100).map(|n| format!("{n}\n")).collect();
    assert!(!reader.text.contains("dropped from memory"), "{}", &reader.text[..200.min(reader.text.len())]);
    // Each stream whole and in order; the stderr line sits where the host
    // read it (the streams were read apart while nobody took them).
    let without_stderr = reader.text.replace("[stderr]\nwarn\n[stdout]\n", "").replace("[stderr]\nwarn\n", "");
    assert_eq!(without_stderr, stdout);
    assert_eq!(reader.text.matches("warn").count(), 1);
}

#[tokio::test]
async fn forwarded_invalid_utf8_is_replaced_and_split_characters_are_joined() {
    let host = host();
    let mark = marker("forward-utf8");
    // A 3-byte character split across two writes with a pause between
    // (the second waits for stdin), then an invalid byte.
    let script = "printf '\\xe2\\x9c'; read a; printf '\\x93 ok \\xff end\\n'";
    let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash(script, &mark) };
    let process = host.spawn(&bash_grant(), request, &tracing::Span::none()).await.unwrap();
    // The first half is read before forwarding begins, so forwarding starts
    // with half a character.
    tokio::time::timeout(Duration::from_secs(20), process.ready()).await.expect("the first bytes");
    let mut reader = SinkReader::new(1 << 20);
    process.forward_output(reader.sink.clone()).unwrap();
    process.write_stdin(b"go\n").unwrap();
    assert_eq!(reader.follow_to_end(&process).await, ExitStatus::Code(0));
    assert_eq!(reader.text, "✓ ok \u{fffd} end\n");
}

/// A host made with `new_unstarted` (what `serve` uses) does no housekeeping
/// on the start's path: a dead host's spill directory stays until
/// `start_ahead`'s thread runs. Its first tree is limited all the same, both
/// when the spawn decides the limiter itself (nothing started ahead) and when
/// it races the start-ahead thread deciding it.
#[tokio::test]
async fn an_unstarted_host_defers_its_housekeeping_and_still_limits_its_first_tree() {
    for ahead in [false, true] {
        let spill_root = std::env::temp_dir().join(format!("taskhost-unstarted-{}-{ahead}", std::process::id()));
        std::fs::create_dir_all(&spill_root).unwrap();
        // A pid above any pid_max: its host is dead.
        let dead = spill_root.join("taskhost-999999999-1");
        std::fs::create_dir_all(&dead).unwrap();
        let host = ProcessHost::new_unstarted(&ProcessHostConfig {
            spill_root: Some(spill_root.clone()),
            ..Default::default()
        })
        .unwrap();
        assert!(dead.exists(), "an unstarted host swept the spill root");
        if ahead {
            host.start_ahead();
        }
        let mark = marker(&format!("unstarted-{ahead}"));
        // The tree's own /proc/self/cgroup is rooted at its cgroup (a cgroup
        // namespace): its keeper's, read from the host, shows where it is.
        let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash("echo up; read line || true", &mark) };
        let process = host.spawn(&bash_grant(), request, &tracing::Span::none()).await.unwrap();
        let mut out = String::new();
        read_until(&process, &mut out, "up").await;
        let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", process.pid())).unwrap();
        process.close_stdin().unwrap();
        let (_, err, _, status) = drain(&process).await;
        assert_eq!(status, ExitStatus::Code(0), "{}", String::from_utf8_lossy(&err));
        match host.limit_mechanism() {
            LimitMechanism::CgroupV1 | LimitMechanism::CgroupV2 => {
                assert!(cgroup.contains("/tree-"), "the first tree is not in a tree cgroup (ahead: {ahead}):\n{cgroup}")
            }
            mechanism => eprintln!("NOTE: trees are limited by {mechanism} here; no cgroup to check"),
        }
        drop(process);
        host.wait_for_spill_cleanup();
        assert!(!dead.exists(), "the housekeeping did not remove a dead host's spill directory");
        drop(host);
        std::fs::remove_dir_all(&spill_root).unwrap();
    }
}
