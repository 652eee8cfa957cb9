//! Stopping runs: cancel from any replica (recorded on the run's record, then the owner is told),
//! local stops by cause (cancel, timeout, drain, liveness), and the listener for cancels
//! accepted on other replicas.

use super::quota::Slot;
use super::{lock, Runner};
use crate::store::{CancelRequest, RunRecord, RunStatus, SessionKey, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Why a local run is being stopped (the first cause wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StopCause {
    /// A cancel request or the client went away.
    Cancel,
    /// `--max-run-secs` / `maxDurationSecs`.
    Timeout,
    /// The replica is shutting down and the drain time is over.
    Drain,
    /// This replica could not reach the database for most of its lease: its runs may be
    /// taken over, so they stop before that can happen.
    Liveness,
    /// The replica is draining and another one is live: the run stops at its next commit and
    /// is handed over (it ends `interrupted` here only if that fails).
    Handover,
}

impl StopCause {
    pub(super) fn status(self) -> RunStatus {
        match self {
            StopCause::Cancel => RunStatus::Cancelled,
            StopCause::Timeout => RunStatus::TimedOut,
            StopCause::Drain | StopCause::Liveness | StopCause::Handover => RunStatus::Interrupted,
        }
    }
}

/// A run executing (or being admitted) in this process.
pub(super) struct LocalRun {
    pub(super) cancel: CancellationToken,
    pub(super) cause: Arc<Mutex<Option<StopCause>>>,
    /// Set to stop the run at its next commit (a hand-over).
    pub(super) boundary: Arc<AtomicBool>,
}

/// A run in this process's registry, with its place in its user's quota; dropping it takes the
/// run out of both (whatever way the run's task ends: its [`RunGuard`](super::life::RunGuard)
/// owns it).
pub(super) struct Registration {
    runner: Arc<Runner>,
    run_id: String,
    pub(super) cancel: CancellationToken,
    pub(super) cause: Arc<Mutex<Option<StopCause>>>,
    pub(super) boundary: Arc<AtomicBool>,
    _slot: Option<Slot>,
}

impl Registration {
    pub(super) fn run_id(&self) -> &str {
        &self.run_id
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.runner.local).remove(&self.run_id);
    }
}

impl Runner {
    /// Registers `run_id` as running here (before it is admitted, so reconciliation never
    /// mistakes it for a leak), holding `slot` of its user's quota.
    pub(super) fn register(self: &Arc<Self>, run_id: &str, slot: Option<Slot>) -> Registration {
        let (cancel, cause) = (CancellationToken::new(), Arc::new(Mutex::new(None)));
        let boundary = Arc::new(AtomicBool::new(false));
        self.registered.fetch_add(1, Ordering::AcqRel);
        lock(&self.local).insert(
            run_id.to_string(),
            LocalRun {
                cancel: cancel.clone(),
                cause: cause.clone(),
                boundary: boundary.clone(),
            },
        );
        Registration {
            runner: self.clone(),
            run_id: run_id.to_string(),
            cancel,
            cause,
            boundary,
            _slot: slot,
        }
    }

    /// Cancels a run on whichever replica executes it: the request is recorded on the run's
    /// row (who and why; idempotent), the run is stopped at once if it is local, else its
    /// owner is told through the bus (and sees the flag at its next heartbeat at the latest).
    pub async fn cancel(
        &self,
        user: &str,
        run_id: &str,
        req: &CancelRequest,
    ) -> Result<Option<RunRecord>, StoreError> {
        let record = self.runs.request_cancel(user, run_id, req).await?;
        if record
            .as_ref()
            .is_some_and(|r| r.status == RunStatus::Running)
            && !self.stop_local(run_id, StopCause::Cancel)
        {
            self.bus.broadcast_cancel(run_id);
        }
        Ok(record)
    }

    /// Cancels the session's active run, if it has one.
    pub async fn cancel_session(
        &self,
        key: &SessionKey,
        req: &CancelRequest,
    ) -> Result<Option<RunRecord>, StoreError> {
        match self.runs.active_run(key).await? {
            Some(active) if active.status == RunStatus::Running => {
                self.cancel(&key.user_id, &active.run_id, req).await
            }
            _ => Ok(None),
        }
    }

    /// Stops a local run for `cause`; false if it is not executing here.
    pub(super) fn stop_local(&self, run_id: &str, cause: StopCause) -> bool {
        let local = lock(&self.local);
        let Some(run) = local.get(run_id) else {
            return false;
        };
        lock(&run.cause).get_or_insert(cause);
        run.cancel.cancel();
        true
    }

    /// Hands the local runs over (a drain with another replica live): each stops at its next
    /// commit, so no call in flight is cut; `super::life::end` then releases it.
    pub(super) fn hand_over_all_local(&self) {
        for run in lock(&self.local).values() {
            lock(&run.cause).get_or_insert(StopCause::Handover);
            run.boundary.store(true, Ordering::SeqCst);
        }
    }

    pub(super) fn stop_all_local(&self, cause: StopCause) {
        let ids: Vec<String> = lock(&self.local).keys().cloned().collect();
        for id in ids {
            self.stop_local(&id, cause);
        }
    }

    /// Cancels local runs named by the bus (a cancel accepted on another replica).
    pub(super) fn spawn_cancel_listener(
        self: &Arc<Self>,
        mut cancels: mpsc::UnboundedReceiver<String>,
    ) {
        let runner = Arc::downgrade(self);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let id = tokio::select! {
                    _ = stop.cancelled() => return,
                    id = cancels.recv() => match id { Some(id) => id, None => return },
                };
                let Some(runner) = runner.upgrade() else {
                    return;
                };
                if runner.stop_local(&id, StopCause::Cancel) {
                    tracing::info!(run = %id, "cancelled on another replica's request");
                }
            }
        });
    }
}
