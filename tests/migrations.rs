//! Migrations: applied on start by every replica, so concurrent starts must be safe.

mod common;

use common::{Backend, TestDb};

/// The versions of the migration files for `backend`, in order (`0003_scale_out.sql` is 3).
fn file_versions(backend: Backend) -> Vec<i64> {
    let dir = match backend {
        Backend::Postgres | Backend::Citus => {
            concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres")
        }
        Backend::Sqlite => concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite"),
    };
    let mut versions: Vec<i64> = std::fs::read_dir(dir)
        .expect("migrations dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".sql"))
        .map(|name| {
            name.split_once('_')
                .and_then(|(v, _)| v.parse().ok())
                .unwrap_or_else(|| panic!("migration file without a version: {name}"))
        })
        .collect();
    versions.sort_unstable();
    assert!(!versions.is_empty(), "no migrations in {dir}");
    versions
}

/// A `_sqlx_migrations` row: (version, success, checksum, installed_on, and on PostgreSQL the
/// row's `xmin`, the transaction that last wrote it).
type MigrationRow = (i64, bool, Vec<u8>, String, String);

/// What a migration run could change: the `_sqlx_migrations` rows and the schema.
#[derive(Debug, PartialEq)]
struct Snapshot {
    /// Every row, failed ones included.
    migrations: Vec<MigrationRow>,
    /// Tables, columns (with type, nullability and default) and indexes.
    schema: Vec<String>,
}

impl Snapshot {
    async fn of(db: &TestDb) -> Snapshot {
        match db.backend {
            Backend::Postgres | Backend::Citus => {
                let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
                let migrations: Vec<MigrationRow> = sqlx::query_as(
                    "SELECT version, success, checksum, installed_on::text, xmin::text
                       FROM _sqlx_migrations ORDER BY version",
                )
                .fetch_all(&pool)
                .await
                .expect("migrations table");
                let mut schema: Vec<String> = sqlx::query_scalar(
                    "SELECT format('column %s.%s %s nullable=%s default=%s',
                                   table_name, column_name, data_type, is_nullable,
                                   column_default)
                       FROM information_schema.columns
                      WHERE table_schema NOT IN ('pg_catalog', 'information_schema')
                      ORDER BY table_schema, table_name, ordinal_position",
                )
                .fetch_all(&pool)
                .await
                .expect("columns");
                let indexes: Vec<String> = sqlx::query_scalar(
                    "SELECT indexdef FROM pg_indexes
                      WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
                      ORDER BY schemaname, tablename, indexname",
                )
                .fetch_all(&pool)
                .await
                .expect("indexes");
                schema.extend(indexes);
                pool.close().await;
                Snapshot { migrations, schema }
            }
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&db.url).await.expect("connect");
                let migrations: Vec<MigrationRow> = sqlx::query_as(
                    "SELECT version, success, checksum, CAST(installed_on AS TEXT), ''
                       FROM _sqlx_migrations ORDER BY version",
                )
                .fetch_all(&pool)
                .await
                .expect("migrations table");
                let schema: Vec<String> = sqlx::query_scalar(
                    "SELECT type || ' ' || name || ' on ' || tbl_name || ': ' || COALESCE(sql, '')
                       FROM sqlite_master ORDER BY type, name",
                )
                .fetch_all(&pool)
                .await
                .expect("schema");
                pool.close().await;
                Snapshot { migrations, schema }
            }
        }
    }

    /// The versions recorded, one entry per row (a version recorded twice would show twice).
    fn versions(&self) -> Vec<i64> {
        self.migrations.iter().map(|m| m.0).collect()
    }
}

/// Four replicas opening one fresh database at the same moment all succeed, and the schema
/// is applied exactly once (sqlx holds a PostgreSQL advisory lock while migrating).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replicas_migrate_a_fresh_postgres_once() {
    let db = TestDb::new(Backend::Postgres).await;
    let opens = (0..4).map(|_| agentd::store::open(&db.url, 2, Default::default()));
    for result in futures::future::join_all(opens).await {
        assert!(
            result.is_ok(),
            "a replica failed to start: {:?}",
            result.err()
        );
    }
    // Every row counts, failed ones too: each file's version exactly once, all successful.
    let after = Snapshot::of(&db).await;
    assert_eq!(
        after.versions(),
        file_versions(Backend::Postgres),
        "each migration is recorded exactly once: {after:#?}"
    );
    assert!(after.migrations.iter().all(|m| m.1), "{after:#?}");
}

/// `agentd migrate` is idempotent: running it on a migrated database changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_twice_is_a_no_op() {
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let db = TestDb::new(backend).await;
        agentd::store::migrate(&db.url, false)
            .await
            .expect("first migrate");
        let before = Snapshot::of(&db).await;
        assert_eq!(
            before.versions(),
            file_versions(backend),
            "{backend:?}: every migration applied once: {before:#?}"
        );
        assert!(before.migrations.iter().all(|m| m.1), "{before:#?}");
        assert!(
            before.schema.iter().any(|s| s.contains("sessions")),
            "{backend:?}: the schema is there: {before:#?}"
        );
        agentd::store::migrate(&db.url, false)
            .await
            .expect("second migrate");
        let after = Snapshot::of(&db).await;
        assert_eq!(
            after, before,
            "{backend:?}: the second migrate applied or rewrote something"
        );
    }
}

/// An unsupported URL is a clear error, not a panic.
#[tokio::test]
async fn unsupported_database_url_is_a_clear_error() {
    let err = agentd::store::open("mysql://localhost/x", 1, Default::default())
        .await
        .err()
        .expect("mysql is not supported");
    assert!(err.to_string().contains("postgres://"), "{err}");
}
