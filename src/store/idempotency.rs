//! Idempotency keys: a retried request (a client timeout, a proxy retry) with the same key and
//! the same body does not do its work twice. The first request claims the key in the database
//! (so a retry on another replica sees it) and records what it produced.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::StoreResult;
use crate::event::now_ts;
use async_trait::async_trait;
use sqlx::Row;

/// What a key already stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct IdempotentRecord {
    pub request_hash: String,
    /// The run the first request started (`/run`, `/run_sse`).
    pub run_id: Option<String>,
    /// The first request's answer (session create).
    pub response: Option<(u16, String)>,
}

/// The outcome of claiming a key.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyClaim {
    /// The key is new (or had expired): this request does the work.
    Claimed,
    /// The key was used before, within its lifetime.
    Seen(IdempotentRecord),
}

#[async_trait]
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Claims `key` in `scope` for a request whose hash is `hash`. A key older than `ttl_secs`
    /// is taken over as new, and so is a claim that recorded nothing within `pending_secs` (its
    /// request died before it could record or release it: a retry must not wait for the TTL).
    async fn claim_key(
        &self,
        user: &str,
        scope: &str,
        key: &str,
        hash: &str,
        ttl_secs: f64,
        pending_secs: f64,
    ) -> StoreResult<KeyClaim>;

    /// Records the run a claimed key started.
    async fn key_run(&self, user: &str, scope: &str, key: &str, run_id: &str) -> StoreResult<()>;

    /// Records the answer a claimed key produced.
    async fn key_response(
        &self,
        user: &str,
        scope: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> StoreResult<()>;

    /// Gives a claimed key up (its request did nothing: it may be retried).
    async fn release_key(&self, user: &str, scope: &str, key: &str) -> StoreResult<()>;

    /// Deletes keys older than `ttl_secs`; returns how many.
    async fn expire_keys(&self, ttl_secs: f64) -> StoreResult<u64>;
}

macro_rules! record_reader {
    ($row:expr) => {{
        let status: Option<i32> = $row.try_get("status")?;
        let response: Option<String> = $row.try_get("response")?;
        IdempotentRecord {
            request_hash: $row.try_get("request_hash")?,
            run_id: $row.try_get("run_id")?,
            response: status.zip(response).map(|(s, r)| (s as u16, r)),
        }
    }};
}

/// The same SQL on both backends (SQLite binds `$N` by position too), so one macro writes both
/// implementations.
macro_rules! idempotency_store {
    ($store:ty, $pool:ident) => {
        #[async_trait]
        impl IdempotencyStore for $store {
            async fn claim_key(
                &self,
                user: &str,
                scope: &str,
                key: &str,
                hash: &str,
                ttl_secs: f64,
                pending_secs: f64,
            ) -> StoreResult<KeyClaim> {
                let now = now_ts();
                // New, or expired (then it starts over with this request).
                let claimed = sqlx::query(
                    "INSERT INTO idempotency_keys (scope, key, request_hash, created_at, user_id)
                     VALUES ($1, $2, $3, $4, $7)
                     ON CONFLICT (user_id, scope, key) DO UPDATE
                        SET request_hash = excluded.request_hash, run_id = NULL, status = NULL,
                            response = NULL, created_at = excluded.created_at
                      WHERE idempotency_keys.created_at < $4 - $5
                         OR (idempotency_keys.run_id IS NULL AND idempotency_keys.response IS NULL
                             AND idempotency_keys.created_at < $4 - $6)",
                )
                .bind(scope)
                .bind(key)
                .bind(hash)
                .bind(now)
                .bind(ttl_secs)
                .bind(pending_secs)
                .bind(user)
                .execute(&self.$pool)
                .await?
                .rows_affected()
                    > 0;
                if claimed {
                    return Ok(KeyClaim::Claimed);
                }
                let row = sqlx::query(
                    "SELECT request_hash, run_id, status, response FROM idempotency_keys
                      WHERE user_id = $3 AND scope = $1 AND key = $2",
                )
                .bind(scope)
                .bind(key)
                .bind(user)
                .fetch_optional(&self.$pool)
                .await?;
                match row {
                    Some(row) => Ok(KeyClaim::Seen(record_reader!(row))),
                    // Released in between (its first request failed): claim it afresh.
                    None => {
                        Box::pin(self.claim_key(user, scope, key, hash, ttl_secs, pending_secs))
                            .await
                    }
                }
            }

            async fn key_run(
                &self,
                user: &str,
                scope: &str,
                key: &str,
                run_id: &str,
            ) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE idempotency_keys SET run_id = $3
                      WHERE user_id = $4 AND scope = $1 AND key = $2",
                )
                .bind(scope)
                .bind(key)
                .bind(run_id)
                .bind(user)
                .execute(&self.$pool)
                .await?;
                Ok(())
            }

            async fn key_response(
                &self,
                user: &str,
                scope: &str,
                key: &str,
                status: u16,
                body: &str,
            ) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE idempotency_keys SET status = $3, response = $4
                      WHERE user_id = $5 AND scope = $1 AND key = $2",
                )
                .bind(scope)
                .bind(key)
                .bind(status as i32)
                .bind(body)
                .bind(user)
                .execute(&self.$pool)
                .await?;
                Ok(())
            }

            async fn release_key(&self, user: &str, scope: &str, key: &str) -> StoreResult<()> {
                sqlx::query(
                    "DELETE FROM idempotency_keys WHERE user_id = $3 AND scope = $1 AND key = $2",
                )
                .bind(scope)
                .bind(key)
                .bind(user)
                    .execute(&self.$pool)
                    .await?;
                Ok(())
            }

            async fn expire_keys(&self, ttl_secs: f64) -> StoreResult<u64> {
                Ok(
                    sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
                        .bind(now_ts() - ttl_secs)
                        .execute(&self.$pool)
                        .await?
                        .rows_affected(),
                )
            }
        }
    };
}

idempotency_store!(PgStore, pool);
idempotency_store!(SqliteStore, writer);
