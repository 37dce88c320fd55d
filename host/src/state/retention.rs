//! Retention of the task store: finished records beyond the `[state]`
//! bounds (count, age, bytes) are deleted, oldest first, at start-up and in
//! batches as tasks finish, and each deletion is reported in the log.
//!
//! Invariants:
//! - Only finished records (a terminal status) are deleted, never a live
//!   one, and never the id counters: an id is not reused after its record
//!   went.
//! - An end nobody was told of (reporting `untold` or `held`) goes last
//!   under the count and bytes bounds: only once no told record is left to
//!   delete. The age bound applies to it like to any other record (an owner
//!   away that long is not coming back for the notice); deleting one is a
//!   warning naming its owner.
//! - Bounded work under the write lock: a pass reads the finished records
//!   in a read transaction (WAL: the server's writes go on), then deletes
//!   in write transactions of at most [`BATCH`] records each, on its own
//!   connection, so a store call of the server waits at most one of those.
//! - Off the start path: the worker thread is woken by settlements
//!   ([`EndSignal`]) and waits [`SETTLE_DELAY`] so the ends of a burst are
//!   pruned together; it also runs every [`AGE_PERIOD`] for the age bound.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, params};
use serde::Deserialize;
use taskhost_core::tasks::TaskStatus;

/// Records one write transaction of a pass deletes at most.
pub const BATCH: usize = 1000;
/// How long the worker waits after an end before pruning (ends of a burst
/// are pruned together).
pub const SETTLE_DELAY: Duration = Duration::from_secs(1);
/// How often the worker prunes when nothing ends (records age out).
pub const AGE_PERIOD: Duration = Duration::from_secs(600);
/// Bytes a record counts for besides its texts (its row's numbers, keys and
/// index entry).
pub const RECORD_OVERHEAD_BYTES: u64 = 128;
/// The bytes of its write-ahead log a store keeps when the log restarts
/// (`PRAGMA journal_size_limit`; SQLite's own checkpoint is at 4 MiB).
pub const WAL_KEPT_BYTES: i64 = 4 << 20;
/// How long a pass's writes wait for another writer of the same file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// `[state]`'s bounds on the finished records the store keeps.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionLimits {
    /// Finished records kept (the newest).
    pub max_finished_tasks: u64,
    /// Seconds a finished record is kept after its end.
    pub max_finished_age_secs: u64,
    /// Bytes of finished records' stored texts (label, detail, final
    /// output, producer, tree record), plus [`RECORD_OVERHEAD_BYTES`] each.
    pub max_finished_bytes: u64,
}

impl Default for RetentionLimits {
    fn default() -> Self {
        Self {
            // Every stable owner's finished records are read into memory at
            // start-up: 10 000 is a few MiB and tens of ms, and far more
            // history than an agent reads back (each owner's own history is
            // bounded by `[tasks] max_finished_tasks_per_owner` while it is
            // connected).
            max_finished_tasks: 10_000,
            // A stable owner away for a month is told nothing more.
            max_finished_age_secs: 30 * 24 * 3600,
            // Final outputs (a subagent's answer) dominate: 64 MiB keeps
            // thousands of them, and the file at most that plus its free pages.
            max_finished_bytes: 64 << 20,
        }
    }
}

/// The least each bound may be: less is refused as a mistake.
pub const MIN_FINISHED_TASKS: u64 = 1;
pub const MIN_FINISHED_AGE_SECS: u64 = 60;
pub const MIN_FINISHED_BYTES: u64 = 64 << 10;

impl RetentionLimits {
    /// Refuses bounds that would keep nothing, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        let checks = [
            ("max_finished_tasks", self.max_finished_tasks, MIN_FINISHED_TASKS),
            ("max_finished_age_secs", self.max_finished_age_secs, MIN_FINISHED_AGE_SECS),
            ("max_finished_bytes", self.max_finished_bytes, MIN_FINISHED_BYTES),
        ];
        for (key, value, least) in checks {
            if value < least {
                return Err(format!("[state] {key} = {value} is below its least value {least}"));
            }
        }
        Ok(())
    }
}

/// What one pass deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    pub by_age: usize,
    pub by_count: usize,
    pub by_bytes: usize,
    /// Of those, ends nobody was told of.
    pub untold: usize,
    /// Finished records left.
    pub kept: usize,
    /// Write transactions it took (at most [`BATCH`] deletions each).
    pub transactions: usize,
}

impl Pruned {
    pub fn deleted(&self) -> usize {
        self.by_age + self.by_count + self.by_bytes
    }
}

/// One finished record, as a pass weighs it.
struct Finished {
    id: String,
    finished_at_ns: i64,
    told: bool,
    bytes: u64,
    owner: Option<String>,
}

/// Opens the store at `file` for pruning (its own connection).
pub fn connect(file: &Path) -> rusqlite::Result<Connection> {
    let connection = Connection::open_with_flags(
        file,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    connection.busy_timeout(BUSY_TIMEOUT)?;
    connection.pragma_update(None, "synchronous", "NORMAL")?;
    connection.pragma_update(None, "journal_size_limit", WAL_KEPT_BYTES)?;
    Ok(connection)
}

/// One pass over the store: reads the finished records (one read
/// transaction, no write lock), then deletes those beyond `limits` at
/// `now` in write transactions of at most [`BATCH`] deletions each.
pub fn prune(connection: &mut Connection, limits: &RetentionLimits, now: SystemTime) -> rusqlite::Result<Pruned> {
    let mut finished: Vec<Finished> = {
        let snapshot = connection.transaction_with_behavior(rusqlite::TransactionBehavior::Deferred)?;
        let read = snapshot
            .prepare(
                "SELECT id, status, reporting, owner, coalesce(finished_at_ns, started_at_ns),
                        length(CAST(label AS BLOB)) + coalesce(length(CAST(detail AS BLOB)), 0)
                        + coalesce(length(CAST(output AS BLOB)), 0) + coalesce(length(CAST(producer_info AS BLOB)), 0)
                        + coalesce(length(CAST(tree AS BLOB)), 0) + coalesce(length(CAST(tree_cursor AS BLOB)), 0)
                 FROM tasks ORDER BY seq",
            )?
            .query_map([], |row| {
                let status: String = row.get(1)?;
                let reporting: String = row.get(2)?;
                if !TaskStatus::parse(&status).is_some_and(TaskStatus::is_terminal) {
                    return Ok(None);
                }
                Ok(Some(Finished {
                    id: row.get(0)?,
                    finished_at_ns: row.get(4)?,
                    told: matches!(reporting.as_str(), "noticed" | "reported"),
                    bytes: u64::try_from(row.get::<_, i64>(5)?).unwrap_or(0) + RECORD_OVERHEAD_BYTES,
                    owner: row.get(3)?,
                }))
            })?
            .filter_map(Result::transpose)
            .collect::<rusqlite::Result<_>>()?;
        snapshot.commit()?;
        read
    };
    // The order records go in: told before untold, then oldest end first.
    finished.sort_by_key(|f| (!f.told, f.finished_at_ns));
    let oldest_kept = now
        .checked_sub(Duration::from_secs(limits.max_finished_age_secs))
        .and_then(|at| at.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let mut pruned = Pruned::default();
    let mut doomed = vec![false; finished.len()];
    for (i, record) in finished.iter().enumerate() {
        if record.finished_at_ns < oldest_kept {
            doomed[i] = true;
            pruned.by_age += 1;
        }
    }
    let mut count = finished.len() - pruned.by_age;
    let mut bytes: u64 = finished.iter().zip(&doomed).filter(|(_, d)| !**d).map(|(f, _)| f.bytes).sum();
    let max_count = usize::try_from(limits.max_finished_tasks).unwrap_or(usize::MAX);
    for (i, record) in finished.iter().enumerate() {
        if doomed[i] {
            continue;
        }
        if count > max_count {
            pruned.by_count += 1;
        } else if bytes > limits.max_finished_bytes {
            pruned.by_bytes += 1;
        } else {
            break;
        }
        doomed[i] = true;
        count -= 1;
        bytes -= record.bytes;
    }
    let doomed: Vec<&Finished> = finished.iter().zip(&doomed).filter(|(_, d)| **d).map(|(f, _)| f).collect();
    for batch in doomed.chunks(BATCH) {
        let transaction = connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        {
            // A finished record never becomes live again: deleting it by
            // what the read saw is safe; one deleted meanwhile is skipped.
            let mut delete = transaction
                .prepare("DELETE FROM tasks WHERE id = ?1 AND status IN ('completed', 'killed', 'failed', 'lost')")?;
            for record in batch {
                delete.execute(params![record.id])?;
            }
        }
        transaction.commit()?;
        pruned.transactions += 1;
    }
    for record in doomed.iter().filter(|r| !r.told) {
        pruned.untold += 1;
        tracing::warn!(
            task = %record.id,
            owner = record.owner.as_deref().unwrap_or("-"),
            "a finished task's record was deleted by retention before its owner was told of its end"
        );
    }
    pruned.kept = finished.len() - doomed.len();
    Ok(pruned)
}

/// One pass ([`prune`]) with what it deleted logged. Errors are logged:
/// retention never stops a server.
pub fn enforce(connection: &mut Connection, file: &Path, limits: &RetentionLimits) -> Pruned {
    match prune(connection, limits, SystemTime::now()) {
        Ok(pruned) => {
            if pruned.deleted() > 0 {
                tracing::info!(
                    store = %file.display(),
                    deleted = pruned.deleted(),
                    by_age = pruned.by_age,
                    by_count = pruned.by_count,
                    by_bytes = pruned.by_bytes,
                    untold = pruned.untold,
                    kept = pruned.kept,
                    "retention deleted finished task records"
                );
            }
            pruned
        }
        Err(error) => {
            tracing::error!(store = %file.display(), %error, "cannot prune finished task records");
            Pruned::default()
        }
    }
}

/// Raised by the store at each settlement; the retention worker waits on it.
#[derive(Debug, Default)]
pub struct EndSignal {
    state: Mutex<SignalState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct SignalState {
    ended: bool,
    closed: bool,
}

impl EndSignal {
    /// A task ended (cheap: no I/O).
    pub fn raise(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !state.ended {
            state.ended = true;
            self.changed.notify_all();
        }
    }

    /// The store is gone: the worker ends.
    pub fn close(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        self.changed.notify_all();
    }

    /// Waits up to `timeout` for an end (or the close); returns false once closed.
    fn wait(&self, timeout: Duration) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (mut state, _) = self
            .changed
            .wait_timeout_while(state, timeout, |s| !s.ended && !s.closed)
            .unwrap_or_else(|e| e.into_inner());
        state.ended = false;
        !state.closed
    }

    /// Waits `delay` unless closed first; returns false once closed.
    fn pause(&self, delay: Duration) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (state, _) =
            self.changed.wait_timeout_while(state, delay, |s| !s.closed).unwrap_or_else(|e| e.into_inner());
        !state.closed
    }
}

/// Prunes the store at `file` now (start-up, before its records are read),
/// then on a thread of its own as `signal` says tasks end, until the store
/// closes `signal`.
pub fn start(file: PathBuf, limits: RetentionLimits, signal: Arc<EndSignal>) {
    let mut connection = match connect(&file) {
        Ok(connection) => connection,
        Err(error) => {
            tracing::error!(store = %file.display(), %error, "cannot open the task store for retention; nothing is pruned");
            return;
        }
    };
    enforce(&mut connection, &file, &limits);
    let spawned = std::thread::Builder::new().name("taskhost-retention".into()).spawn(move || {
        while signal.wait(AGE_PERIOD) && signal.pause(SETTLE_DELAY) {
            enforce(&mut connection, &file, &limits);
        }
    });
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the retention thread; finished records are pruned at start-up only");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path) -> Connection {
        let connection = Connection::open(dir.join("t.sqlite3")).unwrap();
        connection
            .execute_batch(
                "CREATE TABLE tasks (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, label TEXT NOT NULL,
                  owner TEXT, status TEXT NOT NULL, detail TEXT, started_at_ns INTEGER NOT NULL, finished_at_ns INTEGER,
                  producer_info TEXT, reporting TEXT NOT NULL, output TEXT, tree TEXT, tree_cursor TEXT)",
            )
            .unwrap();
        connection
    }

    fn add(connection: &Connection, id: &str, status: &str, reporting: &str, finished_s: i64, output: &str) {
        connection
            .execute(
                "INSERT INTO tasks (id, label, status, started_at_ns, finished_at_ns, reporting, output)
                 VALUES (?1, 'l', ?2, 0, ?3, ?4, ?5)",
                params![id, status, finished_s * 1_000_000_000, reporting, output],
            )
            .unwrap();
    }

    fn ids(connection: &Connection) -> Vec<String> {
        connection
            .prepare("SELECT id FROM tasks ORDER BY seq")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    const NOW: u64 = 1_000_000;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// Over the count: told records go oldest first, untold ones last, and
    /// live ones never.
    #[test]
    fn the_count_bound_keeps_the_newest_and_untold_ends_go_last() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = store(dir.path());
        add(&db, "bash-1", "completed", "untold", 100, "");
        add(&db, "bash-2", "completed", "reported", 200, "");
        add(&db, "bash-3", "running", "untold", 0, "");
        add(&db, "bash-4", "failed", "noticed", 300, "");
        add(&db, "bash-5", "lost", "held", 400, "");
        let limits = RetentionLimits { max_finished_tasks: 2, ..Default::default() };
        let pass = prune(&mut db, &limits, at(NOW)).unwrap();
        assert_eq!((pass.by_count, pass.untold, pass.kept, pass.transactions), (2, 0, 2, 1));
        assert_eq!(ids(&db), ["bash-1", "bash-3", "bash-5"], "told ones went first, the live one stays");
        let limits = RetentionLimits { max_finished_tasks: 1, ..Default::default() };
        let pass = prune(&mut db, &limits, at(NOW)).unwrap();
        assert_eq!((pass.by_count, pass.untold, pass.kept), (1, 1, 1));
        assert_eq!(ids(&db), ["bash-3", "bash-5"], "then the oldest untold end");
    }

    #[test]
    fn the_age_and_bytes_bounds_delete_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = store(dir.path());
        add(&db, "a-1", "completed", "untold", 10, "");
        add(&db, "a-2", "completed", "reported", NOW as i64 - 50, &"x".repeat(1000));
        add(&db, "a-3", "completed", "reported", NOW as i64 - 40, &"x".repeat(1000));
        add(&db, "a-4", "completed", "reported", NOW as i64 - 30, &"x".repeat(1000));
        let limits = RetentionLimits {
            max_finished_age_secs: 60,
            max_finished_bytes: 2 * (1001 + RECORD_OVERHEAD_BYTES),
            ..Default::default()
        };
        let pass = prune(&mut db, &limits, at(NOW)).unwrap();
        assert_eq!((pass.by_age, pass.by_bytes, pass.untold, pass.kept), (1, 1, 1, 2));
        assert_eq!(ids(&db), ["a-3", "a-4"]);
    }

    #[test]
    fn a_pass_deletes_in_transactions_of_at_most_a_batch() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = store(dir.path());
        db.execute_batch("BEGIN").unwrap();
        for n in 0..2 * BATCH + 10 {
            add(&db, &format!("b-{n}"), "completed", "reported", n as i64 + 1, "");
        }
        db.execute_batch("COMMIT").unwrap();
        let limits = RetentionLimits { max_finished_tasks: 5, max_finished_age_secs: NOW, ..Default::default() };
        let pass = prune(&mut db, &limits, at(NOW)).unwrap();
        assert_eq!((pass.by_count, pass.transactions, pass.kept), (2 * BATCH + 5, 3, 5));
        assert_eq!(ids(&db), ["b-2005", "b-2006", "b-2007", "b-2008", "b-2009"]);
        let again = prune(&mut db, &limits, at(NOW)).unwrap();
        assert_eq!((again.deleted(), again.transactions), (0, 0), "within the bounds: nothing to do");
    }

    #[test]
    fn bounds_that_keep_nothing_are_refused_by_name() {
        assert_eq!(RetentionLimits::default().validate(), Ok(()));
        let zero = RetentionLimits { max_finished_tasks: 0, ..Default::default() };
        assert!(zero.validate().unwrap_err().contains("[state] max_finished_tasks = 0"));
        let short = RetentionLimits { max_finished_age_secs: 1, ..Default::default() };
        assert!(short.validate().unwrap_err().contains("max_finished_age_secs"));
        let small = RetentionLimits { max_finished_bytes: 10, ..Default::default() };
        assert!(small.validate().unwrap_err().contains("max_finished_bytes"));
    }
}
