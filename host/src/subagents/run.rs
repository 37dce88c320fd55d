//! One child run: a real agent of the host driven by a backend.
//!
//! Model: [`SubagentRun`] is a cheap handle (shared state behind an `Arc`).
//! Starting spawns one driver task that runs the backend to a [`RunResult`]
//! and publishes it; the handle exposes readiness ([`SubagentRun::wait_result`]),
//! the result, `cancel`, and disposal.
//!
//! Invariants:
//! - The result is published exactly once (first wins); a backend that
//!   panics publishes `error`. After `cancel` the backend gets a grace period
//!   to stop on its own (an ACP agent answers `cancelled`); past it the
//!   driver drops the backend's future (aborting its in-flight request or
//!   killing its process) and publishes `aborted`.
//! - Disposal runs once, in its own tokio task (so a dropped caller cannot
//!   interrupt it): cancel if still running, await the driver, then
//!   [`Agent::dispose`] on the child — which awaits the child's own tasks —
//!   and only then flips `released`. [`SubagentRun::dispose`] resolves after
//!   that.
//! - [`RunGuard`] is the owning handle a capability hands out: dropping it
//!   starts disposal, so a dropped plugin store never orphans a child.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::types::RunResult;
use taskhost_core::agents::Agent;

/// A handle to one child run. Cloning shares the run.
#[derive(Clone)]
pub struct SubagentRun {
    inner: Arc<RunInner>,
}

struct RunInner {
    child: Agent,
    backend: String,
    result: watch::Sender<Option<RunResult>>,
    cancel: CancellationToken,
    cancel_reason: Mutex<Option<String>>,
    driver: Mutex<Option<tokio::task::JoinHandle<()>>>,
    disposing: AtomicBool,
    released: watch::Sender<bool>,
    span: tracing::Span,
}

impl std::fmt::Debug for SubagentRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentRun")
            .field("child", &self.inner.child)
            .field("backend", &self.inner.backend)
            .field("result", &*self.inner.result.borrow())
            .finish()
    }
}

impl SubagentRun {
    /// Spawns the driver of `work`, the backend's future for this run.
    pub(crate) fn spawn<F>(
        child: Agent,
        backend: String,
        cancel: CancellationToken,
        cancel_grace: Duration,
        span: tracing::Span,
        work: F,
    ) -> Self
    where
        F: std::future::Future<Output = RunResult> + Send + 'static,
    {
        let run = Self {
            inner: Arc::new(RunInner {
                child,
                backend,
                result: watch::channel(None).0,
                cancel,
                cancel_reason: Mutex::new(None),
                driver: Mutex::new(None),
                disposing: AtomicBool::new(false),
                released: watch::channel(false).0,
                span: span.clone(),
            }),
        };
        let inner = run.inner.clone();
        let driver = async move {
            let work = std::panic::AssertUnwindSafe(work).catch_unwind();
            let grace_expired = async {
                inner.cancel.cancelled().await;
                tokio::time::sleep(cancel_grace).await;
            };
            let result = tokio::select! {
                result = work => result.unwrap_or_else(|panic| {
                    let message = panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| panic.downcast_ref::<&str>().copied())
                        .unwrap_or("(no message)");
                    RunResult::error(format!("the subagent backend panicked: {message}"))
                }),
                () = grace_expired => {
                    tracing::info!("the backend did not stop within the cancel grace period; dropped it");
                    RunResult::aborted(inner.reason())
                }
            };
            let result = match result {
                RunResult { stop_reason: super::StopReason::Aborted, detail: None, text } => {
                    RunResult { detail: inner.reason(), stop_reason: super::StopReason::Aborted, text }
                }
                result => result,
            };
            tracing::info!(stop_reason = %result.stop_reason, detail = ?result.detail, "subagent run finished");
            inner.publish(result);
        };
        *run.inner.driver.lock().unwrap_or_else(|e| e.into_inner()) = Some(tokio::spawn(driver.instrument(span)));
        run
    }

    /// The child agent (its own id and session).
    pub fn child(&self) -> &Agent {
        &self.inner.child
    }

    /// The backend (profile) name this run uses.
    pub fn backend(&self) -> &str {
        &self.inner.backend
    }

    /// The result, once it is in.
    pub fn result(&self) -> Option<RunResult> {
        self.inner.result.borrow().clone()
    }

    /// Resolves with the result once it is in.
    pub async fn wait_result(&self) -> RunResult {
        let mut rx = self.inner.result.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(result) => result.clone().expect("waited for some"),
            // The sender lives in `inner`, which `self` keeps alive.
            Err(_) => RunResult::error("the subagent run ended without a result"),
        }
    }

    /// Requests the run to stop. Idempotent; the first reason is kept. The
    /// result becomes `aborted` (unless it was already in).
    pub fn cancel(&self, reason: Option<String>) {
        if self.result().is_some() {
            return;
        }
        {
            let mut kept = self.inner.cancel_reason.lock().unwrap_or_else(|e| e.into_inner());
            if kept.is_none() {
                *kept = Some(reason.unwrap_or_else(|| "cancelled".into()));
            }
        }
        tracing::info!(parent: &self.inner.span, reason = ?self.inner.reason(), "subagent run cancelled");
        self.inner.cancel.cancel();
    }

    /// True once `cancel` was called.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// Starts disposal (once) without waiting for it.
    pub fn start_dispose(&self) {
        if self.inner.disposing.swap(true, Ordering::AcqRel) {
            return;
        }
        let run = self.clone();
        let dispose = async move {
            if run.result().is_none() {
                run.cancel(Some("disposed".into()));
            }
            let driver = run.inner.driver.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(driver) = driver
                && let Err(error) = driver.await
            {
                run.inner.publish(RunResult::error(format!("the subagent driver failed: {error}")));
            }
            run.inner.child.dispose().await;
            tracing::debug!("subagent run released: child agent and session disposed");
            run.inner.released.send_replace(true);
        };
        let span = self.inner.span.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(dispose.instrument(span));
            }
            Err(_) => tracing::error!(
                parent: &span,
                "a subagent run was dropped outside a tokio runtime; its child could not be disposed"
            ),
        }
    }

    /// True once disposal started.
    pub fn is_disposing(&self) -> bool {
        self.inner.disposing.load(Ordering::Acquire)
    }

    /// True once the child agent and its session are released.
    pub fn is_released(&self) -> bool {
        *self.inner.released.borrow()
    }

    /// Resolves once the child is released (without starting disposal).
    pub async fn released(&self) {
        let mut rx = self.inner.released.subscribe();
        let _ = rx.wait_for(|released| *released).await;
    }

    /// Disposes the run: cancels it if it is still running, awaits its end,
    /// disposes the child agent (awaiting the child's own tasks). Resolves
    /// only when all of that is done. Idempotent.
    pub async fn dispose(&self) {
        self.start_dispose();
        self.released().await;
    }
}

impl RunInner {
    fn reason(&self) -> Option<String> {
        self.cancel_reason.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn publish(&self, result: RunResult) {
        self.result.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some(result);
            true
        });
    }
}

/// The owning handle of a run: dropping it starts disposal.
#[derive(Debug)]
pub struct RunGuard(pub SubagentRun);

impl Drop for RunGuard {
    fn drop(&mut self) {
        self.0.start_dispose();
    }
}

impl std::ops::Deref for RunGuard {
    type Target = SubagentRun;
    fn deref(&self) -> &SubagentRun {
        &self.0
    }
}
