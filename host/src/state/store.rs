//! The durable task store: SQLite in WAL mode, one file (`tasks.sqlite3`)
//! in the state directory, behind `taskhost_core`'s [`TaskStore`] seam.
//!
//! Invariants:
//! - The file is created `0600` in the `0700` state directory (SQLite gives
//!   its `-wal` and `-shm` files the same mode); a symlink is refused.
//! - Schema versioned by `PRAGMA user_version` and marked as taskhost's by
//!   `PRAGMA application_id`; an older schema is migrated forward on open.
//!   A file of a newer schema, of another application, or that SQLite cannot
//!   read is refused with an error naming the file and what to do; nothing
//!   is ever deleted or rewritten then.
//! - `synchronous = NORMAL` in WAL mode: every committed write survives a
//!   crash of the server (SIGKILL, OOM); a power loss may lose the last
//!   commits, never corrupt the file.
//! - Several servers may share a store: each marks its records with its own
//!   server id and holds `servers/<id>.lock` (`flock`) while it runs. A
//!   server taking over ([`TaskStore::load`]) claims, in one transaction,
//!   only the records of servers whose lock nobody holds.

use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension as _, params};

use super::retention::EndSignal;
pub use super::schema::SCHEMA_VERSION;
use super::schema::{APPLICATION_ID, MIGRATIONS, millis, nanos, stored_task};
use super::server_lock;
use taskhost_core::ids::TaskId;
use taskhost_core::tasks::store::{ReportState, StoreError, StoredEnd, StoredState, StoredTask, TaskStore, input_name};

/// The store's file in the state directory.
pub const STORE_FILE: &str = "tasks.sqlite3";
/// How long a write waits for another server's write to the same file.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The SQLite task store of one server.
pub struct SqliteStore {
    path: PathBuf,
    connection: Mutex<Connection>,
    /// This server's id in the `server` column.
    server: String,
    /// `servers/<server>.lock`, held (`flock`) while the server runs.
    _lock: std::fs::File,
    servers_dir: PathBuf,
    /// Raised at each settlement: the retention worker's cue.
    ends: Arc<EndSignal>,
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.ends.close();
    }
}

impl SqliteStore {
    /// Opens (or creates) the store `file`; `servers_dir` holds the servers'
    /// lock files (both inside the state directory).
    pub fn open(file: &Path) -> Result<Self, StoreError> {
        let refuse = |why: String| {
            StoreError::new(format!(
                "the task store {} {why}. Nothing was changed or deleted; move the file away (or set \
                 [state] store = \"memory\", or another [state] dir) to start with an empty store",
                file.display()
            ))
        };
        // Created 0600 (never through a symlink) before SQLite opens it.
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(file)
            .map_err(|error| refuse(format!("cannot be opened: {error}")))?;
        let connection = Connection::open_with_flags(
            file,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|error| refuse(format!("cannot be opened: {error}")))?;
        connection.busy_timeout(BUSY_TIMEOUT).map_err(|error| refuse(error.to_string()))?;
        let read = |pragma: &str| -> Result<i64, StoreError> {
            connection
                .query_row(&format!("PRAGMA {pragma}"), [], |row| row.get(0))
                .map_err(|error| refuse(format!("is not a readable SQLite database ({error})")))
        };
        let application = read("application_id")?;
        let version = read("user_version")?;
        let tables: i64 = connection
            .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
            .map_err(|error| refuse(format!("is not a readable SQLite database ({error})")))?;
        if application != APPLICATION_ID && !(application == 0 && version == 0 && tables == 0) {
            return Err(refuse(format!("is not a taskhost task store (application id {application:#x})")));
        }
        if version > SCHEMA_VERSION {
            return Err(refuse(format!(
                "has schema version {version}, newer than this taskhost's {SCHEMA_VERSION} (a newer taskhost wrote it): \
                 run that taskhost, or"
            )));
        }
        let integrity: String = connection
            .query_row("PRAGMA quick_check", [], |row| row.get(0))
            .map_err(|error| refuse(format!("is corrupt ({error})")))?;
        if integrity != "ok" {
            return Err(refuse(format!("is corrupt ({integrity})")));
        }
        let mode: String = connection
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(|error| refuse(format!("cannot use write-ahead logging ({error})")))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(refuse(format!("cannot use write-ahead logging (journal mode {mode})")));
        }
        connection.pragma_update(None, "synchronous", "NORMAL").map_err(|error| refuse(error.to_string()))?;
        // The write-ahead log gives its space back beyond this when it restarts.
        connection
            .pragma_update(None, "journal_size_limit", super::retention::WAL_KEPT_BYTES)
            .map_err(|error| refuse(error.to_string()))?;
        for (from, migration) in MIGRATIONS.iter().enumerate().skip(usize::try_from(version).unwrap_or(0)) {
            let to = from + 1;
            connection
                .execute_batch(&format!(
                    "BEGIN IMMEDIATE; {migration}; PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {to}; COMMIT;"
                ))
                .map_err(|error| {
                    let _ = connection.execute_batch("ROLLBACK");
                    refuse(format!("cannot be migrated from schema version {from} to {to} ({error})"))
                })?;
            tracing::info!(file = %file.display(), from, to, "task store schema migrated");
        }
        let servers_dir = file.with_extension("servers");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&servers_dir)
            .or_else(|error| if servers_dir.is_dir() { Ok(()) } else { Err(error) })
            .map_err(|error| refuse(format!("has no servers directory {} ({error})", servers_dir.display())))?;
        let server = random_id();
        let lock_path = servers_dir.join(format!("{server}.lock"));
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|error| refuse(format!("cannot take its lock {} ({error})", lock_path.display())))?;
        if !server_lock::try_lock(&lock) {
            return Err(refuse(format!("cannot lock {}", lock_path.display())));
        }
        // Who holds it, so a later server can tell a dead one's leftover
        // holder from a live server (see `server_lock::take_if_dead`).
        std::io::Write::write_all(&mut &lock, server_lock::owner_line().as_bytes())
            .map_err(|error| refuse(format!("cannot write its lock {} ({error})", lock_path.display())))?;
        Ok(Self {
            path: file.to_path_buf(),
            connection: Mutex::new(connection),
            server,
            _lock: lock,
            servers_dir,
            ends: Arc::default(),
        })
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the store raises at each settlement ([`super::retention::start`] waits on it).
    pub fn end_signal(&self) -> Arc<EndSignal> {
        self.ends.clone()
    }

    fn connection(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.connection.lock().expect("task store connection poisoned")
    }

    fn error(&self, doing: &str, error: rusqlite::Error) -> StoreError {
        StoreError::new(format!("task store {}: {doing}: {error}", self.path.display()))
    }

    /// The servers whose records may be claimed: those whose lock file
    /// nobody holds (their lock files are removed once claimed).
    fn dead_servers(&self, servers: Vec<String>) -> Vec<(String, Option<PathBuf>)> {
        servers
            .into_iter()
            .filter(|server| server != &self.server)
            .filter_map(|server| {
                let valid = server.len() == 32 && server.bytes().all(|b| b.is_ascii_hexdigit());
                let lock_path = self.servers_dir.join(format!("{server}.lock"));
                match std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(&lock_path) {
                    Ok(file) if valid => {
                        server_lock::take_if_dead(&file, &lock_path).then_some((server, Some(lock_path)))
                    }
                    // No lock file: nobody can hold it.
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => Some((server, None)),
                    _ => Some((server, None)).filter(|_| !valid),
                }
            })
            .collect()
    }
}

fn random_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl TaskStore for SqliteStore {
    fn load(&self) -> Result<StoredState, StoreError> {
        let mut connection = self.connection();
        let servers: Vec<String> = connection
            .prepare("SELECT DISTINCT server FROM tasks")
            .and_then(|mut statement| statement.query_map([], |row| row.get(0))?.collect())
            .map_err(|error| self.error("listing servers", error))?;
        let dead = self.dead_servers(servers);
        let transaction = connection.transaction().map_err(|error| self.error("claiming records", error))?;
        for (server, _) in &dead {
            transaction
                .execute("UPDATE tasks SET server = ?1 WHERE server = ?2", params![self.server, server])
                .map_err(|error| self.error("claiming records", error))?;
        }
        let counters = transaction
            .prepare("SELECT kind, last FROM counters")
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?)))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|error| self.error("reading counters", error))?
            .into_iter()
            .map(|(kind, last)| (kind, u64::try_from(last).unwrap_or(0)))
            .collect();
        let tasks = transaction
            .prepare("SELECT * FROM tasks WHERE server = ?1 ORDER BY seq")
            .and_then(|mut statement| statement.query_map([&self.server], stored_task)?.collect::<Result<Vec<_>, _>>())
            .map_err(|error| self.error("reading records", error))?;
        transaction.commit().map_err(|error| self.error("claiming records", error))?;
        for (_, lock) in dead {
            if let Some(lock) = lock {
                let _ = std::fs::remove_file(lock);
            }
        }
        let mut state = StoredState::default();
        state.counters = counters;
        state.tasks = tasks;
        Ok(state)
    }

    fn issue_number(&self, kind: &str, at_least: u64) -> Result<u64, StoreError> {
        let at_least = i64::try_from(at_least).unwrap_or(i64::MAX);
        let issued: i64 = self
            .connection()
            .query_row(
                "INSERT INTO counters (kind, last) VALUES (?1, ?2)
                 ON CONFLICT (kind) DO UPDATE SET last = max(last + 1, ?2) RETURNING last",
                params![kind, at_least],
                |row| row.get(0),
            )
            .map_err(|error| self.error("issuing an id", error))?;
        Ok(u64::try_from(issued).unwrap_or(0))
    }

    fn record_start(&self, task: &StoredTask) -> Result<(), StoreError> {
        let number = task.number().and_then(|n| i64::try_from(n).ok()).unwrap_or(0);
        let mut connection = self.connection();
        let transaction = connection.transaction().map_err(|error| self.error("recording a start", error))?;
        transaction
            .execute(
                "INSERT INTO counters (kind, last) VALUES (?1, ?2)
                 ON CONFLICT (kind) DO UPDATE SET last = max(last, ?2)",
                params![task.kind, number],
            )
            .map_err(|error| self.error("recording a start", error))?;
        transaction
            .execute(
                "INSERT INTO tasks (id, kind, label, owner, owner_durable, server, status, detail, started_at_ns,
                                    finished_at_ns, producer_info, reporting, output, tree, tree_cursor,
                                    input, notify_pattern, notify_stalled_ms, ttl_ms, expires_at_ns)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
                params![
                    task.id.as_str(),
                    task.kind,
                    task.label,
                    task.owner.as_ref().map(|o| o.session.as_str()),
                    task.owner.as_ref().is_some_and(|o| o.durable),
                    self.server,
                    task.status.as_str(),
                    task.detail,
                    nanos(task.started_at),
                    task.finished_at.map(nanos),
                    task.producer_info,
                    task.reporting.as_str(),
                    task.output,
                    task.tree.as_ref().map(|t| t.record.as_str()),
                    task.tree.as_ref().and_then(|t| t.cursor.as_deref()),
                    input_name(task.options.input),
                    task.options.notify_pattern,
                    task.options.notify_stalled.map(millis),
                    task.options.ttl.map(millis),
                    task.options.expires_at.map(nanos),
                ],
            )
            .map_err(|error| self.error(&format!("recording the start of {}", task.id), error))?;
        transaction.commit().map_err(|error| self.error("recording a start", error))
    }

    fn request_stop(&self, id: &TaskId) -> Result<bool, StoreError> {
        let changed = self
            .connection()
            .execute("UPDATE tasks SET status = 'stopping' WHERE id = ?1 AND status = 'running'", [id.as_str()])
            .map_err(|error| self.error("recording a stop request", error))?;
        Ok(changed == 1)
    }

    fn settle(&self, id: &TaskId, end: &StoredEnd) -> Result<bool, StoreError> {
        let changed = self
            .connection()
            .execute(
                "UPDATE tasks SET status = ?2, detail = ?3, finished_at_ns = ?4, reporting = ?5, output = ?6
                 WHERE id = ?1 AND status IN ('running', 'stopping')",
                params![
                    id.as_str(),
                    end.status.as_str(),
                    end.detail,
                    nanos(end.finished_at),
                    end.reporting.as_str(),
                    end.output
                ],
            )
            .map_err(|error| self.error("recording an end", error))?;
        if changed == 1 {
            self.ends.raise();
        }
        Ok(changed == 1)
    }

    fn set_reporting(&self, id: &TaskId, reporting: ReportState) -> Result<(), StoreError> {
        self.connection()
            .execute("UPDATE tasks SET reporting = ?2 WHERE id = ?1", params![id.as_str(), reporting.as_str()])
            .map_err(|error| self.error("recording who was told", error))?;
        Ok(())
    }

    fn set_tree_cursor(&self, id: &TaskId, cursor: &str) -> Result<(), StoreError> {
        self.connection()
            .execute(
                "UPDATE tasks SET tree_cursor = ?2 WHERE id = ?1 AND tree IS NOT NULL",
                params![id.as_str(), cursor],
            )
            .map_err(|error| self.error("recording where a tree's output was read to", error))?;
        Ok(())
    }

    fn set_expiry(&self, id: &TaskId, expires_at: SystemTime) -> Result<(), StoreError> {
        self.connection()
            .execute("UPDATE tasks SET expires_at_ns = ?1 WHERE id = ?2", params![nanos(expires_at), id.as_str()])
            .map(|_| ())
            .map_err(|error| self.error("recording a renewed time to live", error))
    }

    fn forget(&self, ids: &[TaskId]) -> Result<(), StoreError> {
        let mut connection = self.connection();
        let transaction = connection.transaction().map_err(|error| self.error("deleting records", error))?;
        {
            let mut delete = transaction
                .prepare("DELETE FROM tasks WHERE id = ?1")
                .map_err(|error| self.error("deleting records", error))?;
            for id in ids {
                delete.execute([id.as_str()]).map_err(|error| self.error("deleting records", error))?;
            }
        }
        transaction.commit().map_err(|error| self.error("deleting records", error))
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn outlives_process(&self) -> bool {
        true
    }
}

/// Every record of the store at `file`, read-only (for `taskhost ps`: no
/// server needed; a running server's writes are seen as of their commit).
pub fn read_all(file: &Path) -> Result<Vec<StoredTask>, StoreError> {
    let refuse = |why: String| StoreError::new(format!("the task store {} {why}", file.display()));
    let connection = Connection::open_with_flags(
        file,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|error| refuse(format!("cannot be opened: {error}")))?;
    connection.busy_timeout(BUSY_TIMEOUT).map_err(|error| refuse(error.to_string()))?;
    let version: i64 = connection
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|error| refuse(format!("is not a readable SQLite database ({error})")))?;
    if version > SCHEMA_VERSION {
        return Err(refuse(format!("has schema version {version}, newer than this taskhost's {SCHEMA_VERSION}")));
    }
    let table: Option<String> = connection
        .query_row("SELECT name FROM sqlite_schema WHERE name = 'tasks'", [], |row| row.get(0))
        .optional()
        .map_err(|error| refuse(format!("is not a readable SQLite database ({error})")))?;
    if table.is_none() {
        return Ok(Vec::new());
    }
    connection
        .prepare("SELECT * FROM tasks ORDER BY seq")
        .and_then(|mut statement| statement.query_map([], stored_task)?.collect())
        .map_err(|error| refuse(format!("cannot be read ({error})")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskhost_core::ids::SessionId;
    use taskhost_core::tasks::store::{StoredOwner, StoredTree};

    /// `flock` holding `lock` (a holder that is not the server the file
    /// names) until its stdin closes; returns once it holds it.
    fn hold(lock: &Path) -> std::process::Child {
        use std::io::BufRead as _;
        let mut holder = std::process::Command::new("flock")
            .arg("-x")
            .arg(lock)
            .args(["-c", "echo held; read _"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run flock(1)");
        let mut line = String::new();
        std::io::BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line, "held\n");
        holder
    }

    /// A store whose one record belongs to a server that left its lock file
    /// (dead, or alive as `owner` says).
    fn store_left_by(dir: &Path, owner: &str) -> (PathBuf, PathBuf) {
        let file = dir.join(STORE_FILE);
        let left = SqliteStore::open(&file).unwrap();
        let task = StoredTask::new(TaskId::new("bash-1"), "bash", "left", SystemTime::now());
        left.record_start(&task).unwrap();
        let lock = left.servers_dir.join(format!("{}.lock", left.server));
        drop(left);
        std::fs::write(&lock, owner).unwrap();
        (file, lock)
    }

    /// A dead server's lock still held by a leftover holder (a child it was
    /// starting when it died) is waited for, and its records are claimed.
    #[test]
    fn a_dead_servers_lock_held_by_a_leftover_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        // A pid that is gone: a child that exited and was reaped.
        let gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        let mut gone = gone;
        gone.wait().unwrap();
        let (file, lock) = store_left_by(dir.path(), &format!("{gone_pid} 1\n"));
        let mut holder = hold(&lock);
        let next = SqliteStore::open(&file).unwrap();
        let loading = std::thread::spawn(move || next.load().unwrap().tasks.len());
        drop(holder.stdin.take());
        holder.wait().unwrap();
        assert_eq!(loading.join().unwrap(), 1, "the dead server's record is claimed");
        assert!(!lock.exists(), "a claimed server's lock file is removed");
    }

    /// A live server's lock (its pid and start time are this process's) is
    /// not waited for: its records stay its own.
    #[test]
    fn a_live_servers_lock_is_left_alone_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (file, lock) = store_left_by(dir.path(), &server_lock::owner_line());
        let mut holder = hold(&lock);
        let next = SqliteStore::open(&file).unwrap();
        let began = std::time::Instant::now();
        assert_eq!(next.load().unwrap().tasks.len(), 0, "a live server's record is not claimed");
        assert!(began.elapsed() < server_lock::DEAD_HOLDER_WAIT, "no wait for a live server: {:?}", began.elapsed());
        drop(holder.stdin.take());
        holder.wait().unwrap();
        assert!(lock.exists());
    }

    /// A file of schema 1 (before handed-over trees) opens, is migrated to
    /// 2 with its records intact, and then keeps a tree and its cursor.
    #[test]
    fn a_schema_1_store_is_migrated_and_keeps_trees() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(STORE_FILE);
        {
            let old = Connection::open(&file).unwrap();
            old.execute_batch(&format!(
                "{} PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 1;",
                MIGRATIONS[0]
            ))
            .unwrap();
            old.execute(
                "INSERT INTO tasks (id, kind, label, owner, owner_durable, server, status, started_at_ns, reporting)
                 VALUES ('bash-1', 'bash', 'old', 'owner:a', 1, 'gone', 'completed', 1, 'reported')",
                [],
            )
            .unwrap();
        }
        let store = SqliteStore::open(&file).expect("a schema 1 file opens");
        let version: i64 = store.connection().query_row("PRAGMA user_version", [], |row| row.get(0)).unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let loaded = store.load().unwrap();
        assert_eq!(loaded.tasks.len(), 1);
        assert_eq!((loaded.tasks[0].label.as_str(), &loaded.tasks[0].tree), ("old", &None));

        let mut task = StoredTask::new(TaskId::new("bash-2"), "bash", "new", SystemTime::now());
        task.owner = Some(StoredOwner::new(SessionId::new("owner:a"), true));
        task.tree = Some(StoredTree::new("{\"record\":1}".into()));
        store.record_start(&task).unwrap();
        store.set_tree_cursor(&task.id, "cursor 3 4 0 1").unwrap();
        // Only a record with a tree takes a cursor.
        store.set_tree_cursor(&TaskId::new("bash-1"), "cursor 1 1 0 0").unwrap();
        drop(store);
        let store = SqliteStore::open(&file).unwrap();
        let tasks = store.load().unwrap().tasks;
        let tree = |id: &str| tasks.iter().find(|t| t.id.as_str() == id).unwrap().tree.clone();
        assert_eq!(tree("bash-1"), None);
        let kept = tree("bash-2").expect("the tree is kept");
        assert_eq!((kept.record.as_str(), kept.cursor.as_deref()), ("{\"record\":1}", Some("cursor 3 4 0 1")));
    }
}
