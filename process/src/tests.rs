//! Tests with real processes. Leaks are checked through `/proc`, never
//! through our own bookkeeping: every spawned tree carries a unique marker
//! variable, and a test fails if any process still has it.

use std::sync::Arc;
use std::time::Duration;

use super::*;

mod bounds;
mod dev;
mod durable;
mod forward;
mod namespaces;
mod session;
mod stdin;
mod view;

fn host() -> Arc<ProcessHost> {
    ProcessHost::new(&ProcessHostConfig::default()).expect("process host")
}

fn bash_grant() -> ProcessGrant {
    ProcessGrant {
        programs: vec!["bash".into()],
        working_dirs: vec![std::env::temp_dir()],
        limits: ProcessLimits { kill_grace_ms: 3_000, ..ProcessLimits::default() },
        // The tests' spawn requests mark their processes (see `marker`).
        env: crate::EnvPolicy { plugin_may_set: vec![ProcessMark::NAME.into()], ..Default::default() },
        ..ProcessGrant::default()
    }
}

use crate::testing::procfs::{self, ESCAPEES, ProcessMark};

/// A marker unique to one test, put into the environment of its processes.
fn marker(test: &str) -> ProcessMark {
    ProcessMark::new(test)
}

fn bash(script: &str, mark: &ProcessMark) -> SpawnRequest {
    SpawnRequest {
        argv: vec!["bash".into(), "-c".into(), script.into()],
        env: vec![(mark.name.clone(), mark.value.clone())],
        ..Default::default()
    }
}

/// Pids of processes (zombies included) in process group `pgid`: the keeper
/// and init, which never exec and so carry no marker, are found this way.
fn in_group(pgid: u32) -> Vec<u32> {
    procfs::all_pids().into_iter().filter(|pid| procfs::stat_field(*pid, 2) == Some(pgid)).collect()
}

/// Waits up to 5 s for every marked process to be gone.
async fn assert_no_marked(mark: &ProcessMark) {
    mark.assert_none_within(Duration::from_secs(5)).await;
}

/// Waits up to 5 s until neither marked processes nor members of the tree's
/// process group exist.
async fn assert_tree_gone(mark: &ProcessMark, pgid: u32) {
    assert_no_marked(mark).await;
    for _ in 0..100 {
        if in_group(pgid).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("leaked processes in group {pgid}: {:?}", in_group(pgid));
}

/// Waits until at least `n` marked processes run (the tree is set up).
async fn await_marked(mark: &ProcessMark, n: usize) {
    mark.await_at_least(n, Duration::from_secs(5)).await;
}

/// Reads a process to its end: every chunk of stdout and stderr, in order.
async fn drain(process: &Process) -> (Vec<u8>, Vec<u8>, Vec<StreamChunk>, ExitStatus) {
    let (mut out, mut err, mut chunks) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        tokio::time::timeout(Duration::from_secs(20), process.ready()).await.expect("process got stuck");
        let status = process.exit_status();
        let o = process.read(Stream::Stdout);
        let e = process.read(Stream::Stderr);
        out.extend_from_slice(&o.data);
        err.extend_from_slice(&e.data);
        chunks.push(o);
        chunks.push(e);
        if let Some(status) = status {
            return (out, err, chunks, status);
        }
    }
}

/// Reads stdout until it holds `want` (or the process ends), returning all of it.
async fn read_until(process: &Process, out: &mut String, want: &str) {
    while !out.contains(want) {
        tokio::time::timeout(Duration::from_secs(20), process.ready()).await.expect("no output came");
        out.push_str(&String::from_utf8_lossy(&process.read(Stream::Stdout).data));
        if process.exit_status().is_some() {
            out.push_str(&String::from_utf8_lossy(&process.read(Stream::Stdout).data));
            assert!(out.contains(want), "the process ended without printing {want:?}: {out:?}");
        }
    }
}

#[tokio::test]
async fn deltas_never_repeat_or_lose_a_byte() {
    let host = host();
    let mut grant = bash_grant();
    grant.limits.memory_cap_bytes = 4 << 20;
    let mark = marker("deltas");
    let script = "for i in $(seq 1 30000); do echo \"line $i\"; if (( i % 5000 == 0 )); then sleep 0.05; fi; done";
    let process = host.spawn(&grant, bash(script, &mark), &tracing::Span::none()).await.unwrap();
    let (out, err, chunks, status) = drain(&process).await;
    let expected: String = (1..=30000).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8(out).unwrap(), expected);
    assert!(err.is_empty());
    assert_eq!(status, ExitStatus::Code(0));
    let nonempty = chunks.iter().filter(|c| !c.data.is_empty()).count();
    assert!(nonempty >= 3, "expected several deltas, got {nonempty}");
    assert!(chunks.iter().all(|c| !c.dropped && c.spill_path.is_none()));
    // Consuming: nothing is left to read.
    assert!(process.read(Stream::Stdout).data.is_empty());
}

#[tokio::test]
async fn stderr_is_its_own_stream() {
    let host = host();
    let mark = marker("stderr");
    let process = host
        .spawn(&bash_grant(), bash("echo out; echo err >&2; echo out2", &mark), &tracing::Span::none())
        .await
        .unwrap();
    let (out, err, _, status) = drain(&process).await;
    assert_eq!(out, b"out\nout2\n");
    assert_eq!(err, b"err\n");
    assert_eq!(status, ExitStatus::Code(0));
}

#[tokio::test]
async fn overflow_spills_the_full_output_and_flags_the_drop() {
    let host = host();
    let mark = marker("spill");
    let script = "for i in $(seq 1 40000); do echo \"row $i\"; done";
    let process = host.spawn(&bash_grant(), bash(script, &mark), &tracing::Span::none()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), process.finished()).await.unwrap();
    let chunk = process.read(Stream::Stdout);
    let expected: String = (1..=40000).map(|i| format!("row {i}\n")).collect();
    assert!(chunk.dropped, "a late reader must be told output was dropped");
    assert_eq!(chunk.data.len(), grant::DEFAULT_MEMORY_CAP);
    assert!(expected.as_bytes().ends_with(&chunk.data), "memory keeps the tail");
    let path = chunk.spill_path.expect("spill path");
    assert!(path.starts_with(host.spill_dir()));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), expected);
    // The file lives as long as someone holds it, then goes.
    let files = process.spill_files();
    drop(process);
    assert!(path.exists());
    drop(files);
    assert!(!path.exists());
}

#[tokio::test]
async fn exit_codes_and_signals_are_reported() {
    let host = host();
    let mark = marker("codes");
    for (script, expected) in [
        ("exit 3", ExitStatus::Code(3)),
        ("true", ExitStatus::Code(0)),
        ("kill -TERM $$", ExitStatus::Signal(libc::SIGTERM)),
        ("kill -KILL $$", ExitStatus::Signal(libc::SIGKILL)),
    ] {
        let process = host.spawn(&bash_grant(), bash(script, &mark), &tracing::Span::none()).await.unwrap();
        let (_, _, _, status) = drain(&process).await;
        assert_eq!(status, expected, "{script}");
    }
    assert_eq!(ExitStatus::Signal(libc::SIGTERM).to_string(), "signal: SIGTERM");
    assert_eq!(ExitStatus::Code(2).to_string(), "exit code: 2");
}

#[tokio::test]
async fn stdin_is_dev_null_and_terminal_is_model_friendly() {
    let host = host();
    let mark = marker("stdin");
    let script = "cat; echo \"[$NO_COLOR $TERM $PAGER $GIT_PAGER]\"; readlink /proc/self/fd/0";
    let process = host.spawn(&bash_grant(), bash(script, &mark), &tracing::Span::none()).await.unwrap();
    let (out, _, _, status) = drain(&process).await;
    assert_eq!(String::from_utf8(out).unwrap(), "[1 dumb cat cat]\n/dev/null\n");
    assert_eq!(status, ExitStatus::Code(0));
}

#[tokio::test]
async fn kill_ends_the_whole_tree_with_sigterm() {
    let host = host();
    let mark = marker("kill-tree");
    let script = "sleep 1000 & sleep 1000 & (sleep 1000; true) & wait";
    let process = host.spawn(&bash_grant(), bash(script, &mark), &tracing::Span::none()).await.unwrap();
    await_marked(&mark, 4).await;
    process.kill();
    process.kill(); // idempotent
    let (_, _, _, status) = drain(&process).await;
    assert_eq!(status, ExitStatus::Signal(libc::SIGTERM));
    assert!(process.kill_requested());
    assert_no_marked(&mark).await;
}

#[tokio::test]
async fn sigterm_is_graceful_then_sigkill_after_the_grace() {
    let host = host();
    let mut grant = bash_grant();
    // Cleans up on TERM within the grace: its own exit code wins. A long
    // grace, so a loaded machine's scheduling never turns it into a KILL
    // (the exit ends the wait long before).
    grant.limits.kill_grace_ms = 30_000;
    let mark = marker("grace");
    let polite = "trap 'echo cleaning; exit 7' TERM; echo ready; sleep 1000 & wait";
    let process = host.spawn(&grant, bash(polite, &mark), &tracing::Span::none()).await.unwrap();
    let mut out = String::new();
    read_until(&process, &mut out, "ready\n").await;
    await_marked(&mark, 2).await;
    process.kill();
    let (rest, _, _, status) = drain(&process).await;
    out.push_str(&String::from_utf8_lossy(&rest));
    assert_eq!((out.as_str(), status), ("ready\ncleaning\n", ExitStatus::Code(7)));
    // Ignores TERM: SIGKILL after the grace.
    grant.limits.kill_grace_ms = 300;
    let stubborn = "trap '' TERM; echo ready; while true; do sleep 0.05; done";
    let process = host.spawn(&grant, bash(stubborn, &mark), &tracing::Span::none()).await.unwrap();
    // "ready" comes after the trap is set: a TERM before it would end bash.
    read_until(&process, &mut String::new(), "ready\n").await;
    let started = std::time::Instant::now();
    process.kill();
    let (_, _, _, status) = drain(&process).await;
    assert_eq!(status, ExitStatus::Signal(libc::SIGKILL));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_no_marked(&mark).await;
}

#[tokio::test]
async fn timeout_kills_the_tree_and_says_so() {
    let host = host();
    let mark = marker("timeout");
    let request = SpawnRequest { timeout: Some(Duration::from_millis(200)), ..bash("sleep 1000 & wait", &mark) };
    let process = host.spawn(&bash_grant(), request, &tracing::Span::none()).await.unwrap();
    let (_, _, _, status) = drain(&process).await;
    assert!(process.timed_out());
    assert_eq!(status, ExitStatus::Signal(libc::SIGTERM));
    assert_no_marked(&mark).await;
}

#[tokio::test]
async fn the_grant_refuses_clearly() {
    let host = host();
    let mark = marker("refuse");
    let span = tracing::Span::none();
    let err = host
        .spawn(&bash_grant(), SpawnRequest { argv: vec!["env".into()], ..Default::default() }, &span)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("refuses program \"env\"") && text.contains("allowed programs: bash"), "{text}");
    let err = host.spawn(&ProcessGrant::default(), bash("true", &mark), &span).await.unwrap_err();
    assert!(err.to_string().contains("allows no programs"), "{err}");
    let request = SpawnRequest { cwd: Some("/".into()), ..bash("true", &mark) };
    let err = host.spawn(&bash_grant(), request, &span).await.unwrap_err();
    assert!(err.to_string().contains("refuses working directory \"/\""), "{err}");
    let request = SpawnRequest { cwd: Some("..".into()), ..bash("true", &mark) };
    assert!(matches!(host.spawn(&bash_grant(), request, &span).await, Err(SpawnError::Refused(_))));
    let err = host.spawn(&bash_grant(), SpawnRequest::default(), &span).await.unwrap_err();
    assert!(matches!(err, SpawnError::Refused(Refusal::EmptyArgv)));
    assert!(mark.pids().is_empty());
}

#[tokio::test]
async fn working_directory_follows_the_grant() {
    let host = host();
    let mark = marker("cwd");
    let dir = std::env::temp_dir().join(format!("taskhost-cwd-test-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let grant = ProcessGrant { working_dirs: vec![dir.clone()], ..bash_grant() };
    let request = SpawnRequest { cwd: Some("sub".into()), ..bash("pwd", &mark) };
    let process = host.spawn(&grant, request, &tracing::Span::none()).await.unwrap();
    let (out, _, _, _) = drain(&process).await;
    assert_eq!(String::from_utf8(out).unwrap().trim(), dir.join("sub").canonicalize().unwrap().to_str().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

fn require_pid_namespaces() {
    if !confine::support().pid_namespace {
        assert!(
            std::env::var_os("TASKHOST_ALLOW_NO_PIDNS").is_some(),
            "PID namespaces are unavailable here; set TASKHOST_ALLOW_NO_PIDNS=1 to accept that setsid \
             escapees can outlive their task ({})",
            confine::support().describe()
        );
    }
}

#[tokio::test]
async fn no_leak_after_kill_including_setsid_and_double_fork() {
    require_pid_namespaces();
    if !confine::support().pid_namespace {
        return;
    }
    let host = host();
    let mark = marker("leak-kill");
    let process = host.spawn(&bash_grant(), bash(ESCAPEES, &mark), &tracing::Span::none()).await.unwrap();
    assert!(process.confinement().pid_namespace);
    await_marked(&mark, 4).await;
    let pgid = process.pid();
    assert!(in_group(pgid).len() >= 3, "keeper, init and the command share the group");
    process.kill();
    let (_, _, _, status) = drain(&process).await;
    assert_eq!(status, ExitStatus::Signal(libc::SIGTERM));
    assert_tree_gone(&mark, pgid).await;
}

#[tokio::test]
async fn no_leak_after_drop_including_setsid_and_double_fork() {
    require_pid_namespaces();
    if !confine::support().pid_namespace {
        return;
    }
    let host = host();
    let mark = marker("leak-drop");
    let process = host.spawn(&bash_grant(), bash(ESCAPEES, &mark), &tracing::Span::none()).await.unwrap();
    await_marked(&mark, 4).await;
    let pgid = process.pid();
    drop(process);
    assert_tree_gone(&mark, pgid).await;
}

#[tokio::test]
async fn no_leak_after_the_command_exits_on_its_own() {
    require_pid_namespaces();
    if !confine::support().pid_namespace {
        return;
    }
    let host = host();
    let mark = marker("leak-exit");
    let script = "setsid sleep 1000 & ( (sleep 1000 &) & ); sleep 0.3; exit 4";
    let process = host.spawn(&bash_grant(), bash(script, &mark), &tracing::Span::none()).await.unwrap();
    let (_, _, _, status) = drain(&process).await;
    assert_eq!(status, ExitStatus::Code(4));
    assert_tree_gone(&mark, process.pid()).await;
}

#[tokio::test]
async fn kill_all_ends_every_tree() {
    let host = host();
    let mark = marker("kill-all");
    let process = host.spawn(&bash_grant(), bash("sleep 1000 & wait", &mark), &tracing::Span::none()).await.unwrap();
    await_marked(&mark, 2).await;
    assert!(kill_all() >= 1);
    let (_, _, _, status) = drain(&process).await;
    assert_eq!(status, ExitStatus::Signal(libc::SIGKILL));
    assert_no_marked(&mark).await;
}

#[tokio::test]
async fn without_a_pid_namespace_the_group_still_dies() {
    let host = host();
    let mark = marker("no-pidns");
    let grant = ProcessGrant { pid_namespace: false, ..bash_grant() };
    let process =
        host.spawn(&grant, bash("sleep 1000 & echo started; wait", &mark), &tracing::Span::none()).await.unwrap();
    assert!(!process.confinement().pid_namespace);
    await_marked(&mark, 2).await;
    // `sleep` runs before `echo`: killed earlier, bash would never print.
    let mut out = String::new();
    read_until(&process, &mut out, "started\n").await;
    process.kill();
    let (rest, _, _, status) = drain(&process).await;
    out.push_str(&String::from_utf8_lossy(&rest));
    assert_eq!(out, "started\n");
    assert_eq!(status, ExitStatus::Signal(libc::SIGTERM));
    assert_no_marked(&mark).await;
}

#[tokio::test]
async fn no_network_unless_granted() {
    if !confine::support().net_namespace {
        return; // the probe logged it; the spawn below would run with the host network
    }
    let host = host();
    let mark = marker("net");
    let script = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '";
    let process = host.spawn(&bash_grant(), bash(script, &mark), &tracing::Span::none()).await.unwrap();
    assert!(process.confinement().net_namespace);
    let (out, _, _, _) = drain(&process).await;
    assert_eq!(String::from_utf8(out).unwrap(), "lo\n");
    let grant = ProcessGrant { network: true, ..bash_grant() };
    let process = host.spawn(&grant, bash(script, &mark), &tracing::Span::none()).await.unwrap();
    assert!(!process.confinement().net_namespace);
    let (out, _, _, _) = drain(&process).await;
    let host_ifaces = std::fs::read_to_string("/proc/self/net/dev").unwrap().lines().skip(2).count();
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), host_ifaces);
}

#[tokio::test]
async fn writes_are_confined_to_the_workspace_and_the_granted_paths() {
    let host = host();
    let mark = marker("landlock");
    // Outside /tmp: the tree's /tmp is private, a write there would never
    // reach the host whatever the rules.
    let base = std::path::PathBuf::from(format!("/var/tmp/taskhost-landlock-test-{}", std::process::id()));
    let (work, extra, outside) = (base.join("work"), base.join("rw"), base.join("other"));
    for dir in [&work, &extra, &outside] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let grant =
        ProcessGrant { working_dirs: vec![work.clone()], read_write_paths: vec![extra.clone()], ..bash_grant() };
    let script = format!(
        "echo a > ws && echo a > {}/ok && echo wrote-inside; echo b > {}/no 2>/dev/null || echo denied-outside; \
         cat /etc/hostname >/dev/null && echo read-ok",
        extra.display(),
        outside.display()
    );
    let process = host.spawn(&grant, bash(&script, &mark), &tracing::Span::none()).await.unwrap();
    let (out, _, _, _) = drain(&process).await;
    assert_eq!(String::from_utf8(out).unwrap(), "wrote-inside\ndenied-outside\nread-ok\n");
    assert!(work.join("ws").exists() && extra.join("ok").exists());
    assert!(!outside.join("no").exists());
    std::fs::remove_dir_all(&base).unwrap();
}

/// Not a test by itself: the stand-in host of `no_leak_when_the_host_dies`,
/// which runs this test binary again with `--ignored --exact` on this name.
/// It starts a tree that leaves escapees behind, says so, and waits to be
/// killed. Ignored because run on its own it would only sit for 1 000 s
/// (without the parent's mark it returns at once, proving nothing).
#[tokio::test]
#[ignore = "helper process of no_leak_when_the_host_dies"]
async fn helper_host_that_gets_killed() {
    let (Ok(value), Some(root)) = (std::env::var("TASKHOST_HELPER_MARK"), std::env::var_os("TASKHOST_HELPER_SPILL"))
    else {
        return;
    };
    let host = ProcessHost::new(&ProcessHostConfig { spill_root: Some(root.into()), ..Default::default() }).unwrap();
    let mark = ProcessMark::with_value(value);
    let _process = host.spawn(&bash_grant(), bash(ESCAPEES, &mark), &tracing::Span::none()).await.unwrap();
    await_marked(&mark, 4).await;
    println!("helper-ready");
    tokio::time::sleep(Duration::from_secs(1000)).await;
}

#[tokio::test]
async fn no_leak_when_the_host_dies() {
    require_pid_namespaces();
    if !confine::support().pid_namespace {
        return;
    }
    for signal in [libc::SIGKILL, libc::SIGTERM] {
        let mark = marker(&format!("host-dies-{signal}"));
        let spill_root = std::env::temp_dir().join(format!("taskhost-host-dies-{}-{signal}", std::process::id()));
        std::fs::create_dir_all(&spill_root).unwrap();
        let mut helper = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "tests::helper_host_that_gets_killed", "--ignored", "--nocapture"])
            .env("TASKHOST_HELPER_MARK", &mark.value)
            .env("TASKHOST_HELPER_SPILL", &spill_root)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        await_marked(&mark, 4).await;
        let helper_pid = helper.id().unwrap();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(helper_pid as i32, signal) };
        helper.wait().await.unwrap();
        assert_no_marked(&mark).await;
        // The dead host could not remove its spill directory; the next host does.
        let prefix = format!("taskhost-{helper_pid}-");
        let stale = || {
            std::fs::read_dir(&spill_root)
                .unwrap()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        };
        assert!(stale(), "the killed helper left its spill directory");
        // A spill root of its own: hosts of tests running alongside would
        // clean up the dead helper's directory in the default one.
        let host = ProcessHost::new(&ProcessHostConfig { spill_root: Some(spill_root.clone()), ..Default::default() })
            .unwrap();
        host.wait_for_spill_cleanup();
        drop(host);
        assert!(!stale(), "a new host removes the spill directory of a dead one");
        std::fs::remove_dir_all(&spill_root).unwrap();
    }
}

/// Spill files live in a private directory per owner: the owner's own trees
/// read theirs (read-only), another owner's trees see nothing of them, and
/// the directory goes with its last holder (the host holds the most recent
/// owners' ones between their tasks).
#[tokio::test]
async fn spill_files_are_private_to_their_owner() {
    if !confine::support().mount_namespace {
        return; // the probe logged it: trees see the host's files
    }
    let host = host();
    let mark = marker("spill-owner");
    let (alice, bob) = (host.owner_spill("alice").unwrap(), host.owner_spill("bob").unwrap());
    assert_ne!(alice.dir(), bob.dir());
    let grant = bash_grant();
    let request = SpawnRequest { memory_cap: Some(100), ..bash("seq 1 1000", &mark) };
    let process = host.spawn_for(&alice, &grant, request, &tracing::Span::none()).await.unwrap();
    let (_, _, chunks, _) = drain(&process).await;
    let spill = chunks.iter().find_map(|c| c.spill_path.clone()).expect("the output spilled");
    assert!(spill.starts_with(alice.dir()));
    let files = process.spill_files();
    drop(process);
    let run = |owner: &Arc<OwnerSpill>, script: String| {
        let (host, grant, owner, mark) = (host.clone(), grant.clone(), owner.clone(), mark.clone());
        async move {
            let process = host.spawn_for(&owner, &grant, bash(&script, &mark), &tracing::Span::none()).await.unwrap();
            let (out, _, _, _) = drain(&process).await;
            String::from_utf8(out).unwrap()
        }
    };
    let probe = format!(
        "tail -n 1 {0} 2>/dev/null || echo unreadable; echo x >> {0} 2>/dev/null && echo wrote || echo read-only; \
         ls {1} 2>/dev/null | wc -l",
        spill.display(),
        host.spill_dir().display()
    );
    // Alice's tree: her file, read-only; the spill directory shows only hers.
    assert_eq!(run(&alice, probe.clone()).await, "1000\nread-only\n1\n");
    // Bob's tree: nothing of Alice's.
    assert_eq!(run(&bob, probe).await, "unreadable\nread-only\n1\n");
    assert!(std::fs::read_to_string(&spill).unwrap().ends_with("1000\n"), "the file is untouched");
    drop(files);
    assert!(!spill.exists(), "the file goes with its last holder");
    let dir = alice.dir().to_path_buf();
    drop(alice);
    assert!(dir.exists(), "the host keeps a recent owner's directory for her next task");
    assert_eq!(host.owner_spill("alice").unwrap().dir(), dir, "her next task finds it");
    // Once as many other owners asked since, nothing holds it: it is gone.
    let others: Vec<_> = (0..RECENT_OWNER_SPILL_DIRS).map(|n| host.owner_spill(&format!("o{n}")).unwrap()).collect();
    assert!(!dir.exists(), "the owner's directory goes with its last holder");
    let fresh = host.owner_spill("alice").unwrap();
    assert_ne!(fresh.dir(), dir, "a new directory, made again");
    drop((others, bob));
    let dirs = std::fs::read_dir(host.spill_dir()).unwrap().filter(|e| e.as_ref().unwrap().path().is_dir()).count();
    assert!(dirs <= RECENT_OWNER_SPILL_DIRS, "at most {RECENT_OWNER_SPILL_DIRS} idle directories: {dirs}");
}
