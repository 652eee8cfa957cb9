//! A run's own webhook targets after admission: A2A push notification configs are added to,
//! listed from and removed from the run's list (`runs.webhooks`; on PostgreSQL a running
//! run's is `sessions.run_webhooks`, migration 0012), the list the run's end turns into
//! deliveries (the outbox of `webhooks.rs`). Adding is fenced by the run still running, in
//! the same statement: a config added as the run ends is either in the list its end reads,
//! or refused — never stored and then silently not sent. Each statement names the run's user
//! (one shard on Citus).

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::StoreResult;
use async_trait::async_trait;
use serde_json::Value;

/// What adding a target did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddTarget {
    Added,
    /// The run is not running (or does not exist): its end was already written.
    Ended,
    /// The run already has the most targets allowed.
    Full,
}

#[async_trait]
pub trait PushStore: Send + Sync + 'static {
    /// The run's targets (none if it has none; `None` if there is no such run).
    async fn run_targets(&self, user: &str, run_id: &str) -> StoreResult<Option<Vec<Value>>>;

    /// Appends `target` to a running run's targets, if it has fewer than `max` A2A push
    /// configs (the app's webhooks do not count).
    async fn add_run_target(
        &self,
        user: &str,
        run_id: &str,
        target: &Value,
        max: usize,
    ) -> StoreResult<AddTarget>;

    /// Removes the A2A push config `config_id` from the run's targets; false if it had none.
    async fn remove_push_config(
        &self,
        user: &str,
        run_id: &str,
        config_id: &str,
    ) -> StoreResult<bool>;
}

fn parse(raw: Option<String>) -> Vec<Value> {
    raw.and_then(|t| serde_json::from_str::<Vec<Value>>(&t).ok())
        .unwrap_or_default()
}

#[async_trait]
impl PushStore for PgStore {
    async fn run_targets(&self, user: &str, run_id: &str) -> StoreResult<Option<Vec<Value>>> {
        let row: Option<(Option<String>,)> =
            // Running, the run's targets are on its session row (migration 0012).
            sqlx::query_as(
                "SELECT webhooks::text FROM runs WHERE user_id = $2 AND id = $1
                 UNION ALL
                 SELECT run_webhooks::text FROM sessions WHERE user_id = $2 AND active_run = $1
                 LIMIT 1",
            )
                .bind(run_id)
                .bind(user)
                .fetch_optional(self.pool())
                .await?;
        Ok(row.map(|(raw,)| parse(raw)))
    }

    async fn add_run_target(
        &self,
        user: &str,
        run_id: &str,
        target: &Value,
        max: usize,
    ) -> StoreResult<AddTarget> {
        let done = sqlx::query(
            "UPDATE sessions
                SET run_webhooks = COALESCE(run_webhooks, '[]'::jsonb) || jsonb_build_array($2::jsonb)
              WHERE user_id = $4 AND active_run = $1
                AND (SELECT count(*) FROM jsonb_array_elements(COALESCE(run_webhooks, '[]'::jsonb)) t
                      WHERE t ? 'a2a') < $3",
        )
        .bind(run_id)
        .bind(target.to_string())
        .bind(max as i64)
        .bind(user)
        .execute(self.pool())
        .await?;
        if done.rows_affected() > 0 {
            return Ok(AddTarget::Added);
        }
        // Not added: read why now (a run that ended meanwhile reads as ended).
        let status: Option<(String,)> = sqlx::query_as(
            "SELECT 'running'::text FROM sessions WHERE user_id = $2 AND active_run = $1
                 UNION ALL
                 SELECT status FROM runs WHERE user_id = $2 AND id = $1
                 LIMIT 1",
        )
        .bind(run_id)
        .bind(user)
        .fetch_optional(self.pool())
        .await?;
        Ok(why_not(status))
    }

    async fn remove_push_config(
        &self,
        user: &str,
        run_id: &str,
        config_id: &str,
    ) -> StoreResult<bool> {
        // The run's targets, on its session row while it runs, else on its `runs` row.
        let drop = |list: &str| {
            format!(
                "(SELECT COALESCE(jsonb_agg(t.target ORDER BY t.ord), '[]'::jsonb)
                    FROM jsonb_array_elements({list}) WITH ORDINALITY AS t(target, ord)
                   WHERE t.target->'a2a'->>'id' IS DISTINCT FROM $2)"
            )
        };
        let has = |list: &str| {
            format!(
                "EXISTS (SELECT 1 FROM jsonb_array_elements({list}) AS t(target)
                          WHERE t.target->'a2a'->>'id' = $2)"
            )
        };
        let done: i64 = sqlx::query_scalar(&format!(
            "WITH s AS (
                 UPDATE sessions SET run_webhooks = {drop_running}
                  WHERE user_id = $3 AND active_run = $1 AND {has_running}
                 RETURNING 1
             ), r AS (
                 UPDATE runs SET webhooks = {drop_ended}
                  WHERE user_id = $3 AND id = $1 AND {has_ended}
                 RETURNING 1
             )
             SELECT (SELECT count(*) FROM s) + (SELECT count(*) FROM r)",
            drop_running = drop("run_webhooks"),
            has_running = has("run_webhooks"),
            drop_ended = drop("webhooks"),
            has_ended = has("webhooks"),
        ))
        .bind(run_id)
        .bind(config_id)
        .bind(user)
        .fetch_one(self.pool())
        .await?;
        if done > 0 {
            return Ok(true);
        }
        // A run that ended while the session's UPDATE waited for its row is in `runs` only for
        // a newer snapshot than this statement's: ask `runs` again.
        let done = sqlx::query(&format!(
            "UPDATE runs SET webhooks = {drop_ended} WHERE user_id = $3 AND id = $1 AND {has_ended}",
            drop_ended = drop("webhooks"),
            has_ended = has("webhooks"),
        ))
        .bind(run_id)
        .bind(config_id)
        .bind(user)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() > 0)
    }
}

fn why_not(status: Option<(String,)>) -> AddTarget {
    match status {
        Some((s,)) if s == "running" => AddTarget::Full,
        _ => AddTarget::Ended,
    }
}

#[async_trait]
impl PushStore for SqliteStore {
    async fn run_targets(&self, user: &str, run_id: &str) -> StoreResult<Option<Vec<Value>>> {
        let row: Option<(Option<String>,)> =
            sqlx::query_as("SELECT webhooks FROM runs WHERE user_id = ?2 AND id = ?1")
                .bind(run_id)
                .bind(user)
                .fetch_optional(self.writer())
                .await?;
        Ok(row.map(|(raw,)| parse(raw)))
    }

    async fn add_run_target(
        &self,
        user: &str,
        run_id: &str,
        target: &Value,
        max: usize,
    ) -> StoreResult<AddTarget> {
        // One writer: the check and the update see the same row.
        let done = sqlx::query(
            "UPDATE runs SET webhooks = json_insert(COALESCE(webhooks, '[]'), '$[#]', json(?2))
              WHERE user_id = ?4 AND id = ?1 AND status = 'running'
                AND (SELECT count(*) FROM json_each(COALESCE(runs.webhooks, '[]'))
                      WHERE json_extract(value, '$.a2a') IS NOT NULL) < ?3",
        )
        .bind(run_id)
        .bind(target.to_string())
        .bind(max as i64)
        .bind(user)
        .execute(self.writer())
        .await?;
        if done.rows_affected() > 0 {
            return Ok(AddTarget::Added);
        }
        let status: Option<(String,)> =
            sqlx::query_as("SELECT status FROM runs WHERE user_id = ?2 AND id = ?1")
                .bind(run_id)
                .bind(user)
                .fetch_optional(self.writer())
                .await?;
        Ok(why_not(status))
    }

    async fn remove_push_config(
        &self,
        user: &str,
        run_id: &str,
        config_id: &str,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE runs SET webhooks = (
                    SELECT json_group_array(json(value)) FROM
                      (SELECT value FROM json_each(runs.webhooks)
                        WHERE json_extract(value, '$.a2a.id') IS NOT ?2 ORDER BY key))
              WHERE user_id = ?3 AND id = ?1
                AND EXISTS (SELECT 1 FROM json_each(runs.webhooks)
                             WHERE json_extract(value, '$.a2a.id') = ?2)",
        )
        .bind(run_id)
        .bind(config_id)
        .bind(user)
        .execute(self.writer())
        .await?;
        Ok(done.rows_affected() > 0)
    }
}
