//! The tree's filesystem view, through real spawns: what the host protects
//! stays protected inside a workspace.

use super::*;

/// A fresh directory outside `/tmp` (a tree's `/tmp` is private).
fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(format!("/var/tmp/taskhost-view-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `protected_paths` stay hidden and `write_protected_paths` read-only when
/// they lie inside the workspace a tree writes.
#[tokio::test]
async fn the_hosts_paths_inside_a_workspace_stay_hidden_or_read_only() {
    if !confine::support().mount_namespace {
        eprintln!("NOTE: no mount namespaces here: the host's paths cannot be protected (the probe logged it)");
        return;
    }
    let work = scratch("host-paths");
    let (state, config, plugin) = (work.join("state"), work.join("conf/taskhost.toml"), work.join("p.wasm"));
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(state.join("key"), "STATE-CANARY").unwrap();
    std::fs::write(&config, "# config\n").unwrap();
    std::fs::write(&plugin, "wasm").unwrap();
    let host = ProcessHost::new(&ProcessHostConfig {
        protected_paths: vec![state.clone()],
        write_protected_paths: vec![config.clone(), plugin.clone()],
        ..Default::default()
    })
    .unwrap();
    let grant = ProcessGrant { working_dirs: vec![work.clone()], ..bash_grant() };
    let mark = marker("host-paths");
    let r = |name: &str, command: &str| format!("if {command}; then echo {name}:yes; else echo {name}:no; fi\n");
    let script = [
        r("state_read", "grep -q CANARY state/key 2>/dev/null"),
        r("config_read", "grep -q config conf/taskhost.toml"),
        r("plugin_read", "grep -q wasm p.wasm"),
        r("config_write", "echo x 2>/dev/null >> conf/taskhost.toml"),
        r("config_remove", "rm -f conf/taskhost.toml 2>/dev/null && ! test -e conf/taskhost.toml"),
        r("config_replace", "echo y > new 2>/dev/null && mv -f new conf/taskhost.toml 2>/dev/null"),
        r("plugin_write", "echo x 2>/dev/null > p.wasm"),
        r("plugin_rename", "mv p.wasm q.wasm 2>/dev/null"),
        r("workspace_write", "echo ok > other"),
    ]
    .concat();
    let process = host.spawn(&grant, bash(&script, &mark), &tracing::Span::none()).await.unwrap();
    let (out, err, _, _) = drain(&process).await;
    let out = String::from_utf8(out).unwrap();
    for line in [
        "state_read:no",
        "config_read:yes",
        "plugin_read:yes",
        "config_write:no",
        "config_remove:no",
        "config_replace:no",
        "plugin_write:no",
        "plugin_rename:no",
        "workspace_write:yes",
    ] {
        assert!(out.lines().any(|l| l == line), "{line}; output:\n{out}{}", String::from_utf8_lossy(&err));
    }
    assert_eq!(std::fs::read_to_string(&config).unwrap(), "# config\n");
    assert_eq!(std::fs::read_to_string(&plugin).unwrap(), "wasm");
    assert_eq!(std::fs::read_to_string(state.join("key")).unwrap(), "STATE-CANARY");
    std::fs::remove_dir_all(&work).unwrap();
}

/// Runs `script` in a tree whose workspace is `work`; returns stdout,
/// stderr and the status.
async fn run_in(work: &std::path::Path, script: &str, tag: &str) -> (String, String, ExitStatus) {
    let host = host();
    let grant = ProcessGrant { working_dirs: vec![work.to_path_buf()], ..bash_grant() };
    let mark = marker(tag);
    let process = host.spawn(&grant, bash(script, &mark), &tracing::Span::none()).await.unwrap();
    let (out, err, _, status) = drain(&process).await;
    (String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap(), status)
}

fn require_views() {
    assert!(
        confine::support().mount_namespace,
        "this test needs mount namespaces in user namespaces (the probe says: {})",
        confine::support().describe()
    );
}

/// The root of the view is the allow list: system directories, the tree's
/// own /proc, /dev, /tmp, /var/tmp, /run, its home and its workspace;
/// nothing else of the host (other homes, /mnt, /srv, /boot, the host's
/// /run and its sockets, most of /sys) exists.
#[tokio::test]
async fn the_view_holds_the_allow_list_and_nothing_else() {
    require_views();
    let work = scratch("allow-list");
    // A listening socket under the host's /run: the tree must not find it.
    let socket_path = std::path::PathBuf::from(format!("/run/taskhost-test-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket_path);
    let _listener = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    let script = format!(
        "ls -A / | tr '\\n' ' '; echo
         ls -A /var | tr '\\n' ' '; echo
         echo $(ls -A /sys) $(ls -A /sys/devices) $(ls -A /sys/devices/system)
         echo run:$(ls -A /run)
         test -e {sock} && echo socket:yes || echo socket:no
         readlink /var/run
         echo x > /tmp/t && echo x > /var/tmp/t && echo x > /run/t && echo x > $HOME/t && echo private-writes
         (echo x > /usr/t) 2>/dev/null || echo usr-read-only
         (echo x > /t) 2>/dev/null || echo root-read-only
         nproc; python3 -c 'import os; print(os.cpu_count())'",
        sock = socket_path.display()
    );
    let (out, err, status) = run_in(&work, &script, "allow-list").await;
    std::fs::remove_file(&socket_path).unwrap();
    assert_eq!(status, ExitStatus::Code(0), "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    let root: std::collections::BTreeSet<&str> = lines[0].split_whitespace().collect();
    let host_root: Vec<String> =
        std::fs::read_dir("/").unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    for name in ["usr", "etc", "proc", "dev", "tmp", "var", "run", "sys"] {
        assert!(root.contains(name), "/{name} is missing from the view: {root:?}");
    }
    for name in ["mnt", "srv", "boot", "media", "home", "lost+found", "work"] {
        let shown = root.contains(name);
        let home_below = std::env::var("HOME").is_ok_and(|h| h.starts_with(&format!("/{name}/")));
        let workspace_below = work.starts_with(format!("/{name}"));
        if host_root.iter().any(|h| h == name) && !home_below && !workspace_below {
            assert!(!shown, "/{name} of the host is in the view: {root:?}");
        }
    }
    assert_eq!(lines[1], "run tmp ", "{out}");
    assert_eq!(lines[2], "devices system cpu", "{out}");
    assert_eq!(lines[3], "run:", "{out}");
    assert_eq!(&lines[4..9], ["socket:no", "/run", "private-writes", "usr-read-only", "root-read-only"], "{out}");
    let cpus = std::thread::available_parallelism().unwrap().get().to_string();
    assert_eq!(&lines[9..], [cpus.as_str(), cpus.as_str()], "nproc and os.cpu_count work: {out}{err}");
    std::fs::remove_dir_all(&work).unwrap();
}

/// A repository in the workspace stays usable (status, add, commit) while
/// what would run code outside the sandbox stays read-only: its
/// configuration, hooks and info, editor and direnv files, taskhost.toml;
/// renaming `.git` or a directory above a protected path is refused, so the
/// protection cannot be carried away.
#[tokio::test]
async fn git_works_and_the_read_only_set_holds_in_the_workspace() {
    require_views();
    let work = scratch("read-only-set");
    let git = |dir: &std::path::Path, args: &[&str]| {
        let status = std::process::Command::new("git").arg("-C").arg(dir).args(args).status().unwrap();
        assert!(status.success(), "git {args:?}");
    };
    git(&work, &["init", "-q"]);
    let nested = work.join("crates/lib");
    std::fs::create_dir_all(&nested).unwrap();
    git(&nested, &["init", "-q"]);
    std::fs::create_dir_all(work.join(".vscode")).unwrap();
    std::fs::write(work.join(".vscode/tasks.json"), "{}").unwrap();
    std::fs::write(work.join(".envrc"), "export A=1\n").unwrap();
    std::fs::write(work.join("crates/taskhost.toml"), "").unwrap();
    std::fs::write(work.join("README"), "hello\n").unwrap();
    let r = |name: &str, command: &str| format!("if {command}; then echo {name}:yes; else echo {name}:no; fi\n");
    let id = "-c user.email=t@t -c user.name=t";
    let script = [
        r("status", "git status --short >/dev/null"),
        r("add", "git add README"),
        r("commit", &format!("git {id} commit -q -m first")),
        r("diff", "echo more >> README && git diff --stat | grep -q README"),
        r("commit_again", &format!("git {id} commit -qam second")),
        r("config_write", "git config core.fsmonitor evil 2>/dev/null"),
        r("config_append", "echo '[core] fsmonitor = evil' >> .git/config 2>/dev/null"),
        r("hook_write", "echo evil > .git/hooks/pre-commit 2>/dev/null"),
        r("info_write", "echo evil >> .git/info/exclude 2>/dev/null"),
        r("nested_hook", "echo evil > crates/lib/.git/hooks/post-checkout 2>/dev/null"),
        r("envrc_write", "echo evil >> .envrc 2>/dev/null"),
        r("vscode_write", "echo evil > .vscode/tasks.json 2>/dev/null"),
        r("vscode_new", "echo evil > .vscode/settings.json 2>/dev/null"),
        r("toml_write", "echo evil > crates/taskhost.toml 2>/dev/null"),
        r("mv_git", "mv .git moved 2>/dev/null"),
        r("mv_crates", "mv crates moved 2>/dev/null"),
        r("mv_nested", "mv crates/lib crates/other 2>/dev/null"),
        r("rm_envrc", "rm -f .envrc 2>/dev/null && ! test -e .envrc"),
        r("other_write", "echo ok > crates/new && mkdir -p src && echo ok > src/x"),
    ]
    .concat();
    let (out, err, status) = run_in(&work, &script, "read-only-set").await;
    assert_eq!(status, ExitStatus::Code(0), "{out}{err}");
    for line in [
        "status:yes",
        "add:yes",
        "commit:yes",
        "diff:yes",
        "commit_again:yes",
        "config_write:no",
        "config_append:no",
        "hook_write:no",
        "info_write:no",
        "nested_hook:no",
        "envrc_write:no",
        "vscode_write:no",
        "vscode_new:no",
        "toml_write:no",
        "mv_git:no",
        "mv_crates:no",
        "mv_nested:no",
        "rm_envrc:no",
        "other_write:yes",
    ] {
        assert!(out.lines().any(|l| l == line), "{line}; output:\n{out}{err}");
    }
    // The host sees the commits, and nothing of the attempts.
    let log = std::process::Command::new("git").arg("-C").arg(&work).args(["log", "--oneline"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&log.stdout).lines().count(), 2);
    let config = std::fs::read_to_string(work.join(".git/config")).unwrap();
    assert!(!config.contains("fsmonitor"), "{config}");
    assert!(!work.join(".git/hooks/pre-commit").exists());
    assert_eq!(std::fs::read_to_string(work.join(".envrc")).unwrap(), "export A=1\n");
    std::fs::remove_dir_all(&work).unwrap();
}

/// A workspace that is `/`, the home directory or an ancestor of it is
/// refused when the grant is loaded, with what to pass instead.
#[test]
fn a_workspace_that_is_the_root_or_holds_the_home_is_refused_at_load() {
    let home = std::path::Path::new("/var/tmp").join(format!("taskhost-view-home-{}", std::process::id()));
    let project = home.join("project");
    std::fs::create_dir_all(&project).unwrap();
    let grant = |dir: &std::path::Path| ProcessGrant { working_dirs: vec![dir.to_path_buf()], ..bash_grant() };
    for (dir, what) in [
        (std::path::Path::new("/"), "the filesystem root"),
        (home.as_path(), "the home directory"),
        (home.parent().unwrap(), "an ancestor of the home directory"),
    ] {
        let error = grant(dir).check_workspace(Some(&home)).unwrap_err();
        assert!(error.contains(what) && error.contains("working_dirs"), "{error}");
    }
    assert_eq!(grant(&project).check_workspace(Some(&home)), Ok(()), "a project inside the home is fine");
    let rw = ProcessGrant { read_write_paths: vec![home.clone()], ..grant(&project) };
    assert!(rw.check_workspace(Some(&home)).unwrap_err().contains("the home directory"));
    std::fs::remove_dir_all(&home).unwrap();
}

/// One host, spawns before and after the host's filesystem changes: what
/// the view is planned from is cached between spawns, and every change is
/// seen by the next spawn (a denied file created in the workspace, a
/// protected directory moved aside and replaced, a denied path removed).
#[tokio::test]
async fn every_spawn_sees_the_hosts_filesystem_as_it_is_now() {
    if !confine::support().mount_namespace {
        eprintln!("NOTE: no mount namespaces here: the view cannot be checked (the probe logged it)");
        return;
    }
    let work = scratch("cache");
    let state = work.join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("key"), "STATE-CANARY").unwrap();
    let host =
        ProcessHost::new(&ProcessHostConfig { protected_paths: vec![state.clone()], ..Default::default() }).unwrap();
    let secret = work.join("secret");
    let filesystem = crate::fs_policy::FsPolicy { deny_read: vec![secret.clone()], allow_read: vec![] };
    let grant = ProcessGrant { working_dirs: vec![work.clone()], filesystem, ..bash_grant() };
    let run = |script: &'static str| {
        let (host, grant) = (&host, &grant);
        async move {
            let mark = marker("cache");
            let process = host.spawn(grant, bash(script, &mark), &tracing::Span::none()).await.unwrap();
            let (out, _, _, _) = drain(&process).await;
            String::from_utf8(out).unwrap()
        }
    };
    let read_both = "cat secret state/key 2>/dev/null; echo end";
    assert_eq!(run(read_both).await, "end\n", "nothing readable at first");
    assert_eq!(run(read_both).await, "end\n", "the same, planned from the cache");

    std::fs::write(&secret, "SECRET-CANARY").unwrap();
    assert_eq!(run(read_both).await, "end\n", "a denied file created between spawns is hidden");
    std::fs::remove_file(&secret).unwrap();
    assert_eq!(run("test -e secret && echo shown; echo end").await, "end\n");

    // The protected directory moved aside and a new one made in its place:
    // the new one is protected (it is the path that is), the old one is an
    // ordinary workspace directory now.
    std::fs::rename(&state, work.join("old-state")).unwrap();
    std::fs::create_dir(&state).unwrap();
    std::fs::write(state.join("key"), "NEW-STATE-CANARY").unwrap();
    assert_eq!(run(read_both).await, "end\n", "the replaced protected directory is hidden");
    assert_eq!(run("cat old-state/key; echo; echo end").await, "STATE-CANARY\nend\n");
    std::fs::remove_dir_all(&work).unwrap();
}
