//! The bounds of every tree beyond pids and memory: open files and file
//! size (rlimits no process of the tree can raise), one CPU cgroup per owner,
//! and the private `tmpfs` sizes.

use super::*;

async fn run(host: &ProcessHost, owner: Option<&str>, script: &str, test: &str) -> (String, String) {
    let mark = marker(test);
    // The workspace is the crate, so that /tmp is the tree's private one.
    let grant = ProcessGrant { working_dirs: vec![PathBuf::from(env!("CARGO_MANIFEST_DIR"))], ..bash_grant() };
    let process = match owner {
        Some(owner) => {
            let owner = host.owner_spill(owner).unwrap();
            host.spawn_for(&owner, &grant, bash(script, &mark), &tracing::Span::none()).await.unwrap()
        }
        None => host.spawn(&grant, bash(script, &mark), &tracing::Span::none()).await.unwrap(),
    };
    let (out, err, _, status) = drain(&process).await;
    let (out, err) = (String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&err).into_owned());
    assert_eq!(status, ExitStatus::Code(0), "stdout:\n{out}\nstderr:\n{err}");
    (out, err)
}

/// `RLIMIT_NOFILE` and `RLIMIT_FSIZE` hold, soft and hard: a write or an
/// `fallocate` past the file size fails, the tree cannot raise either, and
/// opening more files than allowed fails with EMFILE.
#[tokio::test]
async fn open_files_and_file_size_are_bounded_and_cannot_be_raised() {
    let host = ProcessHost::new(&ProcessHostConfig {
        max_open_files_per_tree: 256,
        max_file_bytes_per_tree: 8 << 20,
        ..Default::default()
    })
    .unwrap();
    let script = "echo nofile=$(ulimit -Sn)/$(ulimit -Hn) fsize=$(ulimit -Sf)/$(ulimit -Hf)
        (ulimit -n 4096) 2>/dev/null; echo raise_nofile=$?
        (ulimit -f unlimited) 2>/dev/null; echo raise_fsize=$?
        (head -c 9M /dev/zero > /tmp/big) 2>/dev/null; echo write=$? size=$(stat -c %s /tmp/big)
        (fallocate -l 16M /tmp/fallocated) 2>/dev/null; echo fallocate=$?
        rm -f /tmp/big /tmp/fallocated
        python3 -c '
import os
fds = []
try:
    while True: fds.append(os.open(\"/dev/null\", os.O_RDONLY))
except OSError as e: print(\"opened\", len(fds), \"then\", e.strerror)'";
    let (out, _) = run(&host, None, script, "bounds-rlimits").await;
    assert!(out.contains("nofile=256/256 fsize=8192/8192"), "{out}");
    assert!(out.contains("raise_nofile=1") && out.contains("raise_fsize=1"), "a tree raised its limits:\n{out}");
    // SIGXFSZ: 128 + 25.
    assert!(out.contains("write=153 size=8388608"), "{out}");
    assert!(out.contains("fallocate=") && !out.contains("fallocate=0"), "{out}");
    let opened: usize = out.split("opened ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    assert!((200..256).contains(&opened) && out.contains("Too many open files"), "{out}");
}

/// The defaults are the documented ones.
#[tokio::test]
async fn the_default_open_files_and_file_size_are_the_documented_ones() {
    let (out, _) = run(&host(), None, "echo $(ulimit -Hn) $(ulimit -Hf)", "bounds-defaults").await;
    let nofile = limits::DEFAULT_MAX_OPEN_FILES_PER_TREE.min(own_hard_nofile());
    assert_eq!(out.trim(), format!("{nofile} {}", limits::DEFAULT_MAX_FILE_BYTES_PER_TREE / 1024));
}

fn own_hard_nofile() -> u64 {
    let mut own = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain syscall into a local.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut own) }, 0);
    #[allow(clippy::unnecessary_cast, reason = "rlim_t is not u64 on every target")]
    let hard = own.rlim_max as u64;
    hard
}

/// The CPU cgroup a tree's keeper is in, as the host sees it, and the file
/// holding its weight (v1 `cpu.shares`, v2 `cpu.weight`).
fn cpu_cgroup_of(pid: u32, share: &CpuShare) -> (String, PathBuf) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    match share {
        CpuShare::CgroupV1 { .. } => {
            let path = text
                .lines()
                .find_map(|l| {
                    let mut parts = l.splitn(3, ':');
                    parts.next();
                    let (controllers, path) = parts.next().zip(parts.next())?;
                    controllers.split(',').any(|c| c == "cpu").then(|| path.to_string())
                })
                .expect("a cpu line");
            let mount = limits_cpu_mount(false);
            let file = mount.join(path.trim_start_matches('/')).join("cpu.shares");
            (path, file)
        }
        CpuShare::CgroupV2 { .. } => {
            let path = text.lines().find_map(|l| l.strip_prefix("0::")).expect("a v2 line").to_string();
            let owner = Path::new(&path).parent().expect("a tree cgroup inside its owner's").to_path_buf();
            let file = limits_cpu_mount(true).join(owner.strip_prefix("/").unwrap()).join("cpu.weight");
            (owner.display().to_string(), file)
        }
        other => panic!("no CPU cgroup: {other}"),
    }
}

fn limits_cpu_mount(v2: bool) -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let options = right.nth(1).unwrap_or("");
            let fields: Vec<&str> = left.split(' ').collect();
            let wanted =
                if v2 { fstype == "cgroup2" } else { fstype == "cgroup" && options.split(',').any(|o| o == "cpu") };
            (wanted && fields.get(3) == Some(&"/")).then(|| PathBuf::from(fields[4]))
        })
        .expect("the cgroup mount")
}

/// Each owner's trees share one CPU cgroup whose weight is the configured
/// one; another owner's trees are in another. (The effect, one owner's busy
/// loops against another's command, is measured in BENCHMARKS.md, not
/// asserted by timing here.)
#[tokio::test]
async fn each_owner_has_one_cpu_cgroup_of_the_configured_weight() {
    let host = ProcessHost::new(&ProcessHostConfig { cpu_weight_per_owner: 50, ..Default::default() }).unwrap();
    let share = host.cpu_share().clone();
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        assert!(host.describe_bounds().contains("CPU share per owner: "), "{}", host.describe_bounds());
        eprintln!("NOTE: not root; this host's CPU share: {share}");
        return;
    }
    let (expected, unit) = match &share {
        CpuShare::CgroupV1 { shares } => (*shares, "cpu.shares"),
        CpuShare::CgroupV2 { weight } => (*weight, "cpu.weight"),
        other => panic!(
            "as root the owners get no CPU cgroup ({other}): run as root where the cgroup v1 cpu hierarchy is \
             writable or cgroup v2 is delegated with the cpu controller"
        ),
    };
    assert_eq!(expected, if unit == "cpu.shares" { 512 } else { 50 });
    // Three trees live at once: two of owner a, one of owner b.
    let (mut seen, mut running) = (Vec::new(), Vec::new());
    for (owner, test) in [("a", "cpu-a1"), ("a", "cpu-a2"), ("b", "cpu-b")] {
        let mark = marker(test);
        let spill = host.owner_spill(owner).unwrap();
        let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash("echo up; read line || true", &mark) };
        let process = host.spawn_for(&spill, &bash_grant(), request, &tracing::Span::none()).await.unwrap();
        let mut out = String::new();
        read_until(&process, &mut out, "up").await;
        let (cgroup, file) = cpu_cgroup_of(process.pid(), &share);
        let configured = std::fs::read_to_string(&file).unwrap();
        assert_eq!(configured.trim(), expected.to_string(), "{unit} of {}", file.display());
        assert!(cgroup.contains("/owner-"), "the tree is not in an owner's cgroup: {cgroup}");
        seen.push((owner, cgroup));
        running.push(process);
    }
    for process in running {
        process.close_stdin().unwrap();
        let (_, _, _, status) = drain(&process).await;
        assert_eq!(status, ExitStatus::Code(0));
    }
    assert_eq!(seen[0].1, seen[1].1, "one owner's trees are in different CPU cgroups: {seen:?}");
    assert_ne!(seen[0].1, seen[2].1, "two owners share a CPU cgroup: {seen:?}");
}

/// The private `tmpfs`es are large under a memory cgroup (which charges
/// their pages to the tree) and share one small budget without one.
#[tokio::test]
async fn private_tmpfs_sizes_come_from_a_budget_without_a_memory_cgroup() {
    let script = "df -B1 --output=size /tmp /var/tmp /run /dev/shm \"$HOME\" | tail -n +2 | tr -d ' ' | paste -sd' '";
    for max_memory_bytes_per_tree in [0, limits::DEFAULT_MAX_MEMORY_BYTES_PER_TREE] {
        let host = ProcessHost::new(&ProcessHostConfig { max_memory_bytes_per_tree, ..Default::default() }).unwrap();
        let expected = host.tmpfs_sizes();
        if max_memory_bytes_per_tree == 0 {
            assert_eq!(expected, crate::view::TmpfsSizes::BUDGETED);
            assert_eq!(expected.total(), crate::view::FALLBACK_TMPFS_BUDGET_BYTES);
        }
        let (out, _) = run(&host, None, script, "bounds-tmpfs").await;
        let sizes: Vec<u64> = out.split_whitespace().map(|s| s.parse().unwrap()).collect();
        assert_eq!(
            sizes,
            [expected.tmp, expected.var_tmp, expected.run, expected.dev_shm, expected.home],
            "memory limit {max_memory_bytes_per_tree} by {}",
            host.limit_mechanism()
        );
    }
}

/// A figure, not a test: how much slower one owner's short command runs
/// while another owner keeps busy loops on every core, with a CPU share per
/// owner and without (`cpu_weight_per_owner = 0`). Recorded in
/// BENCHMARKS.md; run with
/// `CPU_FIGURE_BUSY_PER_CORE=16 cargo nextest run -p taskhost-process --run-ignored only -E 'test(cpu_share_figure)' --no-capture`.
#[tokio::test]
#[ignore = "a benchmark figure: run on purpose, with --no-capture"]
async fn cpu_share_figure() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    // A fixed amount of work: about 0.2 s of one core on the test machine.
    let work = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done";
    for weight in [100, 0] {
        let host = ProcessHost::new(&ProcessHostConfig { cpu_weight_per_owner: weight, ..Default::default() }).unwrap();
        let timed = |host: Arc<ProcessHost>| async move {
            let mut best = Duration::MAX;
            for _ in 0..5 {
                let started = std::time::Instant::now();
                run(&host, Some("victim"), work, "cpu-figure-victim").await;
                best = best.min(started.elapsed());
            }
            best
        };
        let alone = timed(host.clone()).await;
        // The busy owner: 4 loops per core (CPU_FIGURE_BUSY_PER_CORE), each
        // its own tree.
        let per_core: usize = std::env::var("CPU_FIGURE_BUSY_PER_CORE").ok().and_then(|n| n.parse().ok()).unwrap_or(4);
        let busy_spill = host.owner_spill("busy").unwrap();
        let mut busy = Vec::new();
        for _ in 0..per_core * cores {
            let mark = marker("cpu-figure-busy");
            let request = bash("while :; do :; done", &mark);
            busy.push(host.spawn_for(&busy_spill, &bash_grant(), request, &tracing::Span::none()).await.unwrap());
        }
        let loaded = timed(host.clone()).await;
        for process in &busy {
            process.kill();
        }
        drop(busy);
        println!(
            "cpu share {}: victim alone {alone:.2?}, with {} busy trees of another owner {loaded:.2?}: {:.1}x",
            host.cpu_share(),
            per_core * cores,
            loaded.as_secs_f64() / alone.as_secs_f64()
        );
    }
}
