//! The run loop: one user message in, the agent's events out.
//!
//! [`Runner`] is the facade every caller (the HTTP routes, the scheduler, embedding code)
//! holds; it owns what all runs share (the store, the apps, plugins, the bus, this process's
//! registry of runs) and starts each run on its way through [`life`]: prepared, admitted (the
//! session's ownership taken in the database), begun (the user event committed), driven (the
//! agent) and ended (sealed if stopped, recorded, `done`), each stage a value of its own.
//! Partial events stream to the client at once; complete events are committed first, fenced
//! by the run's ownership (the outbox, [`crate::transcript`]).
//!
//! Everything after admission runs on the tracker under a guard, so a client that goes away,
//! a panicking agent or a failed commit can never leave a session busy: whatever way the task
//! ends, the run is finished in the database. Beside the life of a run: [`admission`] (the
//! claim and the queue), [`control`] (cancel and stops), [`liveness`] (heartbeat, sweeper,
//! reconciliation), [`quota`], [`selection`] (which agent answers), `edits` (rewind,
//! compaction, fork: writes that hold a session and are not turns) and the [`bus`].

mod admission;
pub mod budgets;
pub mod bus;
mod control;
mod edits;
mod life;
mod liveness;
mod quota;
mod recovery;
mod request;
mod selection;

pub use admission::{claim, Claim};
pub use edits::fork::ForkPoint;
pub use edits::hold::HOLD_PREFIX;
pub use edits::rewind::RewindError;
pub use life::seal::{INVOCATION_ABORTED, MAX_RESUMES_EXCEEDED};
pub use request::{
    DrainHandover, EditPoint, OnBusy, OnDisconnect, RunError, RunHandle, RunRequest, RunnerConfig,
};

use crate::apps::AppRegistry;
use crate::invocation::PluginSet;
use crate::store::{RunRecord, RunStore, SessionStore, Store, StoreError};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use bus::Bus;
use control::{LocalRun, StopCause};

/// How many items a run may have in flight towards a slow client before the agent waits.
pub const RUN_BUFFER: usize = 16;

/// Runs agents over sessions. One per process, shared by every request.
pub struct Runner {
    /// The runs: every run method of admission, ownership, liveness and a run's end.
    runs: Arc<dyn RunStore>,
    /// The transcripts: what a run reads of its session, and what its outbox commits.
    sessions: Arc<dyn SessionStore>,
    /// The whole store, for what the runner hands on (the agents' context, which reads
    /// artifacts and memory; [`Runner::store`], for the schedule ticker) and the services one
    /// concern of the runner uses: the scans' turns and idempotency keys (liveness), rewinds,
    /// forks and artifacts (the edits), budgets and API keys (admission and resume).
    store: Arc<dyn Store>,
    apps: Arc<AppRegistry>,
    plugins: Arc<PluginSet>,
    config: RunnerConfig,
    bus: Arc<Bus>,
    /// Runs of this process, for instant local cancel, drain and reconciliation.
    local: Mutex<HashMap<String, LocalRun>>,
    /// Runs registered in `local` since start: an idle replica's heartbeat and reconciliation
    /// skip their reads of every user's sessions while none was since their last look
    /// (`liveness`).
    registered: AtomicU64,
    /// Set at shutdown: no new runs, waiting requests give up.
    draining: CancellationToken,
    /// Stops the background tasks (heartbeat, sweeper, bus) at the very end.
    stop: CancellationToken,
    tracker: tokio_util::task::TaskTracker,
    /// Client streams following runs this replica handed over (a drain waits for them).
    handovers: tokio_util::task::TaskTracker,
    quota: quota::UserQuota,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Runner {
    /// Creates the runner, writes this replica's first heartbeat and starts its background
    /// tasks (heartbeat and sweeper; on PostgreSQL the notification listener, which
    /// `channels` share).
    pub async fn start(
        store: Arc<dyn Store>,
        apps: Arc<AppRegistry>,
        plugins: PluginSet,
        config: RunnerConfig,
        channels: Vec<bus::ChannelListener>,
    ) -> Result<Arc<Runner>, StoreError> {
        let stop = CancellationToken::new();
        let (bus, cancels) = match store.pg_pool() {
            Some(pool) => Bus::postgres(&config.owner, pool, stop.clone(), channels).await?,
            None => Bus::local(&config.owner),
        };
        store
            .heartbeat(&config.owner, config.lease, false, false)
            .await?;
        let runner = Arc::new(Runner {
            runs: store.clone(),
            sessions: store.clone(),
            store,
            apps,
            plugins: Arc::new(plugins),
            quota: quota::UserQuota::new(config.max_runs_per_user),
            config,
            bus,
            local: Mutex::new(HashMap::new()),
            registered: AtomicU64::new(0),
            draining: CancellationToken::new(),
            stop,
            tracker: tokio_util::task::TaskTracker::new(),
            handovers: tokio_util::task::TaskTracker::new(),
        });
        runner.spawn_cancel_listener(cancels);
        runner.spawn_liveness();
        Ok(runner)
    }

    /// Validates and admits a run, commits its user event, then runs the agent in the
    /// background ([`life`]). Everything that can fail because of the request fails here,
    /// before the caller has sent a byte: unknown app, missing session, busy session, a user
    /// message the store refuses (e.g. an oversize blob saved as an artifact).
    pub async fn start_run(self: &Arc<Self>, req: RunRequest) -> Result<RunHandle, RunError> {
        life::start(self, req).await
    }

    /// The apps the runner runs.
    pub fn apps(&self) -> &AppRegistry {
        &self.apps
    }

    /// The name of `app`'s root agent (the author of the events that seal its runs).
    fn root_name(&self, app: &str) -> String {
        self.apps
            .get(app)
            .and_then(|e| e.tree.as_ref().ok().map(|t| t.root().name().to_string()))
            .unwrap_or_else(|| "agentd".to_string())
    }

    /// Resolves when the runner has shut down: open followers end then, so a graceful
    /// shutdown does not wait its whole grace period for streams that would never end.
    pub fn stopped(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.stop.cancelled()
    }

    pub fn bus(&self) -> &Arc<Bus> {
        &self.bus
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Parts a run's message may have (`--max-message-parts`).
    pub fn max_message_parts(&self) -> usize {
        self.config.max_message_parts
    }

    /// A run's limit: the request's, at most the server's (`--max-run-secs`).
    pub(crate) fn run_limit(&self, requested: Option<Duration>) -> Duration {
        let server = self.config.max_run_duration;
        requested.map_or(server, |d| d.min(server))
    }

    pub fn enqueue_timeout(&self) -> Duration {
        self.config.enqueue_timeout
    }

    pub fn idempotency_ttl(&self) -> Duration {
        self.config.idempotency_ttl
    }

    pub fn replica_id(&self) -> &str {
        &self.config.owner
    }

    /// The operator's prices (`--prices`).
    pub fn prices(&self) -> &crate::usage::Prices {
        &self.config.prices
    }

    /// A budget (a user's, an app's, a key's) was set or removed here: admission reads it
    /// again.
    pub fn budgets_changed(&self) {
        self.config.budgets.changed();
    }

    /// True from the moment shutdown starts (`GET /ready` answers 503).
    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    pub async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.runs.get_run(run_id).await
    }

    /// A run of `user` (see [`crate::store::RunStore::get_user_run`]).
    pub async fn get_user_run(
        &self,
        user: &str,
        run_id: &str,
    ) -> Result<Option<RunRecord>, StoreError> {
        self.runs.get_user_run(user, run_id).await
    }

    /// Turns the replica not-ready and refuses new runs (503), without stopping anything.
    pub fn begin_drain(&self) {
        self.draining.cancel();
    }

    /// Rolling-deploy shutdown: refuses new runs, lets in-flight runs finish for up to
    /// `drain`, then stops the rest (sealed, status `interrupted`) and waits up to `grace` for
    /// them to record it. Finally tells the other replicas this one is gone.
    pub async fn shutdown(&self, drain: Duration, grace: Duration) {
        self.drain_runs(drain, grace).await;
        self.stop_background().await;
    }

    /// The first half of [`Runner::shutdown`]: refuses new runs and ends the ones in flight
    /// (finished within `drain`, else interrupted and given `grace`). The bus, heartbeats and
    /// followers keep working, so a replica can go on answering while a balancer forgets it.
    pub async fn drain_runs(&self, drain: Duration, grace: Duration) {
        self.begin_drain();
        self.tracker.close();
        // The other replicas' sweeps look for runs handed over while a replica drains
        // (`liveness`): the flag is written now, not at the next heartbeat.
        if let Err(e) = self
            .runs
            .heartbeat(&self.config.owner, self.config.lease, true, false)
            .await
        {
            tracing::warn!(error = %e, "could not record the drain; the next heartbeat does");
        }
        // With another replica live, runs are handed over rather than interrupted.
        let hand_over = self.config.drain_handover != DrainHandover::Off
            && match self.runs.live_replicas(&self.config.owner).await {
                Ok(n) => n > 0,
                Err(e) => {
                    tracing::warn!(error = %e, "could not count the live replicas; runs still going at the end of the drain are interrupted");
                    false
                }
            };
        if hand_over && self.config.drain_handover == DrainHandover::Immediate {
            self.hand_over_all_local();
        }
        if tokio::time::timeout(drain, self.tracker.wait())
            .await
            .is_ok()
        {
            return;
        }
        let n = lock(&self.local).len();
        if hand_over {
            tracing::info!(
                runs = n,
                "drain time over; handing the remaining runs over at their next commit"
            );
            self.hand_over_all_local();
            // A run waiting on a long call commits nothing for a while: half the grace, then
            // it stops where it is (its call in flight is the taker's to answer).
            if tokio::time::timeout(grace / 2, self.tracker.wait())
                .await
                .is_err()
            {
                self.stop_all_local(StopCause::Handover);
            }
        } else {
            tracing::warn!(runs = n, "drain time over; interrupting the remaining runs");
            self.stop_all_local(StopCause::Drain);
        }
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("runs still finishing after the shutdown grace period");
        }
    }

    /// A token that keeps [`Runner::wait_handover_streams`] waiting: a client stream on this
    /// replica following a run it handed over.
    pub fn handover_stream(&self) -> tokio_util::task::task_tracker::TaskTrackerToken {
        self.handovers.token()
    }

    /// Waits up to `grace` for the client streams following runs this replica handed over.
    pub async fn wait_handover_streams(&self, grace: Duration) {
        self.handovers.close();
        if tokio::time::timeout(grace, self.handovers.wait())
            .await
            .is_err()
        {
            tracing::warn!("streams of handed-over runs still open after the shutdown grace period; their clients re-attach");
        }
    }

    /// The second half of [`Runner::shutdown`]: tells the other replicas this one is gone and
    /// stops the background tasks (heartbeat, sweeper, bus); open followers end.
    pub async fn stop_background(&self) {
        if let Err(e) = self.runs.retire_replica(&self.config.owner).await {
            tracing::warn!(error = %e, "could not record this replica's exit");
        }
        self.stop.cancel();
        self.plugins.close().await;
    }
}
