//! Schedules and their ticks. A tick is a row unique on `(schedule_id, tick_time)`, inserted
//! in the transaction that moves the schedule's `next_tick` on, with the run id it starts:
//! however many replicas poll, each tick is claimed once, and re-firing a tick whose claimer
//! died reuses that run id (a primary key), so it never runs twice.
//! See `migrations/postgres/0010_schedules.sql`.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::StoreResult;
use async_trait::async_trait;
use serde::Serialize;
use sqlx::Row;

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleRecord {
    pub id: String,
    pub app_name: String,
    pub user_id: String,
    pub cron: String,
    pub timezone: String,
    /// The user message each run sends (ADK `Content`).
    #[schema(value_type = Object)]
    pub message: serde_json::Value,
    /// `None`: a new session per tick (the API shows it as `session`).
    #[serde(skip)]
    pub session_id: Option<String>,
    pub on_busy: String,
    pub catch_up: String,
    /// The webhook target of its runs (shown without its secret by the HTTP layer).
    #[serde(skip)]
    pub webhook: Option<serde_json::Value>,
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_tick: Option<f64>,
    pub created_at: f64,
    pub updated_at: f64,
    /// The API key that made (or last changed) the schedule (`None`: no key, without
    /// authentication or with a JWT). Its ticks stop when that key is revoked or expires.
    #[serde(skip)]
    pub created_by: Option<String>,
    /// Why the server paused it (`credential_revoked`): it fires again once changed by a
    /// caller with a valid credential.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_reason: Option<String>,
}

/// One tick of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TickRecord {
    pub schedule_id: String,
    /// The schedule's user: with the schedule id and the tick's time, the tick's key.
    #[serde(skip)]
    pub user_id: String,
    /// The tick's time (seconds since the epoch), as the pattern defines it.
    pub tick_time: f64,
    pub run_id: String,
    pub session_id: String,
    /// `claimed` (the run is being started), `started`, `skipped` (the session was busy) or
    /// `failed` (the run could not start; `error` says why).
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub fired_at: f64,
}

/// What the ticker decided for a due schedule at `now`: the tick to fire (if any) and the
/// schedule's next tick after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TickPlan {
    pub fire: Option<f64>,
    pub next: Option<f64>,
}

/// The planner the ticker passes in (cron lives above the store).
pub type Planner = dyn Fn(&ScheduleRecord, f64) -> TickPlan + Send + Sync;

#[async_trait]
pub trait ScheduleStore: Send + Sync + 'static {
    /// Stores `s` unless its user already has `max_per_user` schedules in its app (false);
    /// 0: no limit. Concurrent creations never overshoot the quota.
    async fn create_schedule(&self, s: &ScheduleRecord, max_per_user: u32) -> StoreResult<bool>;

    /// Pauses a schedule (disabled, no next tick) for `reason`; false if there is none.
    async fn pause_schedule(&self, user: &str, id: &str, reason: &str) -> StoreResult<bool>;

    /// Pauses every schedule `key_id` made (its key was revoked); how many.
    async fn pause_schedules_of_key(&self, key_id: &str, reason: &str) -> StoreResult<u64>;

    async fn get_schedule(
        &self,
        app: &str,
        user: &str,
        id: &str,
    ) -> StoreResult<Option<ScheduleRecord>>;

    /// A user's schedules (every user's with `None`: admins), oldest first, after `after`
    /// (`(created_at, id)` of the previous page's last one).
    async fn list_schedules(
        &self,
        app: &str,
        user: Option<&str>,
        after: Option<(f64, String)>,
        limit: u32,
    ) -> StoreResult<Vec<ScheduleRecord>>;

    /// Writes every field but the ids and `created_at`; false if there is no such schedule.
    async fn update_schedule(&self, s: &ScheduleRecord) -> StoreResult<bool>;

    /// Deletes the schedule and its ticks (its runs stay); false if there was none.
    async fn delete_schedule(&self, app: &str, user: &str, id: &str) -> StoreResult<bool>;

    /// A schedule's ticks, newest first, before `before` (a tick time).
    async fn schedule_ticks(
        &self,
        id: &str,
        before: Option<f64>,
        limit: u32,
    ) -> StoreResult<Vec<TickRecord>>;

    /// Claims due schedules for `owner` (up to `limit`): for each, `plan` decides the tick to
    /// fire and the next one; the tick row and the new `next_tick` commit together. Returns
    /// the ticks to fire, with their schedules.
    async fn claim_ticks(
        &self,
        owner: &str,
        plan: &Planner,
        limit: u32,
    ) -> StoreResult<Vec<(ScheduleRecord, TickRecord)>>;

    /// Takes over the `claimed` ticks of replicas whose heartbeat is stale (they died between
    /// claiming a tick and starting its run), and those fired more than `stale_secs` ago (their
    /// firing task was lost), for `owner` to fire with the same run ids.
    async fn take_over_ticks(
        &self,
        owner: &str,
        stale_secs: f64,
    ) -> StoreResult<Vec<(ScheduleRecord, TickRecord)>>;

    /// The earliest time a look for due ticks could find work: `Some(0.0)` (now) while a tick
    /// is claimed and not settled (its claimer may die, and a takeover is due then), else the
    /// soonest `next_tick` of an enabled schedule; `None` when there is none. Read after a
    /// look that found nothing, for the ticker's quiet ([`super::turns`]).
    async fn next_tick_work(&self) -> StoreResult<Option<f64>>;

    /// Records what firing a tick came to, if `owner` still holds it.
    async fn settle_tick(
        &self,
        tick: &TickRecord,
        owner: &str,
        status: &str,
        error: Option<&str>,
    ) -> StoreResult<bool>;
}

const SCHEDULE_COLUMNS: &str = "id, app_name, user_id, cron, timezone, message, session_id, \
     on_busy, catch_up, webhook, enabled, next_tick, created_at, updated_at, created_by, \
     paused_reason";
const TICK_COLUMNS: &str =
    "t.schedule_id, t.user_id, t.tick_time, t.run_id, t.session_id, t.status, t.error, t.fired_at";

macro_rules! readers {
    ($row:ty, $sched:ident, $tick:ident) => {
        fn $sched(r: &$row) -> StoreResult<ScheduleRecord> {
            Ok(ScheduleRecord {
                id: r.try_get("id")?,
                app_name: r.try_get("app_name")?,
                user_id: r.try_get("user_id")?,
                cron: r.try_get("cron")?,
                timezone: r.try_get("timezone")?,
                message: r.try_get("message")?,
                session_id: r.try_get("session_id")?,
                on_busy: r.try_get("on_busy")?,
                catch_up: r.try_get("catch_up")?,
                webhook: r.try_get("webhook")?,
                enabled: r.try_get("enabled")?,
                next_tick: r.try_get("next_tick")?,
                created_at: r.try_get("created_at")?,
                updated_at: r.try_get("updated_at")?,
                created_by: r.try_get("created_by")?,
                paused_reason: r.try_get("paused_reason")?,
            })
        }

        fn $tick(r: &$row) -> StoreResult<TickRecord> {
            Ok(TickRecord {
                schedule_id: r.try_get("schedule_id")?,
                user_id: r.try_get("user_id")?,
                tick_time: r.try_get("tick_time")?,
                run_id: r.try_get("run_id")?,
                session_id: r.try_get("session_id")?,
                status: r.try_get("status")?,
                error: r.try_get("error")?,
                fired_at: r.try_get("fired_at")?,
            })
        }
    };
}

readers!(sqlx::postgres::PgRow, pg_schedule, pg_tick);
readers!(sqlx::sqlite::SqliteRow, sqlite_schedule, sqlite_tick);

/// The session a tick's run uses: the schedule's, or a new one named after the tick (the same
/// name when a tick is re-fired, so a re-fire finds the session its first try created).
pub fn tick_session(s: &ScheduleRecord, tick_time: f64) -> String {
    s.session_id
        .clone()
        .unwrap_or_else(|| format!("{}-{}", s.id, (tick_time * 1000.0).round() as i64))
}

/// Both backends run the same statements; the clock, the row locking, the transaction start
/// and the row readers differ.
macro_rules! schedule_store {
    ($store:ty, $pool:ident, $now:expr, $skip_locked:expr, $begin:literal, $sched:ident, $tick:ident) => {
        #[async_trait]
        impl ScheduleStore for $store {
            async fn create_schedule(
                &self,
                s: &ScheduleRecord,
                max_per_user: u32,
            ) -> StoreResult<bool> {
                sqlx::query(&format!(
                    "INSERT INTO schedules ({SCHEDULE_COLUMNS})
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                             NULL)"
                ))
                .bind(&s.id)
                .bind(&s.app_name)
                .bind(&s.user_id)
                .bind(&s.cron)
                .bind(&s.timezone)
                .bind(&s.message)
                .bind(&s.session_id)
                .bind(&s.on_busy)
                .bind(&s.catch_up)
                .bind(&s.webhook)
                .bind(s.enabled)
                .bind(s.next_tick)
                .bind(s.created_at)
                .bind(s.updated_at)
                .bind(&s.created_by)
                .execute(&self.$pool)
                .await?;
                if max_per_user == 0 {
                    super::turns::wake_after_write(self, super::turns::kind::SCHEDULES).await;
                    return Ok(true);
                }
                // Counted after the insert is committed: of concurrent creations, the last
                // to commit sees every other, so the quota is never overshot (a racing
                // creation may be refused when it would have fit; the caller may retry).
                // The schedule cannot fire in between: its first tick is in the future.
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM schedules WHERE app_name = $1 AND user_id = $2",
                )
                .bind(&s.app_name)
                .bind(&s.user_id)
                .fetch_one(&self.$pool)
                .await?;
                if n > i64::from(max_per_user) {
                    sqlx::query("DELETE FROM schedules WHERE user_id = $1 AND id = $2")
                        .bind(&s.user_id)
                        .bind(&s.id)
                        .execute(&self.$pool)
                        .await?;
                    return Ok(false);
                }
                super::turns::wake_after_write(self, super::turns::kind::SCHEDULES).await;
                Ok(true)
            }

            async fn pause_schedule(&self, user: &str, id: &str, reason: &str) -> StoreResult<bool> {
                let n = sqlx::query(
                    "UPDATE schedules SET enabled = false, next_tick = NULL, paused_reason = $3
                      WHERE user_id = $1 AND id = $2",
                )
                .bind(user)
                .bind(id)
                .bind(reason)
                .execute(&self.$pool)
                .await?
                .rows_affected();
                Ok(n > 0)
            }

            async fn pause_schedules_of_key(&self, key_id: &str, reason: &str) -> StoreResult<u64> {
                let n = sqlx::query(
                    "UPDATE schedules SET enabled = false, next_tick = NULL, paused_reason = $2
                      WHERE created_by = $1 AND enabled",
                )
                .bind(key_id)
                .bind(reason)
                .execute(&self.$pool)
                .await?
                .rows_affected();
                Ok(n)
            }

            async fn get_schedule(
                &self,
                app: &str,
                user: &str,
                id: &str,
            ) -> StoreResult<Option<ScheduleRecord>> {
                let row = sqlx::query(&format!(
                    "SELECT {SCHEDULE_COLUMNS} FROM schedules
                      WHERE id = $1 AND app_name = $2 AND user_id = $3"
                ))
                .bind(id)
                .bind(app)
                .bind(user)
                .fetch_optional(&self.$pool)
                .await?;
                row.as_ref().map($sched).transpose()
            }

            async fn list_schedules(
                &self,
                app: &str,
                user: Option<&str>,
                after: Option<(f64, String)>,
                limit: u32,
            ) -> StoreResult<Vec<ScheduleRecord>> {
                let (at, id) = after.unzip();
                // One user's, or (admins) the app's: two statements, so neither plan carries
                // the other's filter.
                let by = if user.is_some() { "AND user_id = $2" } else { "AND $2::text IS NULL" };
                let by = if $skip_locked.is_empty() { by.replace("::text", "") } else { by.to_string() };
                let rows = sqlx::query(&format!(
                    "SELECT {SCHEDULE_COLUMNS} FROM schedules
                      WHERE app_name = $1 {by}
                        AND ($3 IS NULL OR created_at > $3 OR (created_at = $3 AND id > $4))
                      ORDER BY created_at, id LIMIT $5"
                ))
                .bind(app)
                .bind(user)
                .bind(at)
                .bind(id)
                .bind(i64::from(limit))
                .fetch_all(&self.$pool)
                .await?;
                rows.iter().map($sched).collect()
            }

            async fn update_schedule(&self, s: &ScheduleRecord) -> StoreResult<bool> {
                let n = sqlx::query(
                    "UPDATE schedules
                        SET cron = $4, timezone = $5, message = $6, session_id = $7,
                            on_busy = $8, catch_up = $9, webhook = $10, enabled = $11,
                            next_tick = $12, updated_at = $13, created_by = $14,
                            paused_reason = NULL
                      WHERE id = $1 AND app_name = $2 AND user_id = $3",
                )
                .bind(&s.id)
                .bind(&s.app_name)
                .bind(&s.user_id)
                .bind(&s.cron)
                .bind(&s.timezone)
                .bind(&s.message)
                .bind(&s.session_id)
                .bind(&s.on_busy)
                .bind(&s.catch_up)
                .bind(&s.webhook)
                .bind(s.enabled)
                .bind(s.next_tick)
                .bind(s.updated_at)
                .bind(&s.created_by)
                .execute(&self.$pool)
                .await?
                .rows_affected();
                if n > 0 && s.enabled {
                    super::turns::wake_after_write(self, super::turns::kind::SCHEDULES).await;
                }
                Ok(n > 0)
            }

            async fn delete_schedule(&self, app: &str, user: &str, id: &str) -> StoreResult<bool> {
                let mut tx = self.$pool.begin_with($begin).await?;
                let n = sqlx::query(
                    "DELETE FROM schedules WHERE id = $1 AND app_name = $2 AND user_id = $3",
                )
                .bind(id)
                .bind(app)
                .bind(user)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if n > 0 {
                    sqlx::query("DELETE FROM schedule_ticks WHERE user_id = $2 AND schedule_id = $1")
                        .bind(id)
                        .bind(user)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(n > 0)
            }

            async fn schedule_ticks(
                &self,
                id: &str,
                before: Option<f64>,
                limit: u32,
            ) -> StoreResult<Vec<TickRecord>> {
                let rows = sqlx::query(&format!(
                    "SELECT {TICK_COLUMNS} FROM schedule_ticks t
                      WHERE t.schedule_id = $1 AND ($2 IS NULL OR t.tick_time < $2)
                      ORDER BY t.tick_time DESC LIMIT $3"
                ))
                .bind(id)
                .bind(before)
                .bind(i64::from(limit))
                .fetch_all(&self.$pool)
                .await?;
                rows.iter().map($tick).collect()
            }

            async fn claim_ticks(
                &self,
                owner: &str,
                plan: &Planner,
                limit: u32,
            ) -> StoreResult<Vec<(ScheduleRecord, TickRecord)>> {
                let now: f64 = sqlx::query_scalar(&format!("SELECT {}", $now))
                    .fetch_one(&self.$pool)
                    .await?;
                // Due schedules are found without a lock (across users: on Citus, across
                // shards); each is then taken in a transaction about that one schedule, which
                // checks again that it is due (another replica may have fired it meanwhile).
                let due = sqlx::query(
                    "SELECT user_id, id FROM schedules
                      WHERE enabled AND next_tick <= $1
                      ORDER BY next_tick LIMIT $2",
                )
                .bind(now)
                .bind(i64::from(limit))
                .fetch_all(&self.$pool)
                .await?;
                let mut fired = Vec::new();
                for row in &due {
                    let user: String = row.try_get("user_id")?;
                    let id: String = row.try_get("id")?;
                    let one = async {
                        let mut tx = self.$pool.begin_with($begin).await?;
                        let row = sqlx::query(&format!(
                            "SELECT {SCHEDULE_COLUMNS} FROM schedules
                              WHERE user_id = $1 AND id = $2 AND enabled AND next_tick <= $3 {}",
                            $skip_locked
                        ))
                        .bind(&user)
                        .bind(&id)
                        .bind(now)
                        .fetch_optional(&mut *tx)
                        .await?;
                        let Some(row) = row else {
                            tx.rollback().await?;
                            return StoreResult::Ok(None);
                        };
                        let s = $sched(&row)?;
                        let p = plan(&s, now);
                        let mut fire = None;
                        if let Some(at) = p.fire {
                            let tick = TickRecord {
                                schedule_id: s.id.clone(),
                                user_id: s.user_id.clone(),
                                tick_time: at,
                                run_id: format!("run-{}", uuid::Uuid::new_v4()),
                                session_id: tick_session(&s, at),
                                status: "claimed".into(),
                                error: None,
                                fired_at: now,
                            };
                            let n = sqlx::query(
                                "INSERT INTO schedule_ticks (schedule_id, user_id, tick_time,
                                                             run_id, session_id, status,
                                                             claimed_by, fired_at)
                                 VALUES ($1, $2, $3, $4, $5, 'claimed', $6, $7)
                                 ON CONFLICT (user_id, schedule_id, tick_time) DO NOTHING",
                            )
                            .bind(&tick.schedule_id)
                            .bind(&tick.user_id)
                            .bind(tick.tick_time)
                            .bind(&tick.run_id)
                            .bind(&tick.session_id)
                            .bind(owner)
                            .bind(now)
                            .execute(&mut *tx)
                            .await?
                            .rows_affected();
                            if n > 0 {
                                fire = Some((s.clone(), tick));
                            }
                        }
                        sqlx::query(
                            "UPDATE schedules SET next_tick = $3 WHERE user_id = $1 AND id = $2",
                        )
                        .bind(&user)
                        .bind(&id)
                        .bind(p.next)
                        .execute(&mut *tx)
                        .await?;
                        tx.commit().await?;
                        Ok(fire)
                    }
                    .await;
                    // Ticks claimed so far are fired whatever happens to the rest (a failed
                    // schedule's transaction rolled back: it is due again next time).
                    match one {
                        Ok(Some(f)) => fired.push(f),
                        Ok(None) => {}
                        Err(e) if fired.is_empty() => return Err(e),
                        Err(e) => {
                            tracing::warn!(error = %e, "could not claim a schedule's tick; firing those claimed");
                            break;
                        }
                    }
                }
                Ok(fired)
            }

            async fn take_over_ticks(
                &self,
                owner: &str,
                stale_secs: f64,
            ) -> StoreResult<Vec<(ScheduleRecord, TickRecord)>> {
                let now: f64 = sqlx::query_scalar(&format!("SELECT {}", $now))
                    .fetch_one(&self.$pool)
                    .await?;
                // A claimed tick whose claimer is dead (or that is stale), found without a
                // lock, then taken by a statement about that one tick that checks again.
                let orphaned = |now: &str, stale: &str| {
                    format!(
                        "status = 'claimed'
                         AND (fired_at < {now} - {stale}
                              OR NOT EXISTS (SELECT 1 FROM replicas r
                                              WHERE r.id = schedule_ticks.claimed_by
                                                AND r.heartbeat_at > {now} - r.lease_secs))"
                    )
                };
                let candidates = sqlx::query(&format!(
                    "SELECT user_id, schedule_id, tick_time FROM schedule_ticks WHERE {}",
                    orphaned("$1", "$2")
                ))
                .bind(now)
                .bind(stale_secs)
                .fetch_all(&self.$pool)
                .await?;
                let mut out = Vec::new();
                for c in &candidates {
                    let user: String = c.try_get("user_id")?;
                    let schedule: String = c.try_get("schedule_id")?;
                    let at: f64 = c.try_get("tick_time")?;
                    let taken = sqlx::query(&format!(
                        "UPDATE schedule_ticks SET claimed_by = $1, fired_at = $2
                          WHERE user_id = $4 AND schedule_id = $5 AND tick_time = $6 AND {}
                      RETURNING schedule_id, user_id, tick_time, run_id, session_id, status,
                                error, fired_at",
                        orphaned("$2", "$3")
                    ))
                    .bind(owner)
                    .bind(now)
                    .bind(stale_secs)
                    .bind(&user)
                    .bind(&schedule)
                    .bind(at)
                    .fetch_optional(&self.$pool)
                    .await;
                    // Ticks taken so far are fired whatever happens to the rest.
                    let taken = match taken {
                        Ok(taken) => taken,
                        Err(e) if out.is_empty() => return Err(e.into()),
                        Err(e) => {
                            tracing::warn!(error = %e, "could not take over a tick; firing those taken");
                            break;
                        }
                    };
                    let Some(taken) = taken else { continue };
                    let tick = $tick(&taken)?;
                    let row = sqlx::query(&format!(
                        "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE user_id = $1 AND id = $2"
                    ))
                    .bind(&user)
                    .bind(&schedule)
                    .fetch_optional(&self.$pool)
                    .await;
                    match row {
                        Ok(Some(row)) => out.push(($sched(&row)?, tick)),
                        Ok(None) => {}
                        Err(e) => {
                            // Taken but its schedule unread: the tick goes stale and is taken
                            // over again later.
                            tracing::warn!(error = %e, "could not read a taken tick's schedule");
                            break;
                        }
                    }
                }
                Ok(out)
            }

            async fn next_tick_work(&self) -> StoreResult<Option<f64>> {
                // Two plain statements (on Citus each one read of every shard, pushed down).
                let claimed = sqlx::query("SELECT 1 FROM schedule_ticks WHERE status = 'claimed' LIMIT 1")
                    .fetch_optional(&self.$pool)
                    .await?;
                if claimed.is_some() {
                    return Ok(Some(0.0));
                }
                Ok(sqlx::query_scalar("SELECT min(next_tick) FROM schedules WHERE enabled")
                    .fetch_one(&self.$pool)
                    .await?)
            }

            async fn settle_tick(
                &self,
                tick: &TickRecord,
                owner: &str,
                status: &str,
                error: Option<&str>,
            ) -> StoreResult<bool> {
                let n = sqlx::query(
                    "UPDATE schedule_ticks SET status = $4, error = $5
                      WHERE user_id = $6 AND schedule_id = $1 AND tick_time = $2
                        AND claimed_by = $3",
                )
                .bind(&tick.schedule_id)
                .bind(tick.tick_time)
                .bind(owner)
                .bind(status)
                .bind(error)
                .bind(&tick.user_id)
                .execute(&self.$pool)
                .await?
                .rows_affected();
                Ok(n > 0)
            }
        }
    };
}

schedule_store!(
    PgStore,
    pool,
    "extract(epoch from statement_timestamp())::double precision",
    "FOR UPDATE SKIP LOCKED",
    "BEGIN",
    pg_schedule,
    pg_tick
);
schedule_store!(
    SqliteStore,
    writer,
    "((julianday('now') - 2440587.5) * 86400.0)",
    "",
    "BEGIN IMMEDIATE",
    sqlite_schedule,
    sqlite_tick
);
