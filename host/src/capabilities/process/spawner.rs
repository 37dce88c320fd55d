//! The spawner thread: every task process is forked from one long-lived thread.
//!
//! Why: `PR_SET_PDEATHSIG` fires when the *thread* that forked the child
//! exits, not the process. Tokio's blocking-pool threads exit after idling,
//! and a test's thread exits with the test; forking from them would kill
//! live task processes at random. This thread is started once and never
//! returns, so the death signal fires exactly when the host process dies.

use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

fn sender() -> &'static Mutex<mpsc::Sender<Job>> {
    static SENDER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    SENDER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("taskhost-spawner".into())
            .spawn(move || {
                // Ends only when every sender is gone, i.e. never (the sender is static).
                for job in rx {
                    // A panicking job must not take the thread (and the
                    // death-signal anchor of every live process) with it.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            })
            .expect("cannot start the taskhost-spawner thread");
        Mutex::new(tx)
    })
}

/// Runs `job` on the spawner thread and awaits its result.
pub(crate) async fn run<R: Send + 'static>(
    job: impl FnOnce() -> R + Send + 'static,
) -> std::io::Result<R> {
    let (reply, result) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = reply.send(job());
    });
    sender()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send(job)
        .map_err(|_| std::io::Error::other("the taskhost-spawner thread is gone"))?;
    result
        .await
        .map_err(|_| std::io::Error::other("the taskhost-spawner thread dropped a spawn"))
}
