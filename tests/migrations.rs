//! Migrations: applied on start by every replica, so concurrent starts must be safe.

mod common;

use common::{Backend, TestDb};

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
    let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&pool)
        .await
        .expect("migrations table");
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
        .expect("migrations dir")
        .count() as i64;
    assert_eq!(applied, files, "each migration is recorded exactly once");
    pool.close().await;
}

/// `agentd migrate` is idempotent: running it on a migrated database changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_twice_is_a_no_op() {
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let db = TestDb::new(backend).await;
        agentd::store::migrate(&db.url)
            .await
            .expect("first migrate");
        agentd::store::migrate(&db.url)
            .await
            .expect("second migrate");
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
