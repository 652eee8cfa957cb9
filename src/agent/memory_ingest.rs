//! `--memory-auto-ingest`: a runner plugin that adds each run's session to memory when the run
//! ends, so `load_memory` and `GET …/memory` find a conversation without a `PATCH …/memory`.
//!
//! Adding is idempotent and incremental (only events after the session's memory watermark
//! are read), so doing it after every run is cheap. It never fails a run: errors are logged.

use crate::agent::{InvocationContext, Plugin};
use async_trait::async_trait;

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
        let key = ctx.session_key();
        match ctx.store().add_session_to_memory(key).await {
            Ok(added) => tracing::debug!(added, "session added to memory"),
            Err(e) => tracing::warn!(
                error = %e,
                session = %key.session_id,
                "could not add the session to memory"
            ),
        }
    }
}
