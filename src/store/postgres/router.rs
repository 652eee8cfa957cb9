//! The hot steps on Citus as distributed functions (`router.sql`, which says why): creating a
//! session, admission, the append of a complete event, and the run's end, each one call the
//! coordinator forwards to the worker holding the user's shards.
//!
//! A plain PostgreSQL keeps the statement forms (one statement per step already; its plans
//! are tested in tests/plans.rs). Each call below takes the statement form's parameters in the
//! same order, so the binding code is shared, and returns the same columns.

use super::PgStore;
use crate::store::StoreResult;

/// The functions' definitions; each `CREATE OR REPLACE`, so running them again is harmless.
const DEFINITIONS: &str = include_str!("router.sql");

/// Each function, and the parameter Citus routes its call by (`None`: called only from the
/// others, on the node they run on; distributed so that it exists on every node).
const FUNCTIONS: &[(&str, Option<&str>)] = &[
    (
        "agentd_create_session_v1(text, text, text, jsonb, double precision, double precision)",
        Some("p_user"),
    ),
    (
        "agentd_admit_v1(text, text, text, text, text, text, boolean, bigint, double precision, \
         boolean, jsonb, jsonb, jsonb, double precision, text, text, text, jsonb, jsonb, text, \
         jsonb, double precision, text)",
        Some("p_user"),
    ),
    (
        "agentd_after_end_v1(text, text, text, text, jsonb, jsonb, text)",
        None,
    ),
    (
        "agentd_record_end_v1(text, text, bigint, text, text, text, text, text, text, boolean, \
         text, text, double precision, bigint, boolean, jsonb, integer, jsonb, jsonb, text, text)",
        None,
    ),
    (
        "agentd_append_v1(text, text, text, jsonb, jsonb, jsonb, double precision, text, text, \
         text, jsonb, text, text, integer, jsonb, boolean)",
        Some("p_user"),
    ),
    (
        "agentd_finish_run_v1(text, text, bigint, text, text, integer, jsonb)",
        Some("p_user"),
    ),
];

/// [`super::CREATE_SQL`] as one routed call.
pub const CREATE_CALL: &str = "SELECT * FROM agentd_create_session_v1($1, $2, $3, $4, $5, $6)";

/// [`super::pg_insert_run_sql`] as one routed call.
pub const ADMIT_CALL: &str = "SELECT * FROM agentd_admit_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, \
     $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)";

/// [`super::APPEND`] as one routed call.
pub const APPEND_CALL: &str = "SELECT * FROM agentd_append_v1($1, $2, $3, $4, $5, $6, $7, $8, \
     $9, $10, $11, $12, $13, $14, $15, false)";

/// [`super::APPEND_END`] and its keyless and unmetered forms as one routed call (the function
/// writes what the run's usage and key call for).
pub const APPEND_END_CALL: &str = "SELECT * FROM agentd_append_v1($1, $2, $3, $4, $5, $6, $7, \
     $8, $9, $10, $11, $12, $13, $14, $15, true)";

/// [`super::FINISH_RUN`] as one routed call.
pub const FINISH_CALL: &str = "SELECT agentd_finish_run_v1($1, $2, $3, $4, $5, $6, $7)";

impl PgStore {
    /// Whether the functions are in the database, distributed (a replica that does not
    /// migrate may find a Citus database an older release set up: it then uses the statement
    /// forms).
    pub(super) async fn has_router_functions(&self) -> StoreResult<bool> {
        let mut conn = self.pool().acquire().await?;
        Ok(distributed(&mut conn).await? == FUNCTIONS.len())
    }

    /// Creates and distributes the functions (on `conn`, which holds the lock
    /// [`PgStore::distribute`] takes, after the tables are distributed: each is colocated
    /// with `sessions`). Idempotent.
    pub(super) async fn install_router_functions(conn: &mut sqlx::PgConnection) -> StoreResult<()> {
        if distributed(conn).await? == FUNCTIONS.len() {
            return Ok(());
        }
        sqlx::raw_sql(DEFINITIONS).execute(&mut *conn).await?;
        for (signature, by) in FUNCTIONS {
            if is_distributed(conn, signature, by.is_some()).await? {
                continue;
            }
            let q = match by {
                Some(arg) => sqlx::query(
                    "SELECT create_distributed_function($1::regprocedure, $2, \
                     colocate_with => 'sessions')",
                )
                .bind(signature)
                .bind(*arg),
                None => sqlx::query("SELECT create_distributed_function($1::regprocedure)")
                    .bind(signature),
            };
            q.execute(&mut *conn).await?;
        }
        Ok(())
    }
}

/// How many of [`FUNCTIONS`] Citus knows as they must be: on every node, and those called
/// from outside delegated by their user argument. (Citus copies a function created after the
/// extension to every node by itself, but delegates calls to one only once it is told which
/// argument routes it.)
async fn distributed(conn: &mut sqlx::PgConnection) -> StoreResult<usize> {
    let mut n = 0;
    for (signature, by) in FUNCTIONS {
        n += usize::from(is_distributed(conn, signature, by.is_some()).await?);
    }
    Ok(n)
}

async fn is_distributed(
    conn: &mut sqlx::PgConnection,
    signature: &str,
    routed: bool,
) -> StoreResult<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_dist_object
                         WHERE objid = to_regprocedure($1)
                           AND (NOT $2 OR (distribution_argument_index IS NOT NULL
                                           AND colocationid IS NOT NULL)))",
    )
    .bind(signature)
    .bind(routed)
    .fetch_one(conn)
    .await?)
}
