//! PostgreSQL backend: the production store, shared by every replica.
//!
//! The hot path is [`PgStore::append_event`]: without artifacts it is ONE statement (data-
//! modifying CTEs), so one round trip and one commit per complete event. The `UPDATE` of the
//! session row takes its row lock first, which serializes concurrent appends to one session
//! (no duplicate `seq`, no lost update); `app:`/`user:` state is merged with `jsonb ||` inside
//! `ON CONFLICT DO UPDATE`, which is atomic across sessions. On Citus the same step is one
//! call of a function the coordinator forwards to the user's worker ([`router`]).
//!
//! One file per resource: [`sessions`] (events, state: the append path), [`artifacts`],
//! [`runs`] (admission, ownership, liveness), [`prune`], [`memory`]; [`router`] the hot steps
//! on Citus. API keys and
//! idempotency keys share one implementation with SQLite (`super::keys`, `super::idempotency`).

mod artifacts;
pub mod citus;
mod memory;
mod memory_vectors;
mod outbox;
mod prune;
pub mod router;
mod run_record;
mod runs;
mod session_sql;
mod sessions;
mod takeover;
mod usage;

pub use memory::TRIM_SQL;
pub use runs::{
    list_runs_sql, list_session_runs_sql, pg_insert_run_sql, ACTIVE_RUN_SQL, CANCEL_RUN,
    DEQUEUE_SQL, ENQUEUE_SQL, EXPIRE_RUN, FINISH_RUN, RUN_INVOCATIONS_SQL, USER_RUN_SQL,
};
pub use session_sql::{
    APPEND, APPEND_END, APPEND_END_KEYLESS, APPEND_END_UNMETERED, CREATE_SQL, EVENTS_AFTER_SQL,
    EVENT_BY_ID_SQL, HEAD_SQL, LIST_SESSIONS_SQL,
};
pub use takeover::{EXPIRE_AS, RELEASE_SQL, TAKE_OVER};

use super::*;
use crate::event::{now_ts, SplitState};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::types::Json;
use sqlx::{ConnectOptions, Postgres, Row, Transaction};
use std::str::FromStr;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The PostgreSQL store. Cheap to clone (a pool handle).
#[derive(Clone)]
pub struct PgStore {
    pub(crate) pool: PgPool,
    /// The database has the Citus extension: statements carry their routing quals.
    pub(crate) citus: bool,
    /// On Citus, the hot steps' functions are installed ([`router`]): they are called instead
    /// of the statement forms. Set at connect, and by [`PgStore::migrate`] once it installs them.
    routed: Arc<std::sync::atomic::AtomicBool>,
    /// Whether memories carry vectors (pgvector; see [`memory_vectors`]).
    vectors: Arc<std::sync::RwLock<crate::store::memory::vectors::VectorSupport>>,
    limits: StoreLimits,
    /// Until when every connection is pinged before use (see [`Store::connection_lost`]).
    suspect: Arc<Suspect>,
}

/// A connection was found dead: others in the pool may be too (a PostgreSQL restart cuts
/// them all), so for a short while each one is pinged before it is handed out, not only the
/// ones that sat idle. Milliseconds since `origin`; 0 when nothing is suspect.
struct Suspect {
    origin: std::time::Instant,
    until_ms: std::sync::atomic::AtomicU64,
}

impl Suspect {
    fn active(&self) -> bool {
        let now = self.origin.elapsed().as_millis() as u64;
        now < self.until_ms.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// How long after a dead connection every connection is pinged before use.
const SUSPECT_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// A pooled connection idle for this long is pinged before use (see [`PgStore::connect`]).
const PING_IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Marks a `user_id = $n AND ` on `runs` that only Citus needs (to route the statement to the
/// user's shard). A plain PostgreSQL gets the statement without it ([`Routed`]): there a run's
/// id alone is its key, and with the user's qual as well PostgreSQL without statistics reads
/// the run through a small partial index (unsealed runs, whose predicate the statement's own
/// `sealed` qual matches) instead of the key (tests/plans.rs).
pub(crate) const ROUTE: &str = "/*route*/ ";

/// A statement in both forms: for Citus (with its routing quals) and for a plain PostgreSQL
/// (each [`ROUTE`]-marked qual removed).
pub struct Routed {
    pub citus: String,
    pub plain: String,
}

impl Routed {
    pub fn new(citus: String) -> Routed {
        let mut plain = String::with_capacity(citus.len());
        let mut rest = citus.as_str();
        while let Some(i) = rest.find(ROUTE) {
            plain.push_str(&rest[..i]);
            // Up to and including the next " AND ".
            let after = &rest[i..];
            match after.find(" AND ") {
                Some(j) => rest = &after[j + " AND ".len()..],
                None => rest = "",
            }
        }
        plain.push_str(rest);
        Routed { citus, plain }
    }

    pub fn pick(&self, citus: bool) -> &str {
        if citus {
            &self.citus
        } else {
            &self.plain
        }
    }
}

/// PostgreSQL's clock, as epoch seconds: the time the current statement started. A `STABLE`
/// function, not `clock_timestamp()`: Citus refuses a volatile function in a write to a
/// distributed table, and evaluates a stable one once, on the coordinator, for the whole
/// statement (so all replicas still read one clock).
pub(crate) const PG_NOW: &str = "extract(epoch from statement_timestamp())::double precision";

/// Makes the statement's own (implicit) transaction commit without waiting for its WAL to
/// reach disk (`SET LOCAL synchronous_commit = off`, inside the one statement, so it costs no
/// round trip). Only for writes whose loss in a database crash is harmless or repaired
/// without a client: admission without its user event, heartbeats, a run's outcome when it
/// did not ride on its last event. Why each is safe: docs/storage.md, "Asynchronous commits".
const ASYNC_COMMIT: &str = "SELECT set_config('synchronous_commit', 'off', true)";

/// How often an append refused for a transient reason ([`StoreError::is_transient`]) is
/// tried again (after 100, 200, 400 ms): enough to outlast a shard move's switch-over.
const TRANSIENT_RETRIES: u32 = 3;

/// How often a write that lost the race for an artifact version is retried. Every conflict
/// means a concurrent writer committed that version, so a writer retries at most once per
/// competitor; the bound only stops a bug from looping forever.
const CONFLICT_RETRIES: u32 = 64;

impl PgStore {
    pub async fn connect(
        url: &str,
        max_connections: u32,
        limits: StoreLimits,
    ) -> StoreResult<Self> {
        let opts = PgConnectOptions::from_str(url)?
            .application_name("agentd")
            // Statement logging at INFO would put every append in the log.
            .log_statements(log::LevelFilter::Trace);
        let suspect = Arc::new(Suspect {
            origin: std::time::Instant::now(),
            until_ms: std::sync::atomic::AtomicU64::new(0),
        });
        probe(&opts).await?;
        let pinging = suspect.clone();
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(std::time::Duration::from_secs(10))
            // sqlx pings every pooled connection before handing it out: a round trip per
            // statement. Only a connection that sat idle can have been cut (server restart,
            // idle timeouts along the way), so only those are pinged; a busy pool never is.
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                let suspect = pinging.active();
                Box::pin(async move {
                    if suspect || meta.idle_for >= PING_IDLE_AFTER {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(opts)
            .await?;
        let citus = sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
        )
        .fetch_one(&pool)
        .await?;
        let store = PgStore {
            pool,
            citus,
            routed: Arc::default(),
            vectors: Arc::new(std::sync::RwLock::new(
                crate::store::memory::vectors::VectorSupport::Missing("not checked yet".into()),
            )),
            limits,
            suspect,
        };
        let vectors = store.detect_vectors().await?;
        store.set_vector_support(vectors);
        if citus && store.has_router_functions().await? {
            store
                .routed
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(store)
    }

    /// Applies pending migrations. sqlx holds a PostgreSQL advisory lock while it migrates,
    /// so replicas starting at the same moment apply each migration exactly once. On Citus,
    /// then distributes what is not yet distributed ([`citus`]).
    pub async fn migrate(&self) -> StoreResult<()> {
        MIGRATOR.run(&self.pool).await?;
        if self.is_citus().await? {
            let n = self.distribute().await?;
            if n > 0 {
                tracing::info!(tables = n, "distributed the tables by user (Citus)");
            }
            self.routed
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        // After the tables are distributed: the search function is colocated with them.
        self.install_vectors().await?;
        Ok(())
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn set_vector_support(&self, support: crate::store::memory::vectors::VectorSupport) {
        if let Ok(mut v) = self.vectors.write() {
            *v = support;
        }
    }

    fn vector_support_now(&self) -> crate::store::memory::vectors::VectorSupport {
        self.vectors.read().map(|v| v.clone()).unwrap_or_else(|_| {
            crate::store::memory::vectors::VectorSupport::Missing("unknown".into())
        })
    }

    /// Whether `memory_entries` has its vector columns in use (pgvector installed and new
    /// enough): what a write that resets a memory's vector must name.
    pub(crate) fn has_vectors(&self) -> bool {
        self.vector_support_now() == crate::store::memory::vectors::VectorSupport::Available
    }

    /// Whether the hot steps go through [`router`]'s functions (on Citus, once installed).
    pub(crate) fn routed(&self) -> bool {
        self.routed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// How long the first connection may take before the server says PostgreSQL cannot be reached.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// One connection before the pool: a server that cannot be reached is reported at once, with
/// where it was looked for and why it failed (refused, credentials, no such database, no
/// answer), not as the pool's timeout ten seconds later.
async fn probe(opts: &PgConnectOptions) -> StoreResult<()> {
    use sqlx::ConnectOptions;
    let at = format!("{}:{}", opts.get_host(), opts.get_port());
    let cause = match tokio::time::timeout(PROBE_TIMEOUT, opts.connect()).await {
        Ok(Ok(conn)) => {
            let _ = sqlx::Connection::close(conn).await;
            return Ok(());
        }
        Err(_) => format!("no answer within {} s", PROBE_TIMEOUT.as_secs()),
        Ok(Err(sqlx::Error::Io(e))) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused: is PostgreSQL running and listening there?".to_string()
        }
        Ok(Err(sqlx::Error::Database(e))) => match e.code().as_deref() {
            Some("28P01" | "28000") => format!(
                "it refused the credentials of user {:?} ({})",
                opts.get_username(),
                e.message()
            ),
            Some("3D000") => format!("no such database ({})", e.message()),
            _ => e.message().to_string(),
        },
        Ok(Err(e)) => e.to_string(),
    };
    Err(StoreError::Database(sqlx::Error::Configuration(
        format!("cannot connect to PostgreSQL at {at}: {cause}").into(),
    )))
}

/// Binds an event to append, in the order both [`APPEND`] and admission
/// ([`super::runs::pg_insert_run_sql`]) number them: its state delta split by prefix
/// (session, `app:`, `user:`), then time, id, invocation, author and the event's JSON.
pub(crate) fn bind_event<'q>(
    q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    event: &'q Event,
    split: &'q SplitState,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    q.bind(Json(&split.session))
        .bind(Json(&split.app))
        .bind(Json(&split.user))
        .bind(event.timestamp)
        .bind(&event.id)
        .bind(&event.invocation_id)
        .bind(&event.author)
        .bind(Json(event))
}

/// Whether a database error is a violation of the index or constraint `name`. On Citus the
/// error comes from a shard, whose index is named `name_<shard id>`, and a worker's error may
/// reach the coordinator without the constraint field, only in its message.
pub(crate) fn violates(db: &dyn sqlx::error::DatabaseError, name: &str) -> bool {
    let names = |c: &str| {
        c == name
            || c.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('_'))
                .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
    };
    match db.constraint() {
        Some(c) => names(c),
        None => db.is_unique_violation() && db.message().split('"').nth(1).is_some_and(names),
    }
}

fn map_unique_to_conflict(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if violates(db.as_ref(), "events_by_id") => {
            StoreError::DuplicateEvent(String::new())
        }
        sqlx::Error::Database(db) if db.is_unique_violation() => StoreError::Conflict,
        _ => StoreError::Database(e),
    }
}

/// An event row. Its `timestamp` comes from the column, which holds the exact `f64`: read back
/// from JSON it can differ in the last bit, and then no longer equal the streamed event or the
/// session's `lastUpdateTime`.
/// [`stored_event`] and the length of its stored JSON (for [`page::take`]).
fn sized_event(row: &sqlx::postgres::PgRow) -> StoreResult<(StoredEvent, usize)> {
    let len = row.try_get_raw("event")?.as_bytes().map_or(0, <[u8]>::len);
    Ok((stored_event(row)?, len))
}

fn stored_event(row: &sqlx::postgres::PgRow) -> StoreResult<StoredEvent> {
    let Json(mut event): Json<Event> = row.try_get("event")?;
    event.timestamp = row.try_get("timestamp")?;
    Ok(StoredEvent {
        seq: row.try_get("seq")?,
        event,
    })
}

impl Store for PgStore {
    fn connection_lost(&self) {
        let until = (self.suspect.origin.elapsed() + SUSPECT_FOR).as_millis() as u64;
        self.suspect
            .until_ms
            .fetch_max(until, std::sync::atomic::Ordering::Relaxed);
    }

    fn pool_stats(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }

    fn pg_pool(&self) -> Option<sqlx::PgPool> {
        Some(self.pool.clone())
    }

    fn backend(&self) -> &'static str {
        "postgres"
    }
}

#[cfg(test)]
mod tests {
    use super::Routed;

    #[test]
    fn a_plain_statement_loses_only_its_routing_quals() {
        let r = Routed::new(
            "SELECT 1 FROM runs WHERE /*route*/ user_id = $2 AND id = $1 AND status = 'running'"
                .to_string(),
        );
        assert_eq!(
            r.plain,
            "SELECT 1 FROM runs WHERE id = $1 AND status = 'running'"
        );
        assert!(r.citus.contains("user_id = $2 AND id = $1"));
        assert_eq!(r.pick(true), r.citus);
        assert_eq!(r.pick(false), r.plain);
    }
}
