//! SQLite backend: the embedded default, so `cargo run -- serve` works on a bare machine.
//!
//! SQLite allows one writer at a time, so writes go through a pool of exactly one
//! connection and every write transaction starts with `BEGIN IMMEDIATE` (it takes the write
//! lock up front, so a second process waits on `busy_timeout` instead of failing half-way).
//! Reads use a separate pool and never block on writes (WAL mode). JSON state is merged in
//! Rust inside the write transaction: SQLite's `json_patch` deletes keys set to `null`,
//! while ADK stores the `null`.
//!
//! One file per resource, as for PostgreSQL: [`sessions`], [`artifacts`], [`runs`], [`prune`],
//! [`memory`], [`memory_vectors`].

mod artifacts;
mod hamming;
mod memory;
mod memory_vectors;
mod prune;
mod runs;
mod sessions;
mod takeover;
mod vec_extension;

use super::*;
use crate::event::{apply_delta, now_ts, SplitState};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Row, Sqlite, SqliteConnection, Transaction};
use std::str::FromStr;
use std::time::Duration;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// The SQLite store.
#[derive(Clone)]
pub struct SqliteStore {
    pub(crate) writer: SqlitePool,
    pub(crate) reader: SqlitePool,
    limits: StoreLimits,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file named by `url`, e.g. `sqlite://data/agentd.db`.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        limits: StoreLimits,
    ) -> StoreResult<Self> {
        vec_extension::register();
        let opts = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a commit is on disk before the client sees the event, even across power loss.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(false)
            .log_statements(log::LevelFilter::Trace);
        if let Some(dir) = sqlite_parent_dir(url) {
            std::fs::create_dir_all(&dir).map_err(|e| {
                StoreError::Database(sqlx::Error::Configuration(
                    format!(
                        "cannot create the database directory {}: {e}",
                        dir.display()
                    )
                    .into(),
                ))
            })?;
        }
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts.clone())
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(max_connections.clamp(1, 8))
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts)
            .await?;
        Ok(SqliteStore {
            writer,
            reader,
            limits,
        })
    }

    /// The single writer connection's pool (every write goes through it).
    pub(crate) fn writer(&self) -> &SqlitePool {
        &self.writer
    }

    pub async fn migrate(&self) -> StoreResult<()> {
        MIGRATOR.run(&self.writer).await?;
        Ok(())
    }

    pub(crate) async fn begin(&self) -> StoreResult<Transaction<'static, Sqlite>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }
}

/// The directory a `sqlite://path/file.db` URL points into, if it names one.
fn sqlite_parent_dir(url: &str) -> Option<std::path::PathBuf> {
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = path.split('?').next()?;
    if path.is_empty() || path.starts_with(":memory:") {
        return None;
    }
    let parent = std::path::Path::new(path).parent()?;
    (!parent.as_os_str().is_empty()).then(|| parent.to_path_buf())
}

fn parse_map(s: Option<&str>) -> StoreResult<JsonMap> {
    match s {
        None => Ok(JsonMap::new()),
        Some(s) => Ok(serde_json::from_str(s)?),
    }
}

/// An event row. Its `timestamp` comes from the column, which holds the exact `f64`: read back
/// from JSON it can differ in the last bit, and then no longer equal the streamed event or the
/// session's `lastUpdateTime`.
/// [`stored_event`] and the length of its stored JSON (for [`page::take`]).
fn sized_event(r: &sqlx::sqlite::SqliteRow) -> StoreResult<(StoredEvent, usize)> {
    let len = r.get::<&str, _>("event").len();
    Ok((stored_event(r)?, len))
}

fn stored_event(r: &sqlx::sqlite::SqliteRow) -> StoreResult<StoredEvent> {
    let mut event: Event = serde_json::from_str(r.get::<&str, _>("event"))?;
    event.timestamp = r.get("timestamp");
    Ok(StoredEvent {
        seq: r.get("seq"),
        event,
    })
}

impl Store for SqliteStore {
    fn pool_stats(&self) -> (u32, usize) {
        // Saturating: a pool's counts are read while connections come and go, and a debug
        // build once panicked adding them (tests/metrics.rs, a scrape): a gauge must not.
        (
            self.writer.size().saturating_add(self.reader.size()),
            self.writer
                .num_idle()
                .saturating_add(self.reader.num_idle()),
        )
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }
}
