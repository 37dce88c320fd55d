//! Durable trees: they outlive the server that started them, their output
//! lands in their logs while no server watches, and the next server
//! re-adopts them by their record, and only by it.

use super::*;
use crate::durable::{AdoptError, DurableProcess, DurableSpawn};

/// A state directory (protected: no tree sees it) and a host that protects it.
struct State {
    dir: PathBuf,
}

impl State {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("taskhost-durable-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }

    fn host(&self) -> Arc<ProcessHost> {
        ProcessHost::new(&ProcessHostConfig { protected_paths: vec![self.dir.clone()], ..Default::default() })
            .expect("process host")
    }

    /// Durable options for tree `n`: its own log directory and socket.
    fn spawn(&self, n: u32, ttl: Duration) -> DurableSpawn {
        let logs = self.dir.join(format!("tree-{n}"));
        std::fs::create_dir(&logs).unwrap();
        DurableSpawn::new(logs, self.dir.join(format!("k-{n}.sock")), ttl)
    }
}

impl Drop for State {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A durable tree that sleeps (stdin empty), running its marked processes:
/// with the server that spawned it and the owner's spill, which hold its view.
async fn sleeping_tree(
    state: &State,
    mark: &ProcessMark,
    ttl: Duration,
) -> (Arc<ProcessHost>, Arc<crate::OwnerSpill>, DurableProcess) {
    let host = state.host();
    let owner = host.owner_spill("").unwrap();
    let mut request = bash("sleep 1000", mark);
    request.stdin = StdinMode::Empty;
    let process =
        host.spawn_durable(&owner, &bash_grant(), request, state.spawn(1, ttl), &tracing::Span::none()).await.unwrap();
    await_marked(mark, 1).await;
    (host, owner, process)
}

fn piped(script: &str) -> SpawnRequest {
    SpawnRequest { argv: vec!["bash".into(), "-c".into(), script.into()], stdin: StdinMode::Pipe, ..Default::default() }
}

fn log(process: &DurableProcess, stream: Stream, offset: u64) -> String {
    String::from_utf8(process.read_log(stream, offset, 1 << 20).unwrap()).unwrap()
}

async fn finished(process: &DurableProcess) -> Result<crate::DurableExit, AdoptError> {
    tokio::time::timeout(Duration::from_secs(20), process.finished()).await.expect("the durable tree got stuck")
}

/// The server (its handle and its `ProcessHost`) goes; the tree runs on,
/// reads what was written to its stdin and writes into its log; a new
/// server adopts it, writes to its stdin, reads the rest from an offset and
/// sees its exit code.
#[tokio::test]
async fn a_durable_tree_outlives_its_server_and_is_adopted() {
    let state = State::new("outlives");
    let host = state.host();
    let grant = bash_grant();
    let owner = host.owner_spill("").unwrap();
    let script = "read a; echo \"got $a\"; echo to-stderr >&2; read b; echo \"got $b\"; exit 7";
    let mark = marker("durable-outlives");
    let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash(script, &mark) };
    let process = host
        .spawn_durable(&owner, &grant, request, state.spawn(1, Duration::from_secs(60)), &tracing::Span::none())
        .await
        .unwrap();
    assert_eq!(process.write_stdin(b"one\n").unwrap(), 4);
    // Set up (the view holds this server's spill directory, which goes with it).
    await_marked(&mark, 1).await;
    let record = process.record().clone();
    drop(process);
    drop(owner);
    drop(host);

    let host = state.host();
    let adopted = DurableProcess::adopt(&record);
    let adopted = adopted.expect("the tree is adopted");
    assert_eq!(adopted.write_stdin(b"two\n").unwrap(), 4);
    let exit = finished(&adopted).await.unwrap();
    assert_eq!(exit.status, ExitStatus::Code(7));
    assert!(!exit.deadline);
    assert_eq!(log(&adopted, Stream::Stdout, 0), "got one\ngot two\n");
    assert_eq!(log(&adopted, Stream::Stdout, 8), "got two\n", "reads resume at a recorded offset");
    assert_eq!(log(&adopted, Stream::Stderr, 0), "to-stderr\n");
    assert!(!adopted.truncated());
    // Once ended, a later server still learns how.
    let late = DurableProcess::adopt(&record).expect("an ended tree is adopted ended");
    assert_eq!(finished(&late).await.unwrap().status, ExitStatus::Code(7));
    drop(host);
}

/// A state directory deeper than a Unix socket address holds (108 bytes:
/// a long `$HOME`) still spawns, adopts and stops durable trees.
#[tokio::test]
async fn a_state_directory_deeper_than_a_socket_address_works() {
    let state = State::new("deep");
    let deep = state.dir.join("a-directory-name-long-enough-to-matter".repeat(4));
    std::fs::create_dir(&deep).unwrap();
    let socket = deep.join("k.sock");
    assert!(socket.as_os_str().len() > 108, "{}", socket.display());
    let host = state.host();
    let owner = host.owner_spill("").unwrap();
    let process = host
        .spawn_durable(
            &owner,
            &bash_grant(),
            piped("read a; echo \"got $a\""),
            DurableSpawn::new(deep.clone(), socket, Duration::from_secs(60)),
            &tracing::Span::none(),
        )
        .await
        .expect("a deep state directory spawns");
    let adopted = DurableProcess::adopt(process.record()).expect("and adopts");
    assert_eq!(adopted.write_stdin(b"deep\n").unwrap(), 5);
    assert_eq!(finished(&adopted).await.unwrap().status, ExitStatus::Code(0));
    assert_eq!(log(&adopted, Stream::Stdout, 0), "got deep\n");
    drop((process, owner, host));
}

/// Only the recorded keeper, proved by the recorded secret, is adopted: a
/// wrong secret is refused (and the tree runs on), a socket whose peer is
/// not the recorded pid is refused, a start time that does not match (a
/// recycled pid) is not the tree.
#[tokio::test]
async fn adoption_needs_the_secret_the_pid_and_its_start_time() {
    let state = State::new("proof");
    let host = state.host();
    let owner = host.owner_spill("").unwrap();
    let process = host
        .spawn_durable(
            &owner,
            &bash_grant(),
            piped("read a; echo \"got $a\"; cat; echo eof"),
            state.spawn(1, Duration::from_secs(60)),
            &tracing::Span::none(),
        )
        .await
        .unwrap();
    let record = process.record().clone();

    let mut wrong_secret = record.clone();
    wrong_secret.secret[0] ^= 1;
    let refused = DurableProcess::adopt(&wrong_secret).expect_err("a wrong secret is refused");
    assert!(matches!(refused, AdoptError::Refused(_)), "{refused}");

    let mut recycled = record.clone();
    recycled.keeper_start_time += 1;
    let lost = DurableProcess::adopt(&recycled).expect_err("another process's start time is not the keeper's");
    assert!(matches!(lost, AdoptError::Lost(_)), "{lost}");

    // A record naming a live process that is not the socket's peer.
    let mut impostor = record.clone();
    impostor.keeper_pid = std::process::id();
    impostor.keeper_start_time = crate::durable::start_time(std::process::id()).unwrap();
    let refused = DurableProcess::adopt(&impostor).expect_err("the socket's peer must be the recorded pid");
    assert!(matches!(refused, AdoptError::Refused(_)), "{refused}");

    // None of that disturbed the keeper: the true record adopts (the
    // spawning server lets go first: its stdin copy would keep the pipe open).
    drop(process);
    let adopted = DurableProcess::adopt(&record).expect("the true record adopts");
    adopted.write_stdin(b"still here\n").unwrap();
    // End of file reaches the tree once both the server's and K's copies close.
    adopted.close_stdin().unwrap();
    assert_eq!(finished(&adopted).await.unwrap().status, ExitStatus::Code(0));
    assert_eq!(log(&adopted, Stream::Stdout, 0), "got still here\neof\n");
}

/// A keeper killed from outside takes its tree along and leaves no status:
/// the tree is lost, to its handle and to a later adoption.
#[tokio::test]
async fn a_killed_keeper_means_a_lost_tree() {
    let state = State::new("killed-keeper");
    let mark = marker("durable-killed-keeper");
    let (_host, _owner, process) = sleeping_tree(&state, &mark, Duration::from_secs(60)).await;
    // SAFETY: SIGKILL to the keeper this test started.
    unsafe { libc::kill(process.pid() as i32, libc::SIGKILL) };
    let lost = finished(&process).await.expect_err("no status without the keeper");
    assert!(matches!(lost, AdoptError::Lost(_)), "{lost}");
    let lost = DurableProcess::adopt(process.record()).expect_err("nothing to adopt");
    assert!(matches!(lost, AdoptError::Lost(_)), "{lost}");
    if confine::support().pid_namespace {
        assert_no_marked(&mark).await;
    }
}

/// With no server to end it, the keeper SIGKILLs the tree at its deadline
/// and says so in the status.
#[tokio::test]
async fn the_keeper_kills_the_tree_at_its_deadline() {
    let state = State::new("deadline");
    let host = state.host();
    let owner = host.owner_spill("").unwrap();
    let mark = marker("durable-deadline");
    let process = host
        .spawn_durable(
            &owner,
            &bash_grant(),
            bash("echo started; sleep 1000", &mark),
            state.spawn(1, Duration::from_secs(1)),
            &tracing::Span::none(),
        )
        .await
        .unwrap();
    await_marked(&mark, 1).await;
    let record = process.record().clone();
    drop(process);
    drop(owner);
    drop(host);
    let adopted = match DurableProcess::adopt(&record) {
        Ok(adopted) => adopted,
        Err(e) => panic!("{e}"),
    };
    let exit = finished(&adopted).await.unwrap();
    assert_eq!(exit.status, ExitStatus::Signal(libc::SIGKILL));
    assert!(exit.deadline, "the status says the deadline ended it");
    assert_eq!(log(&adopted, Stream::Stdout, 0), "started\n");
}

/// The logs hold at most the spill cap of unread output together; the
/// keeper drops the rest without holding the tree up, and says where, on a
/// line of its own in each stream it cut.
#[tokio::test]
async fn the_logs_are_bounded_by_the_spill_cap() {
    let state = State::new("cap");
    let host = state.host();
    let owner = host.owner_spill("").unwrap();
    let mut request = piped("head -c 300000 /dev/zero; head -c 300000 /dev/zero >&2; echo done >&2");
    request.spill_cap = Some(100_000);
    let process = host
        .spawn_durable(&owner, &bash_grant(), request, state.spawn(1, Duration::from_secs(60)), &tracing::Span::none())
        .await
        .unwrap();
    assert_eq!(finished(&process).await.unwrap().status, ExitStatus::Code(0));
    let out = process.read_log(Stream::Stdout, 0, 1 << 20).unwrap();
    let err = log(&process, Stream::Stderr, 0);
    let mark = "[taskhost: output dropped here: the command's unread output filled its log cap of 100000 bytes \
                (spill_cap_bytes); what it wrote until the reader caught up is lost]\n";
    // The output stops short of the cap by the marks' room (1 KiB).
    let kept = 100_000 - 1024;
    assert!(out[..kept].iter().all(|&b| b == 0), "stdout's first bytes are the command's");
    assert_eq!(String::from_utf8_lossy(&out[kept..]), format!("\n{mark}"), "a cut line ends before the mark");
    assert_eq!(err, mark, "the cap is for both logs together: stderr gets only its mark");
    assert!(out.len() + err.len() <= 100_000);
    assert!(process.truncated());
}

/// A reader that keeps up reads far past the cap: what it took for good is
/// punched out of the logs ([`crate::LogRelease`]), and the keeper counts
/// what the logs hold on disk, not what they ever held. Read as the server
/// reads it: followed into a sink, woken by the sink's signal.
#[tokio::test]
async fn a_reader_that_keeps_up_reads_past_the_cap() {
    let state = State::new("release");
    let host = state.host();
    let owner = host.owner_spill("").unwrap();
    // 20 lines of 100 000 bytes, each once the reader asks: 2 MB through a 300 kB cap.
    let script = "for i in $(seq 1 20); do read go; head -c 100000 /dev/zero | tr '\\0' a; echo; done";
    let mut request = piped(script);
    request.spill_cap = Some(300_000);
    let process = host
        .spawn_durable(&owner, &bash_grant(), request, state.spawn(1, Duration::from_secs(60)), &tracing::Span::none())
        .await
        .unwrap();
    let release = crate::LogRelease::new(process.record());
    let stdout = process.record().dir.join(crate::durable::log_name(Stream::Stdout));
    let sink = crate::OutputSink::new(1 << 20);
    let forwarded = Arc::new(tokio::sync::Notify::new());
    let signal = forwarded.clone();
    sink.set_signal(Box::new(move || signal.notify_one()));
    let tree = crate::FollowedTree::follow(process, sink.clone(), crate::TreeCursor::default(), Duration::from_secs(1));
    let line = format!("{}\n", "a".repeat(100_000));
    for chunk in 1..=20 {
        tree.process().write_stdin(b"go\n").unwrap();
        let mut got = String::new();
        while got.len() < line.len() {
            got.push_str(&sink.take());
            if got.len() < line.len() {
                // A signal raised since the take is kept (`notify_one`).
                tokio::time::timeout(Duration::from_secs(20), forwarded.notified()).await.expect("the chunk came");
            }
        }
        assert_eq!(got, line, "chunk {chunk}: whole, nothing dropped, nothing more");
        release.release_before(&sink.taken_mark().expect("a mark of what was taken"));
    }
    tokio::time::timeout(Duration::from_secs(20), tree.ended()).await.expect("the tree ends");
    assert_eq!(tree.process().exit().unwrap().unwrap().status, ExitStatus::Code(0));
    assert!(!tree.process().truncated(), "nothing was dropped");
    use std::os::unix::fs::MetadataExt as _;
    let held = std::fs::metadata(&stdout).unwrap().blocks() * 512;
    assert!(held < 300_000, "the log holds {held} bytes on disk: what was read went");
}

/// No tree sees the state directory: not the logs, not the socket (the
/// durable tree itself included); and a directory outside the protected
/// paths is refused.
#[tokio::test]
async fn trees_cannot_reach_the_logs_or_the_socket() {
    let state = State::new("hidden");
    let host = state.host();
    let owner = host.owner_spill("").unwrap();
    let spawn = state.spawn(1, Duration::from_secs(60));
    // The protected directory may show as an empty mount point; nothing in it shows.
    let probe = format!(
        "for p in {} {} {}/stdout.log; do if [ -e \"$p\" ]; then echo \"sees $p\"; fi; done; \
         ls -A {} 2>/dev/null; echo probed",
        spawn.dir.display(),
        spawn.socket.display(),
        spawn.dir.display(),
        state.dir.display(),
    );
    let process =
        host.spawn_durable(&owner, &bash_grant(), piped(&probe), spawn, &tracing::Span::none()).await.unwrap();
    assert_eq!(finished(&process).await.unwrap().status, ExitStatus::Code(0));
    assert_eq!(log(&process, Stream::Stdout, 0), "probed\n");
    // Another owner's plain tree, while the durable one's socket exists.
    let other = host
        .spawn_durable(
            &owner,
            &bash_grant(),
            piped("read x"),
            state.spawn(2, Duration::from_secs(60)),
            &tracing::Span::none(),
        )
        .await
        .unwrap();
    let (out, _, _, status) = drain(
        &host.spawn(&bash_grant(), bash(&probe, &marker("durable-hidden")), &tracing::Span::none()).await.unwrap(),
    )
    .await;
    assert_eq!((String::from_utf8_lossy(&out).as_ref(), status), ("probed\n", ExitStatus::Code(0)));
    other.kill().unwrap();
    assert_eq!(finished(&other).await.unwrap().status, ExitStatus::Signal(libc::SIGKILL));

    let outside = std::env::temp_dir().join(format!("taskhost-durable-outside-{}", std::process::id()));
    std::fs::create_dir_all(&outside).unwrap();
    let refused = host
        .spawn_durable(
            &owner,
            &bash_grant(),
            piped("true"),
            DurableSpawn::new(outside.clone(), outside.join("k.sock"), Duration::from_secs(5)),
            &tracing::Span::none(),
        )
        .await
        .expect_err("an unprotected directory is refused");
    assert!(refused.to_string().contains("protected"), "{refused}");
    // Nor does `..` lead out of the protected directory.
    let escape = state.dir.join("..").join(outside.file_name().unwrap());
    let refused = host
        .spawn_durable(
            &owner,
            &bash_grant(),
            piped("true"),
            DurableSpawn::new(escape.clone(), state.dir.join("k-escape.sock"), Duration::from_secs(5)),
            &tracing::Span::none(),
        )
        .await
        .expect_err("a directory reached through `..` is refused");
    assert!(refused.to_string().contains("protected"), "{refused}");
    std::fs::remove_dir_all(&outside).unwrap();
}

/// Not a test by itself: the server of `a_durable_tree_survives_its_server_killed`,
/// which runs this test binary again on this name. It starts a durable
/// tree, prints its record and waits to be killed.
#[tokio::test]
#[ignore = "helper process of a_durable_tree_survives_its_server_killed"]
async fn helper_server_of_a_durable_tree() {
    let (Ok(value), Some(state)) = (std::env::var("TASKHOST_HELPER_MARK"), std::env::var_os("TASKHOST_HELPER_STATE"))
    else {
        return;
    };
    let state = PathBuf::from(state);
    let host = ProcessHost::new(&ProcessHostConfig { protected_paths: vec![state.clone()], ..Default::default() })
        .expect("process host");
    let owner = host.owner_spill("").unwrap();
    let mark = ProcessMark::with_value(value);
    let script = "read a; echo \"got $a\"; read b; echo \"got $b\"; exit 5";
    let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash(script, &mark) };
    let logs = state.join("tree");
    std::fs::create_dir(&logs).unwrap();
    let spawn = DurableSpawn::new(logs, state.join("k.sock"), Duration::from_secs(60));
    let process = host.spawn_durable(&owner, &bash_grant(), request, spawn, &tracing::Span::none()).await.unwrap();
    process.write_stdin(b"one\n").unwrap();
    await_marked(&mark, 1).await;
    println!("record {}", serde_json::to_string(process.record()).unwrap());
    // Held until the test SIGKILLs this process: nothing here ends it.
    std::future::pending::<()>().await;
}

/// The server process is SIGKILLed (its lifeline hangs up, its spill
/// directory stays behind): the durable tree runs on, and this process
/// adopts it, feeds it and sees it end.
#[tokio::test]
async fn a_durable_tree_survives_its_server_killed() {
    use tokio::io::AsyncBufReadExt;
    let state = State::new("server-killed");
    let mark = marker("durable-server-killed");
    let mut helper = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "tests::durable::helper_server_of_a_durable_tree", "--ignored", "--nocapture"])
        .env("TASKHOST_HELPER_MARK", &mark.value)
        .env("TASKHOST_HELPER_STATE", &state.dir)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(helper.stdout.take().unwrap()).lines();
    let record = loop {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the helper server got stuck")
            .unwrap()
            .expect("the helper server ended without a record");
        if let Some(json) = line.strip_prefix("record ") {
            break serde_json::from_str::<crate::DurableRecord>(json).unwrap();
        }
    };
    // SAFETY: signalling our own child.
    unsafe { libc::kill(helper.id().unwrap() as i32, libc::SIGKILL) };
    helper.wait().await.unwrap();
    let adopted = DurableProcess::adopt(&record).expect("the tree outlived its server");
    adopted.write_stdin(b"two\n").unwrap();
    let exit = finished(&adopted).await.unwrap();
    assert_eq!(exit.status, ExitStatus::Code(5));
    assert_eq!(log(&adopted, Stream::Stdout, 0), "got one\ngot two\n");
    assert_no_marked(&mark).await;
}

/// The secret is in the memory of K and of I (PID 1 of the tree, forked
/// from K; a forked K is a copy of the server's memory): the command reads
/// neither's memory nor where their descriptors lead.
#[tokio::test]
async fn the_command_cannot_read_the_keepers_memory() {
    let state = State::new("memory");
    let host = state.host();
    let owner = host.owner_spill("").unwrap();
    // The first readable mapping of PID 1 (or of the parent without a PID namespace).
    let script = r#"
        p=1; [ -r /proc/1/maps ] || p=$PPID
        if m=$(head -n1 /proc/$p/maps 2>/dev/null) && [ -n "$m" ]; then
            start=$((16#${m%%-*}))
            if dd if=/proc/$p/mem bs=1 skip=$start count=1 status=none 2>/dev/null | od -An -c | grep -q .; then
                echo "read memory of $p"
            fi
        fi
        for f in /proc/$p/fd/*; do readlink "$f" 2>/dev/null | sed 's/^/fd: /'; done
        echo probed"#;
    for (n, pid_namespace) in [(1, true), (2, false)] {
        let grant = ProcessGrant { pid_namespace, ..bash_grant() };
        let process = host
            .spawn_durable(
                &owner,
                &grant,
                piped(script),
                state.spawn(n, Duration::from_secs(60)),
                &tracing::Span::none(),
            )
            .await
            .unwrap();
        assert_eq!(finished(&process).await.unwrap().status, ExitStatus::Code(0));
        let out = log(&process, Stream::Stdout, 0);
        assert!(!out.contains("read memory"), "PID namespace {pid_namespace}: {out}");
        assert!(!out.contains("fd: "), "PID namespace {pid_namespace}: {out}");
        assert!(out.ends_with("probed\n"), "PID namespace {pid_namespace}: {out}");
    }
}

/// A running tree whose state directory is deleted (no server can ever
/// adopt, read or end it again) is killed by its keeper, which then exits:
/// nothing is left running for its time to live.
#[tokio::test]
async fn a_tree_whose_directory_is_deleted_is_killed_by_its_keeper() {
    let state = State::new("orphaned");
    let mark = marker("durable-orphaned");
    let (host, owner, process) = sleeping_tree(&state, &mark, Duration::from_secs(3_600)).await;
    let record = process.record().clone();
    drop((process, owner, host));
    // SAFETY: pidfd_open of the keeper this test started (a plain syscall).
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, record.keeper_pid as libc::pid_t, 0) } as i32;
    assert!(pidfd >= 0, "the keeper is running: {}", std::io::Error::last_os_error());
    // SAFETY: the descriptor pidfd_open just returned, owned from here on.
    let pidfd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) };
    std::fs::remove_dir_all(&state.dir).unwrap();
    // The pidfd turns readable when the keeper exits; it checks every
    // ORPHAN_CHECK_MS.
    let within = Duration::from_millis(crate::child::durable::ORPHAN_CHECK_MS as u64) + Duration::from_secs(15);
    // SAFETY: the OwnedFd stays open for as long as the AsyncFd owns it.
    let exited = unsafe { tokio::io::unix::AsyncFd::register(pidfd) }.unwrap();
    let _ready = tokio::time::timeout(within, exited.readable())
        .await
        .expect("the keeper outlived its deleted directory")
        .unwrap();
    if confine::support().pid_namespace {
        assert_no_marked(&mark).await;
    }
}
