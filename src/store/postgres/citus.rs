//! Distributing the schema on Citus (docs/citus.md): every user-owned table hash-distributed
//! by `user_id`, all colocated with `sessions` (so one user's rows of every table live on one
//! node, and a statement about one user is one shard group's), the cluster-wide tables
//! (`app_states`, `api_keys`, `replicas`) as reference tables, copied to every node, and the
//! app-owned eval tables distributed by `app_name` in a colocation group of their own.
//!
//! Runs after the migrations, when the database has the `citus` extension; idempotent (a
//! table already distributed is left alone), so every replica may run it at start.

use super::PgStore;
use crate::store::StoreResult;

/// Cluster-wide tables: small, read everywhere.
pub const REFERENCE_TABLES: &[&str] = &["app_states", "api_keys", "replicas"];

/// User-owned tables, distributed by `user_id`; the first is the colocation group's anchor.
pub const DISTRIBUTED_TABLES: &[&str] = &[
    "sessions",
    "events",
    "artifacts",
    "user_states",
    "memory_entries",
    "memory_sessions",
    "memory_revisions",
    "memory_due",
    "runs",
    "run_queue",
    "idempotency_keys",
    "webhook_deliveries",
    "schedules",
    "schedule_ticks",
    "usage_daily",
    "budgets",
    "usage_keys",
];

/// App-owned tables (eval sets, eval runs), distributed by `app_name`; the first is their
/// group's anchor.
pub const APP_TABLES: &[&str] = &["eval_sets", "eval_cases", "eval_runs", "eval_run_cases"];

/// Memory search by words (migrations/postgres/0019_memory_search.sql, replaced by 0024 with
/// the same signature, so its distribution stays).
const MEMORY_BY_WORDS: &str = "agentd_memory_by_words_v1(text, text, text, integer)";

/// An arbitrary constant: the advisory lock replicas starting together take, so that one of
/// them distributes the tables and the others then find them distributed.
const DISTRIBUTE_LOCK: i64 = 0x6167_656e_7464_6369;

impl PgStore {
    /// Whether the database has the Citus extension.
    pub async fn is_citus(&self) -> StoreResult<bool> {
        Ok(sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
        )
        .fetch_one(self.pool())
        .await?)
    }

    /// Distributes the tables not yet distributed; returns how many it distributed.
    pub async fn distribute(&self) -> StoreResult<usize> {
        // A connection of its own, out of the pool: the session-level lock goes with it when
        // it is closed, whatever happens in between (a pooled one would carry it on).
        let mut conn = self.pool().acquire().await?.detach();
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(DISTRIBUTE_LOCK)
            .execute(&mut conn)
            .await?;
        let result = async {
            // The memory search's function, on every node (Citus copies a function created
            // after the extension by itself, not one from before it).
            let known: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_dist_object
                                 WHERE objid = 'memory_tsquery(text)'::regprocedure)",
            )
            .fetch_one(&mut conn)
            .await?;
            if !known {
                sqlx::query("SELECT create_distributed_function('memory_tsquery(text)')")
                    .execute(&mut conn)
                    .await?;
            }
            let mut done = 0;
            for table in REFERENCE_TABLES
                .iter()
                .chain(DISTRIBUTED_TABLES)
                .chain(APP_TABLES)
            {
                let known: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM pg_dist_partition
                                     WHERE logicalrelid = to_regclass($1))",
                )
                .bind(table)
                .fetch_one(&mut conn)
                .await?;
                if known {
                    continue;
                }
                if *table == "runs" {
                    // A plain PostgreSQL keys runs by id alone (migration 0011 says why);
                    // distributed, the key must hold the user.
                    sqlx::query(
                        "ALTER TABLE runs DROP CONSTRAINT runs_pkey,
                                          ADD CONSTRAINT runs_pkey PRIMARY KEY (id, user_id)",
                    )
                    .execute(&mut conn)
                    .await?;
                }
                let sql = if APP_TABLES.contains(table) {
                    match *table == APP_TABLES[0] {
                        true => format!(
                            "SELECT create_distributed_table('{table}', 'app_name', \
                             colocate_with => 'none')"
                        ),
                        false => format!(
                            "SELECT create_distributed_table('{table}', 'app_name', \
                             colocate_with => '{}')",
                            APP_TABLES[0]
                        ),
                    }
                } else if REFERENCE_TABLES.contains(table) {
                    format!("SELECT create_reference_table('{table}')")
                } else if *table == DISTRIBUTED_TABLES[0] {
                    format!("SELECT create_distributed_table('{table}', 'user_id')")
                } else {
                    format!(
                        "SELECT create_distributed_table('{table}', 'user_id', \
                         colocate_with => '{}')",
                        DISTRIBUTED_TABLES[0]
                    )
                };
                sqlx::query(&sql).execute(&mut conn).await?;
                done += 1;
            }
            // The hot steps' functions, colocated with the tables just distributed.
            Self::install_router_functions(&mut conn).await?;
            // Memory search by words (migration 0019): one call on the user's worker.
            let routed: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_dist_object
                                 WHERE objid = to_regprocedure($1)
                                   AND distribution_argument_index IS NOT NULL)",
            )
            .bind(MEMORY_BY_WORDS)
            .fetch_one(&mut conn)
            .await?;
            if !routed {
                sqlx::query(
                    "SELECT create_distributed_function($1::regprocedure, 'p_user', \
                     colocate_with => 'memory_entries')",
                )
                .bind(MEMORY_BY_WORDS)
                .execute(&mut conn)
                .await?;
            }
            StoreResult::Ok(done)
        }
        .await;
        let _ = sqlx::Connection::close(conn).await;
        result
    }
}
