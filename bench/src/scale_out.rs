//! `agentd-bench scale-out`: what several replicas on one PostgreSQL cost and how fast they
//! cooperate. Replica A is the harness's agentd; replica B is a second `agentd` process on the
//! same database.
//!
//! - **Cancel across replicas**: a run on A (one partial, then it waits), `POST
//!   /runs/{id}/cancel` on B, until `event: done` arrives on A's stream (sealing included).
//! - **Re-attach**: a run that committed `--replay-events` events; `GET /runs/{id}/stream` on
//!   B from seq 0: time to the first replayed event and to `done`.
//! - **Follower overhead**: the standard run (`POST /run` of the bench app) at concurrency
//!   `--follow-concurrency` on A, with no follower, then with one follower per run on B (the
//!   session's stream, opened before the run and read to its `run_done`): runs/s, agentd CPU
//!   and PostgreSQL CPU.
//! - **Open streams**: `--scale-streams` idle runs held open on a fresh replica: row writes/s
//!   and commits/s in PostgreSQL (`pg_stat_database` of agentd's database), RSS and CPU.

use crate::extra::{self, ms};
use crate::load::{self, RunSpec};
use crate::pg::{self, Admin};
use crate::proc_stats;
use crate::servers::{self, Env, Server, APP, IDLE_APP};
use crate::{Backend, BenchArgs};
use anyhow::{anyhow, bail, Context, Result};
use futures::StreamExt;
use hdrhistogram::Histogram;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The app whose single run commits many events: a loop of echo agents without partials.
const LOOP_APP: &str = "replay";

pub async fn run(args: BenchArgs, agentd_bin: &std::path::Path) -> Result<()> {
    if args.backend != Backend::Postgres {
        bail!("scale-out needs PostgreSQL (several replicas share one database)");
    }
    crate::raise_fd_limit(args.scale_streams.iter().copied().max().unwrap_or(0))?;
    let self_bin = std::env::current_exe().context("cannot find this executable's path")?;
    let admin = Admin::connect(&args.database_url).await?;
    let mut out = String::new();
    let result = async {
        let env = Env::new(&args, &admin, agentd_bin, &self_bin).await?;
        let outcome = measure(&args, &env, &mut out).await;
        env.stop(outcome.is_err()).await;
        outcome
    }
    .await;
    admin.drop_created().await;
    if result.is_err() {
        eprintln!("the benchmark failed; what it measured before that:\n");
    }
    println!("{out}");
    if let Some(path) = &args.out {
        std::fs::write(path, &out)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    result
}

async fn measure(args: &BenchArgs, env: &Env, out: &mut String) -> Result<()> {
    let machine = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    writeln!(
        out,
        "## Scale-out (agentd-bench scale-out)\n\n{} cores ({machine}), release build, \
         PostgreSQL on the same machine; replica A and B are two agentd processes on one \
         database.\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )?;
    writeln!(out, "| what | measured |\n|---|---|")?;
    servers::write_app(
        &env.apps_dir,
        LOOP_APP,
        &format!(
            "agent_class: LoopAgent\nname: replay\nmax_iterations: {}\nsub_agents:\n  - config_path: echo.yaml\n",
            args.replay_events
        ),
    )?;
    std::fs::write(
        env.apps_dir.join(LOOP_APP).join("echo.yaml"),
        "agent_class: EchoAgent\nname: echo\nchunks: 0\n",
    )?;
    // B starts after the loop app is written (apps load at start).
    let b = env
        .extra_agentd(&env.agentd_url, "b", args.db_max_connections)
        .await?;
    let part = |name: &str| args.scale_parts.iter().any(|p| p == name);
    let outcome = async {
        if part("cancel") {
            cancel_latency(args, &env.agentd, &b, out).await?;
        }
        if part("reattach") {
            // The long run is started on B (which loaded the loop app), re-attached to on A.
            re_attach(args, &b, &env.agentd, out).await?;
        }
        if part("follow") {
            follower_overhead(args, &env.agentd, &b, out).await?;
        }
        anyhow::Ok(())
    }
    .await;
    b.stop().await;
    outcome?;
    if part("streams") {
        open_streams(args, env, out).await?;
    }
    Ok(())
}

/// The `x-agentd-run-id` of a run response.
fn run_id_of(resp: &reqwest::Response) -> Result<String> {
    resp.headers()
        .get("x-agentd-run-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .context("the response has no x-agentd-run-id")
}

fn quantiles(h: &Histogram<u64>) -> String {
    format!(
        "p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n = {})",
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.9)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
        h.len()
    )
}

fn histogram() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 600_000_000, 3).map_err(|e| anyhow!("histogram: {e}"))
}

/// Reads SSE bytes until a frame containing `needle`; returns false at the end of the stream.
async fn read_until(
    body: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buf: &mut Vec<u8>,
    needle: &[u8],
) -> Result<bool> {
    loop {
        if let Some(i) = buf.windows(needle.len()).position(|w| w == needle) {
            buf.drain(..i + needle.len());
            return Ok(true);
        }
        // Only a needle cut at the end can still match: keep the scan linear.
        let keep = buf.len().saturating_sub(needle.len() - 1);
        buf.drain(..keep);
        let next = tokio::time::timeout(Duration::from_secs(60), body.next())
            .await
            .map_err(|_| anyhow!("a stream stalled for 60 s"))?;
        match next {
            Some(chunk) => buf.extend_from_slice(&chunk?),
            None => return Ok(false),
        }
    }
}

async fn cancel_latency(args: &BenchArgs, a: &Server, b: &Server, out: &mut String) -> Result<()> {
    eprintln!("scale-out: {} cancels across replicas…", args.cancels);
    let client = load::client(4)?;
    let spec = RunSpec::new(&a.base, IDLE_APP, 64, 2);
    let mut h = histogram()?;
    for _ in 0..args.cancels {
        let session = load::create_session(&client, &spec).await?;
        let resp = client
            .post(format!("{}/run", a.base))
            .json(&spec.run_body(&session))
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("run on A: HTTP {}", resp.status());
        }
        let run_id = run_id_of(&resp)?;
        let mut body = resp.bytes_stream();
        let mut buf = vec![];
        if !read_until(&mut body, &mut buf, b"\"partial\":true").await? {
            bail!("run ended before its first partial");
        }
        let t0 = Instant::now();
        let cancel = client
            .post(format!("{}/runs/{run_id}/cancel", b.base))
            .send()
            .await?;
        if cancel.status().as_u16() != 202 {
            bail!("cancel on B: HTTP {}", cancel.status());
        }
        if !read_until(&mut body, &mut buf, b"event: done").await? {
            bail!("A's stream ended without done");
        }
        h.record(t0.elapsed().as_micros() as u64)?;
        if !read_until(&mut body, &mut buf, b"\n\n").await? {
            bail!("A's done frame was cut");
        }
    }
    writeln!(
        out,
        "| cancel on B of a run on A, until `done` on A's stream | {} |",
        quantiles(&h)
    )?;
    Ok(())
}

async fn re_attach(args: &BenchArgs, a: &Server, b: &Server, out: &mut String) -> Result<()> {
    eprintln!(
        "scale-out: re-attach to a run of {} committed events…",
        args.replay_events
    );
    let client = load::client(4)?;
    let spec = RunSpec::new(&a.base, LOOP_APP, 32, 1);
    let session = load::create_session(&client, &spec).await?;
    let resp = client
        .post(format!("{}/run", a.base))
        .json(&spec.run_body(&session))
        .send()
        .await?;
    let run_id = run_id_of(&resp)?;
    let text = resp.text().await?;
    let committed = text.matches("\nid: ").count() + usize::from(text.starts_with("id: "));
    if !text.contains("\"status\":\"completed\"") {
        bail!(
            "the replay run did not complete: {}",
            &text[text.len().saturating_sub(300)..]
        );
    }
    let (mut first, mut whole) = (histogram()?, histogram()?);
    for _ in 0..20 {
        let t0 = Instant::now();
        let resp = client
            .get(format!("{}/runs/{run_id}/stream?after=0", b.base))
            .send()
            .await?;
        let mut body = resp.bytes_stream();
        let mut buf = vec![];
        if !read_until(&mut body, &mut buf, b"id: ").await? {
            bail!("no replayed event");
        }
        first.record(t0.elapsed().as_micros() as u64)?;
        if !read_until(&mut body, &mut buf, b"event: done").await? {
            bail!("the replay did not end with done");
        }
        whole.record(t0.elapsed().as_micros() as u64)?;
    }
    writeln!(
        out,
        "| re-attach on the other replica to a finished run of {committed} committed events: first replayed event | {} |",
        quantiles(&first)
    )?;
    writeln!(
        out,
        "| the same: whole replay to `done` | {} |",
        quantiles(&whole)
    )?;
    Ok(())
}

struct FollowResult {
    runs: usize,
    secs: f64,
    agentd_cpu: f64,
    b_cpu: f64,
    pg_cpu: f64,
    p50_end_ms: f64,
}

async fn follow_level(
    args: &BenchArgs,
    a: &Server,
    b: &Server,
    followers: bool,
) -> Result<FollowResult> {
    let c = args.follow_concurrency;
    let client = load::client(c * 2)?;
    let spec = Arc::new(RunSpec::new(&a.base, APP, args.message_bytes, args.chunks));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let ends = Arc::new(std::sync::Mutex::new(histogram()?));
    let mut tasks = vec![];
    for _ in 0..c {
        let (client, spec, stop, done, measuring, ends) = (
            client.clone(),
            spec.clone(),
            stop.clone(),
            done.clone(),
            measuring.clone(),
            ends.clone(),
        );
        let b_base = b.base.clone();
        tasks.push(tokio::spawn(async move {
            // One session per client, followed on B (if at all) for all of its runs, as a
            // second tab or device would.
            let session = load::create_session(&client, &spec).await?;
            let seen = Arc::new(AtomicUsize::new(0));
            let follower = if followers {
                let url = format!(
                    "{b_base}/apps/{}/users/{}/sessions/{session}/stream",
                    spec.app, spec.user
                );
                let resp = client.get(url).send().await?;
                if !resp.status().is_success() {
                    bail!("follow on B: HTTP {}", resp.status());
                }
                let seen = seen.clone();
                Some(tokio::spawn(async move {
                    let mut body = resp.bytes_stream();
                    let mut buf = vec![];
                    while read_until(&mut body, &mut buf, b"event: run_done").await? {
                        seen.fetch_add(1, Ordering::Relaxed);
                    }
                    anyhow::Ok(())
                }))
            } else {
                None
            };
            // The watch reaches A before the first run.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut runs = 0;
            while !stop.load(Ordering::Relaxed) {
                let timing = load::run_on(&client, &spec, &session).await?;
                runs += 1;
                if measuring.load(Ordering::Relaxed) {
                    done.fetch_add(1, Ordering::Relaxed);
                    let _ = ends
                        .lock()
                        .map(|mut h| h.record(timing.end.as_micros() as u64));
                }
            }
            if let Some(f) = follower {
                // Every run's end reached the follower (allow a moment for the last one).
                let deadline = Instant::now() + Duration::from_secs(10);
                while seen.load(Ordering::Relaxed) < runs && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                f.abort();
                let got = seen.load(Ordering::Relaxed);
                if got < runs {
                    bail!("the follower saw {got} of {runs} runs end");
                }
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(args.warmup()).await;
    let (a0, b0, p0) = (
        proc_stats::sample(a.pid)?,
        proc_stats::sample(b.pid)?,
        proc_stats::sample_all("postgres"),
    );
    measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(args.duration()).await;
    measuring.store(false, Ordering::Relaxed);
    let (a1, b1, p1) = (
        proc_stats::sample(a.pid)?,
        proc_stats::sample(b.pid)?,
        proc_stats::sample_all("postgres"),
    );
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await??;
    }
    let p50 = ends
        .lock()
        .map(|h| ms(h.value_at_quantile(0.5)))
        .unwrap_or(0.0);
    Ok(FollowResult {
        runs: done.load(Ordering::Relaxed),
        secs: a1.at.duration_since(a0.at).as_secs_f64(),
        agentd_cpu: proc_stats::cpu_percent(&a0, &a1),
        b_cpu: proc_stats::cpu_percent(&b0, &b1),
        pg_cpu: proc_stats::cpu_percent(&p0, &p1),
        p50_end_ms: p50,
    })
}

async fn follower_overhead(
    args: &BenchArgs,
    a: &Server,
    b: &Server,
    out: &mut String,
) -> Result<()> {
    for followers in [false, true] {
        eprintln!(
            "scale-out: runs at c={} with {} follower per run…",
            args.follow_concurrency,
            u8::from(followers)
        );
        let r = follow_level(args, a, b, followers).await?;
        let per_run = |cpu: f64| cpu / 100.0 * r.secs * 1000.0 / r.runs.max(1) as f64;
        writeln!(
            out,
            "| runs on A at c={} (each client's runs on one session), {} follower(s) of each session on B | {:.0} runs/s, end p50 {:.2} ms; CPU per run: agentd A {:.2} ms, agentd B {:.2} ms, PostgreSQL {:.2} ms |",
            args.follow_concurrency,
            u8::from(followers),
            r.runs as f64 / r.secs,
            r.p50_end_ms,
            per_run(r.agentd_cpu),
            per_run(r.b_cpu),
            per_run(r.pg_cpu),
        )?;
    }
    Ok(())
}

async fn open_streams(args: &BenchArgs, env: &Env, out: &mut String) -> Result<()> {
    let db = env
        .agentd_db
        .as_deref()
        .context("agentd's PostgreSQL database")?;
    let pool = pg::connect(db, 1).await?;
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await?;
    for &n in &args.scale_streams {
        eprintln!("scale-out: {n} open streams on a fresh replica…");
        let server = env
            .extra_agentd(
                &env.agentd_url,
                &format!("streams-{n}"),
                args.db_max_connections,
            )
            .await?;
        let counters = |pool: sqlx::PgPool, name: String| async move {
            let row: (i64, i64) = sqlx::query_as(
                "SELECT (tup_inserted + tup_updated + tup_deleted)::bigint, xact_commit::bigint
                   FROM pg_stat_database WHERE datname = $1",
            )
            .bind(&name)
            .fetch_one(&pool)
            .await?;
            anyhow::Ok((row, Instant::now()))
        };
        let sampler = extra::WindowProbe {
            // PostgreSQL reports a backend's counters up to ~10 s late: settle first.
            settle: Duration::from_secs(11),
            sample: Box::new({
                let (pool, name) = (pool.clone(), name.clone());
                move || Box::pin(counters(pool.clone(), name.clone()))
            }),
        };
        let result = extra::hold_idle_streams(n, &server, Some(&sampler)).await;
        server.stop().await;
        let r = result?;
        let ((w0, c0), t0) = r.probe_start.context("no database sample")?;
        let ((w1, c1), t1) = r.probe_end.context("no database sample")?;
        let secs = t1.duration_since(t0).as_secs_f64();
        writeln!(
            out,
            "| {n} open `/run` streams on one replica ({:.0} s window) | {:.2} row writes/s, {:.1} commits/s (reads included); agentd RSS {:.1} MiB ({:.1} KiB per stream over a fresh process), CPU {:.1} %; opened in {:.1} s |",
            secs,
            (w1 - w0) as f64 / secs,
            (c1 - c0) as f64 / secs,
            proc_stats::mib(r.idle.rss_open_max_kib),
            (r.idle.rss_open_max_kib.saturating_sub(r.idle.rss_fresh_kib)) as f64 / n as f64,
            r.idle.server_cpu,
            r.idle.open_secs,
        )?;
    }
    Ok(())
}
