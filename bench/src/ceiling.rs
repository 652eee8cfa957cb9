//! The three ceilings agentd is measured against. Each is the least a server can do to answer
//! the same requests with the same bytes:
//!
//! - (a) `POST /run` streams exactly agentd's frames for an echo run (the same event JSON,
//!   built and serialized with agentd's own `Event` type; `chunks` partial `data:` frames, one
//!   complete frame with an `id:` line, then `event: done`) with no database at all.
//! - (b) the same plus exactly one durable PostgreSQL commit per run: the complete event's JSON
//!   is INSERTed (autocommit, `synchronous_commit` as the server has it, `on` by default) before
//!   its frame is sent, and the row's serial is its `id:`.
//! - (c) the least a durable ADK-shaped server must do (ADK's `DatabaseSessionService`): commit
//!   the session row at create, then the user event before the first byte of the run, then the
//!   reply together with its state delta on the session row (one statement on PostgreSQL, one
//!   transaction on SQLite): three durable commits per session + run, no admission, no
//!   ownership. On PostgreSQL or on SQLite (WAL, `synchronous=FULL`, one writer connection, as
//!   agentd's SQLite store).
//!
//! On a Citus database (b)'s and (c)'s tables are distributed by `user_id`, colocated, as
//! agentd's are, and (c) writes its reply as single-table statements ([`commit_reply_routed`]):
//! what a minimal server designed for Citus does, so the pairing on a cluster is fair.
//!
//! Both parse the JSON request body, produce frames from a spawned task through a bounded
//! channel (as any streaming agent server must: the producer is not the connection), set
//! TCP_NODELAY on accepted sockets like agentd, and run on the same tokio multi-thread runtime.
//! `POST /apps/{app}/users/{user}/sessions` answers a session JSON of the same shape as
//! agentd's without storing anything.

use agentd::agent::echo::split_chunks;
use agentd::event::{new_invocation_id, now_ts, Content, Event};
use anyhow::{bail, Context, Result};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use sqlx::postgres::PgPool;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// No database.
    A,
    /// One durable PostgreSQL commit per run.
    B,
    /// An ADK-shaped durable server: session row, user event, reply + state delta.
    C,
}

#[derive(Debug, Clone, Args)]
pub struct CeilingArgs {
    #[arg(long, value_enum)]
    mode: Mode,
    #[arg(long)]
    bind: SocketAddr,
    /// Partial frames per run (as the echo app's `chunks`).
    #[arg(long, default_value_t = 20)]
    chunks: usize,
    /// PostgreSQL database for mode b; for mode c a postgres:// or sqlite:// URL (tables are
    /// created if missing).
    #[arg(long)]
    database_url: Option<String>,
    /// Pool size for mode b (agentd's `--db-max-connections`).
    #[arg(long, default_value_t = 16)]
    db_max_connections: u32,
}

struct Ceiling {
    chunks: usize,
    db: Db,
    seq: AtomicI64,
}

/// Where a ceiling commits.
enum Db {
    /// (a)
    None,
    /// (b): the complete event only.
    Events(PgPool),
    /// (c) on PostgreSQL; `true` on Citus.
    AdkPg(PgPool, bool),
    /// (c) on SQLite: one writer connection.
    AdkSqlite(SqlitePool),
}

/// Per-session seq is not needed by the floor: a serial numbers the events, as in (b).
const ADK_PG_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS adk_sessions (
    app_name text NOT NULL, user_id text NOT NULL, id text NOT NULL,
    state jsonb NOT NULL, create_time double precision NOT NULL,
    update_time double precision NOT NULL,
    PRIMARY KEY (app_name, user_id, id));
CREATE TABLE IF NOT EXISTS adk_events (
    seq bigserial, app_name text NOT NULL, user_id text NOT NULL,
    session_id text NOT NULL, event jsonb NOT NULL, PRIMARY KEY (user_id, seq));";

/// On Citus, distributes a ceiling's tables by `user_id`, colocated (as agentd's are), so the
/// ceiling measured beside agentd on a cluster is what a minimal server designed for it does:
/// each statement routed to the worker holding the user's shard. Returns whether it did.
async fn distribute_by_user(pool: &PgPool, tables: &[&str]) -> Result<bool> {
    let citus: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")
            .fetch_one(pool)
            .await?;
    if !citus {
        return Ok(false);
    }
    for (i, table) in tables.iter().enumerate() {
        let known: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))",
        )
        .bind(table)
        .fetch_one(pool)
        .await?;
        if known {
            continue;
        }
        let colocate = match i {
            0 => String::new(),
            _ => format!(", colocate_with => '{}'", tables[0]),
        };
        sqlx::query(&format!(
            "SELECT create_distributed_table('{table}', 'user_id'{colocate})"
        ))
        .execute(pool)
        .await
        .with_context(|| format!("distributing the ceiling's {table}"))?;
    }
    Ok(true)
}

const ADK_SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS adk_sessions (
    app_name TEXT NOT NULL, user_id TEXT NOT NULL, id TEXT NOT NULL,
    state TEXT NOT NULL, create_time REAL NOT NULL, update_time REAL NOT NULL,
    PRIMARY KEY (app_name, user_id, id));
CREATE TABLE IF NOT EXISTS adk_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, app_name TEXT NOT NULL, user_id TEXT NOT NULL,
    session_id TEXT NOT NULL, event TEXT NOT NULL);";

async fn connect_pg(url: &str, pool: u32) -> Result<PgPool> {
    // No ping before each use (agentd pings only connections idle for over a second, which
    // under load is none): the floor is the statements themselves.
    crate::pg::connect_with(
        url,
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(pool.max(1))
            .test_before_acquire(false),
    )
    .await
    .with_context(|| format!("the ceiling cannot connect to {url}"))
}

async fn connect_sqlite(url: &str) -> Result<SqlitePool> {
    let opts = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(std::time::Duration::from_secs(10));
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(opts)
        .await
        .with_context(|| format!("ceiling (c) cannot open {url}"))?;
    sqlx::raw_sql(ADK_SQLITE_SCHEMA).execute(&pool).await?;
    Ok(pool)
}

/// The same bound as agentd's `RUN_BUFFER`.
const RUN_BUFFER: usize = 16;

pub async fn serve(args: CeilingArgs) -> Result<()> {
    let db = match (args.mode, args.database_url.as_deref()) {
        (Mode::A, _) => Db::None,
        (Mode::B | Mode::C, None) => bail!("ceilings (b) and (c) need --database-url"),
        (Mode::B, Some(url)) => {
            let pool = connect_pg(url, args.db_max_connections).await?;
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS ceiling_events (
                     user_id    text NOT NULL,
                     seq        bigserial,
                     session_id text NOT NULL,
                     event      jsonb NOT NULL,
                     PRIMARY KEY (user_id, seq))",
            )
            .execute(&pool)
            .await?;
            distribute_by_user(&pool, &["ceiling_events"]).await?;
            Db::Events(pool)
        }
        (Mode::C, Some(url)) if url.starts_with("sqlite:") => {
            Db::AdkSqlite(connect_sqlite(url).await?)
        }
        (Mode::C, Some(url)) => {
            let pool = connect_pg(url, args.db_max_connections).await?;
            sqlx::raw_sql(ADK_PG_SCHEMA).execute(&pool).await?;
            let citus = distribute_by_user(&pool, &["adk_sessions", "adk_events"]).await?;
            Db::AdkPg(pool, citus)
        }
    };
    let state = Arc::new(Ceiling {
        chunks: args.chunks,
        db,
        seq: AtomicI64::new(0),
    });
    let app = Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/apps/{app}/users/{user}/sessions", post(create_session))
        .route("/run", post(run))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("cannot listen on {}", args.bind))?
        .tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
    axum::serve(listener, app)
        .with_graceful_shutdown(sigterm_or_ctrl_c())
        .await?;
    Ok(())
}

async fn sigterm_or_ctrl_c() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term => {} }
}

/// Runs `$body` with `$pool` bound to (c)'s pool, whichever database it is; `Ok(())` for the
/// other ceilings. (A macro: the two pools are different types.)
macro_rules! on_adk_db {
    ($db:expr, |$pool:ident| $body:expr) => {
        match $db {
            Db::AdkPg($pool, _) => $body,
            Db::AdkSqlite($pool) => $body,
            Db::None | Db::Events(_) => Ok(()),
        }
    };
}

async fn create_session(
    State(state): State<Arc<Ceiling>>,
    Path((app, user)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    let id = body
        .get("sessionId")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let now = now_ts();
    let stored = on_adk_db!(&state.db, |pool| sqlx::query(
        "INSERT INTO adk_sessions (app_name, user_id, id, state, create_time, update_time)
         VALUES ($1, $2, $3, '{}', $4, $4)"
    )
    .bind(&app)
    .bind(&user)
    .bind(&id)
    .bind(now)
    .execute(pool)
    .await
    .map(drop));
    if let Err(e) = stored {
        return server_error(&e.to_string());
    }
    Json(json!({
        "id": id, "appName": app, "userId": user,
        "state": {}, "events": [], "lastUpdateTime": now,
    }))
    .into_response()
}

fn server_error(msg: &str) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({"detail": msg, "code": "internal"})),
    )
        .into_response()
}

/// The user event of (c), committed before the run's first byte (as agentd does).
async fn commit_user_event(state: &Ceiling, run: &RunIds, text: &str) -> Result<(), sqlx::Error> {
    let mut e = Event::new(&run.invocation_id, "user").with_content(Content::text("user", text));
    e.fill_defaults();
    // JSON binds as jsonb on PostgreSQL and as text on SQLite: one statement for both.
    on_adk_db!(&state.db, |pool| sqlx::query(
        "INSERT INTO adk_events (app_name, user_id, session_id, event) VALUES ($1, $2, $3, $4)"
    )
    .bind(&run.app)
    .bind(&run.user)
    .bind(&run.session)
    .bind(sqlx::types::Json(&e))
    .execute(pool)
    .await
    .map(drop))
}

/// The reply of (c) with its state delta on the session row, in one commit.
async fn commit_reply(
    pool_pg: &PgPool,
    run: &RunIds,
    delta: &str,
    json: &str,
    now: f64,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "WITH s AS (
             UPDATE adk_sessions SET state = state || $4::jsonb, update_time = $5
              WHERE app_name = $1 AND user_id = $2 AND id = $3
             RETURNING id)
         INSERT INTO adk_events (app_name, user_id, session_id, event)
         SELECT $1, $2, $3, $6::jsonb FROM s
         RETURNING seq",
    )
    .bind(&run.app)
    .bind(&run.user)
    .bind(&run.session)
    .bind(delta)
    .bind(now)
    .bind(json)
    .fetch_one(pool_pg)
    .await
}

/// (c)'s reply on Citus: the same writes as two single-table statements in one transaction,
/// each routed to the user's shard (Citus plans a statement with a data-modifying CTE as one
/// step per CTE, which a server designed for Citus avoids).
async fn commit_reply_routed(
    pool: &PgPool,
    run: &RunIds,
    delta: &str,
    json: &str,
    now: f64,
) -> Result<i64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let updated = sqlx::query(
        "UPDATE adk_sessions SET state = state || $4::jsonb, update_time = $5
          WHERE app_name = $1 AND user_id = $2 AND id = $3",
    )
    .bind(&run.app)
    .bind(&run.user)
    .bind(&run.session)
    .bind(delta)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    if updated.rows_affected() != 1 {
        return Err(sqlx::Error::RowNotFound);
    }
    let seq = sqlx::query_scalar(
        "INSERT INTO adk_events (app_name, user_id, session_id, event)
         VALUES ($1, $2, $3, $4::jsonb) RETURNING seq",
    )
    .bind(&run.app)
    .bind(&run.user)
    .bind(&run.session)
    .bind(json)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(seq)
}

async fn commit_reply_sqlite(
    pool: &SqlitePool,
    run: &RunIds,
    delta: &str,
    json: &str,
    now: f64,
) -> Result<i64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let updated = sqlx::query(
        "UPDATE adk_sessions SET state = json_patch(state, ?4), update_time = ?5
          WHERE app_name = ?1 AND user_id = ?2 AND id = ?3",
    )
    .bind(&run.app)
    .bind(&run.user)
    .bind(&run.session)
    .bind(delta)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    if updated.rows_affected() != 1 {
        return Err(sqlx::Error::RowNotFound);
    }
    let seq = sqlx::query_scalar(
        "INSERT INTO adk_events (app_name, user_id, session_id, event) VALUES (?1, ?2, ?3, ?4)
         RETURNING seq",
    )
    .bind(&run.app)
    .bind(&run.user)
    .bind(&run.session)
    .bind(json)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(seq)
}

/// What a run is about.
struct RunIds {
    app: String,
    user: String,
    session: String,
    run_id: String,
    invocation_id: String,
}

fn bad_request(msg: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"detail": msg, "code": "validation_error"})),
    )
        .into_response()
}

async fn run(State(state): State<Arc<Ceiling>>, Json(body): Json<Value>) -> Response {
    let field = |name: &str| body.get(name).and_then(Value::as_str).map(str::to_string);
    let text = body
        .pointer("/newMessage/parts/0/text")
        .and_then(Value::as_str)
        .map(str::to_string);
    let (Some(text), Some(session)) = (text, field("sessionId")) else {
        return bad_request("sessionId and newMessage.parts[0].text are required");
    };
    let run = RunIds {
        app: field("appName").unwrap_or_default(),
        user: field("userId").unwrap_or_default(),
        session,
        run_id: format!("run-{}", uuid::Uuid::new_v4()),
        invocation_id: new_invocation_id(),
    };
    if let Err(e) = commit_user_event(&state, &run, &text).await {
        return server_error(&e.to_string());
    }
    let (run_id, invocation_id) = (run.run_id.clone(), run.invocation_id.clone());
    let (tx, mut rx) = mpsc::channel::<Bytes>(RUN_BUFFER);
    tokio::spawn(produce(state, text, run, tx));
    let frames = futures::StreamExt::map(
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx)),
        Ok::<_, Infallible>,
    );
    let mut resp = Response::new(Body::from_stream(frames));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Ok(v) = HeaderValue::from_str(&run_id) {
        h.insert("x-agentd-run-id", v);
    }
    if let Ok(v) = HeaderValue::from_str(&invocation_id) {
        h.insert("x-agentd-invocation-id", v);
    }
    resp
}

/// The echo run: partial frames, the (committed, in modes b and c) complete frame, `event: done`.
async fn produce(state: Arc<Ceiling>, text: String, run: RunIds, tx: mpsc::Sender<Bytes>) {
    let invocation_id = run.invocation_id.as_str();
    for chunk in split_chunks(&text, state.chunks) {
        let mut e = Event::new(invocation_id, crate::pg::AGENT_NAME)
            .with_content(Content::text("model", chunk));
        e.partial = Some(true);
        e.fill_defaults();
        let Ok(json) = serde_json::to_string(&e) else {
            return;
        };
        if tx
            .send(Bytes::from(format!("data: {json}\n\n")))
            .await
            .is_err()
        {
            return; // the client went away
        }
    }
    let mut e = Event::new(invocation_id, crate::pg::AGENT_NAME)
        .with_content(Content::text("model", text.as_str()));
    e.actions.state_delta.insert("turns".into(), json!(1));
    e.fill_defaults();
    let Ok(json) = serde_json::to_string(&e) else {
        return;
    };
    let delta = json!({"turns": 1}).to_string();
    let committed = match &state.db {
        Db::None => Ok(state.seq.fetch_add(1, Ordering::Relaxed) + 1),
        Db::Events(pool) => {
            sqlx::query_scalar::<_, i64>(
                "INSERT INTO ceiling_events (user_id, session_id, event) VALUES ($1, $2, $3::jsonb)
             RETURNING seq",
            )
            .bind(&run.user)
            .bind(&run.session)
            .bind(&json)
            .fetch_one(pool)
            .await
        }
        Db::AdkPg(pool, false) => commit_reply(pool, &run, &delta, &json, e.timestamp).await,
        Db::AdkPg(pool, true) => commit_reply_routed(pool, &run, &delta, &json, e.timestamp).await,
        Db::AdkSqlite(pool) => commit_reply_sqlite(pool, &run, &delta, &json, e.timestamp).await,
    };
    let seq = match committed {
        Ok(seq) => seq,
        Err(e) => {
            let body = json!({"error": e.to_string(), "code": "run_failed"});
            let _ = tx
                .send(Bytes::from(format!("event: error\ndata: {body}\n\n")))
                .await;
            return;
        }
    };
    if tx
        .send(Bytes::from(format!("id: {seq}\ndata: {json}\n\n")))
        .await
        .is_err()
    {
        return;
    }
    let done = json!({
        "runId": run.run_id, "invocationId": invocation_id,
        "status": "completed", "lastSeq": seq,
    });
    let _ = tx
        .send(Bytes::from(format!("event: done\ndata: {done}\n\n")))
        .await;
}
