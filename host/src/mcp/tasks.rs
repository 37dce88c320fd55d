//! The MCP tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663),
//! backed by the task registry.
//!
//! Model: when a client declares the extension, a *foreground* call of a
//! producer tool that allows background runs is started as a registry
//! background task of the caller, and answered at once with a
//! `CreateTaskResult` whose task id is the registry id (`ticker-4`). The
//! task is an ordinary background task: `task_list` shows it, `task_kill`
//! stops it, the owner fence guards it. `tasks/get` reports it; once it
//! settles, a collector takes its output (a consuming read, as `task_output`
//! would, which also marks it reported so no completion notice repeats it)
//! and keeps the final tool result, so every later `tasks/get` returns the
//! same result. `tasks/cancel` is `task_kill`.
//!
//! Invariants: an MCP task is only visible to its owner (the registry's
//! fence answers for foreign ids); a result is stored once and never
//! changes; entries live as long as the server (a task's text result,
//! bounded by the producer's output caps).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolResult, ContentBlock, CreateTaskResult, DetailedTask, GetTaskResult, Task, TaskPayload, TaskStatus,
};

use taskhost_core::agents::Agent;
use taskhost_core::ids::TaskId;
use taskhost_core::tasks::{TaskRegistry, TaskSnapshot, TaskStatus as RegistryStatus};

/// How often a client should poll `tasks/get`.
const POLL_INTERVAL_MS: u64 = 500;

/// The MCP tasks this server created, by registry id.
#[derive(Default)]
pub struct McpTasks {
    entries: Mutex<HashMap<TaskId, Entry>>,
}

struct Entry {
    created_at: String,
    /// The final result, once the collector has it.
    result: Option<Collected>,
    /// Woken when `result` is set (`tasks/result` waits on it).
    settled: std::sync::Arc<tokio::sync::Notify>,
}

struct Collected {
    result: CallToolResult,
    status: RegistryStatus,
    at: String,
}

impl McpTasks {
    /// Records a started registry task as an MCP task and starts its collector.
    pub fn track(self: &std::sync::Arc<Self>, registry: &TaskRegistry, owner: &Agent, id: TaskId) -> CreateTaskResult {
        let now = iso8601(SystemTime::now());
        self.entries
            .lock()
            .expect("mcp tasks poisoned")
            .insert(id.clone(), Entry { created_at: now.clone(), result: None, settled: Default::default() });
        let tasks = self.clone();
        let registry = registry.clone();
        let owner = owner.clone();
        let collected_id = id.clone();
        tokio::spawn(async move { tasks.collect(&registry, &owner, collected_id).await });
        CreateTaskResult::new(
            Task::new(id.to_string(), TaskStatus::Working, now.clone(), now)
                .with_status_message("started in the background; poll tasks/get")
                .with_poll_interval_ms(POLL_INTERVAL_MS),
        )
    }

    /// Waits for the task to settle, then stores its final tool result.
    async fn collect(&self, registry: &TaskRegistry, owner: &Agent, id: TaskId) {
        // A wait is bounded by the registry; a live task just means wait again.
        let snapshot = loop {
            match registry.wait(&id, Duration::from_secs(3600), Some(owner), None).await {
                Ok(snapshot) if snapshot.status.is_terminal() => break Ok(()),
                Ok(_) => continue,
                Err(error) => break Err(error),
            }
        };
        let collected = match snapshot {
            Ok(()) => match registry.read(&id, Some(owner)).await {
                Ok(read) => {
                    let body = if read.text.is_empty() { "(no output)" } else { read.text.trim_end_matches('\n') };
                    let text = format!("{body}\n{}", read.snapshot.status_line());
                    let content = vec![ContentBlock::text(text)];
                    let result = if read.snapshot.status == RegistryStatus::Completed {
                        CallToolResult::success(content)
                    } else {
                        CallToolResult::error(content)
                    };
                    Collected { result, status: read.snapshot.status, at: iso8601(SystemTime::now()) }
                }
                Err(error) => failed(&error.to_string()),
            },
            // The owner was disposed or the registry went away under the task.
            Err(error) => failed(&error.to_string()),
        };
        tracing::debug!(task = %id, status = %collected.status, "MCP task result collected");
        if let Some(entry) = self.entries.lock().expect("mcp tasks poisoned").get_mut(&id) {
            entry.result = Some(collected);
            entry.settled.notify_waiters();
        }
    }

    /// `tasks/get` for `owner`.
    pub fn get(&self, registry: &TaskRegistry, owner: &Agent, task_id: &str) -> Result<GetTaskResult, McpError> {
        let id = TaskId::new(task_id);
        // The registry's fence speaks for ownership (and unknown ids).
        let snapshot = registry.get(&id, Some(owner)).map_err(|e| McpError::invalid_params(e.to_string(), None))?;
        let entries = self.entries.lock().expect("mcp tasks poisoned");
        let Some(entry) = entries.get(&id) else {
            return Err(McpError::invalid_params(
                format!("task {id} is a background task, not an MCP task; read it with task_output"),
                None,
            ));
        };
        let detailed = match &entry.result {
            None => DetailedTask::new(
                Task::new(id.to_string(), TaskStatus::Working, entry.created_at.clone(), entry.created_at.clone())
                    .with_status_message(status_message(&snapshot))
                    .with_poll_interval_ms(POLL_INTERVAL_MS),
                TaskPayload::Working,
            ),
            Some(collected) => {
                let task =
                    Task::new(id.to_string(), TaskStatus::Completed, entry.created_at.clone(), collected.at.clone())
                        .with_status_message(status_message(&snapshot));
                let payload = match collected.status {
                    RegistryStatus::Killed => TaskPayload::Cancelled,
                    // A failed run is still a tool result (isError), which the
                    // extension files under completed.
                    _ => TaskPayload::Completed { result: as_object(&collected.result) },
                };
                DetailedTask::new(task, payload)
            }
        };
        Ok(GetTaskResult::new(detailed))
    }

    /// `tasks/cancel` for `owner`: kills the registry task.
    pub async fn cancel(&self, registry: &TaskRegistry, owner: &Agent, task_id: &str) -> Result<(), McpError> {
        let id = TaskId::new(task_id);
        if !self.entries.lock().expect("mcp tasks poisoned").contains_key(&id) {
            // Foreign and unknown ids get the registry's own words.
            registry.get(&id, Some(owner)).map_err(|e| McpError::invalid_params(e.to_string(), None))?;
            return Err(McpError::invalid_params(
                format!("task {id} is not an MCP task; stop it with task_kill"),
                None,
            ));
        }
        registry
            .kill(&id, Some(owner), Some("cancelled by the client (tasks/cancel)"))
            .await
            .map(|_| ())
            .map_err(|e| McpError::invalid_params(e.to_string(), None))
    }
}

/// A task as the 2025-11-25 tasks wire shows it (`tasks/get`,
/// `tasks/list`, `tasks/cancel`, the `task` of a created task).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView {
    pub id: TaskId,
    /// `working`, `completed`, `failed` or `cancelled`.
    pub status: &'static str,
    pub status_message: String,
    pub created_at: String,
    pub last_updated_at: String,
}

impl TaskView {
    pub fn to_v1(&self) -> serde_json::Value {
        serde_json::json!({
            "taskId": self.id.to_string(),
            "status": self.status,
            "statusMessage": self.status_message,
            "createdAt": self.created_at,
            "lastUpdatedAt": self.last_updated_at,
            "ttl": null,
            "pollInterval": POLL_INTERVAL_MS,
        })
    }
}

impl McpTasks {
    /// The MCP task `task_id` of `owner`, as it stands.
    pub fn view(&self, registry: &TaskRegistry, owner: &Agent, task_id: &str) -> Result<TaskView, McpError> {
        let id = TaskId::new(task_id);
        let snapshot = registry.get(&id, Some(owner)).map_err(|e| McpError::invalid_params(e.to_string(), None))?;
        let entries = self.entries.lock().expect("mcp tasks poisoned");
        let entry = entries.get(&id).ok_or_else(|| {
            McpError::invalid_params(
                format!("task {id} is a background task, not an MCP task; read it with task_output"),
                None,
            )
        })?;
        Ok(view_of(&id, entry, &snapshot))
    }

    /// Every MCP task of `owner`, oldest first.
    pub fn list(&self, registry: &TaskRegistry, owner: &Agent) -> Vec<TaskView> {
        let entries = self.entries.lock().expect("mcp tasks poisoned");
        let mut views: Vec<TaskView> = entries
            .iter()
            .filter_map(|(id, entry)| registry.get(id, Some(owner)).ok().map(|snapshot| view_of(id, entry, &snapshot)))
            .collect();
        views.sort_by(|a, b| (&a.created_at, a.id.to_string()).cmp(&(&b.created_at, b.id.to_string())));
        views
    }

    /// Waits until the task settles and returns its final tool result
    /// (`tasks/result`). The wait ends with the task, or with the request.
    pub async fn result(
        &self,
        registry: &TaskRegistry,
        owner: &Agent,
        task_id: &str,
    ) -> Result<(TaskView, CallToolResult), McpError> {
        loop {
            let settled = {
                let view = self.view(registry, owner, task_id)?;
                let entries = self.entries.lock().expect("mcp tasks poisoned");
                let entry = entries.get(&TaskId::new(task_id)).expect("viewed under the same id");
                if let Some(collected) = &entry.result {
                    return Ok((view, collected.result.clone()));
                }
                entry.settled.clone()
            };
            let notified = settled.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            // The result may have landed between the check and `enable`.
            if self
                .entries
                .lock()
                .expect("mcp tasks poisoned")
                .get(&TaskId::new(task_id))
                .is_some_and(|e| e.result.is_some())
            {
                continue;
            }
            notified.await;
        }
    }
}

fn view_of(id: &TaskId, entry: &Entry, snapshot: &TaskSnapshot) -> TaskView {
    let (status, updated) = match &entry.result {
        None => ("working", entry.created_at.clone()),
        Some(collected) => (
            match collected.status {
                RegistryStatus::Completed => "completed",
                RegistryStatus::Killed => "cancelled",
                _ => "failed",
            },
            collected.at.clone(),
        ),
    };
    TaskView {
        id: id.clone(),
        status,
        status_message: status_message(snapshot),
        created_at: entry.created_at.clone(),
        last_updated_at: updated,
    }
}

fn failed(message: &str) -> Collected {
    Collected {
        result: CallToolResult::error(vec![ContentBlock::text(format!("the task could not be collected: {message}"))]),
        status: RegistryStatus::Failed,
        at: iso8601(SystemTime::now()),
    }
}

fn status_message(snapshot: &TaskSnapshot) -> String {
    format!("{} [{}] {} — {}", snapshot.id, snapshot.kind, snapshot.status, snapshot.label)
}

fn as_object(result: &CallToolResult) -> rmcp::model::JsonObject {
    match serde_json::to_value(result) {
        Ok(serde_json::Value::Object(object)) => object,
        _ => rmcp::model::JsonObject::new(),
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC), without a calendar crate.
fn iso8601(at: SystemTime) -> String {
    let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil-from-days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_iso8601_utc() {
        assert_eq!(iso8601(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_000_000_123);
        assert_eq!(iso8601(at), "2026-11-18T11:06:40.123Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(iso8601(leap), "2000-02-29T00:00:00.000Z");
    }
}
