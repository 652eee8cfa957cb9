//! Durable runs: what becomes of a run nobody runs (docs/replicas.md, "Durable runs").
//!
//! A run whose replica died, or that a draining replica handed over, is found by any live
//! replica's sweep (or by an admission that finds it holding its session) and is either
//! **resumed** here (the same run and invocation, one epoch more: `life::resume`) or **ended**
//! (sealed, as before durable runs): when its app says `resume: never`, when a cancel of it
//! came first, when its time is up, or when its replicas died under it `--max-resumes` times
//! (a poison run must not take down every replica in turn). One statement decides each: of
//! several replicas that find the same run, one takes it.

use super::bus::BusMsg;
use super::life::seal::MAX_RESUMES_EXCEEDED;
use super::life::{resume, seal};
use super::{lock, Runner};
use crate::apps::settings::Resume;
use crate::store::{Fence, Orphan, ResumeReason, RunRecord, RunStatus, StoreError};
use std::sync::Arc;

/// Runs one sweep takes on at most (the rest are for the next sweep, or another replica).
const PER_SWEEP: usize = 64;

/// What to do with a run nobody runs.
enum Fate {
    Resume,
    End {
        status: RunStatus,
        error: String,
        code: &'static str,
        reason: String,
    },
    /// Not now: a draining replica takes nothing over, and a run that keeps killing its
    /// replicas is taken again only after a while.
    Later,
}

/// What a sweep came to.
pub(super) struct Swept {
    /// It resumed or ended a run.
    pub found: bool,
    /// A run nobody runs is left (for later, or taken by another replica meanwhile): the
    /// next look reads the sessions again, whatever the replicas say.
    pub left: bool,
}

impl Runner {
    /// Runs nobody runs: each is resumed here or ended. `mine`: also those recorded as this
    /// replica id's own (its previous life: the process with this id died and started again).
    /// Whether it resumed or ended any (a run left for later does not count), and whether
    /// any was left for later.
    pub(super) async fn sweep(self: &Arc<Self>, mine: bool) -> Result<Swept, StoreError> {
        let orphans = self.runs.orphans(&self.config.owner, mine).await?;
        let mut found = false;
        let mut seen = 0;
        for orphan in orphans.into_iter().take(PER_SWEEP) {
            if lock(&self.local).contains_key(&orphan.run.run_id) {
                continue;
            }
            seen += 1;
            let reason = match (orphan.released, orphan.run.owner == self.config.owner) {
                (true, _) => ResumeReason::Drain,
                (false, true) => ResumeReason::Restart,
                (false, false) => ResumeReason::ReplicaLost,
            };
            let done = self.recover(orphan, reason).await;
            found |= done;
            seen -= usize::from(done);
        }
        Ok(Swept {
            found,
            left: seen > 0,
        })
    }

    /// A durable run whose replica died, found holding the session an admission wants.
    pub(super) async fn recover_holder(self: &Arc<Self>, run: RunRecord) {
        let orphan = Orphan {
            run,
            durable: true,
            released: false,
            remaining: None,
        };
        self.recover(orphan, ResumeReason::ReplicaLost).await;
    }

    /// Resumes `orphan` here, or ends it (see the module docs); whether it did either.
    async fn recover(self: &Arc<Self>, orphan: Orphan, reason: ResumeReason) -> bool {
        let restart = reason == ResumeReason::Restart;
        match self.fate(&orphan, reason) {
            Fate::Later => false,
            Fate::Resume => self.resume(orphan.run, reason, restart).await,
            Fate::End {
                status,
                error,
                code,
                reason,
            } => {
                self.end_orphan(&orphan.run, restart, status, &error, code, &reason)
                    .await
            }
        }
    }

    fn fate(&self, orphan: &Orphan, reason: ResumeReason) -> Fate {
        let run = &orphan.run;
        let crashes = run.resumed.iter().filter(|s| s.reason != "drain").count() as u32;
        let resumable = self
            .apps
            .get(&run.app_name)
            .is_some_and(|a| a.tree.is_ok() && a.resume == Resume::Always);
        let end = |status, error: &str, code, reason: &str| Fate::End {
            status,
            error: error.to_string(),
            code,
            reason: reason.to_string(),
        };
        if run.cancel_requested {
            return end(
                RunStatus::Cancelled,
                "cancelled while its replica was gone",
                seal::INVOCATION_ABORTED,
                "Invocation was aborted by client.",
            );
        }
        if !orphan.durable || !resumable {
            return end(
                RunStatus::Abandoned,
                "its replica stopped heartbeating",
                seal::INVOCATION_ABORTED,
                "Invocation was abandoned: the replica running it stopped.",
            );
        }
        if orphan.remaining.is_some_and(|r| r <= 1.0) {
            return end(
                RunStatus::TimedOut,
                "its time ran out while its replica was gone",
                seal::INVOCATION_ABORTED,
                "Invocation exceeded its maximum duration.",
            );
        }
        if reason != ResumeReason::Drain && crashes >= self.config.max_resumes {
            let error = format!(
                "its replica stopped {} times while running it (--max-resumes {}): it is not \
                 resumed again",
                crashes + 1,
                self.config.max_resumes
            );
            return end(RunStatus::Failed, &error, MAX_RESUMES_EXCEEDED, &error);
        }
        if self.is_draining() {
            return Fate::Later;
        }
        // A run its replicas keep dying under waits longer each time before it is taken again
        // (a lease per crash so far), so it cannot take every replica down at once.
        let last = run.resumed.last().map_or(0.0, |s| s.at);
        let wait = self.config.lease.as_secs_f64() * f64::from(crashes);
        if reason != ResumeReason::Drain && crate::event::now_ts() < last + wait {
            return Fate::Later;
        }
        Fate::Resume
    }

    /// Whether it took the run over.
    async fn resume(self: &Arc<Self>, run: RunRecord, reason: ResumeReason, restart: bool) -> bool {
        // Registered before the statement: reconciliation must never take the run for one
        // this replica lost.
        let local = self.register(&run.run_id, None);
        match self
            .runs
            .take_over(&run, &self.config.owner, reason, restart)
            .await
        {
            Ok(Some(taken)) => {
                metrics::counter!("agentd_runs_resumed_total", "reason" => reason.as_str())
                    .increment(1);
                resume::spawn(self, taken, local);
                true
            }
            // Another replica took it first, it ended, or its owner came back.
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(run = %run.run_id, error = %e, "could not take a run over");
                false
            }
        }
    }

    /// Ends a run nobody runs: recorded, its transcript sealed, its followers told. Whether
    /// it ended it (another replica may have first).
    async fn end_orphan(
        &self,
        run: &RunRecord,
        restart: bool,
        status: RunStatus,
        error: &str,
        code: &str,
        reason: &str,
    ) -> bool {
        let ended = self
            .runs
            .expire_as(run, &self.config.owner, restart, status, error)
            .await;
        let ended = match ended {
            Ok(Some(ended)) => ended,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(run = %run.run_id, error = %e, "could not end a run nobody runs");
                return false;
            }
        };
        tracing::warn!(run = %ended.run_id, owner = %ended.owner, status = status.as_str(), "run of a stopped replica ended");
        // Its end wrote its deliveries: this replica's sender sends them.
        self.config.run_ended.notify_one();
        let root = self.root_name(&ended.app_name);
        let fence = Fence::Sealing(&ended.run_id);
        match seal::seal_dead(self, &ended, &root, fence, code, reason).await {
            Ok(sealed) => seal::publish_sealed(self, &ended, sealed),
            // A new run took the session first; it seals the transcript itself.
            Err(StoreError::NotOwner) => {}
            Err(e) => tracing::warn!(run = %ended.run_id, error = %e, "could not seal a dead run"),
        }
        self.bus.publish(
            &ended.key(),
            BusMsg::Done {
                run_id: ended.run_id.as_str().into(),
                status,
                last_seq: None,
            },
        );
        true
    }
}
