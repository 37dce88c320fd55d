//! A stable owner's command (a durable tree) through `taskhost serve
//! --owner`: its logs hold at most the grant's `spill_cap_bytes` of
//! *unread* output. A reader that keeps up reads far past the cap, every
//! line once; output that finds the logs full is dropped, and the reader is
//! told where, never shown "(no new output)" over a silent gap.

use crate::cluster::id_of;
use crate::common;

use common::{Client, call, temp_dir, texts};
use serde_json::json;

/// The log cap of these tests' bash (1 MiB).
const CAP: u64 = 1 << 20;

/// `taskhost serve --owner alice` over stdio in `dir`, its bash configured
/// with a 1 MiB log cap; as `uid` (through `setpriv`) when given, with
/// `dir` made that user's.
async fn serve_alice(dir: &std::path::Path, uid: Option<u32>) -> (Client, tokio::process::Child) {
    let config = format!(
        "[[producer]]\ntool = \"bash\"\nplugin = \"builtin:bash\"\nconfig = {{ spill_cap_bytes = {CAP} }}\n\
         grants = {{ process = {{ programs = [\"bash\"] }} }}\n"
    );
    let Some(uid) = uid else { return common::serve_stdio(dir, Some(&config), Some("alice")).await };
    let (work, home, state) = (dir.join("work"), dir.join("home"), common::state_home(dir));
    let file = dir.join("test.toml");
    if !file.exists() {
        std::fs::write(&file, &config).unwrap();
        // The state directory with its shared cache key (`common::state_home`).
        let (taskhost_state, key) = (state.join("taskhost"), state.join("taskhost").join("cache.key"));
        for path in [dir, &work, &home, &state, &taskhost_state, &key] {
            if !path.exists() {
                std::fs::create_dir_all(path).unwrap();
            }
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
        }
        std::os::unix::fs::chown(&file, Some(uid), Some(uid)).unwrap();
        let trusted = common::taskhost_as(Some(uid)).arg("trust").arg(&file).env("XDG_STATE_HOME", &state).output();
        let trusted = trusted.await.unwrap();
        assert!(trusted.status.success(), "taskhost trust as {uid}: {trusted:?}");
    }
    let mut command = common::serve_stdio_as(Some(uid), dir, &work, &home);
    command.arg("--config").arg(&file).arg("--owner").arg("alice").env("XDG_STATE_HOME", &state);
    common::connect_stdio(&mut command).await
}

/// 50 chunks of 1 000 numbered lines (50 bytes each, ending in `;` so a
/// line a read cut is recognised: 2.5 MB, over twice the cap),
/// each printed once the reader asks for it: every line arrives once, in
/// order, and nothing is dropped, across a restart of the server half way
/// (the next server re-adopts the tree and lets go of what is read too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_keeps_up_reads_past_the_log_cap() {
    reads_past_the_log_cap("durable-output-keeps-up", None).await;
}

/// The same, the server running as an unprivileged user (65534, through
/// `setpriv`): the logs it releases are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_keeps_up_reads_past_the_log_cap_with_an_unprivileged_server() {
    // SAFETY: getuid cannot fail.
    assert_eq!(unsafe { libc::getuid() }, 0, "setpriv to 65534 needs root (CI runs as root)");
    reads_past_the_log_cap("durable-output-keeps-up-nobody", Some(65534)).await;
}

async fn reads_past_the_log_cap(tag: &str, uid: Option<u32>) {
    const CHUNK: u64 = 1_000;
    const CHUNKS: u64 = 50;
    let dir = temp_dir(tag);
    let (mut client, mut child) = serve_alice(&dir, uid).await;
    let command = format!(
        "for c in $(seq 0 {}); do read go || exit 1; seq -f '%048.0f;' $((c * {CHUNK} + 1)) $(((c + 1) * {CHUNK})); done",
        CHUNKS - 1
    );
    let started =
        call(client.peer(), "bash", json!({"command": command, "run_in_background": true, "interactive": true}));
    let id = id_of(&started.await);
    let mut lines = common::NumberedLines::new();
    for chunk in 1..=CHUNKS {
        if chunk == CHUNKS / 2 {
            common::stop_with_sigterm(&mut child).await;
            (client, child) = serve_alice(&dir, uid).await;
        }
        let given = call(client.peer(), "task_input", json!({"task_id": id, "text": "go\n"})).await;
        assert!(!common::is_error(&given), "{:?}", texts(&given));
        // Reads until the whole chunk came (a read may cut a line: its
        // rest starts the next read).
        while lines.next <= chunk * CHUNK {
            let read = texts(&call(client.peer(), "task_output", json!({"task_id": id})).await).remove(0);
            let (body, status) = read.rsplit_once('\n').unwrap_or(("", &read));
            // The read that takes the last lines may be the one that
            // reports the end; none before it.
            let ended = status == "[status: completed, exit code: 0]";
            assert!(status == "[status: running]" || chunk == CHUNKS && ended, "chunk {chunk}: {status}");
            if body == "(no new output)" {
                assert!(!ended, "the end came before the lines {}..", lines.next);
                continue;
            }
            assert!(!body.contains("[taskhost:"), "chunk {chunk}: {body:.300}");
            lines.take(body, |n| format!("{n:048}"), &format!("chunk {chunk}"));
        }
    }
    assert!(lines.is_whole());
    assert_eq!(lines.next, CHUNKS * CHUNK + 1, "every line once");
    assert!((lines.next - 1) * 50 > 2 * CAP, "read past the cap");
    common::stop_with_sigterm(&mut child).await;
}

/// 3 MB printed with nobody reading: the log keeps the first MiB (less the
/// mark's room), then the line that says output was dropped there; what the
/// command printed after it (`end`) is gone, and the read ends with the mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_past_the_log_cap_is_dropped_with_a_mark_where_it_was_cut() {
    let (client, mut child) = serve_alice(&temp_dir("durable-output-mark"), None).await;
    let command = "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo end";
    let id = id_of(&call(client.peer(), "bash", json!({"command": command, "run_in_background": true})).await);
    let waited = call(client.peer(), "task_wait", json!({"task_ids": [id], "timeout_ms": 60000})).await;
    assert!(texts(&waited)[0].contains("finished first"), "{:?}", texts(&waited));
    let tail =
        texts(&call(client.peer(), "task_output", json!({"task_id": id, "view": "tail", "lines": 2})).await).remove(0);
    let mark = format!(
        "[taskhost: output dropped here: the command's unread output filled its log cap of {CAP} bytes \
         (spill_cap_bytes); what it wrote until the reader caught up is lost]"
    );
    let mut last = tail.lines().rev().skip_while(|line| !line.starts_with("[taskhost:"));
    assert_eq!(last.next(), Some(mark.as_str()), "the output ends with the mark: {tail:.500}");
    let cut = last.next().expect("the cut line");
    assert!(
        cut.ends_with("xxxx") && cut.trim_start_matches(|c: char| c != 'x').bytes().all(|b| b == b'x'),
        "{cut:.200}"
    );
    assert!(!tail.contains("\nend"), "what came after the cut is not shown: {tail:.500}");
    common::stop_with_sigterm(&mut child).await;
}
