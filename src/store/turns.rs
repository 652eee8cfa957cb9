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
//!
//! A kind whose work is due at known times can also go quiet: the scan that found nothing
//! learns the earliest time anything of it could be due (for schedules, their next tick), and
//! turns are refused until then ([`TurnStore::quiet`], at most [`MAX_QUIET`] ahead), unless a
//! write made work due after that scan began ([`TurnStore::wake`]). A lost wake (a crash
//! between a write and its wake, a replica of an older release) delays that work by at most
//! [`MAX_QUIET`].

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

    /// The clock turns are kept by (the database's), for [`TurnStore::quiet`]'s `since`; `None`
    /// when this store grants every turn (nothing to quiet).
    async fn turn_clock(&self) -> StoreResult<Option<f64>>;

    /// Nothing of `kind` is due before `until`, as a scan begun at `since` (the turn clock)
    /// found: its turns are refused until then, at most [`MAX_QUIET`] from now; not recorded
    /// when a [`TurnStore::wake`] came at or after `since`.
    async fn quiet(&self, kind: &str, since: f64, until: f64) -> StoreResult<()>;

    /// Work of `kind` may be due now (it was just written): the next turn is granted, and a
    /// scan under way does not go quiet.
    async fn wake(&self, kind: &str) -> StoreResult<()>;
}

/// After a look for `kind` begun at `since` that found nothing due: no replica looks again
/// before `next` (the kind's read of when its next work is due; `None`: none waits, quiet
/// for [`MAX_QUIET`]). A failed read or write leaves the kind to its turns (a scan too many).
pub async fn go_quiet<S: TurnStore + ?Sized>(
    store: &S,
    kind: &str,
    since: f64,
    next: StoreResult<Option<f64>>,
) {
    let until = match next {
        Ok(next) => next.unwrap_or(f64::MAX),
        Err(e) => {
            tracing::debug!(kind, error = %e, "could not read when work is due next; not going quiet");
            return;
        }
    };
    if let Err(e) = store.quiet(kind, since, until).await {
        tracing::debug!(kind, error = %e, "could not record a quiet");
    }
}

/// Wakes `kind` after a write that made its work due (the write stands either way: a wake
/// that fails is logged, and delays that work by at most [`MAX_QUIET`]). Called by the store
/// statements that make work due: storing or changing a schedule, recording a delivery's
/// retry, creating an eval run.
pub async fn wake_after_write<S: TurnStore + ?Sized>(store: &S, kind: &str) {
    if let Err(e) = store.wake(kind).await {
        tracing::warn!(kind, error = %e, "could not end a quiet; the work waits for the next look");
    }
}

/// The longest a kind stays quiet: what a lost wake can cost.
pub const MAX_QUIET: Duration = Duration::from_secs(30);

/// `statement_timestamp()` in seconds, the turn clock.
const PG_CLOCK: &str = "extract(epoch from statement_timestamp())::double precision";

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
                         AND NOT (quiet_until > now.t AND quiet_until <= now.t + $3)
                      RETURNING 1)
             SELECT EXISTS (SELECT 1 FROM taken)
                    OR NOT EXISTS (SELECT 1 FROM poll_turns WHERE kind = $1)",
        )
        .bind(kind)
        .bind(period.as_secs_f64() * SLACK)
        .bind(MAX_QUIET.as_secs_f64())
        .fetch_one(self.pool())
        .await?;
        Ok(granted)
    }

    async fn turn_clock(&self) -> StoreResult<Option<f64>> {
        Ok(Some(
            sqlx::query_scalar(&format!("SELECT {PG_CLOCK}"))
                .fetch_one(self.pool())
                .await?,
        ))
    }

    async fn quiet(&self, kind: &str, since: f64, until: f64) -> StoreResult<()> {
        // A quiet lost in a crash costs a scan or two: asynchronous commit.
        sqlx::query(&format!(
            "WITH async_commit AS (SELECT set_config('synchronous_commit', 'off', true))
             UPDATE poll_turns SET quiet_until = LEAST($3, {PG_CLOCK} + $4)
               FROM async_commit
              WHERE kind = $1 AND woken_at < $2"
        ))
        .bind(kind)
        .bind(since)
        .bind(until)
        .bind(MAX_QUIET.as_secs_f64())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn wake(&self, kind: &str) -> StoreResult<()> {
        // Asynchronous commit: a wake lost in a crash costs at most `MAX_QUIET`, and a hot row
        // need not wait for a flush on every schedule write or delivery retry.
        sqlx::query(&format!(
            "WITH async_commit AS (SELECT set_config('synchronous_commit', 'off', true))
             UPDATE poll_turns SET quiet_until = 0, woken_at = {PG_CLOCK}
               FROM async_commit WHERE kind = $1"
        ))
        .bind(kind)
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

/// SQLite is one file on one machine: its scans are local reads, and the processes that
/// share a file are few. Every scan is granted.
#[async_trait]
impl TurnStore for SqliteStore {
    async fn take_turn(&self, _kind: &str, _period: Duration) -> StoreResult<bool> {
        Ok(true)
    }

    async fn turn_clock(&self) -> StoreResult<Option<f64>> {
        Ok(None)
    }

    async fn quiet(&self, _kind: &str, _since: f64, _until: f64) -> StoreResult<()> {
        Ok(())
    }

    async fn wake(&self, _kind: &str) -> StoreResult<()> {
        Ok(())
    }
}
