//! The warm keeper ([`taskhost_process::zygote`]) with real processes, in a
//! binary that opted into keeper mode as `taskhost` does (so `harness =
//! false`: `main` must call `run_if_keeper` before anything else).
//!
//! Checks: a start through the zygote runs confined (the same checks as the
//! sandbox suites: descriptors, seccomp, capabilities, `/proc`, network,
//! writes), a failing exec fails the process with the reason, the zygote is
//! replaced after use, a waiting zygote holds no environment and no extra
//! descriptor and dies with its host (SIGKILL), a zygote gone before its
//! hand-off costs nothing but the exec'd keeper, and repeated failures
//! degrade once to the exec'd keeper. As root, the same checks run again
//! with this binary as an unprivileged user (`setpriv` to 65534).
//!
//! Synchronisation is by pidfd readiness and pipes, never by sleeping. The
//! harness is libtest-mimic's (the usual flags, filters and `--list`), with
//! one test thread: the checks run in the order below.

use std::io::{BufRead, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::Trial;
use taskhost_process::{
    ExitStatus, Process, ProcessGrant, ProcessHost, ProcessHostConfig, SpawnRequest, StdinMode, Stream, confine,
    keeper, zygote,
};

const NOBODY: u32 = 65534;
/// In this binary's environment (a name the allowlist never passes): no tree
/// may find it.
const SECRET: &str = "hunter2-warm-keeper";
const READY: Duration = Duration::from_secs(20);

fn main() {
    keeper::run_if_keeper();
    // SAFETY: no other thread exists yet.
    unsafe { std::env::set_var("TASKHOST_WARM_SECRET", SECRET) };
    match std::env::var("TASKHOST_WARM_MODE").as_deref() {
        Ok("helper-host") => return helper_host(),
        Ok("unprivileged") => {
            runtime().block_on(confined_checks("unprivileged"));
            println!("unprivileged-ok");
            return;
        }
        _ => {}
    }
    let mut args = libtest_mimic::Arguments::from_args();
    // One at a time, in this order: the checks share the process's warm
    // keeper pool, and the last zygote check turns it off for the process.
    // (cargo-nextest runs each in a process of its own: then order is moot.)
    args.test_threads = Some(1);
    let runtime = Arc::new(runtime());
    let on = |runtime: &Arc<tokio::runtime::Runtime>, future: fn() -> BoxedCheck| {
        let runtime = runtime.clone();
        move || {
            runtime.block_on(future());
            Ok(())
        }
    };
    let trials = vec![
        Trial::test("a_warm_start_is_confined", on(&runtime, || Box::pin(confined_checks("this user")))),
        Trial::test(
            "a_failing_exec_fails_the_process_with_the_reason",
            on(&runtime, || Box::pin(a_failing_exec_fails_the_process_with_the_reason())),
        ),
        Trial::test("the_zygote_holds_nothing_and_dies_with_the_host", || {
            the_zygote_holds_nothing_and_dies_with_the_host();
            Ok(())
        }),
        Trial::test(
            "a_zygote_gone_before_its_hand_off_costs_only_the_exec",
            on(&runtime, || Box::pin(a_zygote_gone_before_its_hand_off_costs_only_the_exec())),
        ),
        Trial::test(
            "with_the_ack_wait_starts_run_and_a_dead_zygote_still_falls_back",
            on(&runtime, || Box::pin(with_the_ack_wait_starts_run_and_a_dead_zygote_still_falls_back())),
        ),
        Trial::test(
            "a_kill_that_lands_at_once_ends_the_command_with_sigterm",
            on(&runtime, || Box::pin(a_kill_that_lands_at_once_ends_the_command_with_sigterm())),
        ),
        Trial::test(
            "repeated_failures_degrade_once_to_the_exec_keeper",
            on(&runtime, || Box::pin(repeated_failures_degrade_once_to_the_exec_keeper())),
        ),
        Trial::test("a_warm_start_is_confined_with_an_unprivileged_host", || {
            unprivileged_run();
            Ok(())
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}

type BoxedCheck = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime")
}

fn host() -> Arc<ProcessHost> {
    ProcessHost::new(&ProcessHostConfig::default()).expect("process host")
}

fn grant(work: &Path) -> ProcessGrant {
    ProcessGrant { programs: vec!["bash".into()], working_dirs: vec![work.to_path_buf()], ..ProcessGrant::default() }
}

fn bash(script: &str) -> SpawnRequest {
    SpawnRequest { argv: vec!["bash".into(), "-c".into(), script.into()], ..Default::default() }
}

async fn drain(process: &Process) -> (String, String, ExitStatus) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        process.ready().await;
        let status = process.exit_status();
        out.extend(process.read(Stream::Stdout).data);
        err.extend(process.read(Stream::Stderr).data);
        if let Some(status) = status {
            out.extend(process.read(Stream::Stdout).data);
            err.extend(process.read(Stream::Stderr).data);
            return (String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&err).into_owned(), status);
        }
    }
}

fn pidfd(pid: u32) -> OwnedFd {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    assert!(fd >= 0, "pidfd_open({pid}): {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor we own.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// Whether the process behind `fd` exits within `within` (pidfd readiness).
fn exits_within(fd: &OwnedFd, within: Duration) -> bool {
    let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll on one valid pollfd.
    unsafe { libc::poll(&mut poll, 1, within.as_millis() as i32) == 1 }
}

/// A directory outside `/tmp` (a tree's `/tmp` is private) for this check.
fn scratch(tag: &str) -> PathBuf {
    let dir = PathBuf::from(format!("/var/tmp/taskhost-warm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("work")).unwrap();
    std::fs::create_dir_all(dir.join("other")).unwrap();
    dir
}

/// A start through the zygote: the tree is the zygote's pid, and it is as
/// confined as every tree (the sandbox suites' checks, through the public API).
async fn confined_checks(who: &str) {
    let host = host();
    let support = confine::support().clone();
    let base = scratch("confined");
    let (work, other) = (base.join("work"), base.join("other"));
    let z = zygote::wait_ready(READY).expect("a warm keeper is ready");
    let before = zygote::warm_starts();
    // The tree reads the pid of the zygote that waits while it runs (its
    // replacement) from stdin, and tries to reach it.
    let script = format!(
        "read next
         ls /proc/$$/fd > fds.txt; echo fds:$(tr '\\n' ' ' < fds.txt)
         echo seccomp:$(grep '^Seccomp:' /proc/self/status | cut -f2)
         echo nnp:$(grep NoNewPrivs /proc/self/status | cut -f2)
         echo capeff:$(grep CapEff /proc/self/status | cut -f2)
         echo pids:$(ls /proc | grep -c '^[0-9]')
         echo ifaces:$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' \\n')
         echo a > ws && echo write-inside:yes
         (echo b > {}/no) 2>/dev/null && echo write-outside:yes || echo write-outside:no
         echo secret:$(cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c {SECRET})
         kill -0 $next 2>/dev/null && echo zygote-signal:yes || echo zygote-signal:no
         test -e /proc/$next && echo zygote-proc:yes || echo zygote-proc:no",
        other.display()
    );
    let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash(&script) };
    let process = host.spawn(&grant(&work), request, &tracing::Span::none()).await.unwrap();
    assert_eq!(process.pid(), z, "{who}: the tree is the warm keeper's");
    assert_eq!(zygote::warm_starts(), before + 1);
    // The zygote is replaced after use: another pid, ready while the tree runs.
    let next = zygote::wait_ready(READY).expect("a replacement is ready");
    assert_ne!(next, z, "{who}: a used zygote is never reused");
    process.write_stdin(format!("{next}\n").as_bytes()).unwrap();
    process.close_stdin().unwrap();
    let (out, err, status) = drain(&process).await;
    assert_eq!(status, ExitStatus::Code(0), "{who}: {out}{err}");
    let lines: std::collections::BTreeMap<&str, &str> = out.lines().filter_map(|l| l.split_once(':')).collect();
    assert_eq!(lines["fds"].split_whitespace().collect::<Vec<_>>(), ["0", "1", "2"], "{who}: no descriptor leaks");
    assert_eq!(lines["write-inside"], "yes", "{who}");
    assert_eq!(lines["write-outside"], "no", "{who}: writes outside the workspace are refused");
    assert_eq!(lines["secret"], "0", "{who}: the host's environment is out of reach");
    assert_eq!(lines["capeff"], "0000000000000000", "{who}: no capabilities");
    if support.seccomp {
        assert_eq!(lines["seccomp"], "2", "{who}: the seccomp filter is on");
        assert_eq!(lines["nnp"], "1", "{who}");
    }
    if support.pid_namespace {
        assert_eq!(lines["zygote-signal"], "no", "{who}: the tree cannot signal the waiting zygote");
    }
    if support.fresh_proc {
        // init, bash, and the command substitution's subshell, ls and grep.
        assert!(lines["pids"].parse::<u32>().unwrap() <= 5, "{who}: a fresh /proc: {}", lines["pids"]);
        assert_eq!(lines["zygote-proc"], "no", "{who}: the waiting zygote is not in the tree's /proc");
    }
    if support.net_namespace {
        assert_eq!(lines["ifaces"], "lo", "{who}: loopback only");
    }
    assert!(!other.join("no").exists());
    assert!(work.join("ws").exists());

    let process = host.spawn(&grant(&work), bash("echo again"), &tracing::Span::none()).await.unwrap();
    assert_eq!(process.pid(), next, "{who}: the replacement takes the next tree");
    let (out, _, status) = drain(&process).await;
    assert_eq!((out.as_str(), status), ("again\n", ExitStatus::Code(0)));
    std::fs::remove_dir_all(&base).unwrap();
    println!("warm_keeper: confined start ({who}) ok");
}

/// An exec failure surfaces as the process failing with exit 127 and the
/// reason on its stderr, also through the zygote.
async fn a_failing_exec_fails_the_process_with_the_reason() {
    use std::os::unix::fs::PermissionsExt;
    let host = host();
    let base = scratch("exec");
    let program = base.join("broken");
    std::fs::write(&program, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let grant = ProcessGrant {
        programs: vec![program.display().to_string()],
        working_dirs: vec![base.join("work")],
        ..ProcessGrant::default()
    };
    let z = zygote::wait_ready(READY).expect("a warm keeper is ready");
    let request = SpawnRequest { argv: vec![program.display().to_string()], ..Default::default() };
    let process = host.spawn(&grant, request, &tracing::Span::none()).await.unwrap();
    assert_eq!(process.pid(), z);
    let (out, err, status) = drain(&process).await;
    assert_eq!(status, ExitStatus::Code(127), "{out}{err}");
    assert_eq!(err, "taskhost: cannot execute the program: errno 2\n");
    std::fs::remove_dir_all(&base).unwrap();
    println!("warm_keeper: failing exec ok");
}

/// The stand-in host of `the_zygote_holds_nothing_and_dies_with_the_host`:
/// prints its zygote's pid, then blocks reading stdin until killed.
fn helper_host() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _host = runtime.block_on(async { host() });
    let z = zygote::wait_ready(READY).expect("a warm keeper is ready");
    println!("zygote {z}");
    let _ = std::io::stdin().read(&mut [0u8; 1]);
}

/// A waiting zygote has an empty environment and only its five descriptors,
/// and dies with its host, also by SIGKILL.
fn the_zygote_holds_nothing_and_dies_with_the_host() {
    let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
        .env("TASKHOST_WARM_MODE", "helper-host")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(helper.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let z: u32 = line.trim().strip_prefix("zygote ").expect("the helper's zygote").parse().unwrap();
    let fd = pidfd(z);
    let environ = std::fs::read(format!("/proc/{z}/environ")).unwrap();
    assert!(environ.is_empty(), "a waiting zygote has no environment: {}", String::from_utf8_lossy(&environ));
    let mut fds: Vec<u32> = std::fs::read_dir(format!("/proc/{z}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
        .collect();
    fds.sort();
    // 0-2 /dev/null, 3 lifeline, 4 socket: nothing else (its own /dev/null
    // is opened once the plan came, clear of a durable K's duties at 5..=13).
    assert_eq!(fds, [0, 1, 2, 3, 4], "a waiting zygote's descriptors");
    let socket = std::fs::read_link(format!("/proc/{z}/fd/4")).unwrap();
    assert!(socket.to_string_lossy().starts_with("socket:"), "{}", socket.display());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(helper.id() as i32, libc::SIGKILL) };
    helper.wait().unwrap();
    assert!(exits_within(&fd, Duration::from_secs(10)), "the zygote outlived its host");
    println!("warm_keeper: zygote dies with the host ok");
}

/// A zygote that died while it waited: the start uses the exec'd keeper,
/// the tree runs, and the next zygote is ready.
async fn a_zygote_gone_before_its_hand_off_costs_only_the_exec() {
    let host = host();
    let base = scratch("gone");
    let z = zygote::wait_ready(READY).expect("a warm keeper is ready");
    let fd = pidfd(z);
    // SAFETY: signalling our own child (the pool reaps it).
    unsafe { libc::kill(z as i32, libc::SIGKILL) };
    assert!(exits_within(&fd, Duration::from_secs(10)));
    let before = zygote::warm_starts();
    let process = host.spawn(&grant(&base.join("work")), bash("echo ran"), &tracing::Span::none()).await.unwrap();
    assert_ne!(process.pid(), z);
    assert_eq!(zygote::warm_starts(), before, "the dead zygote took nothing");
    let (out, _, status) = drain(&process).await;
    assert_eq!((out.as_str(), status), ("ran\n", ExitStatus::Code(0)));
    assert!(zygote::available(), "one failure does not turn the warm keeper off");
    let next = zygote::wait_ready(READY).expect("a replacement is ready");
    assert_ne!(next, z);
    let process = host.spawn(&grant(&base.join("work")), bash("echo warm"), &tracing::Span::none()).await.unwrap();
    assert_eq!(process.pid(), next, "the replacement takes the next tree");
    let (out, _, status) = drain(&process).await;
    assert_eq!((out.as_str(), status), ("warm\n", ExitStatus::Code(0)));
    std::fs::remove_dir_all(&base).unwrap();
    println!("warm_keeper: dead zygote falls back ok");
}

/// With `set_await_ack(true)` the start returns once the zygote acknowledged
/// its plan (the default does not wait): the tree runs through the zygote,
/// and a zygote that died before the send costs only the exec'd keeper.
async fn with_the_ack_wait_starts_run_and_a_dead_zygote_still_falls_back() {
    let host = host();
    let base = scratch("no-ack");
    let grant = grant(&base.join("work"));
    zygote::set_await_ack(true);
    let z = zygote::wait_ready(READY).expect("a warm keeper is ready");
    let fd = pidfd(z);
    // SAFETY: signalling our own child (the pool reaps it).
    unsafe { libc::kill(z as i32, libc::SIGKILL) };
    assert!(exits_within(&fd, Duration::from_secs(10)));
    let process = host.spawn(&grant, bash("echo fell-back"), &tracing::Span::none()).await.unwrap();
    assert_ne!(process.pid(), z);
    let (out, _, status) = drain(&process).await;
    assert_eq!((out.as_str(), status), ("fell-back\n", ExitStatus::Code(0)));
    let next = zygote::wait_ready(READY).expect("a replacement is ready");
    let script = "ls /proc/$$/fd > fds.txt; echo $(cat fds.txt) $(grep '^Seccomp:' /proc/self/status | cut -f2)";
    let process = host.spawn(&grant, bash(script), &tracing::Span::none()).await.unwrap();
    assert_eq!(process.pid(), next, "the start went through the zygote");
    let (out, _, status) = drain(&process).await;
    let seccomp = if confine::support().seccomp { "2" } else { "0" };
    assert_eq!((out, status), (format!("0 1 2 {seccomp}\n"), ExitStatus::Code(0)));
    zygote::set_await_ack(false);
    std::fs::remove_dir_all(&base).unwrap();
    println!("warm_keeper: ack wait ok");
}

/// A kill right after the start ends the command with SIGTERM (not SIGKILL
/// after the grace), through a warm keeper and through the exec'd one: the
/// keeper leads its session from before the start returns, and a SIGTERM
/// that reaches it before the command exists is forwarded.
async fn a_kill_that_lands_at_once_ends_the_command_with_sigterm() {
    let host = host();
    let base = scratch("kill-at-once");
    let grace = Duration::from_secs(20);
    let grant = ProcessGrant {
        limits: taskhost_process::ProcessLimits { kill_grace_ms: grace.as_millis() as u64, ..Default::default() },
        ..grant(&base.join("work"))
    };
    for warm in [true, false] {
        zygote::set_enabled(warm);
        for round in 0..10 {
            let z = if warm { Some(zygote::wait_ready(READY).expect("a warm keeper is ready")) } else { None };
            let process = host.spawn(&grant, bash("sleep 1000; true"), &tracing::Span::none()).await.unwrap();
            process.kill();
            let started = std::time::Instant::now();
            if let Some(z) = z {
                assert_eq!(process.pid(), z, "round {round}: the start went through the zygote");
            }
            let (_, err, status) = drain(&process).await;
            assert_eq!(status, ExitStatus::Signal(libc::SIGTERM), "round {round} (warm {warm}): {err}");
            assert!(started.elapsed() < grace, "round {round} (warm {warm}): the SIGTERM was lost");
        }
    }
    zygote::set_enabled(true);
    std::fs::remove_dir_all(&base).unwrap();
    println!("warm_keeper: kill at once ok");
}

/// Three failed hand-offs in a row turn the warm keeper off (one log line);
/// trees then start through the exec'd keeper, confined as before.
async fn repeated_failures_degrade_once_to_the_exec_keeper() {
    let host = host();
    let base = scratch("degrade");
    let mut zygotes = Vec::new();
    while zygote::available() {
        let z = zygote::wait_ready(READY).expect("a warm keeper is ready");
        let fd = pidfd(z);
        // SAFETY: signalling our own child (the pool reaps it).
        unsafe { libc::kill(z as i32, libc::SIGKILL) };
        assert!(exits_within(&fd, Duration::from_secs(10)));
        let process = host.spawn(&grant(&base.join("work")), bash("echo ran"), &tracing::Span::none()).await.unwrap();
        let (out, _, status) = drain(&process).await;
        assert_eq!((out.as_str(), status), ("ran\n", ExitStatus::Code(0)));
        zygotes.push(z);
        assert!(zygotes.len() <= 3, "still on after {zygotes:?} failed");
    }
    assert_eq!(zygotes.len(), 3, "three failures in a row, counted from the last success: {zygotes:?}");
    assert!(keeper::exec_keeper_available(), "the exec'd keeper stays");
    let before = zygote::warm_starts();
    let grant = grant(&base.join("work"));
    let process = host
        .spawn(&grant, bash("ls /proc/$$/fd > fds.txt; echo ls $(cat fds.txt)"), &tracing::Span::none())
        .await
        .unwrap();
    let (out, _, status) = drain(&process).await;
    assert_eq!((out.as_str(), status), ("ls 0 1 2\n", ExitStatus::Code(0)));
    assert_eq!(zygote::warm_starts(), before);
    assert_eq!(zygote::wait_ready(Duration::from_millis(10)), None);
    std::fs::remove_dir_all(&base).unwrap();
    println!("warm_keeper: degrade ok");
}

/// As root: the confined checks again with this binary as user 65534.
fn unprivileged_run() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        println!("warm_keeper: not root, the unprivileged run is this run");
        return;
    }
    let dir = PathBuf::from(format!("/var/tmp/taskhost-warm-nobody-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    let copy = dir.join("warm_keeper");
    std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let output = std::process::Command::new("setpriv")
        .args([&format!("--reuid={NOBODY}"), &format!("--regid={NOBODY}"), "--clear-groups", "--inh-caps=-all"])
        .arg(&copy)
        .env("TASKHOST_WARM_MODE", "unprivileged")
        .current_dir(&dir)
        .output()
        .expect("setpriv");
    std::fs::remove_dir_all(&dir).unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && text.contains("unprivileged-ok"),
        "unprivileged run: {:?}\n{text}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    print!("{text}");
}
