//! Taking a session for a write that is not a turn (a rewind, a compaction): admitted like a
//! run (a busy session is refused), held under a [`RunGuard`], and published like a run's
//! event once committed. A run that arrives meanwhile waits for the hold to end (up to the
//! enqueue timeout) rather than being refused.

use super::bus::BusMsg;
use super::control::LocalRun;
use super::guard::RunGuard;
use super::{lock, Claim, RunError, Runner};
use crate::event::new_invocation_id;
use crate::store::{NewRun, RunStatus, SessionKey, StoredEvent};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The invocation id prefix of a held session's run: a run arriving meanwhile waits for it
/// instead of being refused (see `admission`).
pub const HOLD_PREFIX: &str = "hold-";

/// A session held for one write; the guard frees it however the write ends.
pub(super) struct Held {
    pub run_id: String,
    pub guard: RunGuard,
    /// A dead run of the session awaits sealing (seal it before writing).
    pub unsealed: bool,
    /// Cancelled by a cancel of the session's run (a stop button) or a replica stop.
    pub cancel: CancellationToken,
}

impl Runner {
    /// Takes `key` for a write that is not a turn; `Busy` if a run holds it. The claim runs on
    /// the runner's tracker: a caller that goes away mid-way cannot abandon a claim the
    /// database already holds (the unclaimed [`Held`] is dropped, and its guard frees it).
    pub(super) async fn hold(self: &Arc<Self>, key: &SessionKey) -> Result<Held, RunError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let runner = self.clone();
        let key = key.clone();
        self.tracker.spawn(async move {
            let _ = tx.send(runner.hold_now(&key).await);
        });
        rx.await
            .map_err(|_| RunError::Internal("the hold's task ended before it answered".into()))?
    }

    async fn hold_now(self: &Arc<Self>, key: &SessionKey) -> Result<Held, RunError> {
        let run_id = format!("run-{}", uuid::Uuid::new_v4());
        let new_run = NewRun {
            run_id: run_id.clone(),
            key: key.clone(),
            invocation_id: format!("{HOLD_PREFIX}{}", new_invocation_id()),
            owner: self.config.owner.clone(),
            user_event: false,
            queue_ttl: self.config.enqueue_timeout + Duration::from_secs(30),
            opening: None,
            webhooks: None,
        };
        let cancel = CancellationToken::new();
        // Registered before admission, so reconciliation never mistakes it for a leak.
        lock(&self.local).insert(
            run_id.clone(),
            LocalRun {
                cancel: cancel.clone(),
                cause: Arc::new(Mutex::new(None)),
            },
        );
        match super::claim(self.store.as_ref(), &new_run, None).await {
            Ok(Claim::Acquired { unsealed, .. }) => Ok(Held {
                guard: RunGuard::new(self.clone(), run_id.clone(), key.clone()),
                run_id,
                unsealed,
                cancel,
            }),
            other => {
                lock(&self.local).remove(&run_id);
                Err(match other {
                    Ok(Claim::Busy(active)) => {
                        RunError::Busy(active.map(|r| r.run_id).unwrap_or_else(|| "queued".into()))
                    }
                    Ok(_) => RunError::SessionNotFound(key.session_id.clone()),
                    Err(e) => e.into(),
                })
            }
        }
    }

    /// Ends a hold that committed nothing, and tells waiters at once.
    pub(super) async fn release_held(
        &self,
        key: &SessionKey,
        held: Held,
        status: RunStatus,
        error: Option<&str>,
    ) {
        let run_id = held.run_id.clone();
        held.guard.finish(status, None, error).await;
        self.bus.publish(
            key,
            BusMsg::Done {
                run_id: run_id.as_str().into(),
                status,
                last_seq: None,
            },
        );
    }

    /// Tells the session's followers about an event a held write committed, and its end.
    pub(super) fn publish_held(&self, key: &SessionKey, run_id: &str, stored: &StoredEvent) {
        self.bus.publish(
            key,
            BusMsg::Committed {
                run_id: Some(run_id.into()),
                seq: stored.seq,
                event: Some(Arc::new(stored.event.clone())),
                in_run_stream: true,
            },
        );
        self.bus.publish(
            key,
            BusMsg::Done {
                run_id: run_id.into(),
                status: RunStatus::Completed,
                last_seq: Some(stored.seq),
            },
        );
    }
}
