//! `--memory-auto-ingest`: a runner plugin that adds each run's session to memory when the run
//! ends, so `load_memory` and `GET …/memory` find a conversation without a `PATCH …/memory`.
//! For an app with `memory: idle_seconds:` (with or without the flag), the run's start and end
//! only mark the session due once it has paused that long; the sweep of
//! [`crate::memory::idle`] adds it then, on whichever replica takes it. The mark at the start
//! is what a replica that dies mid-run leaves behind (its run sealed by another replica, or
//! killed after the run's last commit): the session is still added after its pause.
//!
//! Adding is idempotent and incremental (only events after the session's memory watermark
//! are read), so doing it after every run is cheap. For an app with `memory: {mode:
//! extract}` it is a call of the extraction model, made in the background so the run's end
//! does not wait for it: one at a time per session (a run that ends while its session's
//! extraction is in flight has that extraction read on once more, instead of racing it and
//! paying for the same events twice), at most [`MAX_EXTRACTIONS`] at a time per replica (the
//! others are left to the session's next run or `PATCH`). A replica that dies first loses
//! nothing: the session's mark moves only with what was extracted, and the next add reads the
//! same events. It never fails a run: errors are logged.

use crate::agent::{AgentResult, InvocationContext, Plugin};
use crate::event::Content;
use crate::store::SessionKey;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tracing::Instrument;

/// Background extractions one replica runs at once.
pub const MAX_EXTRACTIONS: usize = 8;

/// Adds the run's session to memory after every run, whatever the run's outcome, or marks it
/// due for when it will have paused.
#[derive(Default)]
pub struct MemoryIngestPlugin {
    /// What the extraction model's calls cost (`--prices`).
    prices: Arc<crate::usage::Prices>,
    /// Sessions whose extraction is in flight here, and whether a run ended since it started.
    in_flight: Arc<Mutex<HashMap<SessionKey, bool>>>,
    /// `--memory-auto-ingest`: apps without `idle_seconds` add sessions as runs end.
    at_run_end: bool,
}

impl MemoryIngestPlugin {
    pub const NAME: &'static str = "agentd_memory_ingest";

    /// `at_run_end`: `--memory-auto-ingest` (apps with `idle_seconds` wait for the pause
    /// either way).
    pub fn new(prices: Arc<crate::usage::Prices>, at_run_end: bool) -> Self {
        MemoryIngestPlugin {
            prices,
            in_flight: Arc::default(),
            at_run_end,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes the session out of the in-flight set when its task ends, however it ends.
struct InFlight {
    set: Arc<Mutex<HashMap<SessionKey, bool>>>,
    key: SessionKey,
    /// Taken out already (by [`InFlight::again`]): the entry now in the set, if any, is
    /// another task's.
    left: bool,
}

impl InFlight {
    /// Whether a run ended since the last pass (and clears it); when not, the session leaves
    /// the set, in the same lock, so a run ending now starts a task of its own.
    fn again(&mut self) -> bool {
        let mut set = lock(&self.set);
        match set.get_mut(&self.key) {
            Some(again) if *again => {
                *again = false;
                true
            }
            _ => {
                set.remove(&self.key);
                self.left = true;
                false
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.left {
            lock(&self.set).remove(&self.key);
        }
    }
}

#[async_trait]
impl Plugin for MemoryIngestPlugin {
    fn name(&self) -> &str {
        Self::NAME
    }

    async fn before_run(&self, ctx: &InvocationContext) -> AgentResult<Option<Content>> {
        if let Some(idle) = ctx.memory_idle() {
            let key = ctx.session_key();
            let at = crate::event::now_ts() + idle.as_secs_f64();
            if let Err(e) = ctx.store().set_memory_due(key, at).await {
                tracing::warn!(error = %e, session = %key.session_id, "could not mark the session's memory due");
            }
        }
        Ok(None)
    }

    async fn after_run(&self, ctx: &InvocationContext) {
        let key = ctx.session_key().clone();
        let store = ctx.store().clone();
        if let Some(idle) = ctx.memory_idle() {
            let at = crate::event::now_ts() + idle.as_secs_f64();
            if let Err(e) = store.set_memory_due(&key, at).await {
                tracing::warn!(error = %e, session = %key.session_id, "could not mark the session's memory due");
            }
            return;
        }
        if !self.at_run_end {
            return;
        }
        let embedder = ctx.embedder().cloned();
        let Some(extraction) = ctx.memory_extraction().cloned() else {
            let added = crate::memory::add_session(
                store.as_ref(),
                embedder.as_deref(),
                None,
                &self.prices,
                &key,
            );
            if let Err(e) = added.await {
                tracing::warn!(error = %e, session = %key.session_id, "could not add the session to memory");
            }
            return;
        };
        {
            let mut set = lock(&self.in_flight);
            if let Some(again) = set.get_mut(&key) {
                *again = true;
                return;
            }
            if set.len() >= MAX_EXTRACTIONS {
                tracing::info!(session = %key.session_id, "memory extractions at their bound; this session waits for its next run or PATCH");
                return;
            }
            set.insert(key.clone(), false);
        }
        let mut guard = InFlight {
            set: self.in_flight.clone(),
            key: key.clone(),
            left: false,
        };
        let prices = self.prices.clone();
        let task = async move {
            loop {
                let added = crate::memory::add_session(
                    store.as_ref(),
                    embedder.as_deref(),
                    Some(&extraction),
                    &prices,
                    &guard.key,
                );
                if let Err(e) = added.await {
                    tracing::warn!(error = %e, session = %guard.key.session_id, "could not extract the session's memories");
                    return;
                }
                if !guard.again() {
                    return;
                }
            }
        };
        tokio::spawn(task.instrument(tracing::Span::current()));
    }
}
