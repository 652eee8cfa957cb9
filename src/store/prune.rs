//! Retention: deleting idle sessions (with their events, session artifacts, memory entries and
//! runs) and old finished runs, in small batches.
//!
//! Sessions are visited in primary-key order a page at a time, so no new index is needed on the
//! hot path and no statement holds many locks for long. Each page's deletions are one short
//! transaction, and a session is deleted only if it is still idle and no run owns it at that
//! moment (the DELETE re-checks both), so pruning never races a run.
//!
//! The statements are per database: [`super::postgres`] and [`super::sqlite`].

use super::{SessionKey, StoreResult};
use async_trait::async_trait;
use serde::Serialize;

/// What a prune removed (or, in a dry run, would remove).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneReport {
    pub sessions: u64,
    pub events: u64,
    pub artifacts: u64,
    pub memory_entries: u64,
    pub runs: u64,
    pub dry_run: bool,
}

/// What to prune.
#[derive(Debug, Clone)]
pub struct PruneRequest {
    /// Sessions whose last update is older than this (epoch seconds) are deleted.
    pub sessions_before: f64,
    /// Finished runs that ended before this are deleted (runs of deleted sessions go too).
    pub runs_before: f64,
    pub app: Option<String>,
    /// Sessions per transaction.
    pub batch: u32,
    pub dry_run: bool,
}

#[async_trait]
pub trait PruneStore: Send + Sync + 'static {
    /// One page of sessions after `after` (PK order) that are idle and free, at most `batch`;
    /// also returns the last key looked at (None at the end).
    async fn idle_sessions(
        &self,
        req: &PruneRequest,
        after: Option<&SessionKey>,
    ) -> StoreResult<(Vec<SessionKey>, Option<SessionKey>)>;

    /// Deletes `keys` (re-checking idle and free) with everything that belongs to them.
    async fn delete_sessions(
        &self,
        keys: &[SessionKey],
        req: &PruneRequest,
    ) -> StoreResult<PruneReport>;

    /// Deletes up to `batch` finished runs that ended before the cutoff (their webhook
    /// deliveries with them) and as many schedule ticks fired before it; returns how many runs.
    async fn delete_old_runs(&self, req: &PruneRequest) -> StoreResult<u64>;

    /// Runs a whole prune in batches.
    async fn prune(&self, req: &PruneRequest) -> StoreResult<PruneReport> {
        let mut total = PruneReport {
            dry_run: req.dry_run,
            ..Default::default()
        };
        let mut after: Option<SessionKey> = None;
        loop {
            let (keys, last) = self.idle_sessions(req, after.as_ref()).await?;
            if !keys.is_empty() {
                let r = self.delete_sessions(&keys, req).await?;
                total.sessions += r.sessions;
                total.events += r.events;
                total.artifacts += r.artifacts;
                total.memory_entries += r.memory_entries;
                total.runs += r.runs;
            }
            match last {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        if !req.dry_run {
            loop {
                let n = self.delete_old_runs(req).await?;
                total.runs += n;
                if n < u64::from(req.batch) {
                    break;
                }
            }
        }
        Ok(total)
    }
}

/// The tables a session's rows live in, and which of their rows are the session's (after
/// `app_name = $1 AND user_id = $2`; `$3` the session's id), in the order they are deleted.
/// What memory holds from a session goes with it: its events' memories and the facts
/// extracted from it, with every revision of those, and the earlier texts that came from it.
pub(crate) const SESSION_TABLES: [(&str, &str); 7] = [
    ("events", "session_id = $3"),
    ("artifacts", "session_id = $3"),
    (
        "memory_revisions",
        "(session_id = $3 OR memory_id IN (SELECT event_id FROM memory_entries
                                             WHERE app_name = $1 AND user_id = $2
                                               AND session_id = $3))",
    ),
    ("memory_entries", "session_id = $3"),
    ("memory_sessions", "session_id = $3"),
    ("memory_due", "session_id = $3"),
    ("runs", "session_id = $3"),
];
