//! The two ceilings agentd is measured against. Each is the least a server can do to answer
//! the same requests with the same bytes:
//!
//! - (a) `POST /run` streams exactly agentd's frames for an echo run (the same event JSON,
//!   built and serialized with agentd's own `Event` type; `chunks` partial `data:` frames, one
//!   complete frame with an `id:` line, then `event: done`) with no database at all.
//! - (b) the same plus exactly one durable PostgreSQL commit per run: the complete event's JSON
//!   is INSERTed (autocommit, `synchronous_commit` as the server has it, `on` by default) before
//!   its frame is sent, and the row's serial is its `id:`.
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
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// No database.
    A,
    /// One durable PostgreSQL commit per run.
    B,
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
    /// PostgreSQL database for mode b (its table is created if missing).
    #[arg(long)]
    database_url: Option<String>,
    /// Pool size for mode b (agentd's `--db-max-connections`).
    #[arg(long, default_value_t = 16)]
    db_max_connections: u32,
}

struct Ceiling {
    chunks: usize,
    pool: Option<PgPool>,
    seq: AtomicI64,
}

/// The same bound as agentd's `RUN_BUFFER`.
const RUN_BUFFER: usize = 16;

pub async fn serve(args: CeilingArgs) -> Result<()> {
    let pool = match (args.mode, &args.database_url) {
        (Mode::A, _) => None,
        (Mode::B, None) => bail!("ceiling (b) needs --database-url"),
        (Mode::B, Some(url)) => {
            // No ping before each use (agentd pings only connections idle for over a
            // second, which under load is none): the floor is one statement per run.
            let pool = crate::pg::connect_with(
                url,
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(args.db_max_connections.max(1))
                    .test_before_acquire(false),
            )
            .await
            .with_context(|| format!("ceiling (b) cannot connect to {url}"))?;
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS ceiling_events (
                     seq        bigserial PRIMARY KEY,
                     session_id text NOT NULL,
                     event      jsonb NOT NULL)",
            )
            .execute(&pool)
            .await?;
            Some(pool)
        }
    };
    let state = Arc::new(Ceiling {
        chunks: args.chunks,
        pool,
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

async fn create_session(
    Path((app, user)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Json<Value> {
    let id = body
        .get("sessionId")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    Json(json!({
        "id": id, "appName": app, "userId": user,
        "state": {}, "events": [], "lastUpdateTime": now_ts(),
    }))
}

fn bad_request(msg: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"detail": msg, "code": "validation_error"})),
    )
        .into_response()
}

async fn run(State(state): State<Arc<Ceiling>>, Json(body): Json<Value>) -> Response {
    let text = body
        .pointer("/newMessage/parts/0/text")
        .and_then(Value::as_str)
        .map(str::to_string);
    let session = body
        .get("sessionId")
        .and_then(Value::as_str)
        .map(str::to_string);
    let (Some(text), Some(session)) = (text, session) else {
        return bad_request("sessionId and newMessage.parts[0].text are required");
    };
    let run_id = format!("run-{}", uuid::Uuid::new_v4());
    let invocation_id = new_invocation_id();
    let (tx, mut rx) = mpsc::channel::<Bytes>(RUN_BUFFER);
    tokio::spawn(produce(
        state,
        text,
        session,
        run_id.clone(),
        invocation_id.clone(),
        tx,
    ));
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

/// The echo run: partial frames, the (committed, in mode b) complete frame, `event: done`.
async fn produce(
    state: Arc<Ceiling>,
    text: String,
    session: String,
    run_id: String,
    invocation_id: String,
    tx: mpsc::Sender<Bytes>,
) {
    for chunk in split_chunks(&text, state.chunks) {
        let mut e = Event::new(&invocation_id, crate::pg::AGENT_NAME)
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
    let mut e = Event::new(&invocation_id, crate::pg::AGENT_NAME)
        .with_content(Content::text("model", text.as_str()));
    e.actions.state_delta.insert("turns".into(), json!(1));
    e.fill_defaults();
    let Ok(json) = serde_json::to_string(&e) else {
        return;
    };
    let seq = match &state.pool {
        None => state.seq.fetch_add(1, Ordering::Relaxed) + 1,
        Some(pool) => {
            let r = sqlx::query_scalar::<_, i64>(
                "INSERT INTO ceiling_events (session_id, event) VALUES ($1, $2::jsonb) RETURNING seq",
            )
            .bind(&session)
            .bind(&json)
            .fetch_one(pool)
            .await;
            match r {
                Ok(seq) => seq,
                Err(e) => {
                    let body = json!({"error": e.to_string(), "code": "run_failed"});
                    let _ = tx
                        .send(Bytes::from(format!("event: error\ndata: {body}\n\n")))
                        .await;
                    return;
                }
            }
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
        "runId": run_id, "invocationId": invocation_id,
        "status": "completed", "lastSeq": seq,
    });
    let _ = tx
        .send(Bytes::from(format!("event: done\ndata: {done}\n\n")))
        .await;
}
