//! PostgreSQL chores: fresh databases per benchmark run, and seeding long sessions.

use agentd::event::{Content, Event};
use anyhow::{bail, Context, Result};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::ConnectOptions;
use std::str::FromStr;
use std::sync::Mutex;

/// A connection to the server's maintenance database that creates the benchmark's
/// databases and drops them at the end.
pub struct Admin {
    url: String,
    pool: PgPool,
    created: Mutex<Vec<String>>,
}

impl Admin {
    pub async fn connect(url: &str) -> Result<Admin> {
        if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            bail!("--database-url must be a postgres:// URL (ceiling (b) and the fresh databases need PostgreSQL)");
        }
        let pool = connect(url, 2).await.with_context(|| {
            format!("cannot connect to PostgreSQL at {url}: start it or pass --database-url")
        })?;
        Ok(Admin {
            url: url.to_string(),
            pool,
            created: Mutex::new(vec![]),
        })
    }

    /// Creates an empty database `agentd_bench_<pid>_<tag>` and returns its URL.
    pub async fn create_database(&self, tag: &str) -> Result<String> {
        let name = format!("agentd_bench_{}_{tag}", std::process::id());
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
            .execute(&self.pool)
            .await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&self.pool)
            .await
            .with_context(|| format!("cannot create database {name}"))?;
        self.created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name.clone());
        let url = with_database(&self.url, &name)?;
        // A Citus coordinator: the database on every worker too, each with the extension,
        // the workers registered; agentd's migration then distributes its tables.
        let workers = self.citus_workers().await?;
        if !workers.is_empty() {
            for (host, port) in &workers {
                let node = with_host_port(&self.url, &format!("{host}:{port}"))?;
                let pool = connect(&node, 1).await?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&pool)
                    .await?;
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&pool)
                    .await?;
                pool.close().await;
                let pool = connect(&with_database(&node, &name)?, 1).await?;
                sqlx::query("CREATE EXTENSION citus").execute(&pool).await?;
                pool.close().await;
            }
            let pool = connect(&url, 1).await?;
            sqlx::query("CREATE EXTENSION citus").execute(&pool).await?;
            let me: (String, i32) = sqlx::query_as(
                "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid = 0 LIMIT 1",
            )
            .fetch_one(&self.pool)
            .await
            .context("the coordinator's own entry (citus_set_coordinator_host)")?;
            sqlx::query("SELECT citus_set_coordinator_host($1, $2)")
                .bind(&me.0)
                .bind(me.1)
                .execute(&pool)
                .await?;
            for (host, port) in &workers {
                sqlx::query("SELECT citus_add_node($1, $2)")
                    .bind(host)
                    .bind(port)
                    .execute(&pool)
                    .await?;
            }
            pool.close().await;
        }
        Ok(url)
    }

    /// The workers of the Citus cluster whose coordinator this is (none on plain PostgreSQL).
    pub async fn citus_workers(&self) -> Result<Vec<(String, i32)>> {
        let citus: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
        )
        .fetch_one(&self.pool)
        .await?;
        if !citus {
            return Ok(vec![]);
        }
        Ok(sqlx::query_as(
            "SELECT nodename, nodeport FROM pg_dist_node
              WHERE groupid <> 0 AND noderole = 'primary' ORDER BY nodeport",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// The server's WAL insert position in bytes (what is written since is the WAL a phase made).
    pub async fn wal_position(&self) -> Result<i64> {
        let v: i64 =
            sqlx::query_scalar("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint")
                .fetch_one(&self.pool)
                .await?;
        Ok(v)
    }

    pub async fn server_version(&self) -> Result<String> {
        let v: String = sqlx::query_scalar("SHOW server_version")
            .fetch_one(&self.pool)
            .await?;
        Ok(v)
    }

    pub async fn setting(&self, name: &str) -> Result<String> {
        let v: String = sqlx::query_scalar("SELECT current_setting($1)")
            .bind(name)
            .fetch_one(&self.pool)
            .await?;
        Ok(v)
    }

    /// Drops every database this run created (best effort; reports failures), on a Citus
    /// coordinator's workers too.
    pub async fn drop_created(&self) {
        let names = std::mem::take(&mut *self.created.lock().unwrap_or_else(|p| p.into_inner()));
        let workers = self.citus_workers().await.unwrap_or_default();
        for name in &names {
            for (host, port) in &workers {
                let Ok(node) = with_host_port(&self.url, &format!("{host}:{port}")) else {
                    continue;
                };
                if let Ok(pool) = connect(&node, 1).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&pool)
                        .await;
                    pool.close().await;
                }
            }
        }
        for name in names {
            if let Err(e) = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&self.pool)
                .await
            {
                eprintln!("warning: could not drop database {name}: {e}");
            }
        }
    }
}

pub async fn connect(url: &str, max: u32) -> Result<PgPool> {
    connect_with(url, PgPoolOptions::new().max_connections(max)).await
}

pub async fn connect_with(url: &str, pool: PgPoolOptions) -> Result<PgPool> {
    let opts = PgConnectOptions::from_str(url)?
        .application_name("agentd-bench")
        .log_statements(log::LevelFilter::Off);
    Ok(pool.connect_with(opts).await?)
}

/// `url` with its database (the path) replaced by `name`, query parameters kept.
pub fn with_database(url: &str, name: &str) -> Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .context("the database URL has no scheme")?;
    let (authority_and_path, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let authority = authority_and_path
        .split_once('/')
        .map_or(authority_and_path, |(a, _)| a);
    let mut out = format!("{scheme}://{authority}/{name}");
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Ok(out)
}

/// `url` with its host and port replaced by `host:port` (for the counting proxy).
pub fn with_host_port(url: &str, host_port: &str) -> Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .context("the database URL has no scheme")?;
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let userinfo = authority.rsplit_once('@').map(|(u, _)| u);
    Ok(match userinfo {
        Some(u) => format!("{scheme}://{u}@{host_port}{tail}"),
        None => format!("{scheme}://{host_port}{tail}"),
    })
}

/// The author of seeded model events, and the name of the bench apps' root agent.
pub const AGENT_NAME: &str = "bench_echo";

/// Stores `n` events (alternating user message / agent reply, ~100-byte texts, each reply
/// with a `turns` state delta) in an existing, empty session, exactly as agentd stores them:
/// rows of `events` with gapless `seq` from 1, the event JSON as agentd serializes it, and
/// the session's `last_seq`/`update_time` moved to the last one. Much faster than `n / 2`
/// runs; the rows are indistinguishable from appended ones.
pub async fn seed_events(
    pool: &PgPool,
    app: &str,
    user: &str,
    session: &str,
    n: usize,
) -> Result<()> {
    let base_ts = agentd::event::now_ts() - n as f64;
    let batch = 5_000;
    let mut seq0 = 1;
    while seq0 <= n {
        let end = (seq0 + batch - 1).min(n);
        let (mut seqs, mut ids, mut invs, mut authors, mut tss, mut jsons) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for seq in seq0..=end {
            let turn = seq.div_ceil(2);
            let inv = format!("e-seed-{turn}");
            let text = format!(
                "Turn {turn:06}: the quick brown fox jumps over the lazy dog, seeded history for the benchmark."
            );
            let mut e = if seq % 2 == 1 {
                Event::new(&inv, "user").with_content(Content::text("user", text))
            } else {
                let mut e = Event::new(&inv, AGENT_NAME).with_content(Content::text("model", text));
                e.actions
                    .state_delta
                    .insert("turns".into(), serde_json::json!(turn));
                e
            };
            e.fill_defaults();
            e.timestamp = base_ts + seq as f64;
            seqs.push(seq as i64);
            ids.push(e.id.clone());
            invs.push(e.invocation_id.clone());
            authors.push(e.author.clone());
            tss.push(e.timestamp);
            jsons.push(serde_json::to_string(&e)?);
        }
        sqlx::query(
            r#"INSERT INTO events (app_name, user_id, session_id, seq, id, invocation_id, author, "timestamp", event)
               SELECT $1, $2, $3, s, i, inv, a, t, j::jsonb
                 FROM UNNEST($4::bigint[], $5::text[], $6::text[], $7::text[], $8::float8[], $9::text[])
                      AS x(s, i, inv, a, t, j)"#,
        )
        .bind(app)
        .bind(user)
        .bind(session)
        .bind(&seqs)
        .bind(&ids)
        .bind(&invs)
        .bind(&authors)
        .bind(&tss)
        .bind(&jsons)
        .execute(pool)
        .await
        .context("cannot seed events")?;
        seq0 = end + 1;
    }
    let updated = sqlx::query(
        "UPDATE sessions SET last_seq = $4, update_time = $5,
                state = state || jsonb_build_object('turns', $6::bigint)
          WHERE app_name = $1 AND user_id = $2 AND id = $3",
    )
    .bind(app)
    .bind(user)
    .bind(session)
    .bind(n as i64)
    .bind(base_ts + n as f64)
    .bind((n / 2) as i64)
    .execute(pool)
    .await?
    .rows_affected();
    if updated != 1 {
        bail!("seeding: session {session} does not exist");
    }
    sqlx::query("ANALYZE").execute(pool).await?;
    Ok(())
}
