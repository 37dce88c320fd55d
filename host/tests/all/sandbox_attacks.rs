//! Escape attempts against `taskhost serve`'s default `bash` tool, run as a
//! model driving it would run them, with the server as the test's user
//! (root in CI) and as an unprivileged user (`setpriv` to 65534, no sudo).
//! Every attempt must be contained; what a command needs must keep working.
//!
//! One bash call runs every attack and prints `name:result` lines; the test
//! checks each line, then checks the host side (no file appeared in `/etc`,
//! the server's stdout carried no forged message, the home's files and the
//! workspace repository's configuration are unchanged, the client still
//! works). The call waits on a FIFO in the middle, while the test creates a
//! credential in the home: one created after the task started must stay
//! out of reach too.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{call, only_text};
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
    /// The workspace repository's configuration before the attack.
    git_config: String,
}

/// Credential files the test plants in the server's home (each holds
/// [`CANARY`]): the issue's list, and the usual ones.
const CREDENTIALS: &[&str] = &[
    ".ssh/id_test",
    ".netrc",
    ".cargo/credentials.toml",
    ".pgpass",
    ".vault-token",
    ".claude/.credentials.json",
    ".codex/auth.json",
    ".config/gh/hosts.yml",
    ".aws/credentials",
    ".docker/config.json",
    ".npmrc",
    ".pypirc",
    ".git-credentials",
    ".kube/config",
    ".gnupg/private-keys-v1.d/key",
    ".config/gcloud/credentials.db",
    ".password-store/x.gpg",
    ".bash_history",
];

/// The credential the test creates once the attack runs.
const LATE_CREDENTIAL: &str = ".config/late/token";

fn attack_script(server_pid: u32, workspace: &Path, home: &Path, host_socket: &Path, run_socket: &Path) -> String {
    let (w, h, sock, run_sock) = (workspace.display(), home.display(), host_socket.display(), run_socket.display());
    let creds = CREDENTIALS.join(" ");
    format!(
        r#"S={server_pid}; W={w}; H={h}
r() {{ if eval "$2" >/dev/null 2>&1; then echo "$1:yes"; else echo "$1:no"; fi; }}
echo "run_list:$(ls -A /run | tr '\n' ' ')"
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
r netrc_read "grep -q secret $H/.netrc"
r cache_list "ls $H/.cache/taskhost/components"
r bashrc "echo evil >> $H/.bashrc"
r bashrc_seen "grep -q clean $H/.bashrc"
r autostart "mkdir -p $H/.config/autostart && touch $H/.config/autostart/x"
echo "home_list:$(ls -A $H | grep -v -e '^.bashrc$' -e '^.config$' -e '^.local$' | tr '\n' ' ')"
echo "local_tree:$(cd $H && find .local -maxdepth 3 | sort | tr '\n' ' ')"
echo "spill_servers:$(ls -A $H/.local/state/taskhost/spill | wc -l)"
echo "spill_owners:$(ls -Ad $H/.local/state/taskhost/spill/*/* | wc -l)"
echo "state_entries:$(ls -A $H/.local/state/taskhost | tr '\n' ' ')"
echo "home_files:$(find $H -mindepth 1 ! -type d ! -path "$H/.bashrc" ! -path "$H/.config/*" ! -path "$H/.local/state/taskhost/spill/*" | tr '\n' ' ')"
for f in {creds}; do grep -qs {CANARY} "$H/$f" && echo "cred_read:$f"; done
echo "creds_checked:1"
r host_socket "test -e {sock}"
r run_socket "test -e {run_sock}"
r git_config_write "git -C $W/proj config core.fsmonitor evil"
r git_hook_write "echo evil > $W/proj/.git/hooks/post-checkout"
r envrc_write "echo evil >> $W/proj/.envrc"
r mv_git "mv $W/proj/.git $W/proj/moved"
r mv_proj "mv $W/proj $W/moved"
r git_commit "git -C $W/proj -c user.email=a@b -c user.name=a commit -qam change"
read go < $W/go.fifo
r late_cred "grep -qs LATE $H/{LATE_CREDENTIAL}"
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

/// How the attacks run.
#[derive(Clone, Copy, PartialEq)]
enum Run {
    /// A foreground call of a plain connection.
    Foreground,
    /// A background command of a stable owner (`serve --owner`): a durable
    /// tree, kept by its own keeper, that outlives the server.
    Durable,
}

/// Starts `taskhost serve` (as `uid` when given), runs the attacks through
/// its default bash tool, and returns what they printed.
async fn attack(tag: &str, uid: Option<u32>, run: Run) -> Attacked {
    let base = common::temp_dir(tag);
    // The workspace below /tmp (it must stay reachable through the tree's
    // private /tmp); the home directory outside it, where the tree gets a
    // private, empty home instead.
    let workspace = base.join("work");
    let home = Path::new("/var/tmp").join(base.file_name().unwrap()).join("home");
    let _ = std::fs::remove_dir_all(&home);
    for dir in [&workspace, &home.join(".cache/taskhost/components")] {
        std::fs::create_dir_all(dir).unwrap();
    }
    for credential in CREDENTIALS {
        let path = home.join(credential);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("secret {CANARY}\n")).unwrap();
    }
    std::fs::write(home.join(".cache/taskhost/components/x.cwasm"), "code").unwrap();
    std::fs::write(home.join(".bashrc"), "# clean\n").unwrap();
    // A repository in the workspace, with a direnv file: its configuration,
    // hooks and .envrc must stay as they are.
    let project = workspace.join("proj");
    std::fs::create_dir_all(&project).unwrap();
    let git = |args: &[&str]| {
        assert!(std::process::Command::new("git").arg("-C").arg(&project).args(args).status().unwrap().success())
    };
    git(&["init", "-q"]);
    std::fs::write(project.join(".envrc"), "export A=1\n").unwrap();
    std::fs::write(project.join("file"), "one\n").unwrap();
    git(&["add", "."]);
    git(&["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "first"]);
    std::fs::write(project.join("file"), "two\n").unwrap();
    let git_config = std::fs::read_to_string(project.join(".git/config")).unwrap();
    // The attack waits on this FIFO while the test plants a credential.
    let fifo = workspace.join("go.fifo");
    let fifo_c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo on a C string we own.
    assert_eq!(unsafe { libc::mkfifo(fifo_c.as_ptr(), 0o600) }, 0);
    // A host Unix socket outside the workspace, as tmux or ssh-agent keep,
    // and one under the host's /run, as daemons keep.
    let socket_dir = common::temp_dir(&format!("{tag}-sock"));
    let host_socket = socket_dir.join("S");
    let _listener = std::os::unix::net::UnixListener::bind(&host_socket).unwrap();
    let run_socket = PathBuf::from(format!("/run/taskhost-{tag}-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&run_socket);
    let _run_listener = std::os::unix::net::UnixListener::bind(&run_socket).unwrap();
    if let Some(uid) = uid {
        for path in [&base, &socket_dir, &home] {
            chown_tree(path, uid);
        }
        std::os::unix::fs::chown(&run_socket, Some(uid), Some(uid)).unwrap();
    }

    let mut command = common::serve_stdio_as(uid, &base, &workspace, &home);
    command.env("XDG_CACHE_HOME", home.join(".cache")).env("CANARY_TOKEN", CANARY);
    if run == Run::Durable {
        command.args(["--owner", "alice"]);
    }
    let (client, mut child) = common::connect_stdio(&mut command).await;
    let peer = client.peer().clone();
    let server_pid = child.id().unwrap();
    // Through setpriv, the server is setpriv's exec: the same pid.
    let script = attack_script(server_pid, &workspace, &home, &host_socket, &run_socket);
    // Once the attack opened the FIFO (the task is running), a credential
    // appears in the home; then the attack goes on.
    let late = home.join(LATE_CREDENTIAL);
    let planter = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut fifo = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        std::fs::create_dir_all(late.parent().unwrap()).unwrap();
        std::fs::write(&late, "LATE credential\n").unwrap();
        fifo.write_all(b"go\n").unwrap();
    });
    let raw = match run {
        Run::Foreground => only_text(&call(&peer, "bash", json!({ "command": script })).await),
        Run::Durable => {
            let started = call(&peer, "bash", json!({ "command": script, "run_in_background": true })).await;
            let id = common::started_task(&started);
            let read = json!({"task_id": id, "wait": true, "timeout_ms": 120_000});
            let raw = only_text(&call(&peer, "task_output", read).await);
            assert!(raw.ends_with("[status: completed, exit code: 0]"), "the durable attack ran to its end:\n{raw}");
            raw
        }
    };
    planter.await.unwrap();
    let _ = std::fs::remove_file(&run_socket);
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
    Attacked { results, raw, workspace, home, server_pid, git_config }
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
        "bashrc_seen",
        "host_socket",
        "run_socket",
        "git_config_write",
        "git_hook_write",
        "envrc_write",
        "mv_git",
        "mv_proj",
        "late_cred",
        "unshare_user",
        "unshare_pid",
    ] {
        expect(k, "no");
    }
    expect("shadow_lines", "0");
    // The tree's home is empty and its own: no credential, planted before or
    // during the task, was read; writes there stay there.
    expect("home_list", "");
    // Of the state directory, only the path to this owner's own spill
    // directory (spill/<server>/<owner>) exists (its output files, named by `full output: <path>`):
    // no trust record, compile-cache key or other owner's directory.
    expect("local_tree", ".local .local/state .local/state/taskhost .local/state/taskhost/spill ");
    expect("state_entries", "spill ");
    expect("spill_servers", "1");
    expect("spill_owners", "1");
    // No file anywhere in the home but what the attacks wrote and the
    // session's own spill files.
    expect("home_files", "");
    expect("creds_checked", "1");
    assert!(!attacked.results.contains_key("cred_read"), "credentials read:\n{}", attacked.raw);
    expect("run_list", "");
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
    for k in ["ws_write", "tmp_write", "git", "pipe", "bashrc", "autostart", "git_commit"] {
        expect(k, "yes");
    }
    // The host side.
    assert!(!Path::new(&format!("/etc/taskhost-attack-{}", attacked.server_pid)).exists());
    assert!(!Path::new(&format!("/tmp/taskhost-private-{}", attacked.server_pid)).exists(), "/tmp is private");
    assert_eq!(std::fs::read_to_string(attacked.home.join(".bashrc")).unwrap(), "# clean\n");
    let project = attacked.workspace.join("proj");
    assert_eq!(std::fs::read_to_string(project.join(".git/config")).unwrap(), attacked.git_config);
    assert!(!project.join(".git/hooks/post-checkout").exists());
    assert_eq!(std::fs::read_to_string(project.join(".envrc")).unwrap(), "export A=1\n");
    assert!(!attacked.home.join(".config/autostart").exists());
    assert_eq!(std::fs::read_to_string(attacked.workspace.join("written")).unwrap(), "ok\n");
    let fds = std::fs::read_to_string(attacked.workspace.join("fds.txt")).unwrap();
    assert_eq!(fds.split_whitespace().collect::<Vec<_>>(), ["0", "1", "2"], "no host descriptor leaks into a tree");
}

async fn contained(tag: &str, uid: Option<u32>, run: Run) {
    if uid.is_some()
        // SAFETY: getuid cannot fail.
        && unsafe { libc::getuid() } != 0
        && common::gap_accepted("root", "switching to another uid needs root", "run the tests as root (CI does)")
    {
        return;
    }
    let attacked = attack(tag, uid, run).await;
    check(&attacked);
    let _ = std::fs::remove_dir_all(attacked.workspace.parent().unwrap());
    let _ = std::fs::remove_dir_all(attacked.home.parent().unwrap());
}

#[tokio::test]
async fn attacks_are_contained_with_the_server_as_this_user() {
    contained("attack-self", None, Run::Foreground).await;
}

#[tokio::test]
async fn attacks_are_contained_with_an_unprivileged_server() {
    contained("attack-nobody", Some(NOBODY), Run::Foreground).await;
}

#[tokio::test]
async fn attacks_from_a_durable_tree_are_contained_with_the_server_as_this_user() {
    contained("attack-durable-self", None, Run::Durable).await;
}

#[tokio::test]
async fn attacks_from_a_durable_tree_are_contained_with_an_unprivileged_server() {
    contained("attack-durable-nobody", Some(NOBODY), Run::Durable).await;
}
