//! A plugin's process grant cannot be widened from the outside: a `cat`
//! planted in a world-writable `PATH` directory ahead of the real one never
//! runs (the grant refuses to load, or refuses the spawn), and a plugin
//! cannot set `LD_PRELOAD` (or any variable that changes how a program loads
//! or starts) for the program it was granted.
//!
//! Its own test binary with a single test: it changes `PATH` for the whole
//! process, which must not race other threads reading it.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use serde_json::json;
use taskhost::config::Config;
use taskhost::setup::host_from_config;
use taskhost::tools::CallContext;

/// A producer entry serving the bash plugin as tool `tool`, running `shell`.
fn entry(tool: &str, shell: &str, programs: &str, env: &str) -> String {
    format!(
        "[[producer]]\ntool = \"{tool}\"\nplugin = \"builtin:bash\"\n\
         config = {{ shell = \"{shell}\", env = {{ {env} }} }}\n\
         [producer.grants.process]\nprograms = [{programs}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_programs_never_run_and_loader_variables_are_refused() {
    let root = std::env::temp_dir().join(format!("taskhost-grant-programs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let planted = root.join("bin");
    std::fs::create_dir_all(&planted).unwrap();
    let marker = root.join("planted-cat-ran");
    let fake = planted.join("cat");
    std::fs::write(&fake, format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Like /tmp, or a shared tools directory: anyone can plant a file there.
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    let real_cat = Path::new("/usr/bin/cat").canonicalize().unwrap();
    // SAFETY: the only test of this binary sets it before any other thread
    // of ours reads the environment.
    unsafe { std::env::set_var("PATH", format!("{}:/usr/bin:/bin", planted.display())) };
    let cache = format!("[plugins]\ncache_dir = \"{}\"\n", root.join("cache").display());

    // A grant of `cat` resolves through the planted directory: refused at load.
    let config = Config::parse(&format!("{cache}{}", entry("cat", "cat", "\"cat\"", ""))).unwrap();
    let error = format!("{:#}", host_from_config(&config, &root).await.err().expect("the grant must not load"));
    assert!(
        error.contains(&format!("program \"cat\" resolves to {} through {}", fake.display(), planted.display()))
            && error.contains("writable by group or others")
            && error.contains("Name the absolute path"),
        "{error}"
    );

    // Granted by absolute path, a bare `cat` (found first in the planted
    // directory) is not the granted program; the absolute one runs the real cat.
    let real = real_cat.display();
    let config = Config::parse(&format!(
        "{cache}{}{}{}",
        entry("bare", "cat", &format!("\"{real}\""), ""),
        entry("absolute", &real.to_string(), &format!("\"{real}\""), ""),
        entry("preload", "bash", "\"/bin/bash\"", "LD_PRELOAD = \"/tmp/evil.so\""),
    ))
    .unwrap();
    let host = host_from_config(&config, &root).await.expect("absolute grants load");
    let agent = host.create_agent("agent", "session").unwrap();
    let call = |tool: &'static str| {
        let (host, agent) = (host.clone(), agent.clone());
        async move {
            match host.call_tool(tool, json!({"command": "true"}), &CallContext::for_agent(&agent)).await {
                Ok(reply) => reply.text,
                Err(error) => format!("{error:#}"),
            }
        }
    };
    let bare = call("bare").await;
    assert!(
        bare.contains(&format!("it resolves to {}, which is not granted", fake.display())),
        "a bare name must not reach the planted program: {bare}"
    );
    let absolute = call("absolute").await;
    assert!(absolute.contains("exit code: 1") && absolute.contains("invalid option"), "the real cat ran: {absolute}");
    assert!(!marker.exists(), "the planted cat ran");

    let preload = call("preload").await;
    assert!(
        preload.contains("refuses environment variable \"LD_PRELOAD\"")
            && preload.contains("changes what the dynamic loader loads"),
        "{preload}"
    );
    host.dispose().await;
    std::fs::remove_dir_all(&root).unwrap();
}
