//! Shared test harness: a fresh PostgreSQL database, Citus database or SQLite file per test,
//! an agentd server on a real port, and the macro that runs one test body against every
//! backend (SQLite, PostgreSQL, and Citus when `AGENTD_TEST_CITUS_URL` names a cluster).
//!
//! PostgreSQL comes from `AGENTD_TEST_DATABASE_URL` (set by `scripts/test.sh`), else
//! `DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/postgres`. If none answers, the
//! test FAILS with a message saying what to start; it never skips.
#![allow(dead_code)]

pub mod citus;
pub mod clients;
pub mod model_server;
pub mod pg_proxy;
pub mod procs;
pub mod sse_client;

use agentd::config::ServeArgs;
use agentd::server::Server;
use agentd::store::{self, Store, StoreLimits};
use sqlx::Connection;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
    /// PostgreSQL with the tables distributed by Citus (a coordinator and its workers).
    Citus,
}

impl Backend {
    /// PostgreSQL's SQL and semantics: PostgreSQL itself, or Citus.
    pub fn is_postgres(self) -> bool {
        matches!(self, Backend::Postgres | Backend::Citus)
    }
}

/// A throwaway database: a fresh PostgreSQL database (dropped afterwards) or a temp file.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    admin: Option<(String, String)>,
    /// On Citus: every node holding a database of the test's name (its admin URL).
    citus_nodes: Vec<String>,
    _dir: Option<tempfile::TempDir>,
}

pub fn admin_url() -> String {
    std::env::var("AGENTD_TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .ok()
        .filter(|u| u.starts_with("postgres"))
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].rfind('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Postgres => Self::postgres().await,
            Backend::Sqlite => Self::sqlite().await,
            Backend::Citus => Self::citus().await,
        }
    }

    /// A database on the Citus cluster at `AGENTD_TEST_CITUS_URL` (the macro checks that it
    /// is set before it calls a test).
    pub async fn citus() -> TestDb {
        let admin = citus::admin_url().expect("AGENTD_TEST_CITUS_URL names a Citus coordinator");
        let name = format!("agentd_test_{}", uuid::Uuid::new_v4().simple());
        let (url, nodes) = citus::create(&admin, &name).await;
        TestDb {
            backend: Backend::Citus,
            url,
            admin: Some((admin, name)),
            citus_nodes: nodes,
            _dir: None,
        }
    }

    pub async fn postgres() -> TestDb {
        let admin = admin_url();
        let mut conn = match sqlx::PgConnection::connect(&admin).await {
            Ok(c) => c,
            Err(e) => panic!(
                "PostgreSQL is required for these tests and {admin} did not answer ({e}).\n\
                 Start PostgreSQL (e.g. `apt-get install postgresql` and start the cluster) or set \
                 DATABASE_URL=postgres://user@host:port/db, or run ./scripts/test.sh, which starts a \
                 throwaway cluster when it can."
            ),
        };
        let name = format!("agentd_test_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("CREATE DATABASE for the test");
        let _ = conn.close().await;
        TestDb {
            backend: Backend::Postgres,
            url: with_database(&admin, &name),
            admin: Some((admin, name)),
            citus_nodes: vec![],
            _dir: None,
        }
    }

    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/agentd.db", dir.path().display());
        TestDb {
            backend: Backend::Sqlite,
            url,
            admin: None,
            citus_nodes: vec![],
            _dir: Some(dir),
        }
    }

    /// Opens (and migrates) a store on this database.
    pub async fn store(&self) -> Arc<dyn Store> {
        self.store_with(StoreLimits::default()).await
    }

    pub async fn store_with(&self, limits: StoreLimits) -> Arc<dyn Store> {
        store::open(&self.url, 8, limits)
            .await
            .unwrap_or_else(|e| panic!("open store at {}: {e}", self.url))
    }

    /// Every row of every table (but what moves on its own: the replicas' heartbeats, the
    /// background scans' turns, and the embedding space each app's embedder adopts after the
    /// server starts), as text in a fixed order: two snapshots are equal only if nothing was
    /// stored, changed or deleted in between.
    pub async fn snapshot(&self) -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::new();
        if self.backend.is_postgres() {
            let mut conn = sqlx::PgConnection::connect(&self.url)
                .await
                .expect("connect");
            let tables: Vec<String> = sqlx::query_scalar(
                "SELECT table_name::text FROM information_schema.tables
                  WHERE table_schema = 'public' AND table_type = 'BASE TABLE'
                    AND table_name NOT IN ('replicas', 'poll_turns', 'memory_spaces',
                                           '_sqlx_migrations')",
            )
            .fetch_all(&mut conn)
            .await
            .expect("tables");
            for t in tables {
                let rows: String = sqlx::query_scalar(&format!(
                    "SELECT coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '') FROM \"{t}\" t"
                ))
                .fetch_one(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("read {t}: {e}"));
                out.insert(t, rows);
            }
            return out;
        }
        let mut conn = sqlx::SqliteConnection::connect(&self.url)
            .await
            .expect("connect");
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table'
              AND name NOT LIKE 'sqlite_%'
              AND name NOT IN ('replicas', 'memory_spaces', '_sqlx_migrations')",
        )
        .fetch_all(&mut conn)
        .await
        .expect("tables");
        for t in tables {
            let columns: Vec<String> =
                sqlx::query_scalar(&format!("SELECT name FROM pragma_table_info('{t}')"))
                    .fetch_all(&mut conn)
                    .await
                    .expect("columns");
            let line = columns
                .iter()
                .map(|c| format!("quote(\"{c}\")"))
                .collect::<Vec<_>>()
                .join(" || '|' || ");
            let rows: Option<String> = sqlx::query_scalar(&format!(
                "SELECT group_concat(line, char(10)) FROM
                   (SELECT {line} AS line FROM \"{t}\" ORDER BY line)"
            ))
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("read {t}: {e}"));
            out.insert(t, rows.unwrap_or_default());
        }
        out
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some((admin, name)) = self.admin.take() {
            let nodes = std::mem::take(&mut self.citus_nodes);
            // Drop from a thread with its own runtime: Drop cannot await.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                if let Ok(rt) = rt {
                    rt.block_on(async {
                        if !nodes.is_empty() {
                            citus::drop(&nodes, &name).await;
                            return;
                        }
                        if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                            let _ = sqlx::query(&format!(
                                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                            ))
                            .execute(&mut c)
                            .await;
                        }
                    });
                }
            })
            .join();
        }
    }
}

/// An agentd server on 127.0.0.1:<random port>, over the given database.
pub struct TestServer {
    pub base: String,
    pub client: reqwest::Client,
    pub server: Option<Server>,
    pub db: TestDb,
}

impl TestServer {
    pub async fn start(backend: Backend) -> TestServer {
        Self::start_with(backend, |_| {}).await
    }

    pub async fn start_with(
        backend: Backend,
        configure: impl FnOnce(&mut ServeArgs),
    ) -> TestServer {
        Self::start_on(TestDb::new(backend).await, configure).await
    }

    /// A server over an existing database (one another process used before, say).
    pub async fn start_on(db: TestDb, configure: impl FnOnce(&mut ServeArgs)) -> TestServer {
        let mut args = ServeArgs::for_database(db.url.clone());
        args.apps_dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/apps");
        configure(&mut args);
        let server = Server::start(args).await.expect("server starts");
        Self::serving(server, db)
    }

    /// A server whose apps and plugins are built in Rust (agents with callbacks, custom agents).
    pub async fn start_embedded(
        backend: Backend,
        apps: agentd::apps::AppRegistry,
        plugins: agentd::agent::PluginSet,
    ) -> TestServer {
        Self::start_embedded_with(backend, apps, plugins, |_| {}).await
    }

    /// [`Self::start_embedded`] with settings changed by `configure`.
    pub async fn start_embedded_with(
        backend: Backend,
        apps: agentd::apps::AppRegistry,
        plugins: agentd::agent::PluginSet,
        configure: impl FnOnce(&mut ServeArgs),
    ) -> TestServer {
        let db = TestDb::new(backend).await;
        let mut args = ServeArgs::for_database(db.url.clone());
        configure(&mut args);
        let limits = StoreLimits {
            max_artifact_bytes: args.max_artifact_bytes,
            max_event_parts: args.max_message_parts,
            max_memories_per_user: args.max_memories_per_user,
        };
        let server = Server::start_with(args, db.store_with(limits).await, Arc::new(apps), plugins)
            .await
            .expect("server starts");
        Self::serving(server, db)
    }

    /// A server for one app whose root agent is built in Rust.
    pub async fn start_agent(
        backend: Backend,
        app: &str,
        root: Arc<dyn agentd::agent::Agent>,
        plugins: agentd::agent::PluginSet,
    ) -> TestServer {
        let mut apps = agentd::apps::AppRegistry::default();
        apps.insert(
            app,
            agentd::agent::AgentTree::new(root).expect("valid tree"),
        );
        Self::start_embedded(backend, apps, plugins).await
    }

    /// `POST /run` with `body`, read to the end of its SSE stream.
    pub async fn run_stream(&self, body: serde_json::Value) -> Vec<sse_client::Msg> {
        sse_client::read_all(self.post_json("/run", body).await).await
    }

    fn serving(server: Server, db: TestDb) -> TestServer {
        TestServer {
            base: format!("http://{}", server.addr),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("http client"),
            server: Some(server),
            db,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.expect("GET")
    }

    pub async fn post_json(&self, path: &str, body: serde_json::Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("POST")
    }

    pub async fn patch_json(&self, path: &str, body: serde_json::Value) -> reqwest::Response {
        self.client
            .patch(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("PATCH")
    }

    pub async fn delete(&self, path: &str) -> reqwest::Response {
        self.client
            .delete(self.url(path))
            .send()
            .await
            .expect("DELETE")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            // Stop accepting; the runtime tears the task down when the test ends.
            drop(tokio::spawn(s.shutdown(Duration::from_millis(100))));
        }
    }
}

/// Reads a response as JSON, asserting its status first.
pub async fn json_with_status(resp: reqwest::Response, status: u16) -> serde_json::Value {
    let got = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    assert_eq!(got, status, "unexpected status {got}, body: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("body is not JSON ({e}): {text}"))
}

/// One `#[tokio::test]` named after `$backend` (`postgres`, `sqlite`, `citus`) that runs the
/// test function `$name` of the enclosing module's parent on it. A Citus test without a
/// cluster says so, loudly, and does not run.
#[macro_export]
macro_rules! backend_test {
    ($name:ident, $test:ident, $backend:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let backend = $crate::common::Backend::$backend;
            if backend == $crate::common::Backend::Citus
                && $crate::common::citus::admin_url().is_none()
            {
                $crate::common::citus::not_run(concat!(module_path!(), "::citus"));
                return;
            }
            super::$name(backend).await
        }
    };
}

/// Runs each named `async fn(Backend)` test once per backend: `name::postgres`, `name::sqlite`,
/// `name::citus`.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                $crate::backend_test!($name, postgres, Postgres);
                $crate::backend_test!($name, sqlite, Sqlite);
                $crate::backend_test!($name, citus, Citus);
            }
        )*
    };
}

/// Runs each named `async fn(Backend)` test on the PostgreSQL backends only: `name::postgres`,
/// `name::citus` (tests of several agentd processes sharing one database, which SQLite, a
/// file of one process, does not serve).
#[macro_export]
macro_rules! postgres_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                $crate::backend_test!($name, postgres, Postgres);
                $crate::backend_test!($name, citus, Citus);
            }
        )*
    };
}

/// The recorded `adk api_server` exchanges (copied from the ADK wire contract; recorded data,
/// so a clone of this repository alone runs its tests).
pub const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/adk-wire/memory"
);

/// The fixture file whose name starts with `<id>_` and ends with `.<ext>`.
pub fn fixture_path(id: &str, ext: &str) -> std::path::PathBuf {
    let prefix = format!("{id}_");
    let suffix = format!(".{ext}");
    std::fs::read_dir(FIXTURES)
        .unwrap_or_else(|e| panic!("fixtures at {FIXTURES}: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(&prefix) && name.ends_with(&suffix)
        })
        .unwrap_or_else(|| panic!("no fixture {id}_*{suffix} in {FIXTURES}"))
}

/// `CREATE OR REPLACE FUNCTION name(…)` with the body of migration 0019's memory search by
/// words (`agentd_memory_by_words_v1`, as it was before 0024): the tests that compare the two,
/// or put a database back as 0019 left it.
pub fn words_function_0019(name: &str) -> String {
    include_str!("../../migrations/postgres/0019_memory_search.sql")
        .split_once("CREATE FUNCTION agentd_memory_by_words_v1(")
        .map(|(_, f)| format!("CREATE OR REPLACE FUNCTION {name}({f}"))
        .expect("0019 creates agentd_memory_by_words_v1")
}
