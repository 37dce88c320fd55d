//! Escape attempts against `taskhost serve`'s default `bash` tool, run as a
//! model driving it would run them, with the server as the test's user
//! (root in CI) and as an unprivileged user (`setpriv` to 65534, no sudo).
//! Every attempt must be contained; what a command needs must keep working.
//!
//! One bash call runs every attack and prints `name:result` lines; the test
//! checks each line, then checks the host side (no file appeared in `/etc`,
//! the server's stdout carried no forged message, the client still works).

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{call, only_text};
use rmcp::ServiceExt;
use serde_json::json;

/// A canary in the server's environment (a name the scrub removes from
/// trees): no attack may print it.
const CANARY: &str = "canary-7f3a9c1e";

/// The uid/gid of the unprivileged server.
const NOBODY: u32 = 65534;

struct Attacked {
    results: BTreeMap<String, String>,
    raw: String,
    workspace: PathBuf,
    home: PathBuf,
    server_pid: u32,
}

fn attack_script(server_pid: u32, workspace: &Path, home: &Path, host_socket: &Path) -> String {
    let (w, h, sock) = (workspace.display(), home.display(), host_socket.display());
    format!(
        r#"S={server_pid}; W={w}; H={h}
r() {{ if eval "$2" >/dev/null 2>&1; then echo "$1:yes"; else echo "$1:no"; fi; }}
r nsenter_net "nsenter --net=/proc/$S/ns/net true"
r nsenter_pid1 "nsenter --net=/proc/1/ns/net --mount=/proc/1/ns/mnt true"
mkdir -p $W/mnt
r mount_tmpfs "mount -t tmpfs none $W/mnt"
r umount_tmp "umount -l /tmp"
r write_etc "echo x > /etc/taskhost-attack-$S"
r write_usr "touch /usr/taskhost-attack-$S"
echo "shadow_lines:$(cat /etc/shadow 2>/dev/null | grep -c :)"
r environ "cat /proc/$S/environ"
echo "environ_canary:$(cat /proc/$S/environ /proc/*/environ 2>/dev/null | tr '\0' '\n' | grep -c {CANARY})"
r forge_fd1 "echo '{{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":{{}}}}' > /proc/$S/fd/1"
r mem "head -c 1 /proc/$S/mem"
echo "ssh_key:$(cat $H/.ssh/id_test 2>/dev/null)"
r ssh_list "ls $H/.ssh"
r netrc_read "grep -q machine $H/.netrc"
r cache_list "ls $H/.cache/taskhost/components"
r bashrc "echo evil >> $H/.bashrc"
r autostart "mkdir -p $H/.config/autostart && touch $H/.config/autostart/x"
r host_socket "test -e {sock}"
r ws_write "echo ok > $W/written && cat $W/written"
r tmp_write "echo ok > /tmp/taskhost-private-$S && cat /tmp/taskhost-private-$S"
r git "git init -q $W/repo && git -C $W/repo -c user.email=a@b -c user.name=a commit -q --allow-empty -m x"
r pipe "seq 1 100 | grep -c 1 | grep -q 20"
ls /proc/$$/fd > $W/fds.txt
echo "host_pids:$(ls /proc | grep -c '^[0-9]')"
echo "capeff:$(grep CapEff /proc/self/status | cut -f2)"
echo "capbnd:$(grep CapBnd /proc/self/status | cut -f2)"
echo "nnp:$(grep NoNewPrivs /proc/self/status | cut -f2)"
echo "seccomp:$(grep '^Seccomp:' /proc/self/status | cut -f2)"
r unshare_user "unshare -U true"
r unshare_pid "unshare -p -f true"
for call in ptrace:101 process_vm_readv:310 keyctl:250 add_key:248 bpf:321 perf_event_open:298 init_module:175 kexec_load:246 setns:308; do
  echo "syscall_${{call%%:*}}:$(perl -e '$r = syscall($ARGV[0], 0, 0, 0, 0, 0, 0); print $r < 0 ? ($!{{EPERM}} ? "EPERM" : "error") : "allowed"' ${{call#*:}})"
done
"#
    )
}

/// Starts `taskhost serve` (as `uid` when given), runs the attacks through
/// its default bash tool, and returns what they printed.
async fn attack(tag: &str, uid: Option<u32>) -> Attacked {
    let base = common::temp_dir(tag);
    // The workspace below /tmp (it must stay reachable through the tree's
    // private /tmp); the home directory outside it, where the tree sees
    // the host's files: read-only, credentials hidden.
    let workspace = base.join("work");
    let home = Path::new("/var/tmp").join(base.file_name().unwrap()).join("home");
    let _ = std::fs::remove_dir_all(&home);
    for dir in [&workspace, &home.join(".ssh"), &home.join(".cache/taskhost/components")] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(home.join(".ssh/id_test"), "PRIVATE-KEY-CANARY").unwrap();
    std::fs::write(home.join(".netrc"), "machine example.com login a password b").unwrap();
    std::fs::write(home.join(".cache/taskhost/components/x.cwasm"), "code").unwrap();
    std::fs::write(home.join(".bashrc"), "# clean\n").unwrap();
    // A host Unix socket outside the workspace, as tmux or ssh-agent keep.
    let socket_dir = common::temp_dir(&format!("{tag}-sock"));
    let host_socket = socket_dir.join("S");
    let _listener = std::os::unix::net::UnixListener::bind(&host_socket).unwrap();
    if let Some(uid) = uid {
        for path in [&base, &socket_dir, &home] {
            chown_tree(path, uid);
        }
    }

    let mut command = common::taskhost_as(uid, &base);
    command
        .arg("serve")
        .current_dir(&workspace)
        .env("HOME", &home)
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("CANARY_TOKEN", CANARY)
        .env("RUST_LOG", "info,taskhost=debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(common::log_file(&base))
        .kill_on_drop(true);
    let mut child = command.spawn().expect("spawn taskhost serve");
    let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = ().serve((stdout, stdin)).await.expect("initialize over stdio");
    let peer = client.peer().clone();
    let server_pid = child.id().unwrap();
    // Through setpriv, the server is setpriv's exec: the same pid.
    let script = attack_script(server_pid, &workspace, &home, &host_socket);
    let raw = only_text(&call(&peer, "bash", json!({ "command": script })).await);
    // The client still works: nothing forged reached the stream.
    assert_eq!(
        only_text(&call(&peer, "bash", json!({"command": "echo still-here"})).await),
        "still-here\n[status: completed, exit code: 0]"
    );
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
    let _ = std::fs::remove_dir_all(&socket_dir);
    Attacked { results, raw, workspace, home, server_pid }
}

fn chown_tree(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap().flatten() {
            chown_tree(&entry.path(), uid);
        }
    }
}

fn check(attacked: &Attacked) {
    let get = |k: &str| {
        attacked.results.get(k).cloned().unwrap_or_else(|| panic!("no result for {k}; output:\n{}", attacked.raw))
    };
    let expect = |k: &str, v: &str| assert_eq!(get(k), v, "{k}; output:\n{}", attacked.raw);
    // Contained.
    for k in [
        "nsenter_net",
        "nsenter_pid1",
        "mount_tmpfs",
        "umount_tmp",
        "write_etc",
        "write_usr",
        "environ",
        "forge_fd1",
        "mem",
        "ssh_list",
        "netrc_read",
        "cache_list",
        "bashrc",
        "autostart",
        "host_socket",
        "unshare_user",
        "unshare_pid",
    ] {
        expect(k, "no");
    }
    expect("shadow_lines", "0");
    expect("environ_canary", "0");
    expect("ssh_key", "");
    expect("capeff", "0000000000000000");
    expect("capbnd", "0000000000000000");
    expect("nnp", "1");
    expect("seccomp", "2");
    for call in [
        "ptrace",
        "process_vm_readv",
        "keyctl",
        "add_key",
        "bpf",
        "perf_event_open",
        "init_module",
        "kexec_load",
        "setns",
    ] {
        expect(&format!("syscall_{call}"), "EPERM");
    }
    // Only the tree's own processes are in its /proc: bash, the init, and
    // the few the script runs at a time.
    let pids: usize = get("host_pids").parse().unwrap();
    assert!(pids < 8, "the tree sees {pids} processes; output:\n{}", attacked.raw);
    // Still working.
    for k in ["ws_write", "tmp_write", "git", "pipe"] {
        expect(k, "yes");
    }
    // The host side.
    assert!(!Path::new(&format!("/etc/taskhost-attack-{}", attacked.server_pid)).exists());
    assert!(!Path::new(&format!("/tmp/taskhost-private-{}", attacked.server_pid)).exists(), "/tmp is private");
    assert_eq!(std::fs::read_to_string(attacked.home.join(".bashrc")).unwrap(), "# clean\n");
    assert!(!attacked.home.join(".config/autostart").exists());
    assert_eq!(std::fs::read_to_string(attacked.workspace.join("written")).unwrap(), "ok\n");
    let fds = std::fs::read_to_string(attacked.workspace.join("fds.txt")).unwrap();
    assert_eq!(fds.split_whitespace().collect::<Vec<_>>(), ["0", "1", "2"], "no host descriptor leaks into a tree");
}

#[tokio::test]
async fn attacks_are_contained_with_the_server_as_this_user() {
    let attacked = attack("attack-self", None).await;
    check(&attacked);
    let _ = std::fs::remove_dir_all(attacked.workspace.parent().unwrap());
    let _ = std::fs::remove_dir_all(attacked.home.parent().unwrap());
}

#[tokio::test]
async fn attacks_are_contained_with_an_unprivileged_server() {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0
        && common::gap_accepted("root", "switching to another uid needs root", "run the tests as root (CI does)")
    {
        return;
    }
    let attacked = attack("attack-nobody", Some(NOBODY)).await;
    check(&attacked);
    let _ = std::fs::remove_dir_all(attacked.workspace.parent().unwrap());
    let _ = std::fs::remove_dir_all(attacked.home.parent().unwrap());
}
