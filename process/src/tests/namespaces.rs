//! The tree's IPC, UTS and cgroup namespaces.

use super::*;

/// The keys of SysV shared memory segments the host's IPC namespace holds.
fn host_shm_keys() -> Vec<i64> {
    std::fs::read_to_string("/proc/sysvipc/shm")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// A tree's SysV shared memory is its own: it cannot reach the host's, the
/// host never sees the tree's, and a 256 MiB segment the tree leaves behind
/// goes with it.
#[tokio::test]
async fn sysv_shared_memory_is_the_trees_own_and_goes_with_it() {
    assert!(confine::support().ipc_namespace, "IPC namespaces are unavailable: {}", confine::support().describe());
    let host_key: libc::key_t = 0x7a57_0000 | (std::process::id() as libc::key_t & 0xffff);
    // SAFETY: shmget of a segment of our own, removed by the guard.
    let host_id = unsafe { libc::shmget(host_key, 4096, libc::IPC_CREAT | libc::IPC_EXCL | 0o666) };
    assert!(host_id >= 0, "shmget: {}", std::io::Error::last_os_error());
    struct Segment(libc::c_int);
    impl Drop for Segment {
        fn drop(&mut self) {
            // SAFETY: removing our own segment.
            unsafe { libc::shmctl(self.0, libc::IPC_RMID, std::ptr::null_mut()) };
        }
    }
    let _segment = Segment(host_id);
    let tree_key: i64 = 0x7a58_0000 | (std::process::id() as i64 & 0xffff);
    let script = format!(
        "perl -e '
          my $host = shmget({host_key}, 0, 0); print defined $host ? \"host:reached\\n\" : \"host:unreachable\\n\";
          defined(my $id = shmget({tree_key}, 256 << 20, 01000 | 0600)) or die \"shmget: $!\";
          shmwrite($id, \"x\" x 4096, 0, 4096) or die \"shmwrite: $!\";
          print \"made:$id\\n\";'
         read line || true",
    );
    let host = host();
    let mark = marker("sysv");
    let request = SpawnRequest { stdin: StdinMode::Pipe, ..bash(&script, &mark) };
    let process = host.spawn(&bash_grant(), request, &tracing::Span::none()).await.unwrap();
    let mut out = String::new();
    while !out.contains("made:") {
        tokio::time::timeout(Duration::from_secs(20), process.ready()).await.expect("no output came");
        out.push_str(&String::from_utf8_lossy(&process.read(Stream::Stdout).data));
        out.push_str(&String::from_utf8_lossy(&process.read(Stream::Stderr).data));
        assert!(process.exit_status().is_none() || out.contains("made:"), "the tree ended early:\n{out}");
    }
    // The tree holds its segment now; the host's namespace does not show it.
    assert!(!host_shm_keys().contains(&tree_key), "the tree's segment is in the host's namespace:\n{out}");
    assert!(out.contains("host:unreachable"), "{out}");
    process.close_stdin().unwrap();
    let (_, err, _, status) = drain(&process).await;
    assert_eq!(status, ExitStatus::Code(0), "{}", String::from_utf8_lossy(&err));
    assert!(!host_shm_keys().contains(&tree_key));
}

/// The host name is the host's, and the tree cannot change it (its own
/// UTS namespace, no capabilities); `/proc/self/cgroup` is rooted at the
/// tree's own cgroups.
#[tokio::test]
async fn the_host_name_holds_and_cgroup_paths_are_the_trees_own() {
    let support = confine::support();
    assert!(support.uts_namespace && support.cgroup_namespace, "{}", support.describe());
    let script = "echo name:$(hostname); hostname taskhost-renamed 2>/dev/null && echo renamed:yes || echo renamed:no
        cut -d: -f3 /proc/self/cgroup | sort -u | tr '\\n' ' '";
    let host = host();
    let mark = marker("uts");
    let process = host.spawn(&bash_grant(), bash(script, &mark), &tracing::Span::none()).await.unwrap();
    let (out, err, _, _) = drain(&process).await;
    let out = String::from_utf8(out).unwrap();
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(out.contains(&format!("name:{}", name.trim())), "{out}{}", String::from_utf8_lossy(&err));
    assert!(out.contains("renamed:no"), "{out}");
    assert_eq!(std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(), name);
    assert!(out.ends_with("/ "), "the tree's cgroup paths are its own root: {out}");
}
