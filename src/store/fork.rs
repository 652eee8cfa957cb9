//! Forking a session: a new session holding the source's events up to a point, its state as
//! of then and its artifacts' versions as of then. The copy is done by the database
//! (`INSERT … SELECT`), in one transaction, so a fork of a long session never passes its events
//! through agentd's memory.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::{SessionKey, StoreError, StoreResult};
use crate::event::{now_ts, JsonMap};
use async_trait::async_trait;
use std::collections::BTreeMap;

/// What a fork copies.
#[derive(Debug, Clone)]
pub struct Fork {
    pub source: SessionKey,
    /// The new session's id (same app and user).
    pub session_id: String,
    /// Events with `seq < before` are copied (seqs kept: the copy is gapless too).
    pub before: i64,
    /// The new session's state (plain keys; shared `app:`/`user:` state is shared anyway).
    pub state: JsonMap,
    /// The state it counts as created with (the source's, and what the fork adds): where its
    /// own rewinds start folding.
    pub initial_state: JsonMap,
    /// Each session artifact's version as of the point: versions up to it are copied.
    pub artifacts: BTreeMap<String, i64>,
}

#[async_trait]
pub trait ForkStore: Send + Sync + 'static {
    /// Creates the fork; [`StoreError::SessionExists`] if the id is taken. Returns its last
    /// seq.
    async fn fork_session(&self, fork: &Fork) -> StoreResult<i64>;
}

macro_rules! fork_store {
    ($store:ty, $pool:ident, $begin:literal) => {
        #[async_trait]
        impl ForkStore for $store {
            async fn fork_session(&self, f: &Fork) -> StoreResult<i64> {
                let src = &f.source;
                let now = now_ts();
                let mut tx = self.$pool.begin_with($begin).await?;
                let created = sqlx::query(
                    "INSERT INTO sessions (app_name, user_id, id, state, initial_state,
                                           create_time, update_time, last_seq)
                     VALUES ($1, $2, $3, $4, $6, $5, $5, 0) ON CONFLICT DO NOTHING",
                )
                .bind(&src.app_name)
                .bind(&src.user_id)
                .bind(&f.session_id)
                .bind(serde_json::Value::Object(f.state.clone()))
                .bind(now)
                .bind(
                    (!f.initial_state.is_empty())
                        .then(|| serde_json::Value::Object(f.initial_state.clone())),
                )
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if created == 0 {
                    return Err(StoreError::SessionExists(f.session_id.clone()));
                }
                let copied = sqlx::query(
                    "INSERT INTO events (app_name, user_id, session_id, seq, id, invocation_id,
                                         author, \"timestamp\", event)
                     SELECT app_name, user_id, $3, seq, id, invocation_id, author,
                            \"timestamp\", event
                       FROM events
                      WHERE app_name = $1 AND user_id = $2 AND session_id = $4 AND seq < $5",
                )
                .bind(&src.app_name)
                .bind(&src.user_id)
                .bind(&f.session_id)
                .bind(&src.session_id)
                .bind(f.before)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                let last_seq = copied as i64;
                for (filename, version) in &f.artifacts {
                    sqlx::query(
                        "INSERT INTO artifacts (app_name, user_id, session_id, filename, version,
                                                mime_type, part, data, custom_metadata,
                                                create_time)
                         SELECT app_name, user_id, $3, filename, version, mime_type, part, data,
                                custom_metadata, create_time
                           FROM artifacts
                          WHERE app_name = $1 AND user_id = $2 AND session_id = $4
                            AND filename = $5 AND version <= $6",
                    )
                    .bind(&src.app_name)
                    .bind(&src.user_id)
                    .bind(&f.session_id)
                    .bind(&src.session_id)
                    .bind(filename)
                    .bind(*version)
                    .execute(&mut *tx)
                    .await?;
                }
                sqlx::query(
                    "UPDATE sessions SET last_seq = $4
                      WHERE app_name = $1 AND user_id = $2 AND id = $3",
                )
                .bind(&src.app_name)
                .bind(&src.user_id)
                .bind(&f.session_id)
                .bind(last_seq)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(last_seq)
            }
        }
    };
}

fork_store!(PgStore, pool, "BEGIN");
fork_store!(SqliteStore, writer, "BEGIN IMMEDIATE");
