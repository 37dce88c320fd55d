//! Settling a gone node's live tasks: each record naming the node that is
//! still running (or stopping) is settled `lost` (`killed`, for a stop
//! that was requested) and handed to the node that settled it, with its
//! stable owners' ended records as they stand.
//!
//! Invariants:
//! - Each record is settled by one compare-and-set: several nodes sweeping
//!   the same gone node settle each record once between them, and a record
//!   the node itself settled meanwhile is left as it is.
//! - A settled record names its settler as its node, which keeps it and
//!   tells its owner (a stable owner, at its next appearance there). A
//!   plain owner's connection is on the gone node: it is told there if the
//!   node comes back with it (a pause), else never (the record says the
//!   end counts as told: nobody is left to tell).
//! - The task is never run again anywhere.
//! - Every end is told once: an ended record whose notice waited in the
//!   gone node's session (noticed, not delivered) is made untold, so the
//!   settler tells it; the gone node, should it return, takes its copy
//!   back unless the record says it told the end itself (`told_by`).

use taskhost_core::ids::TaskId;
use taskhost_core::tasks::TaskStatus;
use taskhost_core::tasks::store::{ReportState, StoreError, StoredTask};

use super::bucket::{Bucket, failed};
use super::record::{Record, nanos};
use super::store::transition;

/// Why a task of a node declared gone was settled.
pub fn lost_detail(gone: &str, settler: &str, silent_ms: u64) -> String {
    format!(
        "its node {gone} was silent for over {} s (no heartbeat), so node {settler} settled it; its process tree on {gone} is killed when {gone} returns, and it was not run again",
        silent_ms.div_ceil(1000)
    )
}

/// Why a stopping task of a node declared gone was settled.
pub fn killed_detail(gone: &str) -> String {
    format!("its stop was requested, and its node {gone} went silent before it was carried out")
}

/// Settles every live record naming `gone` and takes over its stable
/// owners' ended ones (see the module invariants); returns the records
/// this call settled or took over, as they now stand.
pub async fn sweep(bucket: &Bucket, gone: &str, settler: &str, silent_ms: u64) -> Result<Vec<StoredTask>, StoreError> {
    let doing = "settling a gone node's tasks";
    let (mut live, mut ended) = (Vec::new(), Vec::new());
    for key in bucket.keys_under("task.").await.map_err(|error| failed(doing, error))? {
        let Some((value, _)) = bucket.read(&key).await.map_err(|error| failed(doing, error))? else { continue };
        let record = Record::parse(&key, &value)?;
        if record.node != gone {
            continue;
        }
        if matches!(record.status(), TaskStatus::Running | TaskStatus::Stopping) {
            live.push(TaskId::new(record.id));
        } else if record.owner_durable {
            ended.push(TaskId::new(record.id));
        }
    }
    let now = std::time::SystemTime::now();
    let (lost, killed) = (lost_detail(gone, settler, silent_ms), killed_detail(gone));
    let mut settled = change_each(bucket, live, doing, gone, |record| {
        let (status, detail) = match record.status() {
            TaskStatus::Running => (TaskStatus::Lost, &lost),
            TaskStatus::Stopping => (TaskStatus::Killed, &killed),
            _ => return false,
        };
        record.status = status.as_str().to_string();
        record.detail = Some(detail.clone());
        record.finished_at_ns = Some(nanos(now));
        record.node = settler.to_string();
        let reporting = if record.owner_durable { ReportState::Untold } else { ReportState::Reported };
        record.set_reporting(reporting, settler);
        true
    })
    .await?;
    for task in &settled {
        tracing::warn!(task = %task.id, gone, settler, "a gone node's task is settled");
    }
    // Its stable owners' ended records change hands as they are (told or
    // not): their owners read and list them from the settler.
    let taken = change_each(bucket, ended, doing, gone, |record| {
        record.status().is_terminal() && {
            record.node = settler.to_string();
            // A notice put in the owner's session on the gone node, but
            // not yet delivered, is gone with it (or is taken back there,
            // should it return): the settler tells it.
            if record.reporting == ReportState::Noticed.as_str() {
                record.set_reporting(ReportState::Untold, settler);
            }
            true
        }
    })
    .await?;
    for task in &taken {
        tracing::info!(task = %task.id, gone, settler, "a gone node's ended task is taken over");
    }
    settled.extend(taken);
    Ok(settled)
}

/// Changes each record of `ids` that still names `gone` by `change` (a
/// compare-and-set each: false leaves it); returns the records this call
/// changed, as it wrote them.
async fn change_each(
    bucket: &Bucket,
    ids: Vec<TaskId>,
    doing: &str,
    gone: &str,
    change: impl Fn(&mut Record) -> bool,
) -> Result<Vec<StoredTask>, StoreError> {
    let mut changed = Vec::new();
    for id in ids {
        // The record as the last change that was written left it.
        let written = std::sync::Mutex::new(None);
        let won = transition(bucket, &id, doing, gone, |record| {
            change(record) && {
                *written.lock().unwrap_or_else(|e| e.into_inner()) = Some(record.to_task());
                true
            }
        })
        .await?;
        if won {
            changed.extend(written.into_inner().unwrap_or_else(|e| e.into_inner()));
        }
    }
    Ok(changed)
}

/// A task another node took over from this one, as its record says.
pub struct TakenOver {
    pub id: TaskId,
    /// Its owner's session.
    pub session: Option<String>,
    /// The record does not say this node told its end (nobody did yet, or
    /// the node that took it over did): that node tells it, so a notice
    /// waiting here must be taken back.
    pub untold: bool,
}

/// Of `ids` (tasks a node declared gone still holds), the stable owners'
/// whose records another node holds now: the node lets them go when it
/// rejoins, so calls about them go where the record is.
pub async fn taken_over(bucket: &Bucket, node: &str, ids: Vec<TaskId>) -> Result<Vec<TakenOver>, StoreError> {
    let doing = "finding the tasks another node took over";
    let mut taken = Vec::new();
    for id in ids {
        let key = super::record::task_key(&id);
        let Some((value, _)) = bucket.read(&key).await.map_err(|error| failed(doing, error))? else { continue };
        let record = Record::parse(&key, &value)?;
        if record.node != node && record.owner_durable {
            // Told by this node before the fence (its notice here is the
            // one): kept; else the node that took it over tells it.
            let untold = record.told_by.as_deref() != Some(node);
            taken.push(TakenOver { id, session: record.owner, untold });
        }
    }
    Ok(taken)
}
