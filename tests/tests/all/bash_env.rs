//! The bash plugin's environment: the host's environment reaches a command
//! only through the allowlist (`PATH HOME LANG LC_* TERM TZ USER SHELL`) and
//! the names the grant passes; credentials and host sockets stay out unless
//! the grant names them exactly; explicit entries from the plugin config win
//! where the grant lists their names (`env.plugin_may_set`) and are refused
//! otherwise; the terminal is model-friendly.
//!
//! Its own test binary with a single test: it sets variables in the test
//! process's environment, which must not race other threads reading it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use taskhost::Host;
use taskhost::plugin::WasmProducer;
use taskhost::plugin::resources::ProcessCapability;
use taskhost::process::{EnvPolicy, ProcessGrant, ProcessHost, ProcessHostConfig};
use taskhost::settings::TasksSettings;
use taskhost::tools::CallContext;
use taskhost::tools::producer_tool::ProducerToolOptions;

/// What a developer's session or a CI job holds: credentials in many shapes
/// and addresses of host services.
const HOST_ENV: &[(&str, &str)] = &[
    ("TASKHOST_E2E_SECRET_TOKEN", "hunter2"),
    ("TASKHOST_E2E_DB_PASSWORD", "swordfish"),
    ("MYSQL_PWD", "mysqlpw"),
    ("DATABASE_URL", "postgres://app:dbpw@db/app"),
    ("HTTPS_PROXY", "http://proxyuser:proxypw@proxy:3128"),
    ("SENTRY_DSN", "https://sentrykey@sentry.example/1"),
    ("NPM_CONFIG__AUTH", "bnBtYXV0aA=="),
    ("SSH_AUTH_SOCK", "/run/user/1000/ssh-agent.sock"),
    ("TMUX", "/tmp/tmux-1000/default,1234,0"),
    ("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/1000/bus"),
    ("XDG_RUNTIME_DIR", "/run/user/1000"),
    ("TASKHOST_E2E_PLAIN", "visible"),
    ("LC_TIME", "C"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_host_variables_reach_a_command_and_config_entries_win() {
    // SAFETY: the only test of this binary sets them before any other thread
    // of ours reads the environment.
    unsafe {
        for (name, value) in HOST_ENV {
            std::env::set_var(name, value);
        }
    }
    let engine = taskhost_tests::engine(|_| {});
    let version = engine.load_file(taskhost::builtin::BASH_PATH).await.unwrap();
    let processes = ProcessHost::new(&ProcessHostConfig::default()).unwrap();
    let host = Host::new(&TasksSettings::default()).unwrap();
    let config = json!({"env": {"MY_API_KEY": "from-config"}});
    // The config's entry reaches the command only where the grant lists its name.
    let config_names = || vec!["MY_API_KEY".to_string()];
    let unlisted = ProcessGrant { programs: vec!["bash".into()], ..ProcessGrant::default() };
    let by_default = ProcessGrant {
        programs: vec!["bash".into()],
        env: EnvPolicy { plugin_may_set: config_names(), ..EnvPolicy::default() },
        ..ProcessGrant::default()
    };
    let passing = ProcessGrant {
        programs: vec!["bash".into()],
        env: EnvPolicy {
            pass: vec!["TASKHOST_E2E_PLAIN".into(), "SSH_AUTH_SOCK".into(), "DATABASE_URL".into(), "DBUS_*".into()],
            plugin_may_set: config_names(),
            ..EnvPolicy::default()
        },
        ..ProcessGrant::default()
    };
    for (tool, grant) in [("bash_unlisted", unlisted), ("bash", by_default), ("bash_passing", passing)] {
        let producer = WasmProducer::new(version.clone(), config.clone())
            .await
            .unwrap()
            .with_process(ProcessCapability { host: processes.clone(), grant: Arc::new(grant) });
        host.add_producer(
            Arc::new(producer),
            ProducerToolOptions::new(tool).with_foreground_timeout(Duration::from_secs(30)).with_promote_after(None),
        )
        .expect("tool name is valid");
    }
    let agent = host.create_agent("agent", "session").unwrap();
    let names: Vec<&str> = HOST_ENV.iter().map(|(name, _)| *name).collect();
    let secrets: Vec<&str> = HOST_ENV.iter().take(11).map(|(_, value)| *value).collect();
    let command = format!(
        "for v in {}; do printenv $v >/dev/null && echo -n \"$v \"; done; echo; \
         echo \"[$MY_API_KEY] [$NO_COLOR $TERM $PAGER $GIT_PAGER] [${{HOME:+home}} ${{PATH:+path}}]\"; \
         env | grep -c -F {}",
        names.join(" "),
        secrets.iter().map(|s| format!("-e '{s}'")).collect::<Vec<_>>().join(" ")
    );
    let call = |tool: &'static str| {
        let (host, agent, command) = (host.clone(), agent.clone(), command.clone());
        async move {
            match host.call_tool(tool, json!({"command": command}), &CallContext::for_agent(&agent)).await {
                Ok(reply) => reply.text,
                Err(error) => format!("{error:#}"),
            }
        }
    };
    let refused = call("bash_unlisted").await;
    assert!(
        refused.contains("does not let this plugin set environment variable \"MY_API_KEY\"")
            && refused.contains("`env.plugin_may_set`"),
        "a name the grant does not list is refused, with the key to change: {refused}"
    );
    assert_eq!(
        call("bash").await,
        "LC_TIME \n[from-config] [1 dumb cat cat] [home path]\n0\n[status: completed, exit code: 1]",
        "by default only the allowlist passes"
    );
    assert_eq!(
        call("bash_passing").await,
        "DATABASE_URL SSH_AUTH_SOCK DBUS_SESSION_BUS_ADDRESS TASKHOST_E2E_PLAIN LC_TIME \n\
         [from-config] [1 dumb cat cat] [home path]\n3\n[status: completed, exit code: 0]",
        "exactly named variables pass even past the scrub; a pattern passes what is no credential"
    );
}
