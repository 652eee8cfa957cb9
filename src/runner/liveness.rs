//! Liveness per replica, not per run.
//!
//! One task per process writes the replica's heartbeat every `lease / 3` (one write, whatever
//! the number of open runs; each attempt bounded by that period) and learns from it which of
//! its runs someone asked to cancel (the fallback for a lost notification; not read while it
//! runs nothing). Another task
//! looks for runs nobody runs (their replica's heartbeat is older than its lease, or a
//! draining replica handed them over) every `lease / 3`, at most every two seconds, and
//! resumes or ends each (`super::recovery`); a look that follows one which found nothing takes
//! a turn first (`crate::store::turns`), so one replica of the deployment looks per period,
//! and reads the sessions only when the replicas say runs may have become nobody's since
//! three looks ago (a lease ran out, a replica drains), or every `MAX_QUIET` at least.
//! Every 2/3 of the lease it also reconciles: a run
//! the database says this replica runs, but which has no task here (its outcome was lost, or
//! its task vanished), is finished as `failed` (looked for every `MAX_QUIET` only while the
//! replica has registered no run since a look that found none).
//!
//! If this replica has not written its heartbeat for two thirds of its lease, it stops its own
//! runs (`interrupted`) before other replicas may take their sessions over; their writes are
//! fenced anyway, so a run that lost its session cannot write into it.

use super::bus::BusMsg;
use super::control::StopCause;
use super::{lock, Runner};
use crate::store::{turns, RunStatus, StoreError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Runner {
    /// Starts the heartbeat and, separately, the sweeper/reconciler: a long sweep (many dead
    /// runs to seal, a busy pool) must never delay this replica's own heartbeat.
    pub(super) fn spawn_liveness(self: &Arc<Self>) {
        let lease = self.config.lease;
        let period = lease / 3;
        let runner = Arc::downgrade(self);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut last_ok = Instant::now();
            let mut stopped_runs = false;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                }
                let Some(runner) = runner.upgrade() else {
                    return;
                };
                // With no run here, no run of this replica can have a cancel request: the
                // heartbeat then reads no sessions (on Citus, no statement over every shard).
                let runs = !lock(&runner.local).is_empty();
                let beat =
                    runner
                        .runs
                        .heartbeat(&runner.config.owner, lease, runner.is_draining(), runs);
                match tokio::time::timeout(period, beat).await {
                    Ok(Ok(cancels)) => {
                        last_ok = Instant::now();
                        stopped_runs = false;
                        for id in cancels {
                            runner.stop_local(&id, StopCause::Cancel);
                        }
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "heartbeat failed"),
                    Err(_) => tracing::warn!("heartbeat timed out"),
                }
                // Judged by the time since the last success, whatever the failures looked like.
                if last_ok.elapsed() > lease * 2 / 3 && !stopped_runs {
                    tracing::error!("no heartbeat for most of the lease; stopping this replica's runs before they can be taken over");
                    runner.stop_all_local(StopCause::Liveness);
                    stopped_runs = true;
                }
            }
        });

        let runner = Arc::downgrade(self);
        let stop = self.stop.clone();
        // Runs nobody runs are looked for often enough that one is taken over within about
        // two seconds of its replica's lease running out; the rest of the upkeep every 2/3
        // of the lease.
        let look = (lease / 3).min(std::time::Duration::from_secs(2));
        tokio::spawn(async move {
            // At start, the runs of this replica id's previous life are nobody's.
            let mut mine = true;
            // The last sweep found runs to recover: the next needs no turn (store::turns).
            let mut busy = false;
            let mut upkeep = Instant::now();
            // When this replica last read the sessions for runs nobody runs, and whether that
            // read left one (for later: a run that keeps killing its replicas waits).
            let mut swept = Instant::now();
            let mut left = false;
            // `registered` when a reconciliation last found nothing and no run here.
            let mut clean_at = None;
            loop {
                let Some(runner) = runner.upgrade() else {
                    return;
                };
                // A draining replica takes no turn: it would use up the period of a replica
                // that can take runs over. The turn's holder reads every user's sessions only
                // when runs can have become nobody's since a few looks ago (a lease ran out,
                // a replica drains), when its last read left one for later, or when its own
                // last such read is `MAX_QUIET` old.
                let sweep = mine
                    || busy
                    || !runner.is_draining()
                        && runner
                            .store
                            .take_turn(turns::kind::SWEEP, look)
                            .await
                            .unwrap_or(true)
                        && (left
                            || swept.elapsed() >= turns::MAX_QUIET
                            || runner
                                .runs
                                .runs_may_be_orphaned((look * 3).as_secs_f64())
                                .await
                                .unwrap_or(true));
                if sweep {
                    swept = Instant::now();
                    match runner.sweep(std::mem::take(&mut mine)).await {
                        Ok(swept) => (busy, left) = (swept.found, swept.left),
                        Err(e) => {
                            // Looked at again next time, whatever the replicas say.
                            busy = true;
                            tracing::warn!(error = %e, "sweep failed");
                        }
                    }
                }
                if upkeep.elapsed() >= period * 2 {
                    upkeep = Instant::now();
                    runner.upkeep(period * 2, &mut clean_at).await;
                }
                drop(runner);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(look) => {}
                }
            }
        });
    }

    /// Reconciliation (this replica's own runs), and what the database keeps that expires
    /// (once per `every` in the deployment: a turn, `store::turns`).
    ///
    /// Reconciliation is skipped while no run was registered here since one that found
    /// nothing with no run here (`clean_at`: the count of registrations then, and when), for
    /// up to `MAX_QUIET`: every run the database can record as this replica's was registered
    /// first (`Runner::register`, before admission), so there is little new to find, and an
    /// idle replica reads the sessions twice a minute. What it can still find then: an
    /// outcome the database lost in a crash after the clean look (it is committed
    /// asynchronously).
    async fn upkeep(&self, every: std::time::Duration, clean_at: &mut Option<(u64, Instant)>) {
        let seen = self.registered.load(Ordering::Acquire);
        let clean = clean_at.is_some_and(|(n, at)| n == seen && at.elapsed() < turns::MAX_QUIET);
        if !clean {
            *clean_at = None;
            match self.reconcile().await {
                Ok(())
                    if lock(&self.local).is_empty()
                        && self.registered.load(Ordering::Acquire) == seen =>
                {
                    *clean_at = Some((seen, Instant::now()));
                }
                Ok(()) => {}
                Err(e) => tracing::warn!(error = %e, "reconciliation failed"),
            }
        }
        let turn = self.store.take_turn(turns::kind::HOUSEKEEPING, every).await;
        if !turn.unwrap_or(true) {
            return;
        }
        let ttl = self.config.idempotency_ttl.as_secs_f64();
        if let Err(e) = self.store.expire_keys(ttl).await {
            tracing::warn!(error = %e, "expiring idempotency keys failed");
        }
        if let Err(e) = self.runs.sweep_housekeeping(&self.config.owner).await {
            tracing::warn!(error = %e, "sweep housekeeping failed; the next one tries again");
        }
    }

    /// Runs recorded as this replica's that have no task here.
    async fn reconcile(&self) -> Result<(), StoreError> {
        let owned = self.runs.owned_runs(&self.config.owner).await?;
        let orphans: Vec<String> = {
            let local = lock(&self.local);
            owned
                .into_iter()
                .filter(|id| !local.contains_key(id))
                .collect()
        };
        for id in orphans {
            let Some(run) = self.runs.get_run(&id).await? else {
                continue;
            };
            if run.status != RunStatus::Running {
                continue;
            }
            tracing::error!(run = %run.run_id, "run without a task on its replica; finishing it as failed");
            let error = "the run's outcome was lost (its task ended without recording one, or \
                         the database lost it in a crash); its committed events are complete";
            if self
                .runs
                .finish_run(
                    &run.user_id,
                    &run.run_id,
                    run.resumes,
                    RunStatus::Failed,
                    None,
                    Some(error),
                )
                .await?
            {
                // Its end wrote its deliveries: this replica's sender sends them.
                self.config.run_ended.notify_one();
                self.bus.publish(
                    &run.key(),
                    BusMsg::Done {
                        run_id: run.run_id.as_str().into(),
                        status: RunStatus::Failed,
                        last_seq: None,
                    },
                );
            }
        }
        Ok(())
    }
}
