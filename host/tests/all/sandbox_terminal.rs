//! The server's terminal is out of every tree's reach: `taskhost serve`
//! runs with a real controlling terminal (a pty this test opens, as when an
//! agent CLI starts it from a terminal), and a command driving the default
//! `bash` tool tries what a hostile one would: push input into it
//! (`TIOCSTI`), make itself its foreground group (`tcsetpgrp`), open it or
//! another of the host's ptys by path. As this user (root in CI) and as an
//! unprivileged server (`setpriv` to 65534). A pty of the tree's own keeps
//! working.

use crate::common;

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::time::Duration;

use common::{call, only_text};
use rmcp::ServiceExt;
use serde_json::json;

const NOBODY: u32 = 65534;

/// A pty pair: the master, the slave, and the slave's path.
struct Pty {
    master: OwnedFd,
    slave: OwnedFd,
    path: String,
}

fn open_pty() -> Pty {
    // SAFETY: plain libc calls; every result is checked and the descriptors owned.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(master >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(master, name.as_mut_ptr(), name.len()), 0);
        let path = std::ffi::CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
        let slave = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(slave >= 0, "open {path}: {}", std::io::Error::last_os_error());
        Pty { master: OwnedFd::from_raw_fd(master), slave: OwnedFd::from_raw_fd(slave), path }
    }
}

fn attack_script(host_pty: &str) -> String {
    let py = "/usr/bin/python3";
    format!(
        r#"r() {{ if eval "$2" >/dev/null 2>&1; then echo "$1:yes"; else echo "$1:no"; fi; }}
echo "tty_nr:$(cut -d' ' -f7 /proc/self/stat)"
r open_dev_tty "exec 3<>/dev/tty"
r open_host_pty "exec 3<>{host_pty}"
echo "pts:$(ls -A /dev/pts | tr '\n' ' ')"
r tiocsti_dev_tty "{py} -c 'import fcntl, termios, os; fcntl.ioctl(os.open(\"/dev/tty\", os.O_RDWR), termios.TIOCSTI, b\"x\")'"
r tiocsti_stdio "{py} -c 'import fcntl, termios; [fcntl.ioctl(f, termios.TIOCSTI, b\"x\") for f in (0, 1, 2)]'"
r tcsetpgrp "{py} -c 'import os; os.tcsetpgrp(os.open(\"/dev/tty\", os.O_RDWR), os.getpgrp())'"
echo "own_pty:$(script -qc tty /dev/null < /dev/null | tr -d '\r')"
"#
    )
}

/// Starts `taskhost serve` (as `uid` when given) with the slave of `pty`
/// as its controlling terminal, runs the attacks, and returns their results.
async fn attack(tag: &str, uid: Option<u32>, pty: &Pty) -> (BTreeMap<String, String>, String) {
    let base = common::temp_dir(tag);
    let workspace = base.join("work");
    std::fs::create_dir_all(&workspace).unwrap();
    if let Some(uid) = uid {
        for path in [&base, &workspace] {
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
        }
    }
    let mut command = common::serve_stdio_as(uid, &base, &workspace, &base);
    let slave = pty.slave.as_raw_fd();
    // SAFETY: setsid and ioctl are async-signal-safe; `slave` stays open in
    // the parent for the duration of the spawn.
    unsafe {
        command.as_std_mut().pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(slave, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("spawn taskhost serve");
    let server_pid = child.id().unwrap();
    // The server (setpriv's exec: the same pid) holds the pty as its terminal.
    let stat = std::fs::read_to_string(format!("/proc/{server_pid}/stat")).unwrap();
    let tty_nr: u64 = stat.rsplit(')').next().unwrap().split_whitespace().nth(4).unwrap().parse().unwrap();
    assert_ne!(tty_nr, 0, "the server must have a controlling terminal for this test to mean anything");
    let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = ().serve((stdout, stdin)).await.expect("initialize over stdio");
    let raw = only_text(&call(client.peer(), "bash", json!({ "command": attack_script(&pty.path) })).await);
    let results = raw
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| !k.starts_with('[') && !k.contains(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let _ = client.cancel().await;
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("server exits").unwrap();
    let log = std::fs::read_to_string(base.join("stderr.log")).unwrap_or_default();
    assert!(status.success(), "server exit {status}; log:\n{log}");
    let _ = std::fs::remove_dir_all(&base);
    (results, raw)
}

fn check(results: &BTreeMap<String, String>, raw: &str, pty: &Pty) {
    let get = |k: &str| results.get(k).cloned().unwrap_or_else(|| panic!("no result for {k}; output:\n{raw}"));
    let expect = |k: &str, v: &str| assert_eq!(get(k), v, "{k}; output:\n{raw}");
    expect("tty_nr", "0");
    for attack in ["open_dev_tty", "open_host_pty", "tiocsti_dev_tty", "tiocsti_stdio", "tcsetpgrp"] {
        expect(attack, "no");
    }
    expect("pts", "ptmx ");
    expect("own_pty", "/dev/pts/0");
    // Nothing was pushed into the terminal's input.
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD into a local on our own descriptor.
    assert_eq!(unsafe { libc::ioctl(pty.slave.as_raw_fd(), libc::FIONREAD, &mut queued) }, 0);
    assert_eq!(queued, 0, "input was injected into the server's terminal");
    let _ = &pty.master;
}

#[tokio::test]
async fn the_servers_terminal_is_out_of_reach_with_the_server_as_this_user() {
    let pty = open_pty();
    let (results, raw) = attack("terminal-self", None, &pty).await;
    check(&results, &raw, &pty);
}

#[tokio::test]
async fn the_servers_terminal_is_out_of_reach_with_an_unprivileged_server() {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    assert_eq!(
        uid, 0,
        "this test runs the server as another user through setpriv, which needs root (CI runs as root); \
         run the suite as root"
    );
    let pty = open_pty();
    let (results, raw) = attack("terminal-nobody", Some(NOBODY), &pty).await;
    check(&results, &raw, &pty);
}
