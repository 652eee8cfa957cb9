//! Forking a long session: a session of `--fork-events` events (100,000 by default, written
//! straight into agentd's PostgreSQL database), forked through the API before an invocation
//! near its end; the fork's wall time and agentd's peak RSS while it runs (sampled every
//! 10 ms from `/proc`).

use crate::pg::{connect, Admin};
use crate::proc_stats::{mib, sample};
use crate::servers::single_app_agentd;
use crate::BenchArgs;
use anyhow::{ensure, Result};
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub async fn run(args: &BenchArgs, admin: &Admin, agentd_bin: &std::path::Path) -> Result<String> {
    let work = tempfile::Builder::new().prefix("agentd-bench-").tempdir()?;
    let (agentd, url) = single_app_agentd(
        args,
        admin,
        agentd_bin,
        work.path(),
        crate::Backend::Postgres,
        "fork",
        "long",
        "agent_class: EchoAgent\nname: long\nchunks: 1\n",
    )
    .await?;
    let client = reqwest::Client::new();
    let base = agentd.base.clone();
    let created = client
        .post(format!("{base}/apps/long/users/u1/sessions"))
        .json(&serde_json::json!({"sessionId": "big"}))
        .send()
        .await?;
    ensure!(
        created.status().is_success(),
        "create session: {}",
        created.status()
    );
    // Ten events per invocation, the first one the user's; each changes one of 100 state keys.
    let n = args.fork_events as i64;
    let pool = connect(&url, 2).await?;
    sqlx::query(
        "INSERT INTO events (app_name, user_id, session_id, seq, id, invocation_id, author,
                             \"timestamp\", event)
         SELECT 'long', 'u1', 'big', g, 'ev-' || g, 'e-' || ((g - 1) / 10),
                CASE WHEN g % 10 = 1 THEN 'user' ELSE 'long' END, g::float8,
                jsonb_build_object(
                    'id', 'ev-' || g, 'invocationId', 'e-' || ((g - 1) / 10),
                    'author', CASE WHEN g % 10 = 1 THEN 'user' ELSE 'long' END,
                    'timestamp', g,
                    'content', jsonb_build_object('role', 'model', 'parts',
                        jsonb_build_array(jsonb_build_object('text', repeat('x', 200)))),
                    'actions', jsonb_build_object('stateDelta',
                        jsonb_build_object('k' || (g % 100), g), 'artifactDelta', '{}'::jsonb))
           FROM generate_series(1, $1) AS g",
    )
    .bind(n)
    .execute(&pool)
    .await?;
    sqlx::query("UPDATE sessions SET last_seq = $1 WHERE id = 'big'")
        .bind(n)
        .execute(&pool)
        .await?;
    // Cut before the last invocation: all but ten events are copied.
    let before = format!("e-{}", (n - 1) / 10);
    let pid = agentd.pid;
    let idle_kib = sample(pid)?.rss_kib;
    let peak = Arc::new(AtomicU64::new(idle_kib));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                if let Ok(s) = sample(pid) {
                    peak.fetch_max(s.rss_kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let started = Instant::now();
    let resp = client
        .post(format!("{base}/apps/long/users/u1/sessions/big/fork"))
        .json(&serde_json::json!({"beforeInvocationId": before, "sessionId": "copy"}))
        .send()
        .await?;
    let took = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    ensure!(
        resp.status().as_u16() == 201,
        "fork answered {}",
        resp.status()
    );
    let body: serde_json::Value = resp.json().await?;
    agentd.stop().await;
    let mut out = String::new();
    writeln!(
        out,
        "fork of a {n}-event session before its last invocation ({} events copied, PostgreSQL): \
         {:.0} ms; agentd RSS {:.1} MiB idle, {:.1} MiB peak during the fork",
        body["lastSeq"],
        took.as_secs_f64() * 1000.0,
        mib(idle_kib),
        mib(peak.load(Ordering::Relaxed)),
    )?;
    Ok(out)
}
