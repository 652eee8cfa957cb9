//! The drop guard of a run's ownership (mini-redis's `DbDropGuard` idiom).
//!
//! A run holds its session from admission until its outcome is recorded. The happy path calls
//! [`RunGuard::finish`], or [`RunGuard::finished`] when the run's last event recorded the
//! outcome itself; if the run's task ends any other way (a panic that escaped the agent
//! boundary, the runtime shutting down, a bug), dropping the guard records the run as `failed`
//! and frees the session, from a task of its own. The replica's reconciliation
//! (`runner::liveness`) is the last line behind this one.

use super::super::bus::BusMsg;
use super::super::control::Registration;
use super::super::{RunError, Runner};
use crate::store::{RunStatus, SessionKey, StoreError};
use std::sync::Arc;
use std::time::Duration;

pub(in crate::runner) struct RunGuard {
    runner: Arc<Runner>,
    key: SessionKey,
    /// The run in this process's registry; dropped (unregistered) once the outcome is written.
    local: Option<Registration>,
    /// The run had webhook targets at admission: its end wakes this replica's webhook sender
    /// at once. Other runs' ends do not (the sender's look for due deliveries reads every
    /// shard on Citus); a target added later (an A2A push config) is found by the sender's
    /// periodic look, within a second.
    webhooks: bool,
    /// The epoch the run holds its session at (its takeovers so far): the outcome is recorded
    /// only while it still does.
    epoch: i32,
    /// What the run spends: the outcome's statement writes what its commits did not.
    meter: Option<Arc<crate::transcript::Meter>>,
}

impl RunGuard {
    pub(in crate::runner) fn new(
        runner: Arc<Runner>,
        key: SessionKey,
        webhooks: bool,
        local: Registration,
    ) -> Self {
        RunGuard {
            runner,
            key,
            local: Some(local),
            webhooks,
            epoch: 0,
            meter: None,
        }
    }

    /// The run's meter, once it has one (from its beginning on).
    pub(in crate::runner) fn metered(&mut self, meter: Arc<crate::transcript::Meter>) {
        self.meter = Some(meter);
    }

    /// The run's usage its commits have not written yet.
    fn pending_usage(&self) -> Option<crate::usage::RunUsage> {
        self.meter.as_ref().and_then(|m| m.pending())
    }

    /// The guard of a run this replica took over at `epoch`.
    pub(in crate::runner) fn at_epoch(mut self, epoch: i32) -> Self {
        self.epoch = epoch;
        self
    }

    pub(in crate::runner) fn epoch(&self) -> i32 {
        self.epoch
    }

    /// A draining replica gives the run up at a commit boundary, for a live replica to take
    /// over: nothing is recorded here, the run goes on elsewhere. False (and the guard back)
    /// if it could not (a cancel came first, or the run is no longer this replica's).
    pub(in crate::runner) async fn release(mut self) -> Result<(), RunGuard> {
        let run_id = self.run_id().to_string();
        let released = self
            .runner
            .runs
            .release_run(
                &self.key.user_id,
                &run_id,
                self.epoch,
                &self.runner.config.owner,
            )
            .await;
        match released {
            Ok(true) => {
                drop(self.local.take());
                Ok(())
            }
            Ok(false) => Err(self),
            Err(e) => {
                tracing::warn!(error = %e, "could not hand the run over");
                Err(self)
            }
        }
    }

    pub(in crate::runner) fn run_id(&self) -> &str {
        self.local.as_ref().map_or("", |l| l.run_id())
    }

    fn wake_sender(&self) {
        if self.webhooks {
            self.runner.config.run_ended.notify_one();
        }
    }

    /// The outcome was recorded with the run's last event ([`crate::store::Fence::RunEnd`]):
    /// nothing is left to write.
    pub(in crate::runner) fn finished(mut self) {
        self.local.take();
        self.wake_sender();
    }

    /// Records the outcome (synchronously committed) and frees the session. A database that
    /// does not answer is retried for a while: a run must not leave its session busy. Returns
    /// false if the run no longer owned the session (it was taken over), and the guard back,
    /// still holding the session, if `completed` was refused because a cancel of the run came
    /// first (the run then ends `cancelled`).
    pub(in crate::runner) async fn finish(
        mut self,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
    ) -> Result<bool, RunGuard> {
        let run_id = self.run_id().to_string();
        let user = self.key.user_id.clone();
        let epoch = self.epoch;
        let usage = self.pending_usage();
        let outcome = Outcome {
            status,
            last_seq,
            error,
            usage: usage.as_ref(),
        };
        match finish(&self.runner, &user, &run_id, epoch, outcome).await {
            Finished::CancelRequested => Err(self),
            Finished::Owned(owned) => {
                drop(self.local.take());
                self.wake_sender();
                Ok(owned)
            }
        }
    }

    /// Ends a run that never began (its context or user event failed): recorded `failed`,
    /// the session freed, and whoever waits for the session told at once.
    pub(in crate::runner) async fn never_began(self, error: &RunError) {
        let (runner, key, run_id) = (
            self.runner.clone(),
            self.key.clone(),
            self.run_id().to_string(),
        );
        // `failed` is never refused for a cancel.
        let _ = self
            .finish(RunStatus::Failed, None, Some(&error.to_string()))
            .await;
        runner.bus.publish(
            &key,
            BusMsg::Done {
                run_id: run_id.as_str().into(),
                status: RunStatus::Failed,
                last_seq: None,
            },
        );
    }
}

/// What recording an outcome did.
enum Finished {
    /// Recorded (true), or the run no longer owned its session (false).
    Owned(bool),
    /// `completed` was refused: a cancel of the run came first.
    CancelRequested,
}

/// What a run's end records.
struct Outcome<'a> {
    status: RunStatus,
    last_seq: Option<i64>,
    error: Option<&'a str>,
    usage: Option<&'a crate::usage::RunUsage>,
}

async fn finish(runner: &Runner, user: &str, run_id: &str, epoch: i32, o: Outcome<'_>) -> Finished {
    let mut delay = Duration::from_millis(100);
    for attempt in 0..8 {
        match runner
            .runs
            .finish_metered(user, run_id, epoch, o.status, o.last_seq, o.error, o.usage)
            .await
        {
            Ok(owned) => return Finished::Owned(owned),
            Err(StoreError::CancelRequested) => return Finished::CancelRequested,
            Err(e) => {
                tracing::warn!(run = %run_id, attempt, error = %e, "could not record the run's outcome; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
    tracing::error!(run = %run_id, "gave up recording the run's outcome; reconciliation will");
    Finished::Owned(true)
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        let Some(local) = self.local.take() else {
            return;
        };
        tracing::error!(run = %local.run_id(), "run task ended without recording an outcome; releasing the session");
        let runner = self.runner.clone();
        let key = self.key.clone();
        let epoch = self.epoch;
        let usage = self.pending_usage();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            let run_id = local.run_id().to_string();
            let error = "the run's task ended unexpectedly";
            let outcome = Outcome {
                status: RunStatus::Failed,
                last_seq: None,
                error: Some(error),
                usage: usage.as_ref(),
            };
            let _ = finish(&runner, &key.user_id, &run_id, epoch, outcome).await;
            drop(local);
            runner.config.run_ended.notify_one();
            runner.bus.publish(
                &key,
                BusMsg::Done {
                    run_id: run_id.as_str().into(),
                    status: RunStatus::Failed,
                    last_seq: None,
                },
            );
        });
    }
}
