//! Compaction after a run (ADK's `EventsCompactionConfig`, the app's `compaction:` block):
//! when a completed run leaves enough new turns, the due range is summarised by the app's
//! compaction model and one event with `actions.compaction` is committed; models then read
//! the summary instead of the range ([`crate::transcript::compaction`]).
//!
//! Whether a summary is due is read as the run ends (after its final event is committed); the
//! session is then claimed for the compaction before the run's client hears of the end (a run
//! from elsewhere that claims it first defers the compaction to that run's end).
//! The summary is written on the runner's tracker, off the request path, with the session held
//! like a run (no run or rewind can interleave; a run that arrives meanwhile waits for it,
//! whatever its `onBusy`), bounded in time, stopped by a cancel or a replica stop, and
//! committed fenced by that ownership. A failure leaves the history uncompacted; it is logged
//! and counted.

use super::super::{RunError, Runner};
use crate::apps::settings::Compaction;
use crate::event::{Content, Event, JsonMap, Part};
use crate::model::{Delta, LlmRequest};
use crate::store::{EventRange, Fence, RunStatus, SessionKey};
use crate::transcript::compaction::{compaction_event, compaction_of, due_range, prompt};
use futures::StreamExt;
use std::sync::Arc;
use tracing::Instrument;

/// The due check reads back from the newest event, at most this many pages of this size.
const DUE_PAGES: usize = 5;
const DUE_PAGE: u32 = 200;

/// Why a compaction did not land.
#[derive(Debug, thiserror::Error)]
enum CompactError {
    #[error("the summariser failed: {0}")]
    Model(String),
    #[error("the summariser answered no text")]
    Empty,
    #[error("stopped: {0}")]
    Stopped(String),
    #[error(transparent)]
    Run(#[from] RunError),
}

impl From<crate::store::StoreError> for CompactError {
    fn from(e: crate::store::StoreError) -> Self {
        match e {
            // The summary's commit was refused: the session's run was cancelled first.
            crate::store::StoreError::CancelRequested => {
                CompactError::Stopped("the session's run was cancelled".into())
            }
            e => CompactError::Run(e.into()),
        }
    }
}

impl Runner {
    /// The app's compaction, if a summary of `key` is due: a look back from the newest events
    /// to the last summary (at most [`DUE_PAGES`] pages), made as the run ends.
    pub(in crate::runner) async fn compaction_due(&self, key: &SessionKey) -> Option<Compaction> {
        let c = self.apps.get(&key.app_name)?.compaction.clone()?;
        let window = self.recent_live(key).await.ok()?;
        due_range(&window, &c.policy).map(|_| c)
    }

    /// The session's newest events back to the last summary still in force (at most
    /// [`DUE_PAGES`] pages of [`DUE_PAGE`]), oldest first, without what rewinds annulled (found
    /// by the database, so a rewind of a turn older than the window counts too): all a due
    /// range can need, bounded however long the session is.
    async fn recent_live(&self, key: &SessionKey) -> Result<Vec<Event>, CompactError> {
        let rewound = self.store.rewound(key, i64::MAX).await?;
        let live = |seq: i64| !rewound.hides(seq);
        let mut window: Vec<Event> = vec![];
        // Newest first: each page ends just before the previous one.
        let mut before = Some(i64::MAX);
        for _ in 0..DUE_PAGES {
            let page = self
                .sessions
                .list_events(
                    key,
                    EventRange {
                        after: None,
                        before,
                        limit: DUE_PAGE,
                    },
                )
                .await?
                .ok_or_else(|| RunError::SessionNotFound(key.session_id.clone()))?;
            before = page.events.first().map(|e| e.seq);
            let summary = page
                .events
                .iter()
                .any(|e| live(e.seq) && compaction_of(&e.event).is_some());
            let more = page.has_more;
            let mut older: Vec<Event> = page
                .events
                .into_iter()
                .filter(|e| live(e.seq))
                .map(|e| e.event)
                .collect();
            older.append(&mut window);
            window = older;
            if summary || !more {
                break;
            }
        }
        Ok(window)
    }

    /// Takes the session for a due compaction as the run ends (before its client hears of
    /// the end), then summarises and commits in the background.
    pub(in crate::runner) async fn compact_after(
        self: &Arc<Self>,
        key: &SessionKey,
        c: Compaction,
        api_key: Option<String>,
    ) {
        if self.is_draining() {
            return;
        }
        // The summary is charged to the key whose run made it due.
        let held = match self.hold(key, api_key).await {
            Ok(held) => held,
            Err(e) => {
                tracing::debug!(error = %e, "compaction deferred: the session is taken");
                metrics::counter!("agentd_compactions_total", "outcome" => "deferred").increment(1);
                return;
            }
        };
        let runner = self.clone();
        let key = key.clone();
        let span = tracing::info_span!("compaction", app = %key.app_name, user = %key.user_id, session = %key.session_id, run = %held.run_id);
        self.tracker.spawn(
            async move {
                let outcome = match runner.compact(&key, &c, held).await {
                    Ok(Some(seq)) => {
                        tracing::info!(seq, "session compacted");
                        "compacted"
                    }
                    Ok(None) => "not_due",
                    Err(e) => {
                        tracing::warn!(error = %e, "compaction failed; the history stays as it was");
                        "failed"
                    }
                };
                metrics::counter!("agentd_compactions_total", "outcome" => outcome).increment(1);
            }
            .instrument(span),
        );
    }

    /// With the session held: the due range, its summary, the commit (fenced by the hold).
    /// Bounded by half the enqueue timeout (runs that arrive meanwhile wait for it), and
    /// stopped by a cancel of the session's run or a replica stop.
    async fn compact(
        self: &Arc<Self>,
        key: &SessionKey,
        c: &Compaction,
        held: super::hold::Held,
    ) -> Result<Option<i64>, CompactError> {
        let (run_id, keyed) = (held.run_id.clone(), held.keyed);
        let limit = self.config.enqueue_timeout / 2;
        let work = async {
            if held.unsealed {
                super::super::life::seal::seal_dead_runs(self, key, Fence::Run(&run_id, 0)).await?;
            }
            let events = self.recent_live(key).await?;
            let Some(range) = due_range(&events, &c.policy) else {
                return Ok(None);
            };
            let covered: Vec<Event> = events[range]
                .iter()
                .filter(|e| compaction_of(e).is_none())
                .cloned()
                .collect();
            let (summary, usage) = summarise(c, &covered).await?;
            // The summary's tokens are spent by the user (and the key of the run that made it
            // due) too: the commit that ends the hold adds them to the aggregates
            // (docs/usage.md). No budget is checked before it: the run that made it due was.
            let spent = usage.map(|u| {
                let mut spent = crate::usage::RunUsage::default();
                spent.record(c.model.name(), u.tokens(), &self.config.prices);
                spent
            });
            let event = compaction_event(&covered, summary, usage.map(|u| u.to_json()));
            let stored = self
                .sessions
                .append_metered(
                    key,
                    event,
                    vec![],
                    Fence::RunEnd(&run_id, 0),
                    spent
                        .as_ref()
                        .map(|usage| crate::store::Metered { usage, keyed }),
                )
                .await?;
            Ok::<_, CompactError>(Some(stored))
        };
        let committed = tokio::select! {
            done = tokio::time::timeout(limit, work) => match done {
                Ok(result) => result,
                Err(_) => Err(CompactError::Stopped(format!("it took longer than {} s", limit.as_secs()))),
            },
            _ = held.cancel.cancelled() => Err(CompactError::Stopped("the session's run was cancelled".into())),
            _ = self.draining.cancelled() => Err(CompactError::Stopped("the replica is stopping".into())),
        };
        match committed {
            Ok(Some(stored)) => {
                held.guard.finished();
                self.publish_held(key, &run_id, &stored);
                Ok(Some(stored.seq))
            }
            Ok(None) => {
                self.release_held(key, held, RunStatus::Completed, None)
                    .await;
                Ok(None)
            }
            Err(e) => {
                let status = match e {
                    CompactError::Stopped(_) => RunStatus::Cancelled,
                    _ => RunStatus::Failed,
                };
                self.release_held(key, held, status, Some(&e.to_string()))
                    .await;
                Err(e)
            }
        }
    }
}

/// Asks the app's compaction model for a summary of `events`; the text and token counts.
async fn summarise(
    c: &Compaction,
    events: &[Event],
) -> Result<(String, Option<crate::model::Usage>), CompactError> {
    let request = LlmRequest {
        model: c.model.name().to_string(),
        contents: vec![Content {
            role: Some("user".into()),
            parts: vec![Part::text(prompt(&c.prompt, events))],
            extra: JsonMap::new(),
        }],
        ..Default::default()
    };
    let mut stream = c
        .model
        .stream(&request)
        .await
        .map_err(|e| CompactError::Model(e.to_string()))?;
    let mut text = String::new();
    let mut usage = None;
    while let Some(delta) = stream.next().await {
        match delta.map_err(|e| CompactError::Model(e.to_string()))? {
            Delta::Text(t) => text.push_str(&t),
            Delta::Usage(u) => usage = Some(u),
            _ => {}
        }
    }
    if text.trim().is_empty() {
        return Err(CompactError::Empty);
    }
    Ok((text, usage))
}
