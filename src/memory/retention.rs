//! An app's `memory: ttl_days:`: memories not stated or updated for that long are forgotten,
//! with their revisions. Every replica runs the loop; each pass first takes the
//! `memory_ttl` turn ([`crate::store::turns`]), so the deployment scans once per period
//! whatever its number of replicas (on Citus the scan reads every shard).

use crate::store::turns::kind;
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the deployment looks for expired memories.
pub const PERIOD: Duration = Duration::from_secs(600);

/// An app whose memories expire.
#[derive(Debug, Clone)]
pub struct Expiring {
    pub app: String,
    pub ttl: Duration,
}

/// Starts the loop; it ends with `stop`.
pub fn spawn(store: Arc<dyn Store>, apps: Vec<Expiring>, every: Duration, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            if store
                .take_turn(kind::MEMORY_TTL, every)
                .await
                .unwrap_or(true)
            {
                expire(store.as_ref(), &apps).await;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    });
}

/// One pass over `apps`.
pub async fn expire(store: &dyn Store, apps: &[Expiring]) {
    let now = crate::event::now_ts();
    for a in apps {
        match store
            .expire_memories(&a.app, now - a.ttl.as_secs_f64())
            .await
        {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(app = %a.app, forgotten = n, "memories past the app's ttl forgotten")
            }
            Err(e) => {
                tracing::warn!(app = %a.app, error = %e, "expiring memories failed; the next pass tries again")
            }
        }
    }
}
