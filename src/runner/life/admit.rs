//! The second stage: the session taken for the run in the database, by the request's
//! `onBusy`. A busy session is refused, waited for or interrupted; waiting listens on the bus
//! for the end of the session's run (from any replica), with a slow poll as the fallback for a
//! lost notification, and `enqueue` (and `interrupt`) take a place in the database queue, so
//! waiters on every replica go in arrival order. From here on a [`RunGuard`] frees the session
//! however the run's task ends.

use super::super::admission::{claim_telling, Claim, Ticket};
use super::super::bus::BusMsg;
use super::super::control::StopCause;
use super::super::{OnBusy, RunError, RunRequest, Runner};
use super::prepare::Prepared;
use super::{Caller, RunGuard};
use crate::event::Event;
use crate::invocation::AgentTree;
use crate::store::runs::Opened;
use crate::store::{ArtifactWrite, CancelRequest, NewRun, SessionKey, StoreError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Fallback re-check while waiting for a busy session (a missed notification costs this much).
const BUSY_POLL: Duration = Duration::from_secs(1);

/// A run that owns its session. Its guard records an outcome and frees the session whatever
/// happens next.
pub(in crate::runner) struct Admitted {
    pub(super) runner: Arc<Runner>,
    pub(super) req: RunRequest,
    pub(super) tree: Arc<AgentTree>,
    pub(super) run_id: String,
    pub(super) invocation_id: String,
    pub(super) guard: RunGuard,
    /// A dead run of the session awaits sealing: this run seals it first.
    pub(super) unsealed: bool,
    /// The user event, when the admission statement committed it.
    pub(super) opened: Option<Box<Opened>>,
    /// The user event as built from the request.
    pub(super) user: Option<(Event, Vec<ArtifactWrite>)>,
    pub(super) cancel: CancellationToken,
    /// Why the run is being stopped, if it is (the first cause wins).
    pub(super) cause: Arc<Mutex<Option<StopCause>>>,
    /// Set to stop the run after its next commit (a hand-over).
    pub(super) boundary: Arc<std::sync::atomic::AtomicBool>,
    /// A run taken over from a replica that stopped (`super::resume`).
    pub(super) resumed: Option<Resumed>,
    /// The budgets the run is held to (see [`crate::transcript::Meter`]).
    pub(super) budget: Vec<crate::usage::Limit>,
}

/// What a taken-over run starts from.
pub(in crate::runner) struct Resumed {
    /// The session's last seq at the takeover: where its new commits follow on.
    pub(super) session_seq: i64,
    /// The run's user message, committed by its first owner.
    pub(super) user_content: Option<crate::event::Content>,
    /// What the run had spent up to its last commit.
    pub(super) usage: Option<crate::usage::RunUsage>,
}

impl Prepared {
    /// Claims the session (creating it first when it is missing and the request asks for
    /// that), by the request's `onBusy`. Gives up when `caller` leaves while it waits.
    pub(super) async fn admit(self, caller: &mut Caller) -> Result<Admitted, RunError> {
        let Prepared {
            runner,
            req,
            tree,
            mut new_run,
            user,
            local,
            budget,
        } = self;
        let (unsealed, opened) = claim_by_policy(&runner, &mut new_run, &req, caller).await?;
        metrics::counter!("agentd_runs_started_total", "app" => req.key.app_name.clone())
            .increment(1);
        let (cancel, cause) = (local.cancel.clone(), local.cause.clone());
        let boundary = local.boundary.clone();
        // Only a run with webhook targets wakes the sender when it ends (see `RunGuard`).
        let webhooks = new_run.webhooks.is_some();
        let guard = RunGuard::new(runner.clone(), req.key.clone(), webhooks, local);
        Ok(Admitted {
            runner,
            req,
            tree,
            run_id: new_run.run_id,
            invocation_id: new_run.invocation_id,
            guard,
            unsealed,
            opened,
            user,
            cancel,
            cause,
            boundary,
            resumed: None,
            budget,
        })
    }
}

/// The claim loop: returns whether a dead run's transcript awaits sealing, and the user event
/// if admission committed it.
async fn claim_by_policy(
    runner: &Arc<Runner>,
    run: &mut NewRun,
    req: &RunRequest,
    caller: &mut Caller,
) -> Result<(bool, Option<Box<Opened>>), RunError> {
    let deadline = Instant::now() + runner.config.enqueue_timeout;
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
        let claim = claim_telling(
            runner.runs.as_ref(),
            run,
            ticket.as_ref().map(|t| t.id),
            &runner.config.run_ended,
        )
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
                create_session(runner, &run.key).await?;
                created = true;
                continue;
            }
            Claim::NoSession => return Err(RunError::SessionNotFound(run.key.session_id.clone())),
            // A dead replica's durable run holds it: resumed (or ended) now, and then it is
            // an ordinary holder, to which `onBusy` applies.
            Claim::Orphaned(orphan) => {
                runner.recover_holder(*orphan).await;
                continue;
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
            .is_some_and(|a| a.invocation_id.starts_with(super::super::HOLD_PREFIX));
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
                    runner.cancel(&active.user_id, &active.run_id, &why).await?;
                }
                interrupted = true;
            }
            _ => {}
        }
        // Listen first, then claim again: an end that happens in between is not missed.
        if sub.is_none() {
            sub = Some(runner.bus.subscribe(&run.key));
            continue;
        }
        if ticket.is_none() {
            ticket = Some(Ticket::take(&runner.runs, &run.key, &runner.config.owner).await?);
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
                _ = runner.draining.cancelled() => return Err(RunError::ShuttingDown),
            }
        }
    }
}

/// `createSession`: the session, made if it is missing (one made meanwhile is as good).
async fn create_session(runner: &Runner, key: &SessionKey) -> Result<(), RunError> {
    let created = runner
        .sessions
        .create_session(crate::store::NewSession {
            app_name: key.app_name.clone(),
            user_id: key.user_id.clone(),
            session_id: Some(key.session_id.clone()),
            ..Default::default()
        })
        .await;
    match created {
        Ok(_) | Err(StoreError::SessionExists(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
