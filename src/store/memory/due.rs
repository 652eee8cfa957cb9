//! Sessions whose memory is due: an app's `memory: idle_seconds:` adds a session to memory once
//! the conversation has paused that long, not after every run (migrations/postgres/
//! 0021_memory_due.sql says how the rows live; [`crate::memory::idle`] is the sweep). Every
//! statement is the same on both backends; each names one session, but the sweep's read.

use super::super::{SessionKey, StoreResult};
use async_trait::async_trait;

/// A session whose memory is due.
#[derive(Debug, Clone, PartialEq)]
pub struct DueSession {
    pub key: SessionKey,
    /// When it became due, or, while claimed, when the claim ends.
    pub due_at: f64,
    /// Claims since the session was last marked (by a run's start or end) or put off.
    pub attempts: i32,
}

#[async_trait]
pub trait MemoryDueStore: Send + Sync {
    /// The session's memory is due at `at` (a run of it started or ended): whatever was set before, and
    /// a claim in flight, give way, and its attempts start again.
    async fn set_memory_due(&self, key: &SessionKey, at: f64) -> StoreResult<()>;

    /// Up to `limit` sessions (of any app) due by `now`, soonest first: the one read that
    /// spans every user (on Citus every shard; the sweep takes a turn for it).
    async fn due_memories(&self, now: f64, limit: usize) -> StoreResult<Vec<DueSession>>;

    /// Claims `due` until `until` (another replica takes it then, should this one die), while
    /// it is still as read; counts the attempt. Whether it was claimed.
    async fn claim_memory_due(&self, due: &DueSession, until: f64) -> StoreResult<bool>;

    /// The session claimed until `claimed` has not paused yet (a run of it is going on, or
    /// its last event is newer than the pause): it is due again at `at`, its attempts start
    /// again (a long run is put off many times without being given up); nothing changes when
    /// the claim is no longer the one taken.
    async fn rearm_memory_due(&self, key: &SessionKey, claimed: f64, at: f64) -> StoreResult<bool>;

    /// The session is done with (added to memory, gone, or given up): its row goes, while it
    /// is still the claim that ended at `claimed` (a run that ended since made it due again).
    async fn clear_memory_due(&self, key: &SessionKey, claimed: f64) -> StoreResult<bool>;
}

pub const SET_DUE: &str = "INSERT INTO memory_due (app_name, user_id, session_id, due_at, attempts)
     VALUES ($1, $2, $3, $4, 0)
     ON CONFLICT (app_name, user_id, session_id) DO UPDATE
        SET due_at = EXCLUDED.due_at, attempts = 0";

pub const DUE: &str = "SELECT app_name, user_id, session_id, due_at, attempts FROM memory_due
  WHERE due_at <= $1 ORDER BY due_at LIMIT $2";

pub const CLAIM: &str = "UPDATE memory_due SET due_at = $5, attempts = attempts + 1
  WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND due_at = $4";

pub const REARM: &str = "UPDATE memory_due SET due_at = $5, attempts = 0
  WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND due_at = $4";

pub const CLEAR: &str = "DELETE FROM memory_due
  WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND due_at = $4";

/// The service for a backend whose pools are named `$writer` and `$reader`: each backend
/// invokes it (`postgres/memory.rs`, `sqlite/memory.rs`), so this file imports neither.
macro_rules! due_store {
    ($store:ty, $writer:ident, $reader:ident) => {
        #[::async_trait::async_trait]
        impl $crate::store::memory::due::MemoryDueStore for $store {
            async fn set_memory_due(
                &self,
                key: &$crate::store::SessionKey,
                at: f64,
            ) -> $crate::store::StoreResult<()> {
                ::sqlx::query($crate::store::memory::due::SET_DUE)
                    .bind(&key.app_name)
                    .bind(&key.user_id)
                    .bind(&key.session_id)
                    .bind(at)
                    .execute(&self.$writer)
                    .await?;
                Ok(())
            }

            async fn due_memories(
                &self,
                now: f64,
                limit: usize,
            ) -> $crate::store::StoreResult<Vec<$crate::store::memory::due::DueSession>> {
                let rows: Vec<(String, String, String, f64, i32)> =
                    ::sqlx::query_as($crate::store::memory::due::DUE)
                        .bind(now)
                        .bind(limit.min(i64::MAX as usize) as i64)
                        .fetch_all(&self.$reader)
                        .await?;
                Ok(rows
                    .into_iter()
                    .map(|(app_name, user_id, session_id, due_at, attempts)| {
                        $crate::store::memory::due::DueSession {
                            key: $crate::store::SessionKey {
                                app_name,
                                user_id,
                                session_id,
                            },
                            due_at,
                            attempts,
                        }
                    })
                    .collect())
            }

            async fn claim_memory_due(
                &self,
                due: &$crate::store::memory::due::DueSession,
                until: f64,
            ) -> $crate::store::StoreResult<bool> {
                let n = ::sqlx::query($crate::store::memory::due::CLAIM)
                    .bind(&due.key.app_name)
                    .bind(&due.key.user_id)
                    .bind(&due.key.session_id)
                    .bind(due.due_at)
                    .bind(until)
                    .execute(&self.$writer)
                    .await?
                    .rows_affected();
                Ok(n == 1)
            }

            async fn rearm_memory_due(
                &self,
                key: &$crate::store::SessionKey,
                claimed: f64,
                at: f64,
            ) -> $crate::store::StoreResult<bool> {
                let n = ::sqlx::query($crate::store::memory::due::REARM)
                    .bind(&key.app_name)
                    .bind(&key.user_id)
                    .bind(&key.session_id)
                    .bind(claimed)
                    .bind(at)
                    .execute(&self.$writer)
                    .await?
                    .rows_affected();
                Ok(n == 1)
            }

            async fn clear_memory_due(
                &self,
                key: &$crate::store::SessionKey,
                claimed: f64,
            ) -> $crate::store::StoreResult<bool> {
                let n = ::sqlx::query($crate::store::memory::due::CLEAR)
                    .bind(&key.app_name)
                    .bind(&key.user_id)
                    .bind(&key.session_id)
                    .bind(claimed)
                    .execute(&self.$writer)
                    .await?
                    .rows_affected();
                Ok(n == 1)
            }
        }
    };
}
pub(crate) use due_store;
