//! Admission: taking a session for a run, by its `onBusy` policy.
//!
//! The claim itself is one statement (see [`crate::store::RunStore::insert_run`]); [`claim`]
//! retries it over a holder whose replica stopped heartbeating (a takeover). A busy
//! session is waited for by listening on the bus for the end of its run (from any replica),
//! with a slow poll as the fallback for a lost notification. `enqueue` (and `interrupt`) take
//! a ticket in the database queue, so waiters on every replica are admitted in arrival order.

use super::bus::BusMsg;
use super::{OnBusy, RunError, RunHandle, RunRequest, Runner};
use crate::store::runs::Opened;
use crate::store::{CancelRequest, Insert, NewRun, RunRecord, Store, StoreError, StoreResult};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Fallback re-check while waiting for a busy session (a missed notification costs this much).
const BUSY_POLL: Duration = Duration::from_secs(1);

/// The result of trying to admit a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The run owns the session; its events come after `base_seq`. `unsealed`: a dead run of
    /// the session still needs its transcript sealed (the new run does it first).
    Acquired {
        base_seq: i64,
        unsealed: bool,
        /// The user event, if admission committed it (see [`NewRun::opening`]).
        opened: Option<Box<Opened>>,
    },
    /// Another live run holds the session (`None`: earlier queued requests come first).
    Busy(Option<Box<RunRecord>>),
    /// The session does not exist (nothing was written).
    NoSession,
}

/// Admits `run`: takes the session unless a live run holds it. A holder whose replica
/// stopped heartbeating is marked `abandoned` and the claim is retried. One round trip when
/// the session is free.
pub async fn claim(store: &dyn Store, run: &NewRun, ticket: Option<i64>) -> StoreResult<Claim> {
    for _ in 0..5 {
        match store.insert_run(run, ticket).await? {
            Insert::Inserted {
                base_seq,
                unsealed,
                opened,
            } => {
                return Ok(Claim::Acquired {
                    base_seq,
                    unsealed,
                    opened,
                })
            }
            Insert::NoSession => return Ok(Claim::NoSession),
            Insert::Occupied => {}
        }
        let Some(active) = store.active_run(&run.key).await? else {
            return Ok(Claim::Busy(None)); // queued requests come first, or it just ended
        };
        if !store.expire_run(&active).await? {
            return Ok(Claim::Busy(Some(Box::new(active))));
        }
        tracing::warn!(run = %active.run_id, owner = %active.owner, "took over a session whose replica stopped heartbeating");
    }
    Err(StoreError::Conflict)
}

/// A place in a session's queue; leaving it (timed out, the client gone) is the drop. An
/// admitted waiter leaves at once ([`Ticket::leave`]): a request right behind it must not
/// find the ticket still ahead of it.
struct Ticket {
    id: i64,
    user: String,
    store: Arc<dyn Store>,
    left: bool,
}

impl Ticket {
    async fn leave(mut self) {
        self.left = true;
        if let Err(e) = self.store.dequeue(&self.user, self.id).await {
            tracing::warn!(ticket = self.id, error = %e, "could not leave the run queue; the ticket expires with this replica's heartbeat or its time to live");
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        let store = self.store.clone();
        let id = self.id;
        let user = std::mem::take(&mut self.user);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = store.dequeue(&user, id).await {
                    tracing::warn!(ticket = id, error = %e, "could not leave the run queue; the ticket expires with this replica's heartbeat or its time to live");
                }
            });
        }
    }
}

impl Runner {
    /// Claims the session for `run` according to the request's `on_busy` (creating the
    /// session first if it is missing and the request asks for that). Returns whether a dead
    /// run's transcript awaits sealing, and the user event if admission committed it.
    pub(super) async fn admit(
        &self,
        run: &mut NewRun,
        req: &RunRequest,
        caller: &mut tokio::sync::oneshot::Sender<Result<RunHandle, RunError>>,
    ) -> Result<(bool, Option<Box<Opened>>), RunError> {
        let deadline = Instant::now() + self.config.enqueue_timeout;
        let mut interrupted = false;
        let mut created = false;
        let mut ticket: Option<Ticket> = None;
        let mut held = false;
        let mut reclaimed = false;
        let mut sub = None;
        loop {
            let started = Instant::now();
            // The user event is stamped when it is committed, not when the request arrived
            // (it may have waited for the session).
            if let Some(event) = run.opening.as_mut() {
                event.timestamp = crate::event::now_ts();
            }
            // This claim is also the user event's commit: its span carries the event's seq then.
            let span = tracing::info_span!("admit", seq = tracing::field::Empty);
            let claim = claim(self.store.as_ref(), run, ticket.as_ref().map(|t| t.id))
                .instrument(span.clone())
                .await?;
            let active = match claim {
                Claim::Acquired {
                    unsealed, opened, ..
                } => {
                    if let Some(opened) = &opened {
                        span.record("seq", opened.stored.seq);
                        metrics::histogram!("agentd_commit_duration_seconds")
                            .record(started.elapsed().as_secs_f64());
                    }
                    if let Some(t) = ticket.take() {
                        t.leave().await;
                    }
                    return Ok((unsealed, opened));
                }
                Claim::NoSession if req.create_session && !created => {
                    self.create_session(&run.key).await?;
                    created = true;
                    continue;
                }
                Claim::NoSession => {
                    return Err(RunError::SessionNotFound(run.key.session_id.clone()))
                }
                Claim::Busy(active) => active,
            };
            let holder = active.as_ref().map_or_else(
                || "(earlier queued requests)".to_string(),
                |a| a.run_id.clone(),
            );
            // A session held for a brief write that is not a turn (a rewind, a summary) is
            // waited for whatever `onBusy` says: the client did nothing to cause it.
            // (A hold seen before stays the reason to wait while nobody holds the session: the
            // claim after it may find it just ended. A real run holding it is one again.)
            let now_held = active
                .as_ref()
                .is_some_and(|a| a.invocation_id.starts_with(super::hold::HOLD_PREFIX));
            held = now_held || (held && active.is_none());
            // No holder: it ended between the two reads (claim again at once), or requests
            // queued before this one come first.
            if active.is_none() && !reclaimed {
                reclaimed = true;
                continue;
            }
            match req.on_busy {
                OnBusy::Reject if !held => return Err(RunError::Busy(holder)),
                OnBusy::Interrupt if held => {}
                OnBusy::Interrupt if !interrupted => {
                    if let Some(active) = &active {
                        let why = CancelRequest {
                            by: Some(format!("run {}", run.run_id)),
                            reason: Some("interrupted by a new message (onBusy: interrupt)".into()),
                        };
                        self.cancel(&active.user_id, &active.run_id, &why).await?;
                    }
                    interrupted = true;
                }
                _ => {}
            }
            // Listen first, then claim again: an end that happens in between is not missed.
            if sub.is_none() {
                sub = Some(self.bus.subscribe(&run.key));
                continue;
            }
            if ticket.is_none() {
                let id = self.store.enqueue(&run.key, &self.config.owner).await?;
                ticket = Some(Ticket {
                    id,
                    user: run.key.user_id.clone(),
                    store: self.store.clone(),
                    left: false,
                });
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RunError::QueueTimeout(holder));
            }
            let Some(sub) = sub.as_mut() else { continue };
            // Wait for an end on the session (or a possible loss of one), the fallback poll or
            // the deadline; give up if the caller left or the replica is draining. The running
            // run's other messages (its partial events) are no reason to claim again.
            let wake = tokio::time::Instant::now() + BUSY_POLL.min(deadline - now);
            loop {
                tokio::select! {
                    msg = sub.rx.recv() => match msg {
                        Ok(BusMsg::Done { .. } | BusMsg::Resync) | Err(_) => break,
                        Ok(_) => continue,
                    },
                    _ = tokio::time::sleep_until(wake) => break,
                    _ = caller.closed() => {
                        return Err(RunError::Internal("the client left while waiting".into()))
                    }
                    _ = self.draining.cancelled() => return Err(RunError::ShuttingDown),
                }
            }
        }
    }
}
