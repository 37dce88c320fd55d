//! The dashboard's live updates: `GET /dashboard/api/events`, a stream of
//! server-sent events fed by the registry's and the reloader's broadcasts.
//!
//! Invariants: a stream holds one slot of every token's and one of its own
//! token's until it ends; it starts with a `snapshot` (subscribed first, so
//! nothing falls between), resyncs with a new one after a lag (and, on a
//! cluster, every [`CLUSTER_RESYNC`], for the other nodes' tasks), and ends
//! when the server shuts down or a broadcast closes.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::{Dashboard, MAX_EVENT_STREAMS, PING, Viewer, error, task_json};

/// On a cluster, how often a stream sends a new snapshot of every node's
/// tasks: the one bounded poll of the dashboard (other nodes' starts, ends
/// and output raise no event on this node).
pub const CLUSTER_RESYNC: std::time::Duration = std::time::Duration::from_secs(2);
use taskhost_core::tasks::TaskEvent;

/// One server-sent event.
fn sse(event: &str, data: &Value) -> Event {
    sse_text(event, &data.to_string())
}

/// One server-sent event whose data is one line of JSON.
fn sse_text(event: &str, json: &str) -> Event {
    Event::default().event(event).data(json)
}

/// `GET /dashboard/api/events`: a `snapshot` and `plugins` first, then
/// `task` (started or settled), `output` (new output may be readable),
/// `released`, `plugins`, and a new `snapshot` after a lag.
pub(super) async fn events(State(dashboard): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    let viewer = match dashboard.viewer(&headers) {
        Ok(viewer) => viewer,
        Err(refusal) => return *refusal,
    };
    let Ok(own) = viewer.streams.clone().try_acquire_owned() else {
        tracing::warn!(viewer = %viewer.name, limit = viewer.max_streams, "dashboard: event stream bound of a token hit");
        let mut refusal = error(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "too many dashboard event streams for token {:?}: at most {} at once \
                 ([serve.http] max_event_streams_per_token); close another tab",
                viewer.name, viewer.max_streams
            ),
        );
        refusal.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return refusal;
    };
    let Ok(permit) = dashboard.streams.clone().try_acquire_owned() else {
        tracing::warn!(limit = MAX_EVENT_STREAMS, "dashboard: event stream bound hit");
        let mut refusal = error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("too many dashboard event streams: at most {MAX_EVENT_STREAMS} at once; close another tab"),
        );
        refusal.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return refusal;
    };
    // Subscribed before the snapshot is taken, so nothing falls between.
    let tasks = dashboard.server.host().registry().subscribe();
    let snapshot = dashboard.tasks_everywhere(&viewer).await;
    let pump = EventPump {
        tasks,
        reloads: dashboard.reloads.subscribe(),
        queue: vec![sse_text("snapshot", &snapshot), sse("plugins", &dashboard.plugins_json())],
        resync: dashboard.server.membership().map(|_| {
            let mut every = tokio::time::interval_at(tokio::time::Instant::now() + CLUSTER_RESYNC, CLUSTER_RESYNC);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every
        }),
        stop: dashboard.shutdown.clone(),
        dashboard,
        viewer,
        _permit: (permit, own),
    };
    tracing::debug!(viewer = %pump.viewer.name, "dashboard: event stream opened");
    let stream = futures::stream::unfold(pump, |mut pump| async move {
        let next = pump.next().await?;
        Some((Ok::<_, Infallible>(next), pump))
    });
    // axum frames the events and sets `text/event-stream`; the keep-alive
    // comment is sent only after PING without an event.
    (
        [(header::CACHE_CONTROL, "no-store"), (header::HeaderName::from_static("x-accel-buffering"), "no")],
        Sse::new(stream).keep_alive(KeepAlive::new().interval(PING).text("ping")),
    )
        .into_response()
}

/// One event stream's state; dropped (releasing its slot) when the client
/// goes away or the server stops.
struct EventPump {
    tasks: broadcast::Receiver<TaskEvent>,
    reloads: broadcast::Receiver<()>,
    queue: Vec<Event>,
    /// On a cluster: when the next snapshot of every node's tasks is due
    /// (other nodes' changes send no event here).
    resync: Option<tokio::time::Interval>,
    stop: CancellationToken,
    dashboard: Arc<Dashboard>,
    viewer: Viewer,
    /// The stream's slots: one of every token's, one of its own token's.
    _permit: (tokio::sync::OwnedSemaphorePermit, tokio::sync::OwnedSemaphorePermit),
}

impl EventPump {
    /// The next chunk to send; `None` ends the stream.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if !self.queue.is_empty() {
                return Some(self.queue.remove(0));
            }
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return None,
                event = self.tasks.recv() => match event {
                    Ok(event) => self.on_task_event(event),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "dashboard: event stream lagged; resyncing");
                        self.queue.push(sse_text("snapshot", &self.dashboard.tasks_everywhere(&self.viewer).await));
                        self.queue.push(sse("plugins", &self.dashboard.plugins_json()));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                _ = async { self.resync.as_mut().expect("resyncing").tick().await }, if self.resync.is_some() => {
                    self.queue.push(sse_text("snapshot", &self.dashboard.tasks_everywhere(&self.viewer).await));
                }
                reload = self.reloads.recv() => match reload {
                    Ok(()) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        self.queue.push(sse("plugins", &self.dashboard.plugins_json()));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
            }
        }
    }

    fn on_task_event(&mut self, event: TaskEvent) {
        match event {
            TaskEvent::Started { task } | TaskEvent::Settled { task } => {
                if self.viewer.sees(task.owner_session.as_ref()) {
                    self.queue.push(sse("task", &task_json(&task)));
                    if task.producer_info.is_some() {
                        // Live tasks per plugin version changed.
                        self.queue.push(sse("plugins", &self.dashboard.plugins_json()));
                    }
                }
            }
            TaskEvent::Output { id, owner_session } => {
                if self.viewer.sees(owner_session.as_ref()) {
                    self.queue.push(sse("output", &json!({"id": id})));
                }
            }
            TaskEvent::Released { id, owner_session } => {
                if self.viewer.sees(owner_session.as_ref()) {
                    self.queue.push(sse("released", &json!({"id": id})));
                }
            }
        }
    }
}
