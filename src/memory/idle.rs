//! An app's `memory: idle_seconds:`: a session is added to memory once the conversation has
//! paused, not after every run. A run's start and end mark the session due (`memory_due`,
//! migrations/postgres/0021_memory_due.sql, written by [`crate::agent::memory_ingest`]); every
//! replica runs this sweep, which first takes the `memory_idle` turn ([`crate::store::turns`]),
//! so the deployment reads the due sessions about once per period whatever its number of
//! replicas (on Citus that read spans every shard; each later statement names one session).
//!
//! Each due session is claimed for [`CLAIM`] before it is added (raw, or through the app's
//! extraction model), and its row goes once it is added, only while the claim is still the
//! one taken: a run that ended meanwhile made the session due again, and it is added once
//! more after the next pause (from the session's memory mark, so only what is new). A replica
//! that dies mid-way loses nothing: its claim runs out and another replica takes the session.
//! A failed add is tried again when its claim runs out, [`MAX_ATTEMPTS`] times in all.
//!
//! A claimed session is added only once it has paused: no run of it going on, and its last
//! change older than the pause. Otherwise (the mark of a run's start whose end was never
//! marked: the replica died) it is due again when the pause would end ([`Sweep::pause_ends`]).

use crate::memory::extract::{ExtractError, Extraction};
use crate::model::embed::Embedder;
use crate::store::memory::due::DueSession;
use crate::store::turns::kind;
use crate::store::{SessionKey, Store, StoreError, StoreResult};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long one replica holds a due session: longer than an extraction may take (eight
/// calls of the extraction model at its timeout, in the common case far less).
pub const CLAIM: Duration = Duration::from_secs(900);

/// Claims of one session before its add is given up (logged): its model keeps failing.
pub const MAX_ATTEMPTS: i32 = 5;

/// Due sessions one pass reads.
pub const BATCH: usize = 32;

/// Sessions one replica adds at once.
pub const AT_ONCE: usize = 4;

/// An app whose sessions wait for a pause, with what adding one takes.
#[derive(Clone)]
pub struct IdleApp {
    pub app: String,
    /// `idle_seconds`.
    pub idle: Duration,
    pub embedder: Option<Arc<dyn Embedder>>,
    pub extraction: Option<Arc<Extraction>>,
}

/// How often the sweep looks: a quarter of the shortest pause, from 1 s to a minute, so a
/// session is added within about a quarter of its pause after it is due.
pub fn period(idle: impl Iterator<Item = Duration>) -> Duration {
    idle.min()
        .map(|d| d / 4)
        .unwrap_or(Duration::from_secs(60))
        .clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// The sweep of one replica.
pub struct Sweep {
    pub store: Arc<dyn Store>,
    pub apps: Vec<IdleApp>,
    pub prices: Arc<crate::usage::Prices>,
    pub every: Duration,
}

impl Sweep {
    /// Starts the loop; it ends with `stop` (an add in flight is dropped: its claim runs out).
    pub fn spawn(self, stop: CancellationToken) {
        tokio::spawn(async move {
            // A pass that took a full batch scans again without waiting for a turn.
            let mut more = false;
            loop {
                let go = more
                    || self
                        .store
                        .take_turn(kind::MEMORY_IDLE, self.every)
                        .await
                        .unwrap_or(true);
                more = false;
                if go {
                    let pass = tokio::select! {
                        _ = stop.cancelled() => return,
                        pass = self.pass() => pass,
                    };
                    match pass {
                        Ok(read) => more = read == BATCH,
                        Err(e) => {
                            tracing::warn!(error = %e, "reading the sessions due for memory failed; the next pass tries again")
                        }
                    }
                }
                if !more {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(self.every) => {}
                    }
                }
            }
        });
    }

    /// One pass: the sessions due now, each claimed and added. How many were read.
    pub async fn pass(&self) -> StoreResult<usize> {
        let due = self
            .store
            .due_memories(crate::event::now_ts(), BATCH)
            .await?;
        let read = due.len();
        futures::stream::iter(due)
            .for_each_concurrent(AT_ONCE, |d| self.take(d))
            .await;
        Ok(read)
    }

    /// Claims `due` and adds its session; errors are logged (the claim then runs out and the
    /// session is taken again).
    async fn take(&self, due: DueSession) {
        let key = &due.key;
        let until = crate::event::now_ts() + CLAIM.as_secs_f64();
        match self.store.claim_memory_due(&due, until).await {
            Ok(true) => {}
            // Another replica took it, or a run ended since it was read.
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(error = %e, session = %key.session_id, "could not claim a session due for memory");
                return;
            }
        }
        // An app that no longer waits for pauses (its `agentd.yaml` changed, or it is no
        // longer served): its sessions are added as its settings now say (after each run, or
        // by PATCH), so its row is only dropped.
        let app = self.apps.iter().find(|a| a.app == key.app_name);
        let done = match app {
            None => {
                tracing::info!(app = %key.app_name, session = %key.session_id, "a due session of an app that no longer waits for pauses; dropped");
                true
            }
            Some(_) if due.attempts >= MAX_ATTEMPTS => {
                tracing::warn!(app = %key.app_name, session = %key.session_id, attempts = due.attempts, "adding the session to memory failed every time; given up until its next run");
                true
            }
            Some(app) => match self.pause_ends(key, app.idle).await {
                Ok(Some(at)) => {
                    if let Err(e) = self.store.rearm_memory_due(key, until, at).await {
                        tracing::warn!(error = %e, session = %key.session_id, "could not put off a session that has not paused; its claim runs out first");
                    }
                    return;
                }
                Ok(None) => match self.add(app, key).await {
                    Ok(()) => true,
                    // The session was deleted: nothing to add.
                    Err(ExtractError::Store(StoreError::SessionNotFound)) => true,
                    Err(e) => {
                        tracing::warn!(app = %key.app_name, session = %key.session_id, error = %e, "could not add the paused session to memory; tried again later");
                        false
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, session = %key.session_id, "could not read whether the session paused; tried again later");
                    false
                }
            },
        };
        if done {
            if let Err(e) = self.store.clear_memory_due(key, until).await {
                tracing::warn!(error = %e, session = %key.session_id, "could not clear a session due for memory; it is added again (nothing new)");
            }
        }
    }

    /// When the session's pause will end, if it has not yet: a run of it is going on (its
    /// end marks the session again; this is in case it never does), or its last change is
    /// newer than `idle`. `None` when it has paused, or is gone (the add finds that).
    async fn pause_ends(&self, key: &SessionKey, idle: Duration) -> StoreResult<Option<f64>> {
        let now = crate::event::now_ts();
        let idle = idle.as_secs_f64();
        let Some(head) = self.store.session_head(key).await? else {
            return Ok(None);
        };
        if self.store.active_run(key).await?.is_some() {
            return Ok(Some(now + idle));
        }
        let ends = head.last_update_time + idle;
        Ok((ends > now).then_some(ends))
    }

    async fn add(&self, app: &IdleApp, key: &SessionKey) -> Result<(), ExtractError> {
        crate::memory::add_session(
            self.store.as_ref(),
            app.embedder.as_deref(),
            app.extraction.as_deref(),
            &self.prices,
            key,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_a_quarter_of_the_shortest_pause_within_bounds() {
        let s = Duration::from_secs;
        assert_eq!(period([s(600), s(120)].into_iter()), s(30));
        assert_eq!(period([s(2)].into_iter()), s(1));
        assert_eq!(period([s(86_400)].into_iter()), s(60));
        assert_eq!(period(std::iter::empty()), s(60));
    }
}
