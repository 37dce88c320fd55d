//! A full state directory, for real: `taskhost serve --owner` in a private
//! mount namespace whose state directory is a 1 MiB tmpfs, filled by the
//! test through `/proc/<pid>/root`. A durable start is refused with an error
//! that says the state directory is full; a tree started before the disk
//! filled still tells its end (its exit status's room was taken at its
//! spawn); the server keeps serving, and starts again once there is room.

use std::process::Stdio;

use serde_json::json;

use crate::common::{self, call, only_text, texts};

#[tokio::test]
async fn a_full_state_directory_refuses_durable_starts_clearly_and_the_server_carries_on() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0
        && common::gap_accepted("root", "a tmpfs state directory needs root", "run the tests as root (CI does)")
    {
        return;
    }
    let dir = common::temp_dir("state-full");
    let state = dir.join("state");
    let work = dir.join("work");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let config = dir.join("taskhost.toml");
    std::fs::write(&config, format!("[state]\ndir = {:?}\n", state.display().to_string())).unwrap();
    // The tmpfs is mounted over `state` in the server's own mount namespace
    // only, then the shell becomes the server.
    let script = format!(
        "mount -t tmpfs -o size=1m,mode=0700 tmpfs {state} && exec {bin} serve --config {config} --owner alice",
        state = state.display(),
        bin = common::BIN,
        config = config.display()
    );
    let mut child = tokio::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .current_dir(&work)
        .env("RUST_LOG", "info,taskhost=debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(common::log_file(&dir))
        .kill_on_drop(true)
        .spawn()
        .expect("run unshare(1)");
    let (client, mut child) = {
        use rmcp::ServiceExt as _;
        let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
        (().serve((stdout, stdin)).await.expect("initialize over stdio"), child)
    };
    let peer = client.peer();
    // The first tree waits on a fifo until the disk is full, then ends.
    let fifo = work.join("go.fifo");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "{}", std::io::Error::last_os_error());
    let first = common::started_task(
        &call(peer, "bash", json!({"command": "read x < go.fifo; echo before", "run_in_background": true})).await,
    );
    // What the server sees as its state directory, from outside its namespace.
    let pid = child.id().expect("running");
    let seen = std::path::PathBuf::from(format!("/proc/{pid}/root{}", state.display()));
    let filler = seen.join("filler");
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&filler).expect("write into the server's state directory");
        let chunk = vec![b'x'; 64 * 1024];
        loop {
            if let Err(error) = file.write_all(&chunk) {
                assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
                break;
            }
        }
    }
    let refused = call(peer, "bash", json!({"command": "echo during", "run_in_background": true})).await;
    assert!(common::is_error(&refused), "{refused:?}");
    let text = only_text(&refused);
    assert!(text.contains("No space left on device") && text.contains("is the state directory full?"), "{text}");
    // The server carries on, and the tree started before the disk filled
    // ends now and still tells its end (its output is lost to the full disk).
    tokio::task::spawn_blocking(move || std::fs::write(fifo, "go\n")).await.unwrap().unwrap();
    let read = texts(&call(peer, "task_output", json!({"task_id": first, "wait": true, "timeout_ms": 30000})).await);
    assert!(read[0].ends_with("[status: completed, exit code: 0]"), "{read:?}");
    let list = texts(&call(peer, "task_list", json!({})).await);
    assert!(list[0].contains(&format!("{first} [bash] completed")), "{list:?}");
    // With room again, a start works.
    std::fs::remove_file(&filler).unwrap();
    let again =
        common::started_task(&call(peer, "bash", json!({"command": "echo after", "run_in_background": true})).await);
    let read = texts(&call(peer, "task_output", json!({"task_id": again, "wait": true, "timeout_ms": 30000})).await);
    assert_eq!(read[0], "after\n[status: completed, exit code: 0]");
    drop(client);
    let _ = child.wait().await;
}
