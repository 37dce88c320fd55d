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
