//! Compaction after a run (ADK's `EventsCompactionConfig`, the app's `compaction:` block):
//! when a completed run leaves enough new turns, the due range is summarised by the app's
//! compaction model and one event with `actions.compaction` is committed; models then read
//! the summary instead of the range ([`crate::run::compaction`]).
//!
//! It runs on the runner's tracker, off the request path. The summary is written without
//! holding the session (the range is history and does not change), then the session is taken
//! like a run for the commit, fenced by that ownership: a run that started meanwhile makes it
//! give up (the next run's end tries again), and a rewind committed meanwhile voids it. A
//! failure leaves the history uncompacted; it is logged and counted.

use super::{RunError, Runner};
use crate::apps::settings::Compaction;
use crate::event::{Content, Event, JsonMap, Part};
use crate::model::{Delta, LlmRequest};
use crate::run::compaction::{compaction_event, compaction_of, due_range, prompt};
use crate::store::{EventRange, Fence, RunStatus, SessionKey};
use futures::StreamExt;
use std::sync::Arc;
use tracing::Instrument;

/// Events read per page.
const PAGE: u32 = 1000;

/// Why a compaction did not land.
#[derive(Debug, thiserror::Error)]
enum CompactError {
    #[error("the summariser failed: {0}")]
    Model(String),
    #[error("the summariser answered no text")]
    Empty,
    #[error(transparent)]
    Run(#[from] RunError),
}

impl From<crate::store::StoreError> for CompactError {
    fn from(e: crate::store::StoreError) -> Self {
        CompactError::Run(e.into())
    }
}

impl Runner {
    /// After a completed run of `key`'s app: compacts the session if its app asks and a range
    /// is due, in the background.
    pub(super) fn compact_later(self: &Arc<Self>, key: &SessionKey) {
        let Some(c) = self
            .apps
            .get(&key.app_name)
            .and_then(|e| e.compaction.clone())
        else {
            return;
        };
        let runner = self.clone();
        let key = key.clone();
        let span = tracing::info_span!("compaction", app = %key.app_name, user = %key.user_id, session = %key.session_id);
        self.tracker.spawn(
            async move {
                let outcome = match runner.compact(&key, &c).await {
                    Ok(Some(seq)) => {
                        tracing::info!(seq, "session compacted");
                        "compacted"
                    }
                    Ok(None) => return,
                    Err(CompactError::Run(RunError::Busy(run))) => {
                        tracing::debug!(%run, "compaction deferred: a run holds the session");
                        "deferred"
                    }
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

    /// Compacts `key` if a range is due; returns the compaction event's seq.
    async fn compact(
        self: &Arc<Self>,
        key: &SessionKey,
        c: &Compaction,
    ) -> Result<Option<i64>, CompactError> {
        let (events, read_to) = self.read_live(key).await?;
        let Some(range) = due_range(&events, &c.policy) else {
            return Ok(None);
        };
        let covered: Vec<Event> = events[range]
            .iter()
            .filter(|e| compaction_of(e).is_none())
            .cloned()
            .collect();
        let (summary, usage) = summarise(c, &covered).await?;
        let event = compaction_event(&covered, summary, usage);

        let held = self.hold(key).await?;
        let run_id = held.run_id.clone();
        let committed = async {
            if held.unsealed {
                self.seal_dead_runs(key, Fence::Run(&run_id)).await?;
            }
            // A rewind since the read may have annulled part of the range.
            let since = self
                .store
                .list_events(
                    key,
                    EventRange {
                        after: Some(read_to),
                        before: None,
                        limit: PAGE,
                    },
                )
                .await?
                .map(|p| p.events)
                .unwrap_or_default();
            if since
                .iter()
                .any(|e| e.event.actions.rewind_before_invocation_id.is_some())
            {
                return Ok(None);
            }
            let stored = self
                .store
                .append_fenced(key, event, vec![], Fence::RunEnd(&run_id))
                .await?;
            Ok::<_, CompactError>(Some(stored))
        }
        .await;
        match committed {
            Ok(Some(stored)) => {
                held.guard.finished();
                self.publish_held(key, &run_id, &stored);
                Ok(Some(stored.seq))
            }
            Ok(None) => {
                held.guard.finish(RunStatus::Completed, None, None).await;
                Ok(None)
            }
            Err(e) => {
                held.guard
                    .finish(RunStatus::Failed, None, Some(&e.to_string()))
                    .await;
                Err(e)
            }
        }
    }

    /// The session's events as a model reads them (rewinds applied), and the last seq read.
    async fn read_live(&self, key: &SessionKey) -> Result<(Vec<Event>, i64), CompactError> {
        let mut events: Vec<Event> = vec![];
        let mut after = 0;
        loop {
            let page = self
                .store
                .list_events(
                    key,
                    EventRange {
                        after: Some(after),
                        before: None,
                        limit: PAGE,
                    },
                )
                .await?
                .ok_or_else(|| RunError::SessionNotFound(key.session_id.clone()))?;
            after = page.events.last().map_or(after, |e| e.seq);
            events.extend(page.events.into_iter().map(|s| s.event));
            if !page.has_more {
                break;
            }
        }
        let live = crate::run::rewind::live(&events);
        let mut keep = live.into_iter();
        events.retain(|_| keep.next().unwrap_or(true));
        Ok((events, after))
    }
}

/// Asks the app's compaction model for a summary of `events`; the text and token counts.
async fn summarise(
    c: &Compaction,
    events: &[Event],
) -> Result<(String, Option<serde_json::Value>), CompactError> {
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
            Delta::Usage(u) => usage = Some(u.to_json()),
            _ => {}
        }
    }
    if text.trim().is_empty() {
        return Err(CompactError::Empty);
    }
    Ok((text, usage))
}
