//! Rewinding a session (ADK's `rewind_async`): one event that annuls the turns from an
//! invocation on and restores the session's plain state and its artifacts as of just before
//! it (the computation is [`crate::transcript::rewind`]'s). A rewind takes the session like a run:
//! admitted in the database (a busy session is refused, waited for or interrupted, by
//! `onBusy`), its event committed fenced by that
//! ownership, in the same commit as the run's end; a dead predecessor is sealed first.

use super::super::{EditPoint, RunError, Runner};
use crate::event::{new_invocation_id, Blob, Bytes64, Event, Part};
use crate::store::{
    ArtifactScope, ArtifactWrite, EventRange, Fence, RunStatus, SessionKey, StoreError, StoredEvent,
};
use crate::transcript::rewind::{changes_from, delta_from, fold_state, is_user_turn};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Events read per page while reading the session.
const PAGE: u32 = 1000;

/// Why a rewind did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RewindError {
    #[error("Invocation not found in the session: {0}")]
    InvocationNotFound(String),
    #[error("seq {0} is not in the session (its events are 0 to {1})")]
    SeqOutOfRange(i64, i64),
    #[error("the session has no user turn to regenerate")]
    NoTurn,
    #[error(transparent)]
    Run(#[from] RunError),
}

impl From<RewindError> for RunError {
    fn from(e: RewindError) -> Self {
        match e {
            RewindError::InvocationNotFound(inv) => RunError::InvocationNotFound(inv),
            RewindError::NoTurn => RunError::NoTurn,
            e @ RewindError::SeqOutOfRange(..) => RunError::Internal(e.to_string()),
            RewindError::Run(e) => e,
        }
    }
}

impl From<crate::store::StoreError> for RewindError {
    fn from(e: crate::store::StoreError) -> Self {
        RewindError::Run(e.into())
    }
}

impl Runner {
    /// Appends a rewind event to before `invocation`'s first event; returns it as stored. A
    /// session a run holds is refused, waited for or interrupted, as `on_busy` says.
    pub async fn rewind(
        self: &Arc<Self>,
        key: &SessionKey,
        invocation: &str,
        on_busy: super::super::OnBusy,
    ) -> Result<StoredEvent, RewindError> {
        if self.is_draining() {
            return Err(RunError::ShuttingDown.into());
        }
        if self.sessions.session_head(key).await?.is_none() {
            return Err(RunError::SessionNotFound(key.session_id.clone()).into());
        }
        if self
            .sessions
            .invocation_events(key, invocation, -1, 1)
            .await?
            .events
            .is_empty()
        {
            return Err(RewindError::InvocationNotFound(invocation.to_string()));
        }
        let held = self.hold_when_free(key, on_busy).await?;
        let run_id = held.run_id.clone();
        match self
            .rewind_owned(key, invocation, &run_id, held.unsealed)
            .await
        {
            Ok(stored) => {
                held.guard.finished();
                metrics::counter!("agentd_rewinds_total").increment(1);
                tracing::info!(run = %run_id, before = %invocation, seq = stored.seq, "session rewound");
                self.publish_held(key, &run_id, &stored);
                Ok(stored)
            }
            Err(e) => {
                // A stop of the session's run accepted first cancels the rewind.
                let status = match &e {
                    RewindError::Run(RunError::Store(StoreError::CancelRequested)) => {
                        RunStatus::Cancelled
                    }
                    _ => RunStatus::Failed,
                };
                self.release_held(key, held, status, Some(&e.to_string()))
                    .await;
                Err(e)
            }
        }
    }

    /// The rewind itself, with the session held.
    async fn rewind_owned(
        self: &Arc<Self>,
        key: &SessionKey,
        invocation: &str,
        run_id: &str,
        unsealed: bool,
    ) -> Result<StoredEvent, RewindError> {
        if unsealed {
            super::super::life::seal::seal_dead_runs(self, key, Fence::Run(run_id, 0)).await?;
        }
        let head = self
            .sessions
            .session_head(key)
            .await?
            .ok_or_else(|| RunError::SessionNotFound(key.session_id.clone()))?;
        let point = EditPoint::Invocation(invocation.to_string());
        let plan = self
            .plan_rewind(key, &point, &head.state)
            .await?
            .ok_or_else(|| RewindError::InvocationNotFound(invocation.to_string()))?;
        let stored = self
            .sessions
            .append_fenced(key, plan.event, plan.writes, Fence::RunEnd(run_id, 0))
            .await?;
        Ok(stored)
    }

    /// The rewind event (and the artifact versions it writes) that takes the session back to
    /// before the turn `point` names, and that turn's user message. `None` when a
    /// [`EditPoint::Turn`] is past the session's turns. `state` is the session's state now.
    pub(in crate::runner) async fn plan_rewind(
        &self,
        key: &SessionKey,
        point: &EditPoint,
        state: &crate::event::JsonMap,
    ) -> Result<Option<RewindPlan>, RewindError> {
        // The session is read a page at a time, never held whole: first where the point is,
        // then the state and artifact versions as of it.
        let at = match point {
            EditPoint::Invocation(inv) => self
                .sessions
                .invocation_events(key, inv, -1, 1)
                .await?
                .events
                .first()
                .map(|e| e.seq)
                .ok_or_else(|| RewindError::InvocationNotFound(inv.clone()))?,
            EditPoint::LastTurn | EditPoint::Turn(_) => {
                let rewound = self.store.rewound(key, i64::MAX).await?;
                let mut turns: Vec<i64> = vec![];
                self.each_page(key, |e| {
                    if !rewound.hides(e.seq) && is_user_turn(&e.event) {
                        turns.push(e.seq);
                    }
                })
                .await?;
                match point {
                    EditPoint::Turn(n) => match turns.get(n.saturating_sub(1)) {
                        Some(&seq) if *n > 0 => seq,
                        _ => return Ok(None),
                    },
                    _ => *turns.last().ok_or(RewindError::NoTurn)?,
                }
            }
        };
        // The state before the invocation: the state the session was created with, then every
        // delta before it (ADK starts from nothing and so nulls what the session was created
        // with; see docs/editing.md).
        let mut then = self.store.initial_state(key).await?;
        let mut versions_then: BTreeMap<String, i64> = BTreeMap::new();
        let mut versions_now: BTreeMap<String, i64> = BTreeMap::new();
        let mut invocation: Option<String> = None;
        let mut turn = None;
        self.each_page(key, |e| {
            let delta = &e.event.actions.artifact_delta;
            if e.seq < at {
                fold_state(&mut then, &e.event.actions.state_delta);
                versions_then.extend(delta.iter().map(|(f, v)| (f.clone(), *v)));
            }
            if e.seq == at {
                invocation = Some(e.event.invocation_id.clone());
            }
            if turn.is_none()
                && invocation.as_deref() == Some(e.event.invocation_id.as_str())
                && is_user_turn(&e.event)
            {
                turn = e.event.content.clone();
            }
            versions_now.extend(delta.iter().map(|(f, v)| (f.clone(), *v)));
        })
        .await?;
        let invocation = invocation.ok_or_else(|| {
            RunError::Internal(format!("the event at seq {at} is gone from the session"))
        })?;
        let delta = delta_from(&then, state);
        let scope = ArtifactScope::from(key);
        let mut writes = vec![];
        for (filename, then) in changes_from(&versions_then, &versions_now) {
            let part = match then {
                // It did not exist then: a new, empty version marks it deleted (as ADK does).
                None => Part {
                    inline_data: Some(Blob {
                        data: Bytes64(vec![]),
                        mime_type: Some("application/octet-stream".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                // Its content then, as a new version.
                Some(v) => self
                    .store
                    .load_artifact(&scope, &filename, Some(v))
                    .await?
                    .ok_or_else(|| {
                        RunError::Internal(format!("artifact {filename} version {v} is missing"))
                    })?,
            };
            writes.push(ArtifactWrite {
                filename,
                part,
                custom_metadata: Default::default(),
            });
        }
        let mut event = Event::new(new_invocation_id(), "user");
        event.actions.rewind_before_invocation_id = Some(invocation);
        event.actions.state_delta = delta;
        Ok(Some(RewindPlan {
            event,
            writes,
            turn,
        }))
    }
}

impl Runner {
    /// Calls `f` on each of the session's events, oldest first, a page at a time.
    async fn each_page(
        &self,
        key: &SessionKey,
        mut f: impl FnMut(&StoredEvent),
    ) -> Result<(), RewindError> {
        let mut after = None;
        loop {
            let page = self
                .sessions
                .list_events(
                    key,
                    EventRange {
                        after,
                        before: None,
                        limit: PAGE,
                    },
                )
                .await?
                .ok_or_else(|| RunError::SessionNotFound(key.session_id.clone()))?;
            page.events.iter().for_each(&mut f);
            after = page.events.last().map(|e| e.seq).or(after);
            if !page.has_more {
                return Ok(());
            }
        }
    }
}

/// What a rewind writes, and the message of the turn it goes back before.
pub(in crate::runner) struct RewindPlan {
    pub event: Event,
    pub writes: Vec<ArtifactWrite>,
    /// The user message that began the rewound turn (a regenerate runs it again).
    pub turn: Option<crate::event::Content>,
}
