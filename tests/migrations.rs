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

/// The migrations in `dir` (under the crate) before `version`: the schema an older agentd left.
async fn migrations_before(dir: &str, version: i64) -> sqlx::migrate::Migrator {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut before = sqlx::migrate::Migrator::new(path)
        .await
        .expect("migrations");
    before.migrations = before
        .migrations
        .iter()
        .filter(|m| m.version < version)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    before
}

/// A pool on `db`, migrated up to 0011 (the schema an agentd before 0012 left).
async fn migrated_to_0011(db: &TestDb) -> sqlx::PgPool {
    let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
    migrations_before("migrations/postgres", 12)
        .await
        .run(&pool)
        .await
        .expect("migrate to 0011");
    pool
}

/// Migration 0012 moves runs in flight onto their sessions (where a running run now lives):
/// an upgraded database still knows them as running, with everything they had, and they end
/// as any run does. A session that pointed at no running run comes out free, and a running
/// row that its session did not point at comes out abandoned, awaiting its seal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_in_flight_move_onto_their_sessions() {
    use agentd::store::{RunStatus, SessionKey};
    let db = TestDb::new(Backend::Postgres).await;
    let pool = migrated_to_0011(&db).await;
    sqlx::raw_sql(
        "INSERT INTO sessions (app_name, user_id, id, create_time, update_time, last_seq, active_run)
         VALUES ('echo', 'u1', 'busy', 1, 1, 3, 'run-live'),
                ('echo', 'u1', 'stale', 1, 1, 0, 'run-nowhere'),
                ('echo', 'u1', 'free', 1, 1, 2, NULL);
         INSERT INTO runs (id, app_name, user_id, session_id, invocation_id, status, owner,
                           lease_expires_at, created_at, started_at, base_seq, user_event,
                           cancel_requested, cancelled_by, webhooks, sealed)
         VALUES ('run-live', 'echo', 'u1', 'busy', 'e-live', 'running', 'replica-a', 0, 10, 10,
                 2, true, true, 'ops', '[{\"url\": \"http://127.0.0.1:9/hook\"}]', true),
                ('run-lost', 'echo', 'u1', 'free', 'e-lost', 'running', 'replica-a', 0, 5, 5,
                 1, true, false, NULL, NULL, true),
                ('run-done', 'echo', 'u1', 'free', 'e-done', 'completed', 'replica-a', 0, 1, 1,
                 0, true, false, NULL, NULL, true);",
    )
    .execute(&pool)
    .await
    .expect("rows written by a replica before 0012");
    pool.close().await;

    let store = db.store().await; // the rest of the migrations
    let key = |s: &str| SessionKey::new("echo", "u1", s);
    let live = store
        .get_user_run("u1", "run-live")
        .await
        .unwrap()
        .expect("the run in flight is still there");
    assert_eq!(live.status, RunStatus::Running);
    assert_eq!(
        (
            live.session_id.as_str(),
            live.invocation_id.as_str(),
            live.owner.as_str()
        ),
        ("busy", "e-live", "replica-a")
    );
    assert_eq!((live.base_seq, live.user_event), (Some(2), true));
    assert!(live.cancel_requested);
    assert_eq!(live.cancelled_by.as_deref(), Some("ops"));
    assert_eq!(live.created_at, 10.0);
    assert_eq!(
        store.active_run(&key("busy")).await.unwrap().as_ref(),
        Some(&live),
        "it still owns its session"
    );
    assert_eq!(
        store
            .heartbeat("replica-a", std::time::Duration::from_secs(30), false, true)
            .await
            .unwrap(),
        vec!["run-live".to_string()],
        "its owner still hears of the cancel"
    );
    assert!(store.active_run(&key("stale")).await.unwrap().is_none());
    let lost = store.get_user_run("u1", "run-lost").await.unwrap().unwrap();
    assert_eq!(lost.status, RunStatus::Abandoned);
    assert_eq!(
        store.unsealed_runs(&key("free")).await.unwrap(),
        vec![lost],
        "to be sealed"
    );
    let done = store.get_user_run("u1", "run-done").await.unwrap().unwrap();
    assert_eq!(done.status, RunStatus::Completed);

    assert!(store
        .finish_run("u1", "run-live", 0, RunStatus::Cancelled, Some(3), None)
        .await
        .unwrap());
    let ended = store.get_user_run("u1", "run-live").await.unwrap().unwrap();
    assert_eq!(ended.status, RunStatus::Cancelled);
    assert_eq!(
        (ended.last_seq, ended.base_seq, ended.created_at),
        (Some(3), Some(2), 10.0)
    );
    assert!(store.active_run(&key("busy")).await.unwrap().is_none());
}

/// The live run's webhook targets moved with it, and what 0011 kept for older replicas is
/// gone (no replica older than 0012 can run); and 0012 refuses to run while a replica is
/// heartbeating, changing nothing, with a message saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_0012_needs_the_older_replicas_stopped() {
    let db = TestDb::new(Backend::Postgres).await;
    let pool = migrated_to_0011(&db).await;
    sqlx::raw_sql(
        "INSERT INTO sessions (app_name, user_id, id, create_time, update_time, last_seq, active_run)
         VALUES ('echo', 'u1', 'busy', 1, 1, 3, 'run-live');
         INSERT INTO runs (id, app_name, user_id, session_id, invocation_id, status, owner,
                           lease_expires_at, created_at, started_at, base_seq, user_event, webhooks)
         VALUES ('run-live', 'echo', 'u1', 'busy', 'e-live', 'running', 'replica-old', 0, 10, 10,
                 2, true, '[{\"url\": \"http://127.0.0.1:9/hook\", \"events\": [\"run.completed\"]}]');
         INSERT INTO replicas (id, heartbeat_at, lease_secs, started_at)
         VALUES ('replica-old', extract(epoch from now()), 30, 1);",
    )
    .execute(&pool)
    .await
    .expect("an older replica, still serving");

    let refused = agentd::store::migrate(&db.url, false)
        .await
        .expect_err("0012 runs while an older replica serves");
    assert!(
        format!("{refused:?}").contains("needs every agentd replica stopped"),
        "{refused:?}"
    );
    let version: i64 =
        sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(version, 11, "nothing of 0012 applied");
    let status: String = sqlx::query_scalar("SELECT status FROM runs WHERE id = 'run-live'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "running", "the older replica's run untouched");

    // The older replica stops (it retires its heartbeat), and the migration goes through.
    sqlx::query("UPDATE replicas SET heartbeat_at = 0 WHERE id = 'replica-old'")
        .execute(&pool)
        .await
        .unwrap();
    let store = db.store().await;
    let targets = store.run_targets("u1", "run-live").await.unwrap().unwrap();
    assert_eq!(targets.len(), 1, "{targets:?}");
    assert_eq!(targets[0]["url"], "http://127.0.0.1:9/hook");
    let leftovers: Vec<String> = sqlx::query_scalar(
        "SELECT tgname::text FROM pg_trigger WHERE tgrelid = 'runs'::regclass AND NOT tgisinternal
         UNION ALL
         SELECT indexname::text FROM pg_indexes
          WHERE indexname IN ('idempotency_keys_compat', 'schedule_ticks_compat',
                              'runs_one_active_per_session', 'runs_running_by_owner')",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Its end writes the delivery its target asked for.
    assert!(store
        .finish_run(
            "u1",
            "run-live",
            0,
            agentd::store::RunStatus::Completed,
            Some(3),
            None
        )
        .await
        .unwrap());
    let deliveries: i64 =
        sqlx::query_scalar("SELECT count(*) FROM webhook_deliveries WHERE run_id = 'run-live'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(deliveries, 1);
}

/// Migration 0022 (SQLite) keys the vectors' sign bits by the user's part of the space: a
/// database with vectors from before it has every vector's bits under its user's part, and a
/// search by them (through the part; three vectors are all measured exactly) finds the user's
/// nearest first and only the user's; re-embedding a user's only vector keeps one part and one
/// bits row, and a user whose memories are then deleted leaves no part behind.
#[tokio::test]
async fn sqlite_sign_bits_move_under_their_users_parts() {
    use agentd::store::memory::vectors::VectorSpace;
    // sqlite-vec on every SQLite connection from here on (0018 calls it): opening a store
    // registers it.
    TestDb::sqlite().await.store().await;
    let db = TestDb::sqlite().await;
    let pool = sqlx::SqlitePool::connect(&format!("{}?mode=rwc", db.url))
        .await
        .expect("connect");
    migrations_before("migrations/sqlite", 22)
        .await
        .run(&pool)
        .await
        .expect("migrate to 0021");
    // 128 values each: u1's three along axes 0, 1 and 2, u2's one along axis 0.
    let blob = |axis: usize| -> Vec<u8> {
        (0..128)
            .flat_map(|i| if i == axis { 1.0f32 } else { -0.01 }.to_le_bytes())
            .collect()
    };
    for (i, (user, axis)) in [("u1", 0), ("u1", 1), ("u1", 2), ("u2", 0)]
        .iter()
        .enumerate()
    {
        sqlx::query(
            "INSERT INTO memory_entries (app_name, user_id, session_id, event_id, author,
                                         timestamp, text, content, embedding, space)
             VALUES ('echo', ?, 's1', ?, 'user', 0, 'fact', '{}', ?, 'm/128')",
        )
        .bind(user)
        .bind(format!("mem-{i}"))
        .bind(blob(*axis))
        .execute(&pool)
        .await
        .expect("a memory with its vector");
    }
    let old: i64 = sqlx::query_scalar("SELECT count(*) FROM memory_vector_bits")
        .fetch_one(&pool)
        .await
        .expect("0018's bits");
    assert_eq!(old, 4, "the premise: 0018 kept every vector's bits");

    let store = db.store().await; // migrated to the end
    let parts: Vec<(String, String)> =
        sqlx::query_as("SELECT user_id, space FROM memory_vector_parts ORDER BY user_id")
            .fetch_all(&pool)
            .await
            .expect("parts");
    assert_eq!(
        parts,
        [("u1".into(), "m/128".into()), ("u2".into(), "m/128".into())]
    );
    let bits: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM memory_vector_bits b JOIN memory_vector_parts p USING (part)",
    )
    .fetch_one(&pool)
    .await
    .expect("bits");
    assert_eq!(bits, 4, "every vector's bits, under its user's part");
    let space = VectorSpace {
        name: "m/128".into(),
        dims: 128,
    };
    let query: Vec<f32> = (0..128).map(|i| if i == 1 { 1.0 } else { -0.01 }).collect();
    let near = store
        .nearest_memories("echo", "u1", &space, &query, 3)
        .await
        .expect("search");
    let ids: Vec<&str> = near.iter().map(|n| n.entry.event_id.as_str()).collect();
    assert_eq!(ids.len(), 3, "u1's three, not u2's: {ids:?}");
    assert_eq!(ids[0], "mem-1", "the nearest first: {ids:?}");

    // u2's only vector again, in the same space: its part is taken and made again.
    sqlx::query("UPDATE memory_entries SET embedding = ? WHERE user_id = 'u2'")
        .bind(blob(1))
        .execute(&pool)
        .await
        .expect("re-embed u2's memory");
    let u2: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM memory_vector_parts WHERE user_id = 'u2'),
                (SELECT count(*) FROM memory_vector_bits b JOIN memory_vector_parts p
                     USING (part) WHERE p.user_id = 'u2')",
    )
    .fetch_one(&pool)
    .await
    .expect("u2's part");
    assert_eq!(u2, (1, 1), "one part, one bits row");

    sqlx::query("DELETE FROM memory_entries WHERE user_id = 'u1'")
        .execute(&pool)
        .await
        .expect("forget u1");
    let left: Vec<String> = sqlx::query_scalar("SELECT user_id FROM memory_vector_parts")
        .fetch_all(&pool)
        .await
        .expect("parts");
    assert_eq!(
        left,
        ["u2"],
        "a forgotten user's part goes with their last vector"
    );
}
