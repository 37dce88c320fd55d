//! Outbound HTTP from a `taskhost serve` run as an unprivileged user
//! (`nobody`, through `setpriv`): the granted origin answers with the
//! injected credential, which never reaches the guest; other origins and
//! the metadata address are refused; the server carries on.

use std::path::Path;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};
use taskhost_tests::fixtures::HTTP_GET_PATH;

use crate::http::{BIN, SECRET, assert_failed_with, needle, server};

/// The uid the unprivileged runs use: `nobody`.
const NOBODY: u32 = 65534;

/// `taskhost serve` (MCP over stdio) run as `uid` through `setpriv`, its
/// configuration `<base>/etc/taskhost.toml`, in the workspace `<base>/work`
/// with `<base>/home` as its home (all the user's own), its log in
/// `<base>/stderr.log`; killed when dropped.
async fn serve_as(
    uid: u32,
    base: &Path,
) -> (rmcp::service::RunningService<rmcp::RoleClient, ()>, tokio::process::Child) {
    use rmcp::ServiceExt as _;
    let mut command = taskhost_process::testing::as_user::command(Path::new(BIN), Some(uid));
    command
        .args(["serve", "--config", base.join("etc/taskhost.toml").to_str().unwrap()])
        .current_dir(base.join("work"))
        .env("HOME", base.join("home"))
        .env_remove("XDG_STATE_HOME")
        .env_remove("XDG_CACHE_HOME")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(base.join("stderr.log")).unwrap())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("run taskhost serve through setpriv");
    let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = ().serve((stdout, stdin)).await.unwrap_or_else(|e| {
        panic!(
            "initialize over stdio: {e}; the server said: {}",
            std::fs::read_to_string(base.join("stderr.log")).unwrap()
        )
    });
    (client, child)
}

/// One `http_get` call over MCP: the text the model reads.
async fn call_over_mcp(client: &rmcp::service::Peer<rmcp::RoleClient>, args: Value) -> String {
    let params = rmcp::model::CallToolRequestParams::new("http_get")
        .with_arguments(args.as_object().expect("arguments are an object").clone());
    let result = tokio::time::timeout(std::time::Duration::from_secs(60), client.call_tool(params))
        .await
        .expect("http_get answers within 60 s")
        .expect("http_get answers at the protocol level");
    result.content.iter().filter_map(|block| block.as_text()).map(|text| text.text.as_str()).collect()
}

#[tokio::test]
async fn a_server_run_as_an_unprivileged_user_reaches_the_granted_origin_refuses_the_rest_and_keeps_the_credential() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let uid = std::fs::metadata("/proc/self").unwrap().uid();
    assert_eq!(uid, 0, "this test runs the server as {NOBODY} through setpriv, which needs root (CI runs as root)");
    let temp = tempfile::tempdir().unwrap();
    let base = temp.path();
    let (allowed, seen) = server().await;
    let (other, other_seen) = server().await;
    // The user's own files: its home, an empty workspace, the configuration
    // and the plugin (the build's may sit below /root) out of the workspace's
    // reach, and the secret, which only that user may read.
    for sub in ["home", "work", "etc", "secret"] {
        std::fs::create_dir(base.join(sub)).unwrap();
    }
    std::fs::copy(HTTP_GET_PATH, base.join("etc/http-get.wasm")).unwrap();
    std::fs::write(base.join("secret/token"), format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(base.join("secret/token"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = format!(
        "[[producer]]\ntool = \"http_get\"\nplugin = \"http-get.wasm\"\nbackground = false\n\
         [producer.grants.http]\norigins = [\"http://{allowed}\"]\n\
         [[producer.grants.http.credentials]]\norigin = \"http://{allowed}\"\nheader = \"Authorization\"\n\
         value_file = {:?}\n",
        base.join("secret/token")
    );
    std::fs::write(base.join("etc/taskhost.toml"), config).unwrap();
    for path in ["home", "work", "etc", "secret", "etc/http-get.wasm", "etc/taskhost.toml", "secret/token"] {
        std::os::unix::fs::chown(base.join(path), Some(NOBODY), Some(NOBODY)).unwrap();
    }
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();

    let (client, server) = serve_as(NOBODY, base).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.id().unwrap())).unwrap();
    let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap().to_string();
    assert_eq!(
        uids.split_whitespace().nth(1),
        Some(NOBODY.to_string().as_str()),
        "the server runs as {NOBODY}: {uids}"
    );
    let ok = call_over_mcp(&client, json!({"url": format!("http://{allowed}/ok")})).await;
    assert!(ok.contains("status 200") && ok.contains("body hello"), "{ok}");

    let auth = call_over_mcp(
        &client,
        json!({"url": format!("http://{allowed}/auth"), "scan": [needle(SECRET), needle("recorded")]}),
    )
    .await;
    assert_eq!(*seen.authorization.lock().unwrap(), [SECRET], "the server got the credential");
    assert!(auth.contains("scan 1 found at"), "the scan finds the body the guest read: {auth}");
    assert!(auth.contains("scan 0 absent in"), "the secret is in the guest's memory: {auth}");
    assert!(!auth.contains("s3cret"), "the secret is in the guest's output: {auth}");

    let refused = call_over_mcp(&client, json!({"url": format!("http://{other}/ok")})).await;
    assert_failed_with(&refused, &format!("origin http://{other} is not granted to this plugin"));
    let metadata = call_over_mcp(&client, json!({"url": "http://169.254.169.254/latest/meta-data/"})).await;
    assert_failed_with(&metadata, "origin http://169.254.169.254:80 is not granted");
    // The server carries on.
    let again = call_over_mcp(&client, json!({"url": format!("http://{allowed}/ok")})).await;
    assert!(again.contains("body hello"), "{again}");
    assert_eq!(other_seen.hits.load(Ordering::SeqCst), 0, "no request reached the refused server");
}
