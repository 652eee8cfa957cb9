//! The third stage: with the session held, the run gets what its agent works with. Dead
//! predecessors are sealed, the state is read (only now, so a run that finished while this
//! request waited is seen), the run's outbox and invocation context are built and the user
//! event is committed. When admission already committed the user event and read the state
//! (the usual case), none of that touches the database again.

use super::super::bus::{BusMsg, BusTap};
use super::super::control::StopCause;
use super::super::{OnDisconnect, RunError, RunHandle, Runner, RUN_BUFFER};
use super::admit::Admitted;
use super::prepare::user_event;
use super::{seal, RunGuard};
use crate::invocation::{AgentTree, ContextParts, InvocationContext};
use crate::store::{SessionKey, StoreError, StoredEvent};
use crate::transcript::{temp_keys, Meter, Outbox, OutboxParts, RunItem, RunObserver};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A run whose user event is committed: its agent can start.
pub(in crate::runner) struct Begun {
    pub(super) runner: Arc<Runner>,
    pub(super) tree: Arc<AgentTree>,
    pub(super) ctx: InvocationContext,
    pub(super) outbox: Arc<Outbox>,
    pub(super) guard: RunGuard,
    pub(super) max_duration: Option<Duration>,
    pub(super) cancel: CancellationToken,
    pub(super) cause: Arc<Mutex<Option<StopCause>>>,
    /// The id of the API key the run is charged to (so is the compaction its end starts).
    pub(super) api_key: Option<String>,
    /// What the caller's [`RunHandle`] is made of, until it takes it.
    handle: Option<(mpsc::Receiver<RunItem>, bool)>,
    run_id: String,
}

impl Admitted {
    /// Builds the run's context and commits its user event. A failure frees the session again
    /// (nothing of the run was stored but a user event admission committed, which followers
    /// are told of).
    pub(super) async fn begin(self) -> Result<Begun, RunError> {
        match self.prepare().await {
            Ok(begun) => Ok(begun),
            Err(failed) => {
                let (guard, e) = *failed;
                guard.never_began(&e).await;
                Err(e)
            }
        }
    }

    /// [`Admitted::begin`]; a failure hands the guard back with its error.
    async fn prepare(self) -> Result<Begun, Box<(RunGuard, RunError)>> {
        let Admitted {
            runner,
            req,
            tree,
            run_id,
            invocation_id,
            guard,
            unsealed,
            opened,
            mut user,
            cancel,
            cause,
            boundary,
            resumed,
            budget,
        } = self;
        let key = req.key.clone();
        let fail = |guard, e: RunError| Err(Box::new((guard, e)));
        if unsealed {
            let fence = crate::store::Fence::Run(&run_id, guard.epoch());
            if let Err(e) = seal::seal_dead_runs(&runner, &key, fence).await {
                return fail(guard, e.into());
            }
        }
        let state = match opened.as_ref().and_then(|o| o.state.clone()) {
            Some(state) => state,
            None => match runner.sessions.session_head(&key).await {
                Ok(Some(head)) => head.state,
                failed => {
                    // Followers learn of a user event committed by admission even though
                    // this run fails to start after it.
                    if let Some(opened) = opened {
                        publish_user_event(&runner, &key, &run_id, opened.stored);
                    }
                    let e = match failed {
                        Err(e) => e.into(),
                        Ok(_) => RunError::SessionNotFound(key.session_id.clone()),
                    };
                    return fail(guard, e);
                }
            },
        };
        // An edit: the rewind to commit with the user event (a regenerate's user event is the
        // rewound turn's message).
        let mut rewind = None;
        if let Some(point) = &req.edit {
            let plan = match runner.plan_rewind(&key, point, &state).await {
                Ok(plan) => plan,
                Err(e) => return fail(guard, e.into()),
            };
            if user.is_none() {
                let Some(content) = plan.as_ref().and_then(|p| p.turn.clone()) else {
                    return fail(guard, RunError::NoTurn);
                };
                user = Some(user_event(
                    &invocation_id,
                    content,
                    &req.state_delta,
                    &req.run_config,
                ));
            }
            rewind = plan.map(|p| (p.event, p.writes));
        }
        let (tx, rx) = mpsc::channel(RUN_BUFFER);
        let observer: Arc<dyn RunObserver> = Arc::new(BusTap {
            bus: runner.bus.clone(),
            key: key.clone(),
            run_id: run_id.as_str().into(),
            started: std::time::Instant::now(),
            first_event: std::sync::atomic::AtomicBool::new(false),
        });
        let cancel_on_disconnect = req.on_disconnect == OnDisconnect::Cancel;
        let meter = Arc::new(Meter::new(
            runner.config.prices.clone(),
            budget,
            resumed.as_ref().and_then(|r| r.usage.clone()),
            req.api_key.is_some(),
        ));
        let mut guard = guard;
        guard.metered(meter.clone());
        let outbox = Outbox::new(OutboxParts {
            invocation_id: invocation_id.clone(),
            key: key.clone(),
            sessions: runner.sessions.clone(),
            cancel: cancel.clone(),
            cancel_on_disconnect,
            run_id: Some(run_id.clone()),
            epoch: guard.epoch(),
            last_seq: resumed.as_ref().map(|r| r.session_seq),
            boundary,
            observer: Some(observer),
            state,
            out: tx,
            meter: Some(meter.clone()),
        });
        let user_content = match &resumed {
            Some(r) => r.user_content.clone(),
            None => user.as_ref().and_then(|(e, _)| e.content.clone()),
        };
        let app = runner.apps.get(&key.app_name);
        let ctx = InvocationContext::new(ContextParts {
            user_content,
            run_config: req.run_config.clone(),
            cancel: cancel.clone(),
            tree: tree.clone(),
            plugins: runner.plugins.clone(),
            outbox: outbox.clone(),
            store: runner.store.clone(),
            context_cache: app.and_then(|a| a.context_cache),
            memory: app.map(|a| a.memory.clone()).unwrap_or_default(),
        });
        runner.bus.run_started(&key, &run_id, &invocation_id);
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
                                        publish_user_event(&runner, &key, &run_id, s);
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
                Ok(stored) => publish_user_event(&runner, &key, &run_id, stored),
                Err(StoreError::SessionNotFound) => {
                    return fail(guard, RunError::SessionNotFound(key.session_id.clone()))
                }
                Err(e) => return fail(guard, e.into()),
            }
        }
        Ok(Begun {
            runner,
            tree,
            ctx,
            outbox,
            guard,
            max_duration: req.max_duration,
            cancel,
            cause,
            api_key: req.api_key.map(|k| k.id),
            handle: Some((rx, cancel_on_disconnect)),
            run_id,
        })
    }
}

impl Begun {
    /// The caller's handle on the run: its ids and items. Taken once.
    pub(super) fn handle(&mut self) -> RunHandle {
        let (items, cancel_on_disconnect) = self
            .handle
            .take()
            .unwrap_or_else(|| (mpsc::channel(1).1, false));
        let key = self.ctx.session_key();
        RunHandle {
            run_id: self.run_id.clone(),
            user_id: key.user_id.clone(),
            invocation_id: self.ctx.invocation_id().to_string(),
            items,
            guard: cancel_on_disconnect.then(|| self.cancel.clone().drop_guard()),
        }
    }
}

/// Tells the session's followers that a run's user event is committed (it is not part of the
/// run's own stream).
pub(in crate::runner) fn publish_user_event(
    runner: &Runner,
    key: &SessionKey,
    run_id: &str,
    stored: StoredEvent,
) {
    runner.bus.publish(
        key,
        BusMsg::Committed {
            run_id: Some(run_id.into()),
            seq: stored.seq,
            event: Some(Arc::new(stored.event)),
            in_run_stream: false,
        },
    );
}
