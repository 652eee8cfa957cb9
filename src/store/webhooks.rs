//! Webhook deliveries: the outbox the run's end writes (on PostgreSQL the statement that ends
//! the run, see `postgres/outbox.rs`; on SQLite a trigger), claimed by any replica's sender.
//!
//! A claim moves the row's due time one lease ahead and counts the attempt; the attempt's
//! outcome is written only by the claimer of that attempt (`claimed_by` and `attempts` in the
//! `WHERE`). A sender that dies mid-attempt therefore loses nothing: the row is due again when
//! the lease ends, and its id — the `webhook-id` — is the same for every attempt.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::StoreResult;
use async_trait::async_trait;
use serde::Serialize;
use sqlx::Row;

/// A claimed delivery: one attempt to make.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub id: String,
    pub run_id: String,
    /// The run's user: with `id`, the delivery's key (one shard on Citus).
    pub user_id: String,
    pub event_type: String,
    /// The target as stored on the run (`WebhookTarget` JSON).
    pub target: serde_json::Value,
    /// This attempt's number (1 for the first).
    pub attempt: i32,
    pub created_at: f64,
}

/// A due delivery before it is claimed: whose it is and where it goes (what a sender shares
/// its slots by).
#[derive(Debug, Clone, PartialEq)]
pub struct DueDelivery {
    pub user_id: String,
    pub id: String,
    /// The target's URL.
    pub url: String,
}

/// What an attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Settle {
    Delivered {
        status: u16,
    },
    /// Try again at `retry_at` (seconds since the epoch).
    Retry {
        status: Option<u16>,
        error: String,
        retry_at: f64,
    },
    /// No more attempts.
    Failed {
        status: Option<u16>,
        error: String,
    },
    /// Not sent: the target does not want this event after all (`run.input_required` vs
    /// `run.completed`).
    Skipped,
}

/// A delivery as `GET /runs/{id}` shows it (never its secret).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryRecord {
    /// The `webhook-id` header.
    pub id: String,
    pub url: String,
    #[serde(rename = "type")]
    pub event_type: String,
    /// `pending`, `delivered`, `failed` or `skipped`.
    pub status: String,
    pub attempts: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_status: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<f64>,
    /// To one of the app's own webhooks (shown to admins only).
    #[serde(skip)]
    pub app: bool,
}

#[async_trait]
pub trait WebhookStore: Send + Sync + 'static {
    /// Due deliveries, unclaimed, at most `per_user` of each user's oldest, in turns: every
    /// user's oldest first, then every user's second, and so on (a sender that takes them in
    /// this order shares its slots between users). At most `limit`.
    async fn due_deliveries(&self, per_user: u32, limit: u32) -> StoreResult<Vec<DueDelivery>>;

    /// Claims one due delivery for `owner` for `lease_secs`; `None` if it is no longer due
    /// (another sender claimed it first).
    async fn claim_delivery(
        &self,
        owner: &str,
        lease_secs: f64,
        due: &DueDelivery,
    ) -> StoreResult<Option<Delivery>>;

    /// Claims up to `limit` due deliveries for `owner`, each for `lease_secs`, in the order of
    /// [`WebhookStore::due_deliveries`].
    async fn claim_deliveries(
        &self,
        owner: &str,
        lease_secs: f64,
        limit: u32,
    ) -> StoreResult<Vec<Delivery>> {
        let due = self.due_deliveries(limit, limit).await?;
        let mut claimed = Vec::with_capacity(due.len());
        for d in &due {
            match self.claim_delivery(owner, lease_secs, d).await {
                Ok(Some(c)) => claimed.push(c),
                Ok(None) => {}
                Err(e) if claimed.is_empty() => return Err(e),
                // Those claimed so far are sent whatever happens to the rest.
                Err(e) => {
                    tracing::warn!(error = %e, "could not claim a webhook delivery; sending those claimed");
                    break;
                }
            }
        }
        Ok(claimed)
    }

    /// Records an attempt's outcome, if `owner` still holds that attempt's claim;
    /// `event_type`: the event it was sent as, when the sender told it apart
    /// (`run.input_required`).
    async fn settle_delivery(
        &self,
        delivery: &Delivery,
        owner: &str,
        outcome: &Settle,
        event_type: Option<&str>,
    ) -> StoreResult<bool>;

    /// A run's deliveries, oldest first.
    async fn run_deliveries(&self, user: &str, run_id: &str) -> StoreResult<Vec<DeliveryRecord>>;

    /// The earliest time a pending delivery is due (a retry's time, or a claim's end: a
    /// claimed delivery is due again when its claim runs out); `None` when none is pending.
    /// Read after a look that found nothing due, for the senders' quiet ([`super::turns`]).
    async fn next_delivery_at(&self) -> StoreResult<Option<f64>>;
}

/// Both backends run the same statements; only the clock differs.
macro_rules! webhook_store {
    ($store:ty, $pool:ident, $now:expr, $url:expr) => {
        #[async_trait]
        impl WebhookStore for $store {
            async fn due_deliveries(
                &self,
                per_user: u32,
                limit: u32,
            ) -> StoreResult<Vec<DueDelivery>> {
                // Found without a lock (across users: on Citus, across shards); each is then
                // claimed by a statement about that one row, which checks again that it is
                // still due: of two senders, one wins each row.
                let rows = sqlx::query(&format!(
                    "SELECT user_id, id, url FROM (
                        SELECT user_id, id, {url} AS url, next_attempt_at,
                               row_number() OVER (PARTITION BY user_id
                                                  ORDER BY next_attempt_at, id) AS turn
                          FROM webhook_deliveries
                         WHERE status = 'pending' AND next_attempt_at <= {now}) d
                      WHERE turn <= $1
                      ORDER BY turn, next_attempt_at, user_id LIMIT $2",
                    now = $now,
                    url = $url,
                ))
                .bind(i64::from(per_user.max(1)))
                .bind(i64::from(limit))
                .fetch_all(&self.$pool)
                .await?;
                rows.iter()
                    .map(|r| {
                        Ok(DueDelivery {
                            user_id: r.try_get("user_id")?,
                            id: r.try_get("id")?,
                            url: r.try_get::<Option<String>, _>("url")?.unwrap_or_default(),
                        })
                    })
                    .collect()
            }

            async fn claim_delivery(
                &self,
                owner: &str,
                lease_secs: f64,
                due: &DueDelivery,
            ) -> StoreResult<Option<Delivery>> {
                let r = sqlx::query(&format!(
                    "UPDATE webhook_deliveries
                        SET claimed_by = $1, attempts = attempts + 1,
                            next_attempt_at = {now} + $2
                      WHERE user_id = $3 AND id = $4
                        AND status = 'pending' AND next_attempt_at <= {now}
                  RETURNING id, run_id, user_id, event_type, target, attempts, created_at",
                    now = $now,
                ))
                .bind(owner)
                .bind(lease_secs)
                .bind(&due.user_id)
                .bind(&due.id)
                .fetch_optional(&self.$pool)
                .await?;
                r.map(|r| {
                    Ok(Delivery {
                        id: r.try_get("id")?,
                        run_id: r.try_get("run_id")?,
                        user_id: r.try_get("user_id")?,
                        event_type: r.try_get("event_type")?,
                        target: r.try_get("target")?,
                        attempt: r.try_get("attempts")?,
                        created_at: r.try_get("created_at")?,
                    })
                })
                .transpose()
            }

            async fn settle_delivery(
                &self,
                d: &Delivery,
                owner: &str,
                outcome: &Settle,
                event_type: Option<&str>,
            ) -> StoreResult<bool> {
                let (status, code, error, retry_at) = match outcome {
                    Settle::Delivered { status } => ("delivered", Some(*status), None, None),
                    Settle::Retry {
                        status,
                        error,
                        retry_at,
                    } => ("pending", *status, Some(error.as_str()), Some(*retry_at)),
                    Settle::Failed { status, error } => {
                        ("failed", *status, Some(error.as_str()), None)
                    }
                    Settle::Skipped => ("skipped", None, None, None),
                };
                let n = sqlx::query(
                    "UPDATE webhook_deliveries
                        SET status = $4, last_status = $5, last_error = $6,
                            next_attempt_at = COALESCE($7, next_attempt_at), claimed_by = NULL,
                            delivered_at = CASE WHEN $4 = 'delivered' THEN $10 END,
                            event_type = COALESCE($8, event_type),
                            -- Skipped: nothing was sent.
                            attempts = CASE WHEN $4 = 'skipped' THEN attempts - 1
                                            ELSE attempts END
                      WHERE user_id = $9 AND id = $1 AND claimed_by = $2 AND attempts = $3",
                )
                .bind(&d.id)
                .bind(owner)
                .bind(d.attempt)
                .bind(status)
                .bind(code.map(i32::from))
                .bind(error)
                .bind(retry_at)
                .bind(event_type)
                .bind(&d.user_id)
                // The sender's clock: Citus takes no clock function inside a CASE, and this
                // time is only shown (no lease or due time is compared with it).
                .bind(crate::event::now_ts())
                .execute(&self.$pool)
                .await?
                .rows_affected();
                // A retry may be due before the senders' quiet ends (`turns::go_quiet`).
                if n > 0 && matches!(outcome, Settle::Retry { .. }) {
                    super::turns::wake_after_write(self, super::turns::kind::WEBHOOKS).await;
                }
                Ok(n > 0)
            }

            async fn next_delivery_at(&self) -> StoreResult<Option<f64>> {
                Ok(sqlx::query_scalar(
                    "SELECT min(next_attempt_at) FROM webhook_deliveries WHERE status = 'pending'",
                )
                .fetch_one(&self.$pool)
                .await?)
            }

            async fn run_deliveries(
                &self,
                user: &str,
                run_id: &str,
            ) -> StoreResult<Vec<DeliveryRecord>> {
                let rows = sqlx::query(
                    "SELECT id, url, event_type, status, attempts, next_attempt_at, last_status,
                            last_error, created_at, delivered_at, target
                       FROM webhook_deliveries WHERE user_id = $2 AND run_id = $1 ORDER BY id",
                )
                .bind(run_id)
                .bind(user)
                .fetch_all(&self.$pool)
                .await?;
                rows.iter()
                    .map(|r| {
                        let status: String = r.try_get("status")?;
                        let target: serde_json::Value = r.try_get("target")?;
                        Ok(DeliveryRecord {
                            app: target.get("app") == Some(&serde_json::Value::Bool(true)),
                            id: r.try_get("id")?,
                            url: r.try_get("url")?,
                            event_type: r.try_get("event_type")?,
                            next_attempt_at: if status == "pending" {
                                r.try_get("next_attempt_at")?
                            } else {
                                None
                            },
                            status,
                            attempts: r.try_get("attempts")?,
                            last_status: r.try_get("last_status")?,
                            last_error: r.try_get("last_error")?,
                            created_at: r.try_get("created_at")?,
                            delivered_at: r.try_get("delivered_at")?,
                        })
                    })
                    .collect()
            }
        }
    };
}

webhook_store!(
    PgStore,
    pool,
    "extract(epoch from statement_timestamp())::double precision",
    "target->>'url'"
);
webhook_store!(
    SqliteStore,
    writer,
    "((julianday('now') - 2440587.5) * 86400.0)",
    "json_extract(target, '$.url')"
);
