//! Where a run's database time goes: a TCP proxy between a server and PostgreSQL that reads
//! the wire protocol and counts round trips (each `Sync` or simple `Query` answered by a
//! `ReadyForQuery`), the statement each one ran, how long PostgreSQL took to answer it, and
//! which of them were durable commits (a `COMMIT`, or a writing statement outside an explicit
//! transaction).
//!
//! The proxy is used only for this profile, never while throughput is measured.

use crate::load::{self, RunSpec};
use crate::pg::Admin;
use crate::servers::{Env, APP};
use crate::BenchArgs;
use anyhow::{bail, Context, Result};
use sqlx::postgres::PgConnectOptions;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Totals for one statement text.
#[derive(Debug, Clone, Default)]
pub struct StatementStat {
    pub count: u64,
    pub total: Duration,
    /// Commits that wait for their WAL flush.
    pub commits: u64,
    /// Commits with `synchronous_commit = off` (set inside the statement).
    pub async_commits: u64,
}

#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub by_statement: BTreeMap<String, StatementStat>,
}

impl Counts {
    pub fn round_trips(&self) -> u64 {
        self.by_statement.values().map(|s| s.count).sum()
    }
    pub fn commits(&self) -> u64 {
        self.by_statement.values().map(|s| s.commits).sum()
    }
    pub fn async_commits(&self) -> u64 {
        self.by_statement.values().map(|s| s.async_commits).sum()
    }
    pub fn db_time(&self) -> Duration {
        self.by_statement.values().map(|s| s.total).sum()
    }
}

type Shared = Arc<Mutex<Counts>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Counts> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct Proxy {
    pub addr: std::net::SocketAddr,
    counts: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: String) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts: Shared = Arc::default();
        let c = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (c, upstream) = (c.clone(), upstream.clone());
                tokio::spawn(async move {
                    if let Err(e) = connection(client, &upstream, c).await {
                        eprintln!("proxy connection: {e:#}");
                    }
                });
            }
        });
        Ok(Proxy { addr, counts, task })
    }

    /// The counts so far, and a fresh start.
    pub fn take(&self) -> Counts {
        std::mem::take(&mut *lock(&self.counts))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A round trip the client started: its statement, when, and whether it commits.
struct Pending {
    label: String,
    at: Instant,
    commit: Commit,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Commit {
    No,
    Durable,
    Async,
}

/// What ending this statement's transaction costs.
fn commit_kind(sql: &str, in_transaction: bool) -> Commit {
    if in_transaction || !writes(sql) {
        Commit::No
    } else if sql
        .to_ascii_lowercase()
        .contains("set_config('synchronous_commit', 'off'")
        // agentd's routed functions on Citus (src/store/postgres/router.sql): the run's end
        // outside its last event commits asynchronously, inside the function.
        || sql.contains("agentd_finish_run_v1(")
    {
        Commit::Async
    } else {
        Commit::Durable
    }
}

async fn connection(client: TcpStream, upstream: &str, counts: Shared) -> Result<()> {
    let server = TcpStream::connect(upstream)
        .await
        .with_context(|| format!("proxy cannot reach PostgreSQL at {upstream}"))?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let pending: Arc<Mutex<VecDeque<Pending>>> = Arc::default();

    let p = pending.clone();
    let upstream_dir = tokio::spawn(async move {
        let mut parser = FrontendParser::default();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = cr.read(&mut buf).await?;
            if n == 0 {
                let _ = sw.shutdown().await;
                return anyhow::Ok(());
            }
            parser.feed(&buf[..n], &p)?;
            sw.write_all(&buf[..n]).await?;
        }
    });
    let mut parser = BackendParser::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = sr.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        // Count first: the client may send its next query as soon as it has these bytes.
        for _ in 0..parser.ready_for_query(&buf[..n]) {
            let done = pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            if let Some(d) = done {
                let mut c = lock(&counts);
                let s = c.by_statement.entry(d.label).or_default();
                s.count += 1;
                s.total += d.at.elapsed();
                s.commits += u64::from(d.commit == Commit::Durable);
                s.async_commits += u64::from(d.commit == Commit::Async);
            }
        }
        cw.write_all(&buf[..n]).await?;
    }
    upstream_dir.abort();
    Ok(())
}

/// Splits a byte stream into PostgreSQL messages (type byte + big-endian length).
#[derive(Default)]
struct Framer {
    buf: Vec<u8>,
}

impl Framer {
    /// Complete typed messages as (type, body).
    fn messages(&mut self, bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        self.buf.extend_from_slice(bytes);
        let mut out = vec![];
        let mut at = 0;
        while self.buf.len() - at >= 5 {
            let len = u32::from_be_bytes([
                self.buf[at + 1],
                self.buf[at + 2],
                self.buf[at + 3],
                self.buf[at + 4],
            ]) as usize;
            if self.buf.len() - at < 1 + len {
                break;
            }
            out.push((self.buf[at], self.buf[at + 5..at + 1 + len].to_vec()));
            at += 1 + len;
        }
        self.buf.drain(..at);
        out
    }
}

#[derive(Default)]
struct BackendParser {
    framer: Framer,
}

impl BackendParser {
    /// How many `ReadyForQuery` messages these bytes complete.
    fn ready_for_query(&mut self, bytes: &[u8]) -> usize {
        self.framer
            .messages(bytes)
            .iter()
            .filter(|(t, _)| *t == b'Z')
            .count()
    }
}

#[derive(Default)]
struct FrontendParser {
    started: bool,
    startup: Vec<u8>,
    framer: Framer,
    /// Prepared statement name → its text.
    statements: HashMap<String, String>,
    /// What the next `Sync` completes.
    current: Option<String>,
    in_transaction: bool,
}

fn cstr(body: &[u8], from: usize) -> (String, usize) {
    let end = body[from..]
        .iter()
        .position(|&b| b == 0)
        .map_or(body.len(), |p| from + p);
    (
        String::from_utf8_lossy(&body[from..end]).into_owned(),
        end + 1,
    )
}

/// Whitespace collapsed, at most 90 characters.
fn label(sql: &str) -> String {
    let one_line = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > 90 {
        format!("{}…", one_line.chars().take(89).collect::<String>())
    } else {
        one_line
    }
}

fn writes(sql: &str) -> bool {
    // agentd's hot steps on Citus are calls of functions that write (router.sql).
    if sql.contains("FROM agentd_") || sql.contains("SELECT agentd_") {
        return true;
    }
    let s = sql.trim_start().to_ascii_uppercase();
    let head = s.split_whitespace().next().unwrap_or("");
    matches!(head, "INSERT" | "UPDATE" | "DELETE")
        || (head == "WITH"
            && ["INSERT ", "UPDATE ", "DELETE "]
                .iter()
                .any(|k| s.contains(k)))
}

impl FrontendParser {
    fn feed(&mut self, bytes: &[u8], pending: &Mutex<VecDeque<Pending>>) -> Result<()> {
        if !self.started {
            // The untyped startup message: length, protocol, parameters.
            self.startup.extend_from_slice(bytes);
            if self.startup.len() < 8 {
                return Ok(());
            }
            let len = u32::from_be_bytes([
                self.startup[0],
                self.startup[1],
                self.startup[2],
                self.startup[3],
            ]) as usize;
            let code = u32::from_be_bytes([
                self.startup[4],
                self.startup[5],
                self.startup[6],
                self.startup[7],
            ]);
            if code == 80877103 || code == 80877104 {
                bail!("the client asked for TLS/GSS through the proxy; use sslmode=disable");
            }
            if self.startup.len() < len {
                return Ok(());
            }
            self.started = true;
            let rest = self.startup.split_off(len);
            self.startup.clear();
            // Startup's own ReadyForQuery has no client message to pair with.
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back(Pending {
                    label: "(connection start-up)".into(),
                    at: Instant::now(),
                    commit: Commit::No,
                });
            return self.feed_typed(&rest, pending);
        }
        self.feed_typed(bytes, pending)
    }

    fn feed_typed(&mut self, bytes: &[u8], pending: &Mutex<VecDeque<Pending>>) -> Result<()> {
        for (t, body) in self.framer.messages(bytes) {
            match t {
                b'P' => {
                    let (name, next) = cstr(&body, 0);
                    let (query, _) = cstr(&body, next);
                    self.current = Some(format!("(prepare) {}", label(&query)));
                    self.statements.insert(name, query);
                }
                b'B' => {
                    let (_portal, next) = cstr(&body, 0);
                    let (stmt, _) = cstr(&body, next);
                    let sql = self.statements.get(&stmt).cloned().unwrap_or_default();
                    self.current = Some(sql);
                }
                b'S' => {
                    // A Sync with nothing before it is sqlx's ping of a pooled connection.
                    let sql = self
                        .current
                        .take()
                        .unwrap_or_else(|| "(ping: Sync alone)".into());
                    let prepare = sql.starts_with("(prepare)");
                    let commit = if prepare {
                        Commit::No
                    } else {
                        commit_kind(&sql, self.in_transaction)
                    };
                    let l = if prepare { sql } else { label(&sql) };
                    pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back(Pending {
                            label: l,
                            at: Instant::now(),
                            commit,
                        });
                }
                b'Q' => {
                    let (sql, _) = cstr(&body, 0);
                    let upper = sql.trim().to_ascii_uppercase();
                    let mut commit = Commit::No;
                    if upper.starts_with("BEGIN") || upper.starts_with("START TRANSACTION") {
                        self.in_transaction = true;
                    } else if upper.starts_with("COMMIT") || upper.starts_with("END") {
                        self.in_transaction = false;
                        commit = Commit::Durable;
                    } else if upper.starts_with("ROLLBACK") {
                        self.in_transaction = false;
                    } else {
                        commit = commit_kind(&sql, self.in_transaction);
                    }
                    pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back(Pending {
                            label: label(&sql),
                            at: Instant::now(),
                            commit,
                        });
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The database work of one request kind, per request.
pub struct PhaseProfile {
    pub what: String,
    pub requests: u64,
    pub counts: Counts,
    /// WAL bytes the server generated during the phase (`pg_current_wal_insert_lsn()` before
    /// and after; every other server of the benchmark is idle meanwhile).
    pub wal_bytes: i64,
}

/// Counts one phase: what the proxy saw and the WAL written since `wal0`.
async fn phase(
    proxy: &Proxy,
    admin: &Admin,
    what: &str,
    requests: u64,
    wal0: i64,
) -> Result<PhaseProfile> {
    Ok(PhaseProfile {
        what: what.into(),
        requests,
        counts: proxy.take(),
        wal_bytes: admin.wal_position().await? - wal0,
    })
}

pub struct Profile {
    pub phases: Vec<PhaseProfile>,
}

fn proxied_url(url: &str, proxy: std::net::SocketAddr) -> Result<String> {
    let mut u = crate::pg::with_host_port(url, &proxy.to_string())?;
    u.push(if u.contains('?') { '&' } else { '?' });
    u.push_str("sslmode=disable");
    Ok(u)
}

fn upstream_of(url: &str) -> Result<String> {
    let opts = PgConnectOptions::from_str(url)?;
    Ok(format!("{}:{}", opts.get_host(), opts.get_port()))
}

/// Pool size of the profiled servers: requests are sequential, and the benchmark's own servers
/// still hold their connections (PostgreSQL's `max_connections` is shared).
const PROFILE_POOL: u32 = 4;

/// Sequential requests through the proxy: agentd's session create and run, and the same for
/// ceilings (b) and (c). Connections and prepared statements are warmed first; then each phase
/// is counted.
pub async fn profile(args: &BenchArgs, env: &Env, admin: &Admin) -> Result<Profile> {
    const N: u64 = 50;
    let mut phases = vec![];
    let client = load::client(4)?;

    let mut targets = vec![];
    if let Some(db) = &env.agentd_db {
        targets.push(("agentd", None, db.clone()));
    }
    targets.push(("ceiling (b)", Some("b"), env.ceiling_db.clone()));
    if env.ceiling_c_url.starts_with("postgres") {
        targets.push(("ceiling (c)", Some("c"), env.ceiling_c_url.clone()));
    }
    for (name, mode, db) in targets {
        eprintln!("profile: {name}'s database work per request, through a counting proxy…");
        let proxy = Proxy::start(upstream_of(&db)?).await?;
        let url = proxied_url(&db, proxy.addr)?;
        let server = match mode {
            None => env.extra_agentd(&url, "proxied", PROFILE_POOL).await?,
            Some(mode) => env.extra_ceiling(mode, &url, PROFILE_POOL).await?,
        };
        let spec = RunSpec::new(&server.base, APP, args.message_bytes, args.chunks);
        for _ in 0..3 * PROFILE_POOL {
            load::one_run(&client, &spec).await?;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        proxy.take();
        let wal0 = admin.wal_position().await?;
        let mut sessions = vec![];
        for _ in 0..N {
            sessions.push(load::create_session(&client, &spec).await?);
        }
        let what = format!("{name}: POST /apps/…/sessions");
        phases.push(phase(&proxy, admin, &what, N, wal0).await?);
        let wal0 = admin.wal_position().await?;
        for s in &sessions {
            load::run_on(&client, &spec, s).await?;
        }
        // A run's last statement (agentd: its outcome) is written before `done` is sent, but
        // give a straggler a moment anyway.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let what = format!("{name}: POST /run");
        phases.push(phase(&proxy, admin, &what, N, wal0).await?);
        server.stop().await;
    }
    Ok(Profile { phases })
}
