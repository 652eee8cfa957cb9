//! Forking a session at a point: the new session gets the events before it, the state and the
//! artifact versions as of then ([`crate::store::fork`] copies in the database). The source is
//! only read: its events before the point never change, so no ownership is taken.

use super::super::{RunError, Runner};
use super::rewind::RewindError;
use crate::event::JsonMap;
use crate::store::fork::Fork;
use crate::store::{EventRange, SessionKey};
use std::collections::BTreeMap;

/// Events read per page while folding the source's state.
const PAGE: u32 = 1000;

/// Where a fork is cut.
#[derive(Debug, Clone)]
pub enum ForkPoint {
    /// The whole session as it is.
    End,
    /// Before the first event of this invocation.
    BeforeInvocation(String),
    /// Up to and including this seq.
    AtSeq(i64),
}

impl Runner {
    /// Forks `source` into `session_id` (same app and user) at `point`, with `state` merged
    /// over the state as of then; returns the new session's last seq.
    pub async fn fork(
        &self,
        source: &SessionKey,
        session_id: &str,
        point: ForkPoint,
        state: Option<JsonMap>,
    ) -> Result<i64, RewindError> {
        let head = self
            .sessions
            .session_head(source)
            .await?
            .ok_or_else(|| RunError::SessionNotFound(source.session_id.clone()))?;
        let plain = |m: &JsonMap| -> JsonMap {
            m.iter()
                .filter(|(k, _)| !k.starts_with("app:") && !k.starts_with("user:"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let before = match &point {
            ForkPoint::End => head.last_seq + 1,
            ForkPoint::AtSeq(n) if (0..=head.last_seq).contains(n) => n + 1,
            ForkPoint::AtSeq(n) => return Err(RewindError::SeqOutOfRange(*n, head.last_seq)),
            ForkPoint::BeforeInvocation(inv) => self
                .sessions
                .invocation_events(source, inv, -1, 1)
                .await?
                .events
                .first()
                .map(|e| e.seq)
                .ok_or_else(|| RewindError::InvocationNotFound(inv.clone()))?,
        };
        // The state and artifact versions as of the point, folded page by page over the state
        // the source was created with.
        let initial = self.store.initial_state(source).await?;
        let mut then = initial.clone();
        let mut artifacts: BTreeMap<String, i64> = BTreeMap::new();
        let mut after = None;
        loop {
            let page = self
                .sessions
                .list_events(
                    source,
                    EventRange {
                        after,
                        before: Some(before),
                        limit: PAGE,
                    },
                )
                .await?
                .ok_or_else(|| RunError::SessionNotFound(source.session_id.clone()))?;
            for stored in &page.events {
                let actions = &stored.event.actions;
                crate::transcript::rewind::fold_state(&mut then, &actions.state_delta);
                for (f, v) in &actions.artifact_delta {
                    if !f.starts_with("user:") {
                        artifacts.insert(f.clone(), *v);
                    }
                }
            }
            after = page.events.last().map(|e| e.seq).or(after);
            if !page.has_more || page.events.is_empty() {
                break;
            }
        }
        // The whole session: its state as it is (a session's initial state is no event).
        let mut state_then = match point {
            ForkPoint::End => plain(&head.state),
            _ => then,
        };
        let mut initial_state = initial;
        if let Some(extra) = state {
            state_then.extend(plain(&extra));
            initial_state.extend(plain(&extra));
        }
        let last_seq = self
            .store
            .fork_session(&Fork {
                source: source.clone(),
                session_id: session_id.to_string(),
                before,
                state: state_then,
                initial_state,
                artifacts,
            })
            .await?;
        metrics::counter!("agentd_forks_total").increment(1);
        Ok(last_seq)
    }
}
