//! The tree's private `/dev`: the few character devices a command needs, a
//! pty instance of its own, no host terminal, pty or block device.

use super::*;

fn require_mount_namespaces() {
    assert!(
        confine::support().mount_namespace,
        "these tests need mount namespaces in user namespaces (the probe says: {}); on Debian/Ubuntu: \
         sysctl kernel.unprivileged_userns_clone=1 (and on Ubuntu 24.04+ \
         kernel.apparmor_restrict_unprivileged_userns=0)",
        confine::support().describe()
    );
}

async fn run(script: &str, tag: &str) -> (String, String, ExitStatus) {
    let host = host();
    let mark = marker(tag);
    let process = host.spawn(&bash_grant(), bash(script, &mark), &tracing::Span::none()).await.unwrap();
    let (out, err, _, status) = drain(&process).await;
    (String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap(), status)
}

#[tokio::test]
async fn dev_holds_only_the_trees_own_devices() {
    require_mount_namespaces();
    let script = "ls -A /dev | tr '\\n' ' '; echo
        ls -A /dev/pts | tr '\\n' ' '; echo
        readlink /dev/ptmx /dev/fd
        echo x > /dev/null && head -c 4 /dev/urandom | wc -c && head -c 2 /dev/zero | wc -c
        (echo x > /dev/full) 2>/dev/null || echo full-refuses
        touch /dev/new 2>/dev/null || echo dev-sealed
        echo shm > /dev/shm/s && cat /dev/shm/s";
    let (out, err, status) = run(script, "dev-list").await;
    assert_eq!(status, ExitStatus::Code(0), "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero ", "{out}");
    assert_eq!(lines[1], "ptmx ", "a devpts of its own: no host pty is there\n{out}");
    assert_eq!(&lines[2..], ["pts/ptmx", "/proc/self/fd", "4", "2", "full-refuses", "dev-sealed", "shm"], "{out}");
}

/// A tree uses ptys of its own: `script` gives its command a terminal, and
/// so does Python's `pty.spawn`; the host's ptys stay out of reach.
#[tokio::test]
async fn a_tree_can_use_a_pty_of_its_own() {
    require_mount_namespaces();
    let script = "script -qc 'tty; tty' /dev/null < /dev/null | tr -d '\\r'
        python3 -c 'import pty, os; pty.spawn([\"sh\", \"-c\", \"tty\"])' < /dev/null | tr -d '\\r'
        tty || true";
    let (out, err, status) = run(script, "dev-pty").await;
    assert_eq!(status, ExitStatus::Code(0), "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["/dev/pts/0", "/dev/pts/0", "/dev/pts/0", "not a tty"], "{out}{err}");
}

/// The instance's `max` bounds the ptys one tree may hold.
#[tokio::test]
async fn a_tree_holds_at_most_its_share_of_ptys() {
    require_mount_namespaces();
    let script = "python3 -c '
import os
held = []
try:
    while True:
        held.append(os.openpty())
except OSError as e:
    print(len(held), e.errno)
'";
    let (out, err, status) = run(script, "dev-pty-max").await;
    assert_eq!(status, ExitStatus::Code(0), "{out}{err}");
    assert_eq!(out.trim(), format!("{} {}", crate::view::PTYS_PER_TREE, libc::ENOSPC), "{err}");
}
