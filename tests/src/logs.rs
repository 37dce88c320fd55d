//! One `tracing` subscriber for the whole test binary: a process has one
//! global subscriber, and every suite shares the process. Events at `warn`
//! and above go to the test's output and into a buffer that suites search
//! (the log-line bound of `plugin_bounds`); each suite logs under names of
//! its own, so a search never matches another suite's lines.
//!
//! Bound: the buffer keeps the first [`CAPTURE_CAP`] bytes.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

/// The most the capture buffer holds; later lines go to the test output only.
pub const CAPTURE_CAP: usize = 64 << 20;

static CAPTURED: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

/// Installs the subscriber (once; later calls do nothing).
pub fn init() {
    CAPTURED.get_or_init(|| {
        let captured = Arc::new(Mutex::new(Vec::new()));
        let sink = captured.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter("warn")
            .with_ansi(false)
            .with_writer(move || Tee(sink.clone()))
            .try_init();
        captured
    });
}

/// Everything logged so far (up to [`CAPTURE_CAP`] bytes).
pub fn captured() -> String {
    init();
    let captured = CAPTURED.get().expect("initialized above");
    String::from_utf8_lossy(&captured.lock().unwrap()).into_owned()
}

/// Writes to the captured buffer and to the running test's output.
struct Tee(Arc<Mutex<Vec<u8>>>);

impl Write for Tee {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut captured = self.0.lock().unwrap();
        if captured.len() + bytes.len() <= CAPTURE_CAP {
            captured.extend_from_slice(bytes);
        }
        // `print!` goes to libtest's capture for the test's own thread.
        print!("{}", String::from_utf8_lossy(bytes));
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}
