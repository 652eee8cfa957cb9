//! Taking a session for a write that is not a turn (a rewind, a compaction): admitted like a
//! run (a busy session is refused or waited for), held under a [`RunGuard`], and published
//! like a run's event once committed. A run that arrives meanwhile waits for the hold to end (up to the
//! enqueue timeout) rather than being refused.

use super::super::admission::{claim_telling, Claim};
use super::super::bus::BusMsg;
use super::super::life::RunGuard;
use super::super::{OnBusy, RunError, Runner};
use crate::event::new_invocation_id;
use crate::store::{CancelRequest, NewRun, RunStatus, SessionKey, StoredEvent};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Fallback re-check while waiting for a busy session.
const WAIT_POLL: Duration = Duration::from_secs(1);

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
    /// Charged to an API key (what it spends is the key's too).
    pub keyed: bool,
}

impl Runner {
    /// Takes `key` for a write that is not a turn; `Busy` if a run holds it. The claim runs on
    /// the runner's tracker: a caller that goes away mid-way cannot abandon a claim the
    /// database already holds (the unclaimed [`Held`] is dropped, and its guard frees it).
    /// What it spends (a summary's model call) is charged to `api_key`'s key, if given.
    pub(super) async fn hold(
        self: &Arc<Self>,
        key: &SessionKey,
        api_key: Option<String>,
    ) -> Result<Held, RunError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let runner = self.clone();
        let key = key.clone();
        self.tracker.spawn(async move {
            let _ = tx.send(runner.hold_now(&key, api_key).await);
        });
        rx.await
            .map_err(|_| RunError::Internal("the hold's task ended before it answered".into()))?
    }

    /// [`Runner::hold`] by a request's `onBusy` when a run holds the session: refused at once
    /// (`reject`), or waited for up to the enqueue timeout (`enqueue`; `interrupt` cancels
    /// that run first). Another hold is always waited for. It takes no place in the run queue:
    /// runs queued before it is free go first. Waiting listens for the end of the holder on
    /// the bus, with a slow poll as a fallback.
    pub(super) async fn hold_when_free(
        self: &Arc<Self>,
        key: &SessionKey,
        on_busy: OnBusy,
    ) -> Result<Held, RunError> {
        let deadline = tokio::time::Instant::now() + self.config.enqueue_timeout;
        let mut sub = None;
        let mut interrupted = false;
        loop {
            let holder = match self.hold(key, None).await {
                Err(RunError::Busy(holder)) => holder,
                other => return other,
            };
            // Another hold (a summary, a rewind) is waited for, never refused or cancelled,
            // as runs treat it.
            let holder_is_hold = match holder.as_str() {
                "queued" => false,
                id => self
                    .runs
                    .get_user_run(&key.user_id, id)
                    .await?
                    .is_some_and(|r| r.invocation_id.starts_with(HOLD_PREFIX)),
            };
            match on_busy {
                _ if holder_is_hold => {}
                OnBusy::Reject => return Err(RunError::Busy(holder)),
                OnBusy::Interrupt if !interrupted && holder != "queued" => {
                    interrupted = true;
                    let why = CancelRequest {
                        by: Some("a rewind".into()),
                        reason: Some("interrupted by a rewind (onBusy: interrupt)".into()),
                    };
                    self.cancel(&key.user_id, &holder, &why).await?;
                }
                _ => {}
            }
            // Listen first, then claim again: an end in between is not missed.
            if sub.is_none() {
                sub = Some(self.bus.subscribe(key));
                continue;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RunError::QueueTimeout(holder));
            }
            let Some(sub) = sub.as_mut() else { continue };
            let wake = (tokio::time::Instant::now() + WAIT_POLL).min(deadline);
            loop {
                tokio::select! {
                    msg = sub.rx.recv() => match msg {
                        Ok(BusMsg::Done { .. } | BusMsg::Resync) | Err(_) => break,
                        Ok(_) => continue,
                    },
                    _ = tokio::time::sleep_until(wake) => break,
                    _ = self.draining.cancelled() => return Err(RunError::ShuttingDown),
                }
            }
        }
    }

    async fn hold_now(
        self: &Arc<Self>,
        key: &SessionKey,
        api_key: Option<String>,
    ) -> Result<Held, RunError> {
        let run_id = format!("run-{}", uuid::Uuid::new_v4());
        let keyed = api_key.is_some();
        let new_run = NewRun {
            run_id: run_id.clone(),
            key: key.clone(),
            invocation_id: format!("{HOLD_PREFIX}{}", new_invocation_id()),
            owner: self.config.owner.clone(),
            user_event: false,
            queue_ttl: self.config.enqueue_timeout + Duration::from_secs(30),
            opening: None,
            webhooks: None,
            durable: None,
            api_key,
        };
        // Registered before admission, so reconciliation never mistakes it for a leak.
        let local = self.register(&run_id, None);
        let cancel = local.cancel.clone();
        match claim_telling(self.runs.as_ref(), &new_run, None, &self.config.run_ended).await {
            Ok(Claim::Acquired { unsealed, .. }) => Ok(Held {
                guard: RunGuard::new(self.clone(), key.clone(), false, local),
                run_id,
                unsealed,
                cancel,
                keyed,
            }),
            other => {
                drop(local);
                Err(match other {
                    Ok(Claim::Busy(active)) => {
                        RunError::Busy(active.map(|r| r.run_id).unwrap_or_else(|| "queued".into()))
                    }
                    // A dead replica's run holds it: resumed (or ended) now; the hold waits
                    // for it as for any run.
                    Ok(Claim::Orphaned(orphan)) => {
                        let id = orphan.run_id.clone();
                        self.recover_holder(*orphan).await;
                        RunError::Busy(id)
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
        // A hold that ends `completed` refused for a cancel of the session's run is cancelled.
        if let Err(guard) = held.guard.finish(status, None, error).await {
            let _ = guard.finish(RunStatus::Cancelled, None, error).await;
        }
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
