//! The task store's schema, version by version, and how a row reads as a
//! [`StoredTask`]: what [`super::store::SqliteStore`] writes and reads.
//!
//! Invariants: `MIGRATIONS[n]` takes version `n` to `n + 1` and only adds
//! (columns, tables, indexes), so a record an older taskhost wrote reads
//! with the defaults of what it did not know; an unknown word in a column
//! (a newer writer's) reads as its safest meaning.

use std::time::{Duration, SystemTime};

use taskhost_core::ids::{SessionId, TaskId};
use taskhost_core::tasks::store::{ReportState, StoredOptions, StoredOwner, StoredTask, StoredTree, parse_input};
use taskhost_core::tasks::{TaskInput, TaskStatus};

/// The schema this build writes.
pub const SCHEMA_VERSION: i64 = 3;
/// `PRAGMA application_id`: "tskh".
pub(super) const APPLICATION_ID: i64 = 0x7473_6b68;

/// The schema, version by version: `MIGRATIONS[n]` takes version `n` to `n + 1`.
pub(super) const MIGRATIONS: &[&str] = &[
    "
    CREATE TABLE counters (kind TEXT PRIMARY KEY, last INTEGER NOT NULL) STRICT;
    CREATE TABLE tasks (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        label TEXT NOT NULL,
        owner TEXT,
        owner_durable INTEGER NOT NULL,
        server TEXT NOT NULL,
        status TEXT NOT NULL,
        detail TEXT,
        started_at_ns INTEGER NOT NULL,
        finished_at_ns INTEGER,
        producer_info TEXT,
        reporting TEXT NOT NULL,
        output TEXT
    ) STRICT;
    CREATE INDEX tasks_by_server ON tasks (server);
",
    "
    ALTER TABLE tasks ADD COLUMN tree TEXT;
    ALTER TABLE tasks ADD COLUMN tree_cursor TEXT;
",
    "
    ALTER TABLE tasks ADD COLUMN input TEXT;
    ALTER TABLE tasks ADD COLUMN notify_pattern TEXT;
    ALTER TABLE tasks ADD COLUMN notify_stalled_ms INTEGER;
    ALTER TABLE tasks ADD COLUMN ttl_ms INTEGER;
    ALTER TABLE tasks ADD COLUMN expires_at_ns INTEGER;
",
];

pub(super) fn nanos(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

pub(super) fn time(nanos: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(nanos).unwrap_or(0))
}

pub(super) fn stored_task(row: &rusqlite::Row<'_>) -> rusqlite::Result<StoredTask> {
    let status: String = row.get("status")?;
    let reporting: String = row.get("reporting")?;
    let id: String = row.get("id")?;
    let kind: String = row.get("kind")?;
    let label: String = row.get("label")?;
    let mut task = StoredTask::new(TaskId::new(id), kind, label, time(row.get("started_at_ns")?));
    task.owner = row
        .get::<_, Option<String>>("owner")?
        .map(|session| StoredOwner::new(SessionId::new(session), row.get::<_, i64>("owner_durable").unwrap_or(0) != 0));
    // An unknown word (a newer writer's) reads as the safest meaning: a
    // live task (settled lost on restore), an end already told.
    task.status = TaskStatus::parse(&status).unwrap_or(TaskStatus::Running);
    task.detail = row.get("detail")?;
    task.finished_at = row.get::<_, Option<i64>>("finished_at_ns")?.map(time);
    task.producer_info = row.get("producer_info")?;
    task.reporting = ReportState::parse(&reporting).unwrap_or(ReportState::Reported);
    task.output = row.get("output")?;
    let millis = |column: &str| -> rusqlite::Result<Option<Duration>> {
        Ok(row.get::<_, Option<i64>>(column)?.and_then(|ms| u64::try_from(ms).ok()).map(Duration::from_millis))
    };
    let mut options = StoredOptions::default();
    options.input = row.get::<_, Option<String>>("input")?.map_or(TaskInput::Unsupported, |word| parse_input(&word));
    options.notify_pattern = row.get("notify_pattern")?;
    options.notify_stalled = millis("notify_stalled_ms")?;
    options.ttl = millis("ttl_ms")?;
    options.expires_at = row.get::<_, Option<i64>>("expires_at_ns")?.map(time);
    task.options = options;
    if let Some(record) = row.get::<_, Option<String>>("tree")? {
        let mut tree = StoredTree::new(record);
        tree.cursor = row.get("tree_cursor")?;
        task.tree = Some(tree);
    }
    Ok(task)
}
