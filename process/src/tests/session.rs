//! The tree's session: its own, without a controlling terminal, and a kill
//! that reaches the command however early it lands.

use super::*;

/// A kill right after the start (before the tree has set itself up, or
/// while it does) ends the command with SIGTERM, not SIGKILL after the
/// grace: the session exists when the spawn returns, and a SIGTERM that
/// reaches the keeper or the init before the command exists is forwarded.
#[tokio::test]
async fn a_kill_that_lands_at_once_ends_the_command_with_sigterm() {
    let host = host();
    let grace = Duration::from_secs(20);
    for pid_namespace in [true, false] {
        let grant = ProcessGrant {
            pid_namespace,
            limits: ProcessLimits { kill_grace_ms: grace.as_millis() as u64, ..ProcessLimits::default() },
            ..bash_grant()
        };
        for round in 0..25 {
            let mark = marker(&format!("kill-at-once-{pid_namespace}-{round}"));
            let process = host.spawn(&grant, bash("sleep 1000; true", &mark), &tracing::Span::none()).await.unwrap();
            process.kill();
            let started = std::time::Instant::now();
            let (_, err, _, status) = drain(&process).await;
            assert_eq!(
                status,
                ExitStatus::Signal(libc::SIGTERM),
                "round {round} (PID namespace {pid_namespace}): {}",
                String::from_utf8_lossy(&err)
            );
            assert!(started.elapsed() < grace, "the SIGTERM was lost: SIGKILL came after the grace");
            assert_no_marked(&mark).await;
        }
    }
}

/// The command leads no terminal and inherits none: no controlling
/// terminal (`/dev/tty` does not open), no blocked or ignored signals.
#[tokio::test]
async fn the_tree_has_no_controlling_terminal_and_a_clean_signal_state() {
    let host = host();
    let mark = marker("session");
    let script = "echo tty_nr:$(cut -d' ' -f7 /proc/self/stat)
        if (exec 3</dev/tty) 2>/dev/null; then echo dev_tty:open; else echo dev_tty:none; fi
        echo $(grep -E '^Sig(Blk|Ign)' /proc/self/status | tr -d '\\t')";
    let process = host.spawn(&bash_grant(), bash(script, &mark), &tracing::Span::none()).await.unwrap();
    let (out, err, _, status) = drain(&process).await;
    let out = String::from_utf8(out).unwrap();
    assert_eq!(status, ExitStatus::Code(0), "{out}{}", String::from_utf8_lossy(&err));
    assert!(out.contains("tty_nr:0\n"), "{out}");
    assert!(out.contains("dev_tty:none\n"), "{out}");
    // bash itself ignores nothing it did not choose to: SIGPIPE and the
    // kill signals reach the command at their defaults.
    assert!(out.contains("SigBlk:0000000000000000"), "{out}");
    let ignored = out.split("SigIgn:").nth(1).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).unwrap();
    for signal in [libc::SIGPIPE, libc::SIGTERM, libc::SIGHUP] {
        assert_eq!(ignored & (1 << (signal - 1)), 0, "signal {signal} ignored: {out}");
    }
}
