//! Limits per process tree, against `taskhost serve`'s default `bash` tool
//! as a model would hit them: a fork bomb and a memory hog, with the server
//! as the test's user (root in CI: the cgroup path) and as an unprivileged
//! user (`setpriv` to 65534: the rlimit fallback). Either way the tree is
//! bounded and the server keeps answering.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{call, only_text};
use serde_json::json;

const NOBODY: u32 = 65534;
const MAX_PIDS: usize = 64;
const MAX_MEMORY: u64 = 64 << 20;

/// Forks children that sleep until 300 exist or a fork fails 20 times,
/// counts the processes of the tree (its own PID namespace and /proc), then
/// kills them. Also prints how the tree is limited.
const FORK_BOMB: &str = r#"grep -E '^[0-9]+:pids:' /proc/self/cgroup | sed 's/^/cgroup:/'
grep 'Max processes' /proc/self/limits | awk '{print "nproc:" $3}'
perl -e '
  my ($ok, $failed, @kids) = (0, 0);
  for (1..300) {
    my $pid = fork();
    if (!defined $pid) { $failed++; last if $failed >= 20; next }
    if ($pid == 0) { sleep 120; exit 0 }
    $ok++; push @kids, $pid;
  }
  opendir(my $proc, "/proc") or die;
  my $live = grep { /^\d+$/ } readdir($proc);
  print "forked:$ok\nfailed:$failed\nlive:$live\n";
  kill "KILL", @kids; waitpid($_, 0) for @kids;
'"#;

/// `tail` keeps a line without end in memory: 600 MiB of zeros.
const MEMORY_HOG: &str = "head -c 600M /dev/zero | tail";

struct Server {
    client: rmcp::service::RunningService<rmcp::service::RoleClient, ()>,
    child: tokio::process::Child,
    base: PathBuf,
    pid: u32,
}

impl Server {
    /// `taskhost serve` with small tree limits (as `uid` when given).
    async fn start(tag: &str, uid: Option<u32>) -> Self {
        Self::start_with(tag, uid, "").await
    }

    /// As [`Self::start`], with more `[process]` keys.
    async fn start_with(tag: &str, uid: Option<u32>, more: &str) -> Self {
        let base = common::temp_dir(tag);
        let workspace = base.join("work");
        std::fs::create_dir_all(&workspace).unwrap();
        let config = base.join("taskhost.toml");
        std::fs::write(
            &config,
            format!("[process]\nmax_pids_per_tree = {MAX_PIDS}\nmax_memory_bytes_per_tree = {MAX_MEMORY}\n{more}"),
        )
        .unwrap();
        if let Some(uid) = uid {
            for path in [&base, &workspace, &config] {
                std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
            }
        }
        let mut command = common::serve_stdio_as(uid, &base, &workspace, &base);
        command.arg("--config").arg(&config);
        let (client, child) = common::connect_stdio(&mut command).await;
        // Through setpriv, the server is setpriv's exec: the same pid.
        let pid = child.id().unwrap();
        Self { client, child, base, pid }
    }

    async fn bash(&self, command: &str) -> String {
        only_text(&call(self.client.peer(), "bash", json!({ "command": command })).await)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.base.join("stderr.log")).unwrap_or_default()
    }

    /// Checks the server still answers, disconnects, and waits for its exit.
    async fn stop(mut self) -> String {
        assert_eq!(self.bash("echo still-here").await, "still-here\n[status: completed, exit code: 0]");
        let _ = self.client.cancel().await;
        let status =
            tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.expect("server exits").unwrap();
        let log = std::fs::read_to_string(self.base.join("stderr.log")).unwrap_or_default();
        assert!(status.success(), "server exit {status}; log:\n{log}");
        let _ = std::fs::remove_dir_all(&self.base);
        log
    }
}

fn value<'a>(output: &'a str, key: &str) -> &'a str {
    output
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|rest| rest.strip_prefix(':')))
        .unwrap_or_else(|| panic!("no {key} in:\n{output}"))
}

/// The cgroup v1 `pids` hierarchy of this process, when the test can create
/// cgroups in it (then the server, as the same user, must use cgroups).
fn writable_v1_pids_dir() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == "pids").then(|| path.to_string())
    })?;
    let dir = Path::new("/sys/fs/cgroup/pids").join(path.trim_start_matches('/'));
    let probe = dir.join(format!("taskhost-test-probe-{}", std::process::id()));
    std::fs::create_dir(&probe).ok()?;
    std::fs::remove_dir(&probe).ok()?;
    Some(dir)
}

fn is_root() -> bool {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() == 0 }
}

fn check_fork_bomb(output: &str) {
    let number = |key: &str| -> usize { value(output, key).trim().parse().unwrap() };
    let (forked, failed, live) = (number("forked"), number("failed"), number("live"));
    assert!(live <= MAX_PIDS, "{live} processes live in one tree, limit {MAX_PIDS}:\n{output}");
    assert!(failed > 0, "no fork was refused:\n{output}");
    // The limit is what refused them, not something smaller.
    assert!(forked >= MAX_PIDS - 8, "only {forked} forks succeeded under a limit of {MAX_PIDS}:\n{output}");
}

#[tokio::test]
async fn a_fork_bomb_and_a_memory_hog_are_bounded_with_the_server_as_this_user() {
    let cgroup_dir = writable_v1_pids_dir();
    // A base left by a server that died (pid above any pid_max) is swept
    // when the server decides its tree limiter: on its start-ahead thread,
    // at the latest by the first spawn (which needs the limiter).
    let stale = cgroup_dir.as_ref().map(|dir| dir.join("taskhost-999999999-0"));
    if let Some(stale) = &stale {
        std::fs::create_dir(stale).unwrap();
        std::fs::create_dir(stale.join("tree-1")).unwrap();
    }
    let server = Server::start("limits-self", None).await;

    let bomb = server.bash(FORK_BOMB).await;
    if let Some(stale) = &stale {
        assert!(!stale.exists(), "the stale cgroup base {} was not swept", stale.display());
    }
    check_fork_bomb(&bomb);
    let memory = server.bash(MEMORY_HOG).await;
    match &cgroup_dir {
        Some(dir) => {
            // The cgroup path: the tree is in its own pids cgroup, the root
            // of its cgroup namespace (the host's path is not shown), and
            // the kernel's OOM kill in its own memory cgroup is reported.
            let cgroup = value(&bomb, "cgroup");
            assert!(cgroup.ends_with(":pids:/"), "tree cgroup {cgroup}");
            assert!(memory.contains("exit code: 137"), "the hog was not killed:\n{memory}");
            assert!(
                memory.contains("memory limit (64 MiB) of this process tree reached"),
                "no limit notice:\n{memory}"
            );
            let pid = server.pid;
            let log = server.stop().await;
            assert!(log.contains("mechanism=cgroup"), "log:\n{log}");
            let bases: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("taskhost-{pid}-")))
                .collect();
            assert!(bases.is_empty(), "the server left its cgroup base: {bases:?}");
        }
        None => {
            eprintln!("NOTE: no writable cgroup v1 pids hierarchy here; checking the bound alone");
            assert!(!memory.contains("exit code: 0"), "the hog succeeded:\n{memory}");
            server.stop().await;
        }
    }
}

#[tokio::test]
async fn a_fork_bomb_and_a_memory_hog_are_bounded_with_an_unprivileged_server() {
    if !is_root()
        && common::gap_accepted("root", "switching to another uid needs root", "run the tests as root (CI does)")
    {
        return;
    }
    let server = Server::start("limits-nobody", Some(NOBODY)).await;
    let bomb = server.bash(FORK_BOMB).await;
    check_fork_bomb(&bomb);
    let memory = server.bash(MEMORY_HOG).await;
    let log = server.log();
    if log.contains("limiting each tree with rlimits") {
        // The fallback: RLIMIT_NPROC bounded the tree, RLIMIT_DATA the hog.
        assert_eq!(value(&bomb, "nproc"), MAX_PIDS.to_string(), "{bomb}");
        assert!(memory.contains("memory exhausted"), "the hog was not bounded:\n{memory}");
        assert!(memory.contains("exit code: 1"), "{memory}");
    } else {
        // A host that delegates a cgroup to this user.
        assert!(memory.contains("memory limit (64 MiB)"), "{memory}\nlog:\n{log}");
    }
    server.stop().await;
}

/// Open files, file size, the private `tmpfs` sizes and the CPU share, as a
/// model's command meets them.
const FILE_BOUNDS: &str =
    "max_open_files_per_tree = 128\nmax_file_bytes_per_tree = 4194304\ncpu_weight_per_owner = 200\n";

const FILE_PROBE: &str = r#"echo nofile=$(ulimit -Hn) fsize=$(ulimit -Hf)
(ulimit -n 100000) 2>/dev/null; echo raise=$?
(head -c 5M /dev/zero > big) 2>/dev/null; echo write=$? size=$(stat -c %s big)
(fallocate -l 3G huge) 2>/dev/null; echo fallocate=$?
rm -f big huge
echo tmpfs:$(df -B1 --output=size /tmp /var/tmp /run /dev/shm "$HOME" | tail -n +2 | tr -d ' ' | paste -sd,)"#;

/// `root_server`: the server runs as root (then, on a host whose cgroup v1
/// cpu hierarchy root can use, each owner must get its cgroup).
async fn check_file_bounds(server: &Server, root_server: bool) {
    let out = server.bash(FILE_PROBE).await;
    assert!(out.contains("nofile=128 fsize=4096"), "{out}");
    assert!(out.contains("raise=1"), "the tree raised its open files:\n{out}");
    assert!(out.contains("write=153 size=4194304"), "a write went past the file size:\n{out}");
    assert!(out.contains("fallocate=") && !out.contains("fallocate=0"), "a 3 GiB fallocate went through:\n{out}");
    let log = server.log();
    let tmpfs = value(&out, "tmpfs");
    let mib = |m: u64| (m << 20).to_string();
    if log.contains("share a small budget") {
        // No memory cgroup: the sizes come from the 256 MiB budget.
        let budget = [mib(96), mib(32), mib(16), mib(64), mib(48)].join(",");
        assert_eq!(tmpfs, budget, "{out}\nlog:\n{log}");
    } else {
        assert_eq!(tmpfs, vec![mib(1024); 5].join(","), "{out}\nlog:\n{log}");
    }
    assert!(log.contains("CPU share per owner"), "the server does not say how owners share the CPU:\n{log}");
    if root_server && writable_v1_cpu() {
        assert!(log.contains("cpu.shares 2048 per owner"), "{log}");
    }
}

/// Whether this host has a cgroup v1 cpu hierarchy a root server can use.
fn writable_v1_cpu() -> bool {
    Path::new("/sys/fs/cgroup/cpu/cpu.shares").exists()
}

#[tokio::test]
async fn open_files_file_size_tmpfs_and_cpu_share_are_bounded_with_the_server_as_this_user() {
    let server = Server::start_with("bounds-self", None, FILE_BOUNDS).await;
    check_file_bounds(&server, is_root()).await;
    server.stop().await;
}

#[tokio::test]
async fn open_files_file_size_tmpfs_and_cpu_share_are_bounded_with_an_unprivileged_server() {
    if !is_root()
        && common::gap_accepted("root", "switching to another uid needs root", "run the tests as root (CI does)")
    {
        return;
    }
    let server = Server::start_with("bounds-nobody", Some(NOBODY), FILE_BOUNDS).await;
    check_file_bounds(&server, false).await;
    let log = server.log();
    if log.contains("limiting each tree with rlimits") {
        assert!(
            log.contains("share a small budget"),
            "the fallback does not say memory is bounded less strictly:\n{log}"
        );
    }
    server.stop().await;
}
