//! `--memory-auto-ingest`: a runner plugin that adds each run's session to memory when the run
//! ends, so `load_memory` and `GET …/memory` find a conversation without a `PATCH …/memory`.
//!
//! Adding is idempotent and incremental (only events after the session's memory watermark
//! are read), so doing it after every run is cheap. For an app with `memory: {mode:
//! extract}` it is a call of the extraction model, made in the background so the run's end
//! does not wait for it; a replica that dies first loses nothing, as the session's mark moves
//! only with what was extracted, and the next add reads the same events. It never fails a
//! run: errors are logged.

use crate::agent::{InvocationContext, Plugin};
use async_trait::async_trait;
use tracing::Instrument;

/// Adds the run's session to memory after every run, whatever the run's outcome.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryIngestPlugin;

impl MemoryIngestPlugin {
    pub const NAME: &'static str = "agentd_memory_ingest";
}

#[async_trait]
impl Plugin for MemoryIngestPlugin {
    fn name(&self) -> &str {
        Self::NAME
    }

    async fn after_run(&self, ctx: &InvocationContext) {
        let key = ctx.session_key().clone();
        let store = ctx.store().clone();
        let embedder = ctx.embedder().cloned();
        let extraction = ctx.memory_extraction().cloned();
        let background = extraction.is_some();
        let add = async move {
            let added = crate::memory::add_session(
                store.as_ref(),
                embedder.as_deref(),
                extraction.as_deref(),
                &key,
            );
            if let Err(e) = added.await {
                tracing::warn!(
                    error = %e,
                    session = %key.session_id,
                    "could not add the session to memory"
                );
            }
        };
        if background {
            tokio::spawn(add.instrument(tracing::Span::current()));
        } else {
            add.await;
        }
    }
}
