//! The durable store's size after many finished tasks, within the
//! retention bounds, against the same writes with retention off.
//!
//! Run: `cargo bench -p taskhost --bench store_size`
//! (`STORE_BENCH_TASKS`, default 100 000; `STORE_BENCH_MAX_FINISHED`
//! overrides `[state] max_finished_tasks`, default its default.)
//!
//! Each task is written through the store API as the registry writes a
//! stable owner's background bash task: an id issued, the start recorded,
//! the end settled, the end reported: four transactions. The retained run
//! opens the store as `serve` does (`StateDir::task_store`: a start-up
//! pass, then the retention thread woken by each settlement); after the
//! writes it runs one more pass (the one the thread runs a second later)
//! and measures the file and its write-ahead log. The baseline writes the
//! same records into a store nothing prunes. Both runs alternate in one
//! process, each in a fresh state directory.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use taskhost::ids::{SessionId, TaskId};
use taskhost::state::retention::{connect, enforce};
use taskhost::state::store::{STORE_FILE, SqliteStore};
use taskhost::state::{StateDir, StateSettings};
use taskhost::tasks::TaskStatus;
use taskhost::tasks::store::{ReportState, StoredEnd, StoredOwner, StoredTask, TaskStore};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Writes `tasks` finished tasks through `store`; returns the time taken.
fn write(store: &dyn TaskStore, tasks: u64) -> Duration {
    let owner = StoredOwner::new(SessionId::new("owner:bench"), true);
    let began = Instant::now();
    for _ in 0..tasks {
        let number = store.issue_number("bash", 1).expect("issue an id");
        let id = TaskId::new(format!("bash-{number}"));
        let mut task = StoredTask::new(
            id.clone(),
            "bash",
            format!("cargo test -p crate-{number} -- --nocapture"),
            SystemTime::now(),
        );
        task.owner = Some(owner.clone());
        task.producer_info = Some("bash@8a4b5bc76d1e".into());
        store.record_start(&task).expect("record a start");
        let end =
            StoredEnd::new(TaskStatus::Completed, Some("exit code: 0".into()), SystemTime::now(), ReportState::Untold);
        store.settle(&id, &end).expect("settle");
        store.set_reporting(&id, ReportState::Reported).expect("report");
    }
    began.elapsed()
}

fn size(file: &Path) -> u64 {
    let of = |suffix: &str| std::fs::metadata(format!("{}{suffix}", file.display())).map_or(0, |m| m.len());
    of("") + of("-wal")
}

fn wal_size(file: &Path) -> u64 {
    std::fs::metadata(format!("{}-wal", file.display())).map_or(0, |m| m.len())
}

fn records(file: &Path) -> i64 {
    connect(file).unwrap().query_row("SELECT count(*) FROM tasks", [], |row| row.get(0)).unwrap()
}

fn main() {
    let tasks = env_number("STORE_BENCH_TASKS", 100_000);
    let mut settings = StateSettings::default();
    settings.max_finished_tasks = env_number("STORE_BENCH_MAX_FINISHED", settings.max_finished_tasks);
    let limits = settings.retention();
    println!(
        "{tasks} finished tasks; retention: max_finished_tasks {}, max_finished_age_secs {}, max_finished_bytes {}",
        limits.max_finished_tasks, limits.max_finished_age_secs, limits.max_finished_bytes
    );
    println!("run        records   file+wal bytes   (file / wal)          µs per task");
    let mut results = Vec::new();
    for (round, retained) in [(1, false), (1, true), (2, false), (2, true)] {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(&dir.path().join("state")).unwrap();
        let file = state.file(STORE_FILE);
        // Sizes are read with the store open, as a running server leaves
        // them (closing the last connection checkpoints and drops the WAL).
        let (elapsed, kept, bytes, wal) = if retained {
            let store = state.task_store(&settings).unwrap();
            let elapsed = write(store.as_ref(), tasks);
            enforce(&mut connect(&file).unwrap(), &file, &limits);
            (elapsed, records(&file), size(&file), wal_size(&file))
        } else {
            let store = SqliteStore::open(&file).unwrap();
            let elapsed = write(&store, tasks);
            (elapsed, records(&file), size(&file), wal_size(&file))
        };
        let per_task = elapsed.as_secs_f64() * 1e6 / tasks as f64;
        println!(
            "{:<10} {kept:>7}   {bytes:>14}   ({} / {wal})   {per_task:>10.1}",
            format!("{}{round}", if retained { "retained " } else { "baseline " }),
            bytes - wal,
        );
        results.push((retained, bytes, per_task));
    }
    let mean = |retained: bool, pick: fn(&(bool, u64, f64)) -> f64| {
        let picked: Vec<f64> = results.iter().filter(|r| r.0 == retained).map(pick).collect();
        picked.iter().sum::<f64>() / picked.len() as f64
    };
    println!(
        "retained / baseline: size {:.3}x, time per task {:.3}x",
        mean(true, |r| r.1 as f64) / mean(false, |r| r.1 as f64),
        mean(true, |r| r.2) / mean(false, |r| r.2)
    );
}
