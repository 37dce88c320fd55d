//! The plugin file watcher (`taskhost::reload::watch`) with the real
//! `ticker` plugin, driven by real writes to a real directory.
//!
//! The fast path is proved by the event, not by a clock: the watches here
//! use a debounce of two minutes, far beyond the wait for the reload event,
//! so a reload that arrives at all came from a write the watcher recognized
//! as complete (a close after writing, a rename onto the file, a hard link).
//! Required:
//! - a rename onto the file, a hard link (cargo's way of placing a built
//!   artifact) and a plain write-and-close each reload without the debounce,
//!   to exactly the new content;
//! - a rename followed by a `touch` makes one version: the next event is the
//!   next build's;
//! - a writer that writes, closes, appends and closes again ends serving the
//!   final content, with no reported failure and nothing torn served;
//! - a complete but broken build is reported once, after the settle check,
//!   and the previous version keeps serving;
//! - with the fast path turned off, a write still reloads through the
//!   debounce and settle check.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use taskhost::Host;
use taskhost::plugin::component::content_hash;
use taskhost::reload::{ReloadEvent, ReloadablePlugin, WatchHandle, WatchOptions};
use taskhost::settings::TasksSettings;
use taskhost::tools::producer_tool::ProducerToolOptions;
use taskhost_tests::{TICKER_WASM, rebuilt, truncated};
use tokio::sync::broadcast;

/// Far longer than any wait for an event below: a reload that needed the
/// debounce would time the test out.
const NEVER: Duration = Duration::from_secs(120);
/// How long a test waits for a reload event.
const EVENT_WAIT: Duration = Duration::from_secs(60);

/// Fast path on, debounce path effectively off.
fn fast_only() -> WatchOptions {
    WatchOptions { debounce: NEVER, settle: Duration::from_millis(10), ..WatchOptions::default() }
}

struct Setup {
    dir: PathBuf,
    file: PathBuf,
    host: Host,
    plugin: Arc<ReloadablePlugin>,
    events: broadcast::Receiver<ReloadEvent>,
    _watch: WatchHandle,
}

impl Setup {
    async fn new(name: &str, options: WatchOptions) -> Self {
        taskhost_tests::logs::init();
        let dir = std::env::temp_dir().join(format!("taskhost-reload-watch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let engine = taskhost_tests::engine(|config| {
            config.call_deadline_ms = 5000;
        });
        let host = Host::new(&TasksSettings::default()).expect("host");
        let file = dir.join("ticker.wasm");
        std::fs::write(&file, build("initial")).expect("write");
        let v1 = engine.load_file(&file).await.expect("load");
        let options_ = ProducerToolOptions::new("ticker")
            .with_foreground_timeout(Duration::from_secs(60))
            .with_promote_after(None);
        let plugin = ReloadablePlugin::serve(&host, &engine, v1, json!({}), options_).await.expect("serve");
        let events = plugin.subscribe();
        let watch = taskhost::reload::watch(plugin.clone(), &file, options).expect("watch");
        Self { dir, file, host, plugin, events, _watch: watch }
    }

    /// The next reload event.
    async fn next_event(&mut self) -> ReloadEvent {
        tokio::time::timeout(EVENT_WAIT, self.events.recv())
            .await
            .expect("no reload event: the write was not recognized as complete")
            .expect("event channel")
    }

    /// The next event, which must be a successful reload to `bytes`.
    async fn expect_serving(&mut self, bytes: &[u8]) {
        match self.next_event().await {
            ReloadEvent::Reloaded(reloaded) => {
                assert_eq!(reloaded.to.version.content_hash(), content_hash(bytes), "{reloaded}");
            }
            ReloadEvent::Failed(failed) => panic!("unexpected failure: {failed}"),
        }
        assert_eq!(self.plugin.serving().version.content_hash(), content_hash(bytes));
    }

    /// Writes `bytes` next to the file and renames it onto the file.
    fn rename_onto(&self, bytes: &[u8]) {
        let temp = self.dir.join(".ticker.wasm.partial");
        std::fs::write(&temp, bytes).expect("write");
        std::fs::rename(&temp, &self.file).expect("rename");
    }

    async fn finish(self) {
        self.host.dispose().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A distinct, valid build of the ticker.
fn build(tag: &str) -> Vec<u8> {
    rebuilt(TICKER_WASM, &format!("{tag} {}", std::process::id()))
}

/// Opens `path` for writing (truncating or appending), writes, closes.
fn write_step(path: &Path, bytes: &[u8], append: bool) {
    let mut file =
        std::fs::OpenOptions::new().create(true).write(true).append(append).truncate(!append).open(path).expect("open");
    file.write_all(bytes).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_onto_the_file_reloads_without_the_debounce_and_a_touch_after_it_makes_no_version() {
    let mut s = Setup::new("rename", fast_only()).await;
    let v2 = build("rename v2");
    s.rename_onto(&v2);
    s.expect_serving(&v2).await;
    // `touch`: open for writing, set the mtime, close (an attribute change
    // and a close after writing, with the same content).
    let file = std::fs::OpenOptions::new().write(true).open(&s.file).expect("open");
    file.set_modified(std::time::SystemTime::now()).expect("set mtime");
    drop(file);
    // The next event is the next build's: the touch made no version.
    let v3 = build("rename v3");
    s.rename_onto(&v3);
    s.expect_serving(&v3).await;
    assert_eq!(s.plugin.serving().seq, 3);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_link_onto_the_name_reloads_without_the_debounce() {
    // What cargo does to place a built artifact: remove the old name, then
    // hard-link the file it built under `deps/`.
    let mut s = Setup::new("link", fast_only()).await;
    let deps = s.dir.join("deps");
    std::fs::create_dir_all(&deps).expect("deps");
    for round in 0..2 {
        let bytes = build(&format!("link {round}"));
        let built = deps.join(format!("ticker-{round}.wasm"));
        std::fs::write(&built, &bytes).expect("write");
        std::fs::remove_file(&s.file).expect("remove");
        std::fs::hard_link(&built, &s.file).expect("link");
        s.expect_serving(&bytes).await;
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_and_close_reloads_without_the_debounce() {
    let mut s = Setup::new("close", fast_only()).await;
    let v2 = build("close v2");
    std::fs::write(&s.file, &v2).expect("write");
    s.expect_serving(&v2).await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_closes_twice_ends_serving_the_final_content_and_reports_nothing_torn() {
    let mut s = Setup::new("two-closes", fast_only()).await;
    for round in 0..3 {
        let bytes = build(&format!("two closes {round}"));
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        // The first close leaves a torn file; whether the watcher looks at
        // it before the second step lands or not, the first event must be
        // the final content serving (a torn load is retried, not reported).
        write_step(&s.file, head, false);
        write_step(&s.file, tail, true);
        s.expect_serving(&bytes).await;
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_complete_writes_in_a_row_end_serving_the_second_with_no_failure() {
    let mut s = Setup::new("two-writes", fast_only()).await;
    let first = build("first of two");
    let second = build("second of two");
    write_step(&s.file, &first, false);
    write_step(&s.file, &second, false);
    // The first may or may not be served on the way (each close is a
    // finished write); the second must be, and nothing fails.
    loop {
        match s.next_event().await {
            ReloadEvent::Reloaded(reloaded) if reloaded.to.version.content_hash() == content_hash(&second) => break,
            ReloadEvent::Reloaded(reloaded) => {
                assert_eq!(reloaded.to.version.content_hash(), content_hash(&first), "{reloaded}")
            }
            ReloadEvent::Failed(failed) => panic!("unexpected failure: {failed}"),
        }
    }
    assert_eq!(s.plugin.serving().version.content_hash(), content_hash(&second));
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_but_broken_build_is_reported_once_and_the_old_version_keeps_serving() {
    let options = WatchOptions {
        debounce: Duration::from_millis(50),
        settle: Duration::from_millis(10),
        ..WatchOptions::default()
    };
    let mut s = Setup::new("broken", options).await;
    let serving = s.plugin.serving();
    let broken = truncated(&build("broken"));
    s.rename_onto(&broken);
    match s.next_event().await {
        ReloadEvent::Failed(failed) => {
            assert_eq!(failed.serving.seq, serving.seq);
            assert!(failed.reason.contains("cannot load plugin"), "{}", failed.reason);
        }
        ReloadEvent::Reloaded(reloaded) => panic!("a truncated build was served: {reloaded}"),
    }
    assert_eq!(s.plugin.serving().seq, serving.seq);
    // Reported once: the next event is the fixed build's.
    let fixed = build("fixed");
    s.rename_onto(&fixed);
    s.expect_serving(&fixed).await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_fast_path_off_a_write_reloads_after_the_debounce() {
    let options =
        WatchOptions { debounce: Duration::from_millis(50), settle: Duration::from_millis(10), complete_quiet: None };
    let mut s = Setup::new("debounce-only", options).await;
    let v2 = build("debounced v2");
    std::fs::write(&s.file, &v2).expect("write");
    s.expect_serving(&v2).await;
    s.finish().await;
}
