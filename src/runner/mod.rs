//! The run loop: one user message in, the agent's events out.
//!
//! For `(app, user, session, new message)`, [`Runner::start`] does everything that can fail
//! because of the request before the caller sends a byte: admit the run (the session's
//! ownership is taken in the database, see [`admission`]; the same statement commits the user
//! event and reads the run's starting state), then, on the runner's task tracker, seal any dead
//! predecessor and, where admission could not, read the state and commit the user event. The caller
//! gets the result of that; the same task then picks the agent ([`selection`]) and runs it —
//! partial events stream to the client at once, complete events are committed first, fenced
//! by the run's ownership (see [`crate::agent::InvocationContext::emit`]) — and ends by
//! sealing a stopped transcript ([`seal`]), recording the outcome and telling the client.
//!
//! Everything after admission runs on the tracker under a [`guard::RunGuard`], so a client
//! that goes away, a panicking agent or a failed commit can never leave a session busy:
//! whatever way the task ends, the run is finished in the database. Liveness is per replica
//! ([`liveness`]); followers and cross-replica cancel go through the [`bus`].

mod admission;
pub mod bus;
mod guard;
mod liveness;
mod quota;
mod seal;
mod selection;

pub use seal::INVOCATION_ABORTED;

use crate::agent::context::ContextParts;
use crate::agent::{run_agent, AgentError, AgentTree, InvocationContext, PluginSet, RunConfig};
use crate::apps::AppRegistry;
use crate::event::{new_invocation_id, Content, Event, JsonMap, Part};
use crate::run::{temp_keys, Outbox, OutboxParts, RunItem, RunObserver};
use crate::store::runs::Opened;
use crate::store::{
    ArtifactWrite, CancelRequest, Fence, NewRun, RunRecord, RunStatus, SessionKey, Store,
    StoreError, StoredEvent,
};
use bus::{Bus, BusMsg};
use futures::FutureExt;
use guard::RunGuard;
use serde::Deserialize;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// How many items a run may have in flight towards a slow client before the agent waits.
pub const RUN_BUFFER: usize = 16;

/// How long a run that has ended waits for a client that does not read to take its error and
/// `done`; after that the client is dropped as a reader (its stream still ends with a `done`
/// read from the database, and it can re-attach).
const POST_RUN_DELIVERY: Duration = Duration::from_secs(10);

/// Runner settings (from flags).
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// This replica's id: the owner recorded on the runs it executes.
    pub owner: String,
    /// How long this replica may go without a heartbeat before its runs count as dead.
    /// Heartbeats are written every `lease / 3`.
    pub lease: Duration,
    /// Longest a run may take (also bounds runs whose client left with `on_disconnect=continue`).
    pub max_run_duration: Duration,
    /// Longest an `enqueue`d request waits for the session.
    pub enqueue_timeout: Duration,
    /// How long an `Idempotency-Key` is remembered (expired keys are deleted by the sweeper).
    pub idempotency_ttl: Duration,
    /// Concurrent runs per user on this replica; 0: no limit.
    pub max_runs_per_user: usize,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            owner: format!("agentd-{}", uuid::Uuid::new_v4().simple()),
            lease: Duration::from_secs(10),
            max_run_duration: Duration::from_secs(600),
            enqueue_timeout: Duration::from_secs(60),
            idempotency_ttl: Duration::from_secs(86_400),
            max_runs_per_user: 0,
        }
    }
}

/// What a request does when its session already has a running run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnBusy {
    /// Fail at once (HTTP 409).
    #[default]
    Reject,
    /// Wait for the session to be free (up to the enqueue timeout), first come first served.
    Enqueue,
    /// Cancel the running run, then start.
    Interrupt,
}

/// What happens to a run whose client disconnects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnDisconnect {
    #[default]
    Cancel,
    Continue,
}

/// One run to start.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub key: SessionKey,
    pub new_message: Option<Content>,
    /// Applied with the user event.
    pub state_delta: Option<JsonMap>,
    pub run_config: RunConfig,
    pub on_busy: OnBusy,
    pub on_disconnect: OnDisconnect,
    /// Create the session if it does not exist.
    pub create_session: bool,
    /// Shorter than the server's maximum, if given.
    pub max_duration: Option<Duration>,
}

/// Why a run did not start. All of these happen before any byte is streamed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("Agent not found: '{0}'")]
    AppNotFound(String),
    #[error("Failed to load agent: {0}")]
    AppBroken(String),
    #[error("Session not found: {0}")]
    SessionNotFound(String),
    #[error("Running an agent requires either a new_message or an invocation_id to resume a previous invocation.")]
    NoMessage,
    #[error("Session is busy with run {0}")]
    Busy(String),
    #[error("Timed out waiting for the session's active run {0} to finish")]
    QueueTimeout(String),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("this user already has {0} runs in progress")]
    TooManyRuns(usize),
    #[error("internal error: {0}")]
    Internal(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A started run: its ids, and its items in order (ending with [`RunItem::Done`], unless the
/// client fell so far behind that it was dropped as a reader; the run's end is then in the
/// database, see [`Runner::get_run`]).
pub struct RunHandle {
    pub run_id: String,
    pub invocation_id: String,
    pub items: mpsc::Receiver<RunItem>,
    /// Cancels the run when dropped before the run ends, if the request asked for
    /// `on_disconnect: cancel`: the HTTP layer keeps it inside the response stream, so a
    /// client that goes away cancels even an agent that is not emitting at that moment.
    pub guard: Option<tokio_util::sync::DropGuard>,
}

/// Why a local run is being stopped (the first cause wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopCause {
    /// A cancel request or the client went away.
    Cancel,
    /// `--max-run-secs` / `maxDurationSecs`.
    Timeout,
    /// The replica is shutting down and the drain time is over.
    Drain,
    /// This replica could not reach the database for most of its lease: its runs may be
    /// taken over, so they stop before that can happen.
    Liveness,
}

impl StopCause {
    fn status(self) -> RunStatus {
        match self {
            StopCause::Cancel => RunStatus::Cancelled,
            StopCause::Timeout => RunStatus::TimedOut,
            StopCause::Drain | StopCause::Liveness => RunStatus::Interrupted,
        }
    }
}

/// A run executing (or being admitted) in this process.
struct LocalRun {
    cancel: CancellationToken,
    cause: Arc<Mutex<Option<StopCause>>>,
}

/// Runs agents over sessions. One per process, shared by every request.
pub struct Runner {
    store: Arc<dyn Store>,
    apps: Arc<AppRegistry>,
    plugins: Arc<PluginSet>,
    config: RunnerConfig,
    bus: Arc<Bus>,
    /// Runs of this process, for instant local cancel, drain and reconciliation.
    local: Mutex<HashMap<String, LocalRun>>,
    /// Set at shutdown: no new runs, waiting requests give up.
    draining: CancellationToken,
    /// Stops the background tasks (heartbeat, sweeper, bus) at the very end.
    stop: CancellationToken,
    tracker: tokio_util::task::TaskTracker,
    quota: quota::UserQuota,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Runner {
    /// Creates the runner, writes this replica's first heartbeat and starts its background
    /// tasks (heartbeat and sweeper; on PostgreSQL the notification listener).
    pub async fn start(
        store: Arc<dyn Store>,
        apps: Arc<AppRegistry>,
        plugins: PluginSet,
        config: RunnerConfig,
    ) -> Result<Arc<Runner>, StoreError> {
        let stop = CancellationToken::new();
        let (bus, cancels) = match store.pg_pool() {
            Some(pool) => Bus::postgres(&config.owner, pool, stop.clone()).await?,
            None => Bus::local(&config.owner),
        };
        store.heartbeat(&config.owner, config.lease, false).await?;
        let runner = Arc::new(Runner {
            store,
            apps,
            plugins: Arc::new(plugins),
            quota: quota::UserQuota::new(config.max_runs_per_user),
            config,
            bus,
            local: Mutex::new(HashMap::new()),
            draining: CancellationToken::new(),
            stop,
            tracker: tokio_util::task::TaskTracker::new(),
        });
        runner.spawn_cancel_listener(cancels);
        runner.spawn_liveness();
        Ok(runner)
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

    pub fn enqueue_timeout(&self) -> Duration {
        self.config.enqueue_timeout
    }

    pub fn idempotency_ttl(&self) -> Duration {
        self.config.idempotency_ttl
    }

    pub fn replica_id(&self) -> &str {
        &self.config.owner
    }

    /// True from the moment shutdown starts (`GET /ready` answers 503).
    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// Validates and admits a run, commits its user event, then runs the agent in the
    /// background. Everything that can fail because of the request fails here, before the
    /// caller has sent a byte: unknown app, missing session, busy session, a user message the
    /// store refuses (e.g. an oversize blob saved as an artifact).
    pub async fn start_run(self: &Arc<Self>, req: RunRequest) -> Result<RunHandle, RunError> {
        if self.is_draining() {
            return Err(RunError::ShuttingDown);
        }
        let entry = self
            .apps
            .get(&req.key.app_name)
            .ok_or_else(|| RunError::AppNotFound(req.key.app_name.clone()))?;
        let tree = entry.tree.clone().map_err(RunError::AppBroken)?;
        // Held by the run's task until it ends, however it ends.
        let slot = self
            .quota
            .take(&req.key.user_id)
            .ok_or(RunError::TooManyRuns(self.config.max_runs_per_user))?;
        if req.new_message.is_none() && !req.run_config.resume {
            // As ADK: a missing session is reported before a missing message.
            return Err(
                if req.create_session || self.store.session_head(&req.key).await?.is_some() {
                    RunError::NoMessage
                } else {
                    RunError::SessionNotFound(req.key.session_id.clone())
                },
            );
        }

        let run_id = format!("run-{}", uuid::Uuid::new_v4());
        let invocation_id = new_invocation_id();
        let user = req
            .new_message
            .clone()
            .map(|m| user_event(&invocation_id, m, &req.state_delta, &req.run_config));
        let new_run = NewRun {
            run_id: run_id.clone(),
            key: req.key.clone(),
            invocation_id: invocation_id.clone(),
            owner: self.config.owner.clone(),
            user_event: user.is_some(),
            queue_ttl: self.config.enqueue_timeout + Duration::from_secs(30),
            // Committed by the admission statement itself where the backend can; an event
            // with staged artifacts (input blobs) needs their transaction.
            opening: user
                .as_ref()
                .filter(|(_, artifacts)| artifacts.is_empty())
                .map(|(event, _)| event.clone()),
        };
        // Registered before admission, so reconciliation never mistakes it for a leak.
        let cancel = CancellationToken::new();
        let cause = Arc::new(Mutex::new(None));
        lock(&self.local).insert(
            run_id.clone(),
            LocalRun {
                cancel: cancel.clone(),
                cause: cause.clone(),
            },
        );
        let span = tracing::info_span!(
            "run",
            app = %req.key.app_name, user = %req.key.user_id, session = %req.key.session_id,
            run = %run_id, invocation = %invocation_id,
        );
        // Admission and the begin step run on the tracker, not in the caller's future: a
        // client that goes away mid-way cannot abandon a claim that the database already
        // holds. The caller waits for the outcome; if it has left, a waiting admission gives
        // up and an admitted run is cancelled by its dropped handle.
        let (ready_tx, ready_rx) = oneshot::channel();
        let runner = self.clone();
        self.tracker.spawn(
            async move {
                let _slot = slot;
                let mut ready_tx = ready_tx;
                let mut new_run = new_run;
                let (unsealed, opened) = match runner.admit(&mut new_run, &req, &mut ready_tx).await
                {
                    Ok(admitted) => admitted,
                    Err(e) => {
                        lock(&runner.local).remove(&run_id);
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                metrics::counter!("agentd_runs_started_total", "app" => req.key.app_name.clone())
                    .increment(1);
                let guard = RunGuard::new(runner.clone(), run_id.clone(), req.key.clone());
                let begun = runner
                    .begin(
                        &req,
                        &run_id,
                        &invocation_id,
                        Opening {
                            unsealed,
                            opened,
                            user,
                        },
                        &tree,
                        cancel.clone(),
                    )
                    .await;
                let (ctx, outbox, items) = match begun {
                    Ok(begun) => begun,
                    Err(e) => {
                        // Free the session again. Nothing of this run was stored, except its
                        // user event if admission committed it (then already published).
                        guard
                            .finish(RunStatus::Failed, None, Some(&e.to_string()))
                            .await;
                        runner.bus.publish(
                            &req.key,
                            BusMsg::Done {
                                run_id: run_id.as_str().into(),
                                status: RunStatus::Failed,
                                last_seq: None,
                            },
                        );
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let handle = RunHandle {
                    run_id: run_id.clone(),
                    invocation_id: invocation_id.clone(),
                    items,
                    guard: (req.on_disconnect == OnDisconnect::Cancel)
                        .then(|| cancel.clone().drop_guard()),
                };
                // If the caller is gone, the handle comes back and is dropped here: with
                // `on_disconnect: cancel` that cancels the run, which then ends as usual.
                let _ = ready_tx.send(Ok(handle));
                let run = ActiveRun {
                    tree,
                    ctx,
                    outbox,
                    max_duration: req.max_duration,
                    cancel,
                    cause,
                };
                runner.drive(run, guard).await;
            }
            .instrument(span),
        );
        match ready_rx.await {
            Ok(result) => result,
            Err(_) if self.is_draining() => Err(RunError::ShuttingDown),
            Err(_) => Err(RunError::Internal(
                "the run's task ended before it started".into(),
            )),
        }
    }

    /// With the session held: seals dead predecessors, reads the state (only now, so a run
    /// that finished while this request waited is seen), builds the invocation context and
    /// commits the user event. When admission already committed the user event and read the
    /// state (the usual case), none of that touches the database again.
    async fn begin(
        self: &Arc<Self>,
        req: &RunRequest,
        run_id: &str,
        invocation_id: &str,
        opening: Opening,
        tree: &Arc<AgentTree>,
        cancel: CancellationToken,
    ) -> Result<(InvocationContext, Arc<Outbox>, mpsc::Receiver<RunItem>), RunError> {
        let Opening {
            unsealed,
            opened,
            user,
        } = opening;
        if unsealed {
            self.seal_dead_runs(&req.key, Fence::Run(run_id)).await?;
        }
        let state = match opened.as_ref().and_then(|o| o.state.clone()) {
            Some(state) => state,
            None => match self.store.session_head(&req.key).await {
                Ok(Some(head)) => head.state,
                failed => {
                    // Followers learn of a user event committed by admission even though
                    // this run fails to start after it.
                    if let Some(opened) = opened {
                        self.publish_user_event(&req.key, run_id, opened.stored);
                    }
                    return Err(match failed {
                        Err(e) => e.into(),
                        Ok(_) => RunError::SessionNotFound(req.key.session_id.clone()),
                    });
                }
            },
        };
        let (tx, rx) = mpsc::channel(RUN_BUFFER);
        let observer: Arc<dyn RunObserver> = Arc::new(BusTap {
            bus: self.bus.clone(),
            key: req.key.clone(),
            run_id: run_id.into(),
            started: std::time::Instant::now(),
            first_event: std::sync::atomic::AtomicBool::new(false),
        });
        let outbox = Outbox::new(OutboxParts {
            invocation_id: invocation_id.to_string(),
            key: req.key.clone(),
            store: self.store.clone(),
            cancel: cancel.clone(),
            cancel_on_disconnect: req.on_disconnect == OnDisconnect::Cancel,
            run_id: Some(run_id.to_string()),
            observer: Some(observer),
            state,
            out: tx,
        });
        let ctx = InvocationContext::new(ContextParts {
            user_content: user.as_ref().and_then(|(e, _)| e.content.clone()),
            run_config: req.run_config.clone(),
            cancel,
            tree: tree.clone(),
            plugins: self.plugins.clone(),
            outbox: outbox.clone(),
        });
        self.bus.run_started(&req.key, run_id, invocation_id);
        // A resume without a message has no user event.
        if let Some((mut user_event, artifacts)) = user {
            let mut st = outbox.emit().await;
            let stored = match opened {
                Some(opened) => {
                    outbox.adopt(&mut st, &opened.stored, temp_keys(&user_event));
                    Ok(opened.stored)
                }
                None => {
                    // Stamped now: after any wait for the session and after the seal.
                    user_event.timestamp = crate::event::now_ts();
                    outbox.record(&mut st, user_event, artifacts).await
                }
            };
            match stored {
                Ok(stored) => self.publish_user_event(&req.key, run_id, stored),
                Err(StoreError::SessionNotFound) => {
                    return Err(RunError::SessionNotFound(req.key.session_id.clone()))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok((ctx, outbox, rx))
    }

    /// Tells the session's followers that a run's user event is committed (it is not part of
    /// the run's own stream).
    fn publish_user_event(&self, key: &SessionKey, run_id: &str, stored: StoredEvent) {
        self.bus.publish(
            key,
            BusMsg::Committed {
                run_id: Some(run_id.into()),
                seq: stored.seq,
                event: Some(Arc::new(stored.event)),
                in_run_stream: false,
            },
        );
    }

    /// Seals the transcripts of the session's runs that died with their replica.
    async fn seal_dead_runs(&self, key: &SessionKey, fence: Fence<'_>) -> Result<(), StoreError> {
        for dead in self.store.unsealed_runs(key).await? {
            let root = self.root_name(&dead.app_name);
            let sealed = seal::seal_dead(self.store.as_ref(), &dead, &root, fence).await?;
            self.publish_sealed(&dead, sealed);
            self.bus.publish(
                key,
                BusMsg::Done {
                    run_id: dead.run_id.as_str().into(),
                    status: RunStatus::Abandoned,
                    last_seq: None,
                },
            );
        }
        Ok(())
    }

    fn root_name(&self, app: &str) -> String {
        self.apps
            .get(app)
            .and_then(|e| e.tree.as_ref().ok().map(|t| t.root().name().to_string()))
            .unwrap_or_else(|| "agentd".to_string())
    }

    fn publish_sealed(&self, run: &RunRecord, sealed: Vec<(i64, Event)>) {
        let key = run.key();
        let run_id: Arc<str> = run.run_id.as_str().into();
        for (seq, event) in sealed {
            self.bus.publish(
                &key,
                BusMsg::Committed {
                    run_id: Some(run_id.clone()),
                    seq,
                    event: Some(Arc::new(event)),
                    in_run_stream: true,
                },
            );
        }
    }

    async fn create_session(&self, key: &SessionKey) -> Result<(), RunError> {
        let created = self
            .store
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

    /// Cancels a run on whichever replica executes it: the request is recorded on the run's
    /// row (who and why; idempotent), the run is stopped at once if it is local, else its
    /// owner is told through the bus (and sees the flag at its next heartbeat at the latest).
    pub async fn cancel(
        &self,
        run_id: &str,
        req: &CancelRequest,
    ) -> Result<Option<RunRecord>, StoreError> {
        let record = self.store.request_cancel(run_id, req).await?;
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
        match self.store.active_run(key).await? {
            Some(active) if active.status == RunStatus::Running => {
                self.cancel(&active.run_id, req).await
            }
            _ => Ok(None),
        }
    }

    /// Stops a local run for `cause`; false if it is not executing here.
    fn stop_local(&self, run_id: &str, cause: StopCause) -> bool {
        let local = lock(&self.local);
        let Some(run) = local.get(run_id) else {
            return false;
        };
        lock(&run.cause).get_or_insert(cause);
        run.cancel.cancel();
        true
    }

    fn stop_all_local(&self, cause: StopCause) {
        let ids: Vec<String> = lock(&self.local).keys().cloned().collect();
        for id in ids {
            self.stop_local(&id, cause);
        }
    }

    pub async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.store.get_run(run_id).await
    }

    /// Turns the replica not-ready and refuses new runs (503), without stopping anything.
    pub fn begin_drain(&self) {
        self.draining.cancel();
    }

    /// Rolling-deploy shutdown: refuses new runs, lets in-flight runs finish for up to
    /// `drain`, then stops the rest (sealed, status `interrupted`) and waits up to `grace` for
    /// them to record it. Finally tells the other replicas this one is gone.
    pub async fn shutdown(&self, drain: Duration, grace: Duration) {
        self.begin_drain();
        self.tracker.close();
        if tokio::time::timeout(drain, self.tracker.wait())
            .await
            .is_err()
        {
            let n = lock(&self.local).len();
            tracing::warn!(runs = n, "drain time over; interrupting the remaining runs");
            self.stop_all_local(StopCause::Drain);
            if tokio::time::timeout(grace, self.tracker.wait())
                .await
                .is_err()
            {
                tracing::warn!("runs still finishing after the shutdown grace period");
            }
        }
        if let Err(e) = self.store.retire_replica(&self.config.owner).await {
            tracing::warn!(error = %e, "could not record this replica's exit");
        }
        self.stop.cancel();
        self.plugins.close().await;
    }

    /// Runs the agent of a started run to its end and records the outcome.
    async fn drive(self: Arc<Self>, run: ActiveRun, guard: RunGuard) {
        let ActiveRun {
            tree,
            ctx,
            outbox,
            max_duration,
            cancel,
            cause,
        } = run;
        let started = std::time::Instant::now();
        let max = max_duration.map_or(self.config.max_run_duration, |d| {
            d.min(self.config.max_run_duration)
        });
        let turn = AssertUnwindSafe(self.run_turn(&ctx, &tree)).catch_unwind();
        let result = tokio::select! {
            r = turn => r.unwrap_or_else(|panic| {
                let message = panic_message(&panic);
                tracing::error!(%message, "agent panicked");
                Err(AgentError::failed("Panic", format!("the agent panicked: {message}")))
            }),
            _ = cancel.cancelled() => Err(AgentError::Cancelled),
            _ = tokio::time::sleep(max) => {
                lock(&cause).get_or_insert(StopCause::Timeout);
                cancel.cancel();
                Err(AgentError::Cancelled)
            }
        };
        let cause = *lock(&cause);
        // How long a slow client may take the run's last event from here: what is left of the
        // run's time, and at least the post-run limit (it waited as long while the agent ran).
        let deliver_within = max.saturating_sub(started.elapsed()).max(POST_RUN_DELIVERY);
        // The agent is done. A hold timer may own the emit lock, handing its event to a client
        // that does not read; past that limit the run's token cuts that client loose.
        let mut st = tokio::select! {
            st = outbox.emit() => st,
            _ = tokio::time::sleep(deliver_within) => {
                cancel.cancel();
                outbox.emit().await
            }
        };
        // A final response held back for the outcome (`emit_final`): a completed run commits
        // the two together; any other end commits it first, before a seal or an error. The
        // client must take it within `deliver_within`: nothing else bounds the wait now.
        let completed = result.is_ok();
        let settled = outbox
            .settle_held(&mut st, completed, Some(deliver_within))
            .await;
        // A held event that could not be committed fails the run, whatever else ended it.
        let finished = completed && matches!(settled, Ok(true));
        let result = match settled {
            Err(e) => Err(e.into()),
            Ok(_) => result,
        };
        let mut status = match (&result, cause) {
            (Ok(()), _) => RunStatus::Completed,
            (Err(AgentError::Cancelled), Some(c)) => c.status(),
            (Err(AgentError::Cancelled), None) => RunStatus::Cancelled,
            (Err(_), _) => RunStatus::Failed,
        };
        let lost = st.lost;
        if !lost
            && matches!(
                status,
                RunStatus::Cancelled | RunStatus::TimedOut | RunStatus::Interrupted
            )
        {
            let reason = match status {
                RunStatus::TimedOut => format!(
                    "Invocation exceeded its maximum duration of {} s.",
                    max.as_secs()
                ),
                RunStatus::Interrupted => "Invocation was interrupted: the server shut down \
                     before it ended. Resume it with a new run and \"resume\": true."
                    .to_string(),
                _ => "Invocation was aborted by client.".to_string(),
            };
            seal::seal_live(&ctx, &outbox, &mut st, tree.root().name(), &reason).await;
        }
        let error = match &result {
            Err(e @ (AgentError::Failed { .. } | AgentError::Commit(_))) if !lost => {
                tracing::warn!(error = %e, "run failed");
                outbox
                    .deliver_within(
                        &mut st,
                        RunItem::Error {
                            kind: e.kind().to_string(),
                            message: e.message(),
                        },
                        POST_RUN_DELIVERY,
                    )
                    .await;
                Some(e.to_string())
            }
            _ => None,
        };
        let last_seq = st.last_seq;
        drop(st);
        self.plugins.after_run(&ctx).await;
        let run_id = guard.run_id().to_string();
        if finished {
            guard.finished();
        } else if !guard.finish(status, last_seq, error.as_deref()).await {
            // Taken over (or finished by reconciliation): report what the database says.
            status = match self.store.get_run(&run_id).await {
                Ok(Some(r)) if r.status != RunStatus::Running => r.status,
                _ => RunStatus::Abandoned,
            };
        }
        tracing::info!(status = status.as_str(), last_seq, "run finished");
        let app = ctx.session_key().app_name.clone();
        metrics::counter!("agentd_runs_finished_total", "app" => app.clone(), "status" => status.as_str())
            .increment(1);
        metrics::histogram!("agentd_run_duration_seconds", "app" => app, "status" => status.as_str())
            .record(started.elapsed().as_secs_f64());
        let mut st = outbox.emit().await;
        outbox
            .deliver_within(
                &mut st,
                RunItem::Done { status, last_seq },
                POST_RUN_DELIVERY,
            )
            .await;
    }

    /// Plugins' before-run hook, agent selection, the agent.
    async fn run_turn(
        &self,
        ctx: &InvocationContext,
        tree: &Arc<AgentTree>,
    ) -> Result<(), AgentError> {
        if let Some(content) = self.plugins.before_run(ctx).await? {
            let root = ctx.for_agent(tree.root().name());
            root.emit_final(root.new_event().with_content(content))
                .await?;
            return Ok(());
        }
        // A tree of one agent has nothing to choose from: no history read.
        if tree.root().sub_agents().is_empty() {
            return run_agent(tree.root(), ctx).await;
        }
        let answered: Vec<String> = ctx
            .user_content()
            .map(|c| {
                c.parts
                    .iter()
                    .filter_map(|p| p.function_response.as_ref()?.id.clone())
                    .collect()
            })
            .unwrap_or_default();
        let agent =
            selection::select_agent(self.store.as_ref(), tree, ctx.session_key(), &answered)
                .await
                .map_err(AgentError::store)?;
        tracing::debug!(agent = agent.name(), "agent selected");
        run_agent(&agent, ctx).await
    }

    /// Cancels local runs named by the bus (a cancel accepted on another replica).
    fn spawn_cancel_listener(self: &Arc<Self>, mut cancels: mpsc::UnboundedReceiver<String>) {
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

/// What admission left for [`Runner::begin`]: whether a dead run awaits sealing, the user
/// event if admission committed it, and the user event as built from the request.
struct Opening {
    unsealed: bool,
    opened: Option<Box<Opened>>,
    user: Option<(Event, Vec<ArtifactWrite>)>,
}

/// A started run (user event committed), moved into its task.
struct ActiveRun {
    tree: Arc<AgentTree>,
    ctx: InvocationContext,
    outbox: Arc<Outbox>,
    max_duration: Option<Duration>,
    cancel: CancellationToken,
    cause: Arc<Mutex<Option<StopCause>>>,
}

/// Forwards a run's items to its session's followers (see [`bus`]). Costs nothing per item
/// when nobody follows the session.
struct BusTap {
    bus: Arc<Bus>,
    key: SessionKey,
    run_id: Arc<str>,
    /// For `agentd_run_time_to_first_event_seconds`.
    started: std::time::Instant,
    first_event: std::sync::atomic::AtomicBool,
}

impl RunObserver for BusTap {
    fn observe(&self, item: &RunItem, after: Option<i64>) {
        if matches!(item, RunItem::Event { .. })
            && !self
                .first_event
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            metrics::histogram!("agentd_run_time_to_first_event_seconds", "app" => self.key.app_name.clone())
                .record(self.started.elapsed().as_secs_f64());
        }
        let msg = match item {
            RunItem::Event { event, seq: None } => {
                if !self.bus.is_followed(&self.key) {
                    return;
                }
                BusMsg::Partial {
                    run_id: self.run_id.clone(),
                    after,
                    event: Arc::new((**event).clone()),
                }
            }
            RunItem::Event {
                event,
                seq: Some(seq),
            } => BusMsg::Committed {
                run_id: Some(self.run_id.clone()),
                seq: *seq,
                event: self
                    .bus
                    .is_followed(&self.key)
                    .then(|| Arc::new((**event).clone())),
                in_run_stream: true,
            },
            RunItem::Error { kind, message } => BusMsg::Error {
                run_id: self.run_id.clone(),
                kind: kind.clone(),
                message: message.clone(),
            },
            RunItem::Done { status, last_seq } => BusMsg::Done {
                run_id: self.run_id.clone(),
                status: *status,
                last_seq: *last_seq,
            },
        };
        self.bus.publish(&self.key, msg);
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// The user event: role forced to `user`, the request's state delta and metadata attached,
/// inline blobs moved to artifacts (`artifact_<invocation>_<n>`) when the run config says so.
fn user_event(
    invocation_id: &str,
    mut content: Content,
    state_delta: &Option<JsonMap>,
    config: &RunConfig,
) -> (Event, Vec<ArtifactWrite>) {
    content.role = Some("user".into());
    let mut artifacts = vec![];
    if config.save_input_blobs_as_artifacts {
        for (i, part) in content.parts.iter_mut().enumerate() {
            if part.inline_data.is_some() {
                let filename = format!("artifact_{invocation_id}_{i}");
                artifacts.push(ArtifactWrite {
                    filename: filename.clone(),
                    part: std::mem::take(part),
                    custom_metadata: JsonMap::new(),
                });
                *part = Part::text(format!(
                    "Uploaded file: {filename}. It is saved into artifacts"
                ));
            }
        }
    }
    let mut event = Event::new(invocation_id, "user").with_content(content);
    if let Some(delta) = state_delta {
        event.actions.state_delta = delta.clone();
    }
    event.custom_metadata = config.custom_metadata.clone();
    (event, artifacts)
}
