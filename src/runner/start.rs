//! Starting a run: validation, admission on the runner's task tracker, the begin step (seal
//! dead predecessors, the starting state, the outbox and the user event), then the hand-off
//! to [`super::drive`].

use super::bus::{BusMsg, BusTap};
use super::drive::ActiveRun;
use super::guard::RunGuard;
use super::*;
use crate::agent::context::ContextParts;
use crate::agent::{AgentTree, InvocationContext, RunConfig};
use crate::event::{new_invocation_id, Content, Event, JsonMap, Part};
use crate::run::{temp_keys, Outbox, OutboxParts, RunItem, RunObserver};
use crate::store::runs::Opened;
use crate::store::{
    ArtifactWrite, Fence, NewRun, RunRecord, RunStatus, SessionKey, StoreError, StoredEvent,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

impl Runner {
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
        if req.new_message.is_none() && !req.run_config.resume && req.edit.is_none() {
            // As ADK: a missing session is reported before a missing message.
            return Err(
                if req.create_session || self.store.session_head(&req.key).await?.is_some() {
                    RunError::NoMessage
                } else {
                    RunError::SessionNotFound(req.key.session_id.clone())
                },
            );
        }

        // An edit naming an unknown turn is refused before anything is admitted.
        if let Some(EditPoint::Invocation(inv)) = &req.edit {
            if self
                .store
                .invocation_events(&req.key, inv, -1, 1)
                .await?
                .is_empty()
            {
                return Err(match self.store.session_head(&req.key).await? {
                    Some(_) => RunError::InvocationNotFound(inv.clone()),
                    None => RunError::SessionNotFound(req.key.session_id.clone()),
                });
            }
        }
        let run_id = req
            .run_id
            .clone()
            .unwrap_or_else(|| format!("run-{}", uuid::Uuid::new_v4()));
        // The request's webhook, then the app's: the run's end writes their deliveries.
        let webhooks: Vec<&crate::webhook::WebhookTarget> =
            req.webhook.iter().chain(entry.webhooks.iter()).collect();
        let webhooks = (!webhooks.is_empty())
            .then(|| serde_json::to_value(&webhooks).ok())
            .flatten();
        let invocation_id = new_invocation_id();
        let user = req
            .new_message
            .clone()
            .map(|m| user_event(&invocation_id, m, &req.state_delta, &req.run_config));
        // Only a run with webhook targets wakes the sender when it ends (see `RunGuard`).
        let has_webhooks = webhooks.is_some();
        let new_run = NewRun {
            run_id: run_id.clone(),
            key: req.key.clone(),
            invocation_id: invocation_id.clone(),
            owner: self.config.owner.clone(),
            // An edit commits a user event too (a regenerate's is built after admission).
            user_event: user.is_some() || req.edit.is_some(),
            queue_ttl: self.config.enqueue_timeout + Duration::from_secs(30),
            // Committed by the admission statement itself where the backend can; an event
            // with staged artifacts (input blobs) needs their transaction, and an edit's
            // comes after its rewind, in one commit.
            opening: user
                .as_ref()
                .filter(|(_, artifacts)| artifacts.is_empty() && req.edit.is_none())
                .map(|(event, _)| event.clone()),
            webhooks,
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
                let guard = RunGuard::new(
                    runner.clone(),
                    run_id.clone(),
                    req.key.clone(),
                    has_webhooks,
                );
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
                    user_id: req.key.user_id.clone(),
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
    pub(super) async fn begin(
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
            mut user,
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
        // An edit: the rewind to commit with the user event (a regenerate's user event is the
        // rewound turn's message).
        let mut rewind = None;
        if let Some(point) = &req.edit {
            let plan = self.plan_rewind(&req.key, point, &state).await?;
            if user.is_none() {
                let content = plan
                    .as_ref()
                    .and_then(|p| p.turn.clone())
                    .ok_or(RunError::NoTurn)?;
                user = Some(user_event(
                    invocation_id,
                    content,
                    &req.state_delta,
                    &req.run_config,
                ));
            }
            rewind = plan.map(|p| (p.event, p.writes));
        }
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
                    match rewind {
                        Some((mut rewind, writes)) => {
                            rewind.timestamp = user_event.timestamp;
                            let events = vec![(rewind, writes), (user_event, artifacts)];
                            match outbox.record_all(&mut st, events).await {
                                Ok(mut stored) => {
                                    let user = stored.pop();
                                    for s in stored {
                                        self.publish_user_event(&req.key, run_id, s);
                                    }
                                    user.ok_or_else(|| {
                                        StoreError::Corrupt("an edit committed no event".into())
                                    })
                                }
                                Err(e) => Err(e),
                            }
                        }
                        None => outbox.record(&mut st, user_event, artifacts).await,
                    }
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
    pub(super) fn publish_user_event(&self, key: &SessionKey, run_id: &str, stored: StoredEvent) {
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
    pub(super) async fn seal_dead_runs(
        &self,
        key: &SessionKey,
        fence: Fence<'_>,
    ) -> Result<(), StoreError> {
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

    pub(super) fn root_name(&self, app: &str) -> String {
        self.apps
            .get(app)
            .and_then(|e| e.tree.as_ref().ok().map(|t| t.root().name().to_string()))
            .unwrap_or_else(|| "agentd".to_string())
    }

    pub(super) fn publish_sealed(&self, run: &RunRecord, sealed: Vec<(i64, Event)>) {
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

    pub(super) async fn create_session(&self, key: &SessionKey) -> Result<(), RunError> {
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
}

/// What admission left for [`Runner::begin`]: whether a dead run awaits sealing, the user
/// event if admission committed it, and the user event as built from the request.
pub(super) struct Opening {
    unsealed: bool,
    opened: Option<Box<Opened>>,
    user: Option<(Event, Vec<ArtifactWrite>)>,
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
