//! Turns of the cluster-wide scans. Every replica runs the same background loops (schedules,
//! webhook deliveries, the sweep for runs nobody runs, housekeeping), and each loop's scan
//! reads every user's rows: on Citus every shard. Polled by every replica, that work grows with
//! shards × replicas. A loop whose last scan found nothing asks for a turn first; the turn is a
//! row per kind of scan, and it is granted to one replica per period, so an idle deployment
//! scans about once per period whatever its number of replicas. The ticker and the sweep,
//! once a scan found work, scan again without asking until one finds none; a webhook sender
//! woken by its own replica's work (a run's end, an attempt done) scans without asking, and
//! asks on each poll; housekeeping asks every time. So work due waits about one period at most
//! for some replica's turn (as it waited up to one poll before), and a failure to take a turn
//! counts as granted (a scan too many, never one too few). The first sweep after start needs
//! no turn.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::StoreResult;
use async_trait::async_trait;
use std::time::Duration;

/// The kinds of scans that take turns (each has its row from a migration).
pub mod kind {
    pub const SCHEDULES: &str = "schedules";
    pub const WEBHOOKS: &str = "webhooks";
    pub const SWEEP: &str = "sweep";
    pub const HOUSEKEEPING: &str = "housekeeping";
    pub const MEMORY_TTL: &str = "memory_ttl";
    pub const MEMORY_IDLE: &str = "memory_idle";
    pub const EVALS: &str = "evals";
}

#[async_trait]
pub trait TurnStore: Send + Sync + 'static {
    /// Whether this replica may scan for `kind` now: no replica took that turn in the last
    /// `period` (less a tenth, so that replicas polling at the same rate do not skip a period
    /// through timing noise), or the last turn is more than a period in the future (the
    /// database's clock stepped back; a smaller step delays a turn by at most a period).
    /// Taking it records the time.
    async fn take_turn(&self, kind: &str, period: Duration) -> StoreResult<bool>;
}

/// A turn within `period` less this share of it is refused.
const SLACK: f64 = 0.9;

#[async_trait]
impl TurnStore for PgStore {
    async fn take_turn(&self, kind: &str, period: Duration) -> StoreResult<bool> {
        // Asynchronous commit: a turn lost in a crash costs one scan more.
        // An UPDATE of the kind's row (seeded by migration 0018), not an upsert: a kind
        // without its row is granted every time (fail open).
        let granted: bool = sqlx::query_scalar(
            "WITH async_commit AS (SELECT set_config('synchronous_commit', 'off', true)),
                  now AS (SELECT extract(epoch from statement_timestamp())::double precision AS t
                            FROM async_commit),
                  taken AS (
                      UPDATE poll_turns SET polled_at = now.t FROM now
                       WHERE kind = $1
                         AND (polled_at <= now.t - $2 OR polled_at > now.t + $2)
                      RETURNING 1)
             SELECT EXISTS (SELECT 1 FROM taken)
                    OR NOT EXISTS (SELECT 1 FROM poll_turns WHERE kind = $1)",
        )
        .bind(kind)
        .bind(period.as_secs_f64() * SLACK)
        .fetch_one(self.pool())
        .await?;
        Ok(granted)
    }
}

/// SQLite is one file on one machine: its scans are local reads, and the processes that
/// share a file are few. Every scan is granted.
#[async_trait]
impl TurnStore for SqliteStore {
    async fn take_turn(&self, _kind: &str, _period: Duration) -> StoreResult<bool> {
        Ok(true)
    }
}
