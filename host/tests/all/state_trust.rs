//! taskhost's own state against the trees it runs, through `taskhost serve`
//! (and `trust`), with the server as the test's user (root in CI) and as an
//! unprivileged user (`setpriv` to 65534): a configuration a tree planted or
//! replaced is refused with the command that trusts it, a trusted one loads,
//! an edit needs a new trust.
//!
//! Each test has its own state directory (`XDG_STATE_HOME`), compile cache
//! and home, outside the workspace the server's trees write.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{call, only_text};
use rmcp::ServiceExt;
use serde_json::json;

/// The uid/gid of the unprivileged server.
const NOBODY: u32 = 65534;

/// One test's directories, owned by the server's user.
pub struct Place {
    pub base: PathBuf,
    /// The servers' working directory: where their trees write.
    pub work: PathBuf,
    /// `XDG_STATE_HOME` (default `base/state`, outside the workspace).
    pub state_home: PathBuf,
    pub uid: Option<u32>,
}

impl Place {
    pub fn new(tag: &str, uid: Option<u32>) -> Self {
        let base = common::temp_dir(tag);
        let work = base.join("work");
        for dir in [&work, &base.join("home"), &base.join("state"), &base.join("cache")] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let state_home = base.join("state");
        let place = Self { base, work, state_home, uid };
        place.chown();
        place
    }

    /// Gives everything below `base` to the server's user.
    /// The ticker as `plugins/beats.wasm` in the workspace: the directory,
    /// the file and its bytes.
    pub fn workspace_plugin(&self) -> (PathBuf, PathBuf, Vec<u8>) {
        let plugins = self.work.join("plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        let file = plugins.join("beats.wasm");
        let original = std::fs::read(taskhost::builtin::TICKER_PATH).unwrap();
        std::fs::write(&file, &original).unwrap();
        (plugins, file, original)
    }

    pub fn chown(&self) {
        if let Some(uid) = self.uid {
            chown_tree(&self.base, uid);
        }
    }

    /// `taskhost <args>` as the server's user, in the workspace, with this
    /// test's state, cache and home.
    pub fn taskhost(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = common::taskhost_as(self.uid);
        command
            .args(args)
            .current_dir(&self.work)
            .env("HOME", self.base.join("home"))
            .env("XDG_STATE_HOME", &self.state_home)
            .env("XDG_CACHE_HOME", self.base.join("cache"))
            .env("RUST_LOG", "info,taskhost=debug")
            .kill_on_drop(true);
        command
    }

    /// `taskhost trust <file>` (or other `trust`/`untrust` arguments): its stdout.
    pub async fn trust(&self, args: &[&str]) -> String {
        let output = self.taskhost(args).stdin(Stdio::null()).output().await.unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "taskhost {args:?} failed: {stdout}\n{stderr}");
        stdout.into_owned()
    }

    /// `taskhost serve <args>` over stdio, and a client.
    pub async fn serve(&self, args: &[&str]) -> Served {
        let mut command = self.taskhost(&[&["serve"], args].concat());
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(common::log_file(&self.base));
        let mut child = command.spawn().expect("spawn taskhost serve");
        let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
        let client = match ().serve((stdout, stdin)).await {
            Ok(client) => client,
            Err(error) => panic!("the server did not start ({error}); its log:\n{}", self.log()),
        };
        Served { client, child }
    }

    /// `taskhost serve <args>`, which must refuse to start: its stderr.
    pub async fn serve_refused(&self, args: &[&str]) -> String {
        let output = tokio::time::timeout(
            Duration::from_secs(30),
            self.taskhost(&[&["serve"], args].concat()).stdin(Stdio::null()).output(),
        )
        .await
        .expect("a refused server exits at once")
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(!output.status.success(), "the server must refuse to start; its log:\n{stderr}");
        assert!(output.stdout.is_empty(), "nothing on the MCP stream: {:?}", output.stdout);
        stderr
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.base.join("stderr.log")).unwrap_or_default()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

pub struct Served {
    pub client: common::Client,
    pub child: tokio::process::Child,
}

impl Served {
    /// Runs `command` through the default `bash` tool: its output.
    pub async fn bash(&self, command: &str) -> String {
        only_text(&call(self.client.peer(), "bash", json!({ "command": command })).await)
    }

    /// The tool names served.
    pub async fn tools(&self) -> Vec<String> {
        self.client.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect()
    }

    /// Disconnects and waits for a clean exit.
    pub async fn stop(mut self) {
        let _ = self.client.cancel().await;
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.expect("exits").unwrap();
        assert!(status.success(), "server exit {status}");
    }
}

pub fn chown_tree(path: &Path, uid: u32) {
    let _ = std::os::unix::fs::lchown(path, Some(uid), Some(uid));
    if path.is_dir() && !path.is_symlink() {
        for entry in std::fs::read_dir(path).unwrap().flatten() {
            chown_tree(&entry.path(), uid);
        }
    }
}

/// The uid to run as, or `None` to skip (with the reason) when the test is
/// not root: switching to another uid needs root (CI runs as root).
pub fn unprivileged() -> Option<u32> {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0
        && common::gap_accepted("root", "switching to another uid needs root", "run the tests as root (CI does)")
    {
        return None;
    }
    Some(NOBODY)
}

/// What a model would plant: its own tool, with the network and the home.
const PLANTED: &str = "[[producer]]\ntool = \"planted\"\nplugin = \"builtin:bash\"\n\
                       [producer.grants.process]\nprograms = [\"bash\"]\nnetwork = true\nread_write_paths = [\"/var/tmp\"]\n";

/// A tree plants `./taskhost.toml` (there was none); the next stock `serve`
/// there refuses to start, naming the file and the command; once trusted it
/// loads; an edit after the trust is refused again.
async fn planted_configuration(tag: &str, uid: Option<u32>) {
    let place = Place::new(tag, uid);
    let served = place.serve(&[]).await;
    let planted = served.bash(&format!("printf '%s' '{PLANTED}' > taskhost.toml && echo planted")).await;
    assert!(planted.starts_with("planted"), "{planted}");
    served.stop().await;
    let file = place.work.join("taskhost.toml");
    assert!(file.exists(), "the tree wrote the workspace");

    let refused = place.serve_refused(&[]).await;
    let path = file.display().to_string();
    assert!(refused.contains(&format!("refusing the configuration {path}")), "{refused}");
    assert!(refused.contains("the server's working directory") && refused.contains("never trusted"), "{refused}");
    assert!(refused.contains(&format!("taskhost trust {path}")), "the command to run: {refused}");
    assert!(!refused.contains("host ready"), "nothing was served: {refused}");

    // The user checked it and vouches for it: it loads.
    let trusted = place.trust(&["trust", &path]).await;
    assert!(trusted.contains(&format!("trusted configuration {path}: sha256 ")), "{trusted}");
    let served = place.serve(&[]).await;
    assert!(served.tools().await.contains(&"planted".to_string()));
    served.stop().await;
    let listed = place.trust(&["trust", "--list"]).await;
    assert!(listed.starts_with("ok ") && listed.contains(&path), "{listed}");

    // Edited after the trust (by a tree, say): refused again.
    std::fs::write(&file, format!("{PLANTED}# one more line\n")).unwrap();
    let refused = place.serve_refused(&[]).await;
    assert!(refused.contains("changed since it was trusted"), "{refused}");
    assert!(place.trust(&["trust", "--list"]).await.starts_with("changed "));
    // Untrusted: never again.
    place.trust(&["trust", &path]).await;
    place.trust(&["untrust", &path]).await;
    assert!(place.serve_refused(&[]).await.contains("never trusted"));
}

#[tokio::test]
async fn a_planted_configuration_is_refused_until_trusted() {
    planted_configuration("trust-planted", None).await;
}

#[tokio::test]
async fn a_planted_configuration_is_refused_until_trusted_by_an_unprivileged_server() {
    let Some(uid) = unprivileged() else { return };
    planted_configuration("trust-planted-nobody", Some(uid)).await;
}

/// A trusted `--config` in the workspace: a tree moves its directory away
/// and puts its own configuration at the same path; the next `serve` with
/// the same `--config` refuses it (the hash changed).
async fn renamed_configuration(tag: &str, uid: Option<u32>) {
    let place = Place::new(tag, uid);
    let conf = place.work.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let file = conf.join("taskhost.toml");
    std::fs::write(
        &file,
        "[[producer]]\ntool = \"bash\"\nplugin = \"builtin:bash\"\n[producer.grants.process]\nprograms = [\"bash\"]\n",
    )
    .unwrap();
    place.chown();
    let path = file.display().to_string();
    place.trust(&["trust", &path]).await;

    let served = place.serve(&["--config", &path]).await;
    let swapped = served
        .bash(&format!(
            "mv conf conf.old && mkdir conf && printf '%s' '{PLANTED}' > conf/taskhost.toml && echo swapped"
        ))
        .await;
    served.stop().await;
    if !swapped.starts_with("swapped") {
        // The sandbox held the directory in place. The host's own check is
        // what this test is about: make the swap from outside, as a tree of
        // a weaker sandbox (no mount namespace) could.
        eprintln!("the tree could not swap the directory ({swapped}); swapping it from outside");
        std::fs::rename(&conf, place.work.join("conf.old")).unwrap();
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::write(&file, PLANTED).unwrap();
        place.chown();
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), PLANTED);
    let refused = place.serve_refused(&["--config", &path]).await;
    assert!(refused.contains(&format!("refusing the configuration {path}")), "{refused}");
    assert!(refused.contains("changed since it was trusted"), "{refused}");
}

#[tokio::test]
async fn a_configuration_swapped_by_renaming_its_directory_is_refused() {
    renamed_configuration("trust-renamed", None).await;
}

#[tokio::test]
async fn a_configuration_swapped_by_renaming_its_directory_is_refused_by_an_unprivileged_server() {
    let Some(uid) = unprivileged() else { return };
    renamed_configuration("trust-renamed-nobody", Some(uid)).await;
}

/// A configuration outside every tree-writable directory needs no trust;
/// the state directory is made `0700` and a group-writable one is refused
/// with the fix.
#[tokio::test]
async fn a_configuration_outside_the_workspace_loads_and_the_state_directory_is_checked() {
    use std::os::unix::fs::PermissionsExt as _;
    let place = Place::new("trust-outside", None);
    let file = place.base.join("outside.toml");
    std::fs::write(&file, "[[producer]]\ntool = \"beats\"\nplugin = \"native:ticker\"\n").unwrap();
    let served = place.serve(&["--config", file.to_str().unwrap()]).await;
    assert!(served.tools().await.contains(&"beats".to_string()));
    served.stop().await;
    let state = place.base.join("state/taskhost");
    assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let refused = place.serve_refused(&["--config", file.to_str().unwrap()]).await;
    assert!(refused.contains("writable by group or others (mode 0777)") && refused.contains("chmod 700"), "{refused}");
}

/// A compile cache entry forged by whoever can write the cache directory
/// but not read the key (a tree that reached `~/.cache`): the right format,
/// another plugin's compiled code under `bash`'s key, and the digest an
/// unkeyed format would have. The next server refuses it, recompiles, and
/// serves bash.
async fn forged_cache_entry(tag: &str, uid: Option<u32>) {
    use sha2::Digest as _;
    let place = Place::new(tag, uid);
    let file = place.base.join("both.toml");
    std::fs::write(
        &file,
        "[[producer]]\ntool = \"bash\"\nplugin = \"builtin:bash\"\n[producer.grants.process]\nprograms = [\"bash\"]\n\
         [[producer]]\ntool = \"beats\"\nplugin = \"builtin:ticker\"\n",
    )
    .unwrap();
    let config = ["--config", file.to_str().unwrap()];
    let served = place.serve(&config).await;
    assert_eq!(served.bash("echo compiled").await, "compiled\n[status: completed, exit code: 0]");
    served.stop().await;

    let cache = place.base.join("cache/taskhost/components");
    let entry_of = |plugin: &str| {
        let hash = taskhost::builtin::find(plugin).unwrap().sha256;
        std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.starts_with(hash) && name.ends_with(".cwasm")
            })
            .unwrap_or_else(|| panic!("no compiled {plugin} in {}", cache.display()))
    };
    let (bash, ticker) = (entry_of("bash"), entry_of("ticker"));
    let magic = b"taskhost-cwasm2\n";
    let header = magic.len() + 32;
    let ticker_code = std::fs::read(&ticker).unwrap()[header..].to_vec();
    let key = bash.file_stem().unwrap().to_string_lossy().into_owned();
    let mut digest = sha2::Sha256::new();
    digest.update(magic);
    digest.update((key.len() as u64).to_le_bytes());
    digest.update(key.as_bytes());
    digest.update(&ticker_code);
    let mut forged = magic.to_vec();
    forged.extend_from_slice(&digest.finalize());
    forged.extend_from_slice(&ticker_code);
    std::fs::write(&bash, &forged).unwrap();
    // Written as the server's user would (else it is refused for its owner).
    place.chown();

    let served = place.serve(&config).await;
    assert_eq!(served.bash("echo still-bash").await, "still-bash\n[status: completed, exit code: 0]");
    served.stop().await;
    let log = place.log();
    let refused = log.lines().find(|l| l.contains("refused a compile cache entry")).unwrap_or_else(|| {
        panic!("the forged entry was not refused; log:\n{log}");
    });
    assert!(refused.contains("MAC does not match") && refused.contains(&key), "{refused}");
    let stored = std::fs::read(&bash).expect("recompiled and stored again");
    assert_ne!(stored, forged, "the forged entry is gone");
}

#[tokio::test]
async fn a_forged_compile_cache_entry_is_recompiled_not_run() {
    forged_cache_entry("trust-cache-forgery", None).await;
}

#[tokio::test]
async fn a_forged_compile_cache_entry_is_recompiled_not_run_by_an_unprivileged_server() {
    let Some(uid) = unprivileged() else { return };
    forged_cache_entry("trust-cache-forgery-nobody", Some(uid)).await;
}

/// A configuration (trusted, with its plugin) serves `beats` from a `.wasm`
/// in the workspace, with `--watch`. A tree overwrites and replaces that
/// file with its own build; the watcher never serves those bytes under
/// `beats`, the reload fails naming the command, and the next server
/// refuses to start with them until the user trusts that build.
async fn swapped_plugin(tag: &str, uid: Option<u32>) {
    let place = Place::new(tag, uid);
    let (plugins, file, original) = place.workspace_plugin();
    // The tree's build: the same behaviour, another hash.
    let tree_bytes = common::rebuilt(&original, "a tree's build");
    std::fs::write(place.work.join("tree.wasm"), &tree_bytes).unwrap();
    let config = place.work.join("taskhost.toml");
    std::fs::write(
        &config,
        "[[producer]]\ntool = \"bash\"\nplugin = \"builtin:bash\"\n[producer.grants.process]\nprograms = [\"bash\"]\n\
         [[producer]]\ntool = \"beats\"\nplugin = \"plugins/beats.wasm\"\n",
    )
    .unwrap();
    place.chown();
    let (config_path, path) = (config.display().to_string(), file.display().to_string());
    let trusted = place.trust(&["trust", &config_path]).await;
    assert!(trusted.contains(&format!("trusted plugin {path} (named by {config_path})")), "{trusted}");

    let served = place.serve(&["--watch"]).await;
    assert!(served.tools().await.contains(&"beats".to_string()));
    let log_path = place.base.join("stderr.log");
    common::wait_for_text(&log_path, "watching the plugin file", Duration::from_secs(20)).await;
    let tried = served
        .bash(
            "cat tree.wasm > plugins/beats.wasm; cp tree.wasm plugins/next.wasm && mv -f plugins/next.wasm \
             plugins/beats.wasm; echo tried",
        )
        .await;
    assert!(tried.contains("tried"), "{tried}");
    if std::fs::read(&file).unwrap() != tree_bytes {
        // The sandbox kept the tree off the file. The host's own check is
        // what this test is about: replace it from outside, as a tree of a
        // weaker sandbox (no mount namespace) could.
        eprintln!("the tree could not replace the plugin file; replacing it from outside");
        let next = plugins.join("next-outside.wasm");
        std::fs::write(&next, &tree_bytes).unwrap();
        std::fs::rename(&next, &file).unwrap();
    }
    let log = common::wait_for_text(&log_path, "reload failed", Duration::from_secs(20)).await;
    let line = log.lines().find(|l| l.contains("reload failed")).unwrap();
    assert!(line.contains(&format!("refusing the plugin {path}")), "{line}");
    assert!(
        line.contains("changed since it was trusted") && line.contains(&format!("taskhost trust {path}")),
        "{line}"
    );
    // Still the trusted build: a call works, and nothing reloaded.
    let beat = only_text(&call(served.client.peer(), "beats", json!({"count": 1, "interval_ms": 1})).await);
    assert!(beat.contains("[status: completed"), "{beat}");
    served.stop().await;
    let log = place.log();
    assert!(!log.contains("reloaded beats"), "the tree's bytes were served:\n{log}");

    // A new server does not start with them either.
    let refused = place.serve_refused(&[]).await;
    assert!(refused.contains(&format!("refusing the plugin {path}")), "{refused}");
    assert!(refused.contains(&format!("taskhost trust {path}")), "{refused}");
    // Until its user vouches for that build.
    place.trust(&["trust", &path]).await;
    let served = place.serve(&[]).await;
    assert!(served.tools().await.contains(&"beats".to_string()));
    served.stop().await;
}

#[tokio::test]
async fn a_plugin_a_tree_replaced_is_never_served() {
    swapped_plugin("trust-plugin", None).await;
}

#[tokio::test]
async fn a_plugin_a_tree_replaced_is_never_served_by_an_unprivileged_server() {
    let Some(uid) = unprivileged() else { return };
    swapped_plugin("trust-plugin-nobody", Some(uid)).await;
}

/// The developer's own rebuild of a plugin in the workspace is refused like
/// any untrusted build; once its user runs `taskhost trust` on it, the
/// running server loads it: the watcher follows the trust records, so no
/// second touch of the plugin file is needed. Trusting an unrelated file
/// loads nothing.
async fn trusted_after_refusal(tag: &str, uid: Option<u32>) {
    let place = Place::new(tag, uid);
    let (plugins, file, original) = place.workspace_plugin();
    let config = place.work.join("taskhost.toml");
    std::fs::write(&config, "[[producer]]\ntool = \"beats\"\nplugin = \"plugins/beats.wasm\"\n").unwrap();
    let other = place.work.join("other.wasm");
    std::fs::write(&other, common::rebuilt(&original, "an unrelated build")).unwrap();
    place.chown();
    let (config_path, path) = (config.display().to_string(), file.display().to_string());
    place.trust(&["trust", &config_path]).await;

    let served = place.serve(&["--watch"]).await;
    let log_path = place.base.join("stderr.log");
    common::wait_for_text(&log_path, "watching the plugin file", Duration::from_secs(20)).await;
    // The rebuild lands the way cargo and most tools write: a new file
    // renamed onto the name.
    let next = plugins.join("beats.wasm.next");
    std::fs::write(&next, common::rebuilt(&original, "the developer's rebuild")).unwrap();
    if let Some(uid) = uid {
        std::os::unix::fs::chown(&next, Some(uid), Some(uid)).unwrap();
    }
    std::fs::rename(&next, &file).unwrap();
    let log = common::wait_for_text(&log_path, "reload failed", Duration::from_secs(20)).await;
    let line = log.lines().find(|l| l.contains("reload failed")).unwrap();
    assert!(line.contains(&format!("taskhost trust {path}")), "{line}");
    // Trusting something else rewrites the records but admits nothing.
    place.trust(&["trust", &other.display().to_string()]).await;
    // Trusting the build loads it, with no further change to the file.
    place.trust(&["trust", &path]).await;
    let log = common::wait_for_text(&log_path, "reloaded beats", Duration::from_secs(20)).await;
    assert_eq!(log.matches("reloaded beats").count(), 1, "{log}");
    assert_eq!(log.matches("reload failed").count(), 1, "one refusal, not one per records change:\n{log}");
    let beat = only_text(&call(served.client.peer(), "beats", json!({"count": 1, "interval_ms": 1})).await);
    assert!(beat.contains("[status: completed"), "{beat}");
    served.stop().await;
}

#[tokio::test]
async fn a_refused_build_loads_once_its_user_trusts_it() {
    trusted_after_refusal("trust-retry", None).await;
}

#[tokio::test]
async fn a_refused_build_loads_once_its_user_trusts_it_with_an_unprivileged_server() {
    let Some(uid) = unprivileged() else { return };
    trusted_after_refusal("trust-retry-nobody", Some(uid)).await;
}

/// taskhost's own directories inside the workspace. The compile cache and
/// taskhost's configuration directory stay hidden: no tree reads, lists or
/// writes them. A state directory there (trust records, the cache's key) is
/// refused outright, naming the fix: hidden or not, a tree can move a
/// directory above it away and put its own records in its place (measured
/// with the view of this branch: `mv .state .state.old && mkdir -p
/// .state/taskhost` worked from a tree, as root and as 65534).
async fn own_directories_in_the_workspace(tag: &str, uid: Option<u32>) {
    let place = Place::new(tag, uid);
    let (cache, config) = (place.work.join(".cache"), place.work.join(".config/taskhost"));
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("taskhost.toml"), "# the user's own\n").unwrap();
    place.chown();
    let mut command = place.taskhost(&["serve"]);
    command.env("XDG_CACHE_HOME", &cache).env("XDG_CONFIG_HOME", place.work.join(".config"));
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(common::log_file(&place.base));
    let mut child = command.spawn().unwrap();
    let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let served = Served { client: ().serve((stdout, stdin)).await.expect("serves"), child };
    assert_eq!(served.bash("echo compiled").await, "compiled\n[status: completed, exit code: 0]");
    let entries = std::fs::read_dir(cache.join("taskhost/components")).unwrap().count();
    assert!(entries > 0, "the compile cache holds entries");
    let tried = served
        .bash(
            "r() { if eval \"$2\" >/dev/null 2>&1; then echo \"$1:yes\"; else echo \"$1:no\"; fi; }\n\
             r list_cache \"ls .cache/taskhost/components | grep -q .\"\n\
             r plant_cache \"echo x > .cache/taskhost/components/x.cwasm\"\n\
             r read_config \"grep -q own .config/taskhost/taskhost.toml\"\n\
             r write_config \"echo x >> .config/taskhost/taskhost.toml\"",
        )
        .await;
    served.stop().await;
    for attempt in ["list_cache", "plant_cache", "read_config", "write_config"] {
        assert!(tried.contains(&format!("{attempt}:no")), "{attempt}: {tried}");
    }
    assert_eq!(std::fs::read_to_string(config.join("taskhost.toml")).unwrap(), "# the user's own\n");
    assert!(!cache.join("taskhost/components/x.cwasm").exists());

    let mut inside = Place::new(&format!("{tag}-state"), uid);
    inside.state_home = inside.work.join(".state");
    let refused = inside.serve_refused(&[]).await;
    let state = inside.state_home.join("taskhost").display().to_string();
    assert!(
        refused.contains(&format!("taskhost's state directory {state} lies in {}", inside.work.display()))
            && refused.contains("set XDG_STATE_HOME (or [state] dir) to a directory outside"),
        "{refused}"
    );
    let file = inside.work.join("taskhost.toml");
    std::fs::write(&file, "").unwrap();
    inside.chown();
    let refused = inside.serve_refused(&[]).await;
    assert!(refused.contains("the trust records' directory"), "{refused}");
}

#[tokio::test]
async fn taskhosts_own_directories_in_the_workspace_are_hidden_or_refused() {
    own_directories_in_the_workspace("trust-own-dirs", None).await;
}

#[tokio::test]
async fn taskhosts_own_directories_in_the_workspace_are_hidden_or_refused_by_an_unprivileged_server() {
    let Some(uid) = unprivileged() else { return };
    own_directories_in_the_workspace("trust-own-dirs-nobody", Some(uid)).await;
}
