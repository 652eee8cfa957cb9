//! The measurements besides the run table, all against agentd: reading long sessions,
//! artifacts, many idle streams, and a run's time to first byte on a long session.

use crate::load::{self, RunSpec};
use crate::pg;
use crate::proc_stats::{self, mib};
use crate::servers::{Env, Server, APP, IDLE_APP};
use crate::BenchArgs;
use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use futures::StreamExt;
use hdrhistogram::Histogram;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Latencies of one kind of request.
pub struct Timed {
    pub what: String,
    pub reps: u64,
    pub hist: Histogram<u64>,
    /// Response body size.
    pub bytes: usize,
}

pub struct ArtifactRow {
    pub size: usize,
    pub save: Timed,
    pub load: Timed,
}

pub struct IdleResult {
    pub streams: usize,
    /// A fresh agentd process serves the idle streams, so its RSS is theirs alone.
    pub rss_fresh_kib: u64,
    pub open_secs: f64,
    pub rss_before_kib: u64,
    pub rss_open_max_kib: u64,
    pub window_secs: f64,
    pub server_cpu: f64,
    pub postgres_cpu: f64,
    pub keep_alives: usize,
}

pub struct HistoryResult {
    pub events: usize,
    pub fresh: Histogram<u64>,
    pub long: Histogram<u64>,
    pub fresh_end: Histogram<u64>,
    pub long_end: Histogram<u64>,
}

pub struct Extra {
    /// (events in the session, measurements)
    pub reads: Vec<(usize, Vec<Timed>)>,
    /// agentd's RSS after serving the long sessions (its allocator keeps freed memory).
    pub rss_after_reads_kib: Option<u64>,
    pub artifacts: Vec<ArtifactRow>,
    pub history: Option<HistoryResult>,
    pub idle: IdleResult,
    pub notes: Vec<String>,
}

pub async fn measure(args: &BenchArgs, env: &Env) -> Result<Extra> {
    let client = load::client(64)?;
    let base = env.agentd.base.clone();
    let spec = RunSpec::new(&base, APP, args.message_bytes, args.chunks);
    let mut notes = vec![];
    let pool = match &env.agentd_db {
        Some(url) => Some(pg::connect(url, 2).await?),
        None => {
            notes.push(
                "Long sessions are seeded with SQL on PostgreSQL only: with --backend sqlite the \
                 event-page, whole-session and long-history measurements are skipped."
                    .to_string(),
            );
            None
        }
    };

    let mut reads = vec![];
    let mut rss_after_reads_kib = None;
    let mut history = None;
    if let Some(pool) = &pool {
        for n in [1_000usize, 100_000] {
            eprintln!("extra: reading a session of {n} events…");
            let session = load::create_session(&client, &spec).await?;
            pg::seed_events(pool, APP, &spec.user, &session, n).await?;
            let s = format!("{base}/apps/{APP}/users/{}/sessions/{session}", spec.user);
            let whole_reps = if n > 10_000 { 5 } else { 50 };
            reads.push((
                n,
                vec![
                    timed_get(
                        &client,
                        "events, first page (`?limit=20`)",
                        &format!("{s}/events?limit=20"),
                        200,
                    )
                    .await?,
                    timed_get(
                        &client,
                        "events, newest page (`?before=<last+1>&limit=20`)",
                        &format!("{s}/events?before={}&limit=20", n + 1),
                        200,
                    )
                    .await?,
                    timed_get(
                        &client,
                        "session with its newest 20 events (`?limit=20`)",
                        &format!("{s}?limit=20"),
                        200,
                    )
                    .await?,
                    timed_get(
                        &client,
                        "whole session (`GET …/sessions/{id}`)",
                        &s,
                        whole_reps,
                    )
                    .await?,
                ],
            ));
        }

        rss_after_reads_kib = Some(proc_stats::sample(env.agentd.pid)?.rss_kib);

        eprintln!("extra: run time to first byte on a 10,000-event session vs fresh sessions…");
        let long_session = load::create_session(&client, &spec).await?;
        pg::seed_events(pool, APP, &spec.user, &long_session, 10_000).await?;
        let mut h = HistoryResult {
            events: 10_000,
            fresh: histogram(),
            long: histogram(),
            fresh_end: histogram(),
            long_end: histogram(),
        };
        for i in 0..110 {
            // Interleaved, so drift affects both alike; the first 10 of each warm up.
            let fresh = load::one_run(&client, &spec).await?;
            let long = load::run_on(&client, &spec, &long_session).await?;
            if i >= 10 {
                h.fresh.record(fresh.ttfb.as_micros() as u64)?;
                h.long.record(long.ttfb.as_micros() as u64)?;
                h.fresh_end.record(fresh.end.as_micros() as u64)?;
                h.long_end.record(long.end.as_micros() as u64)?;
            }
        }
        history = Some(h);
    }

    let mut artifacts = vec![];
    let session = load::create_session(&client, &spec).await?;
    for size in [1usize << 20, 10 << 20] {
        eprintln!("extra: artifacts of {} MiB…", size >> 20);
        artifacts.push(artifact_row(&client, &base, &spec.user, &session, size).await?);
    }

    let idle = idle_streams(args, env).await?;

    Ok(Extra {
        reads,
        rss_after_reads_kib,
        artifacts,
        history,
        idle,
        notes,
    })
}

/// `reps` sequential GETs after a few unmeasured ones.
async fn timed_get(client: &reqwest::Client, what: &str, url: &str, reps: u64) -> Result<Timed> {
    let mut hist = histogram();
    let mut bytes = 0;
    let warm = (reps / 10).max(1);
    for i in 0..warm + reps {
        let t0 = Instant::now();
        let resp = client
            .get(url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        if !resp.status().is_success() {
            bail!("GET {url}: HTTP {}", resp.status());
        }
        let body = resp.bytes().await?;
        let dt = t0.elapsed();
        bytes = body.len();
        if i >= warm {
            hist.record(dt.as_micros() as u64)?;
        }
    }
    Ok(Timed {
        what: what.to_string(),
        reps,
        hist,
        bytes,
    })
}

async fn artifact_row(
    client: &reqwest::Client,
    base: &str,
    user: &str,
    session: &str,
    size: usize,
) -> Result<ArtifactRow> {
    // Incompressible bytes (an xorshift stream), as a real upload would mostly be.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let data: Vec<u8> = (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
    let filename = format!("blob-{}m.bin", size >> 20);
    let body = serde_json::to_vec(&json!({
        "filename": filename,
        "artifact": {"inlineData": {"mimeType": "application/octet-stream", "data": b64}},
    }))?;
    let url = format!("{base}/apps/{APP}/users/{user}/sessions/{session}/artifacts");
    let reps = 10;
    let mut save = histogram();
    for i in 0..reps + 1 {
        let t0 = Instant::now();
        let resp = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .context("save artifact")?;
        if !resp.status().is_success() {
            bail!(
                "save artifact: HTTP {}: {}",
                resp.status(),
                resp.text().await.unwrap_or_default()
            );
        }
        resp.bytes().await?;
        if i > 0 {
            save.record(t0.elapsed().as_micros() as u64)?;
        }
    }
    let mut load = histogram();
    let mut bytes = 0;
    for i in 0..reps + 1 {
        let t0 = Instant::now();
        let resp = client
            .get(format!("{url}/{filename}"))
            .send()
            .await
            .context("load artifact")?;
        if !resp.status().is_success() {
            bail!("load artifact: HTTP {}", resp.status());
        }
        let got = resp.bytes().await?;
        if i > 0 {
            load.record(t0.elapsed().as_micros() as u64)?;
        }
        bytes = got.len();
        if bytes < b64.len() {
            bail!(
                "loaded artifact is {bytes} bytes, the base64 alone is {}",
                b64.len()
            );
        }
    }
    Ok(ArtifactRow {
        size,
        save: Timed {
            what: "save".into(),
            reps: reps as u64,
            hist: save,
            bytes: body.len(),
        },
        load: Timed {
            what: "load".into(),
            reps: reps as u64,
            hist: load,
            bytes,
        },
    })
}

/// Opens `--idle-streams` runs of the idle app (one partial, then an hour's wait), each on its
/// own session, holds them all open, and measures agentd's RSS and CPU (and PostgreSQL's CPU)
/// while they stay idle. Then lets them all go (each run is cancelled on disconnect).
async fn idle_streams(args: &BenchArgs, env: &Env) -> Result<IdleResult> {
    let n = args.idle_streams;
    eprintln!("extra: {n} idle streams on a fresh agentd process…");
    let server = env
        .extra_agentd(&env.agentd_url, "idle", args.db_max_connections)
        .await?;
    let result = hold_idle_streams(n, &server, None).await;
    server.stop().await;
    result.map(|held| held.idle)
}

/// A database counter sample and when it was taken.
pub type Probe = ((i64, i64), Instant);

/// Something sampled at both ends of the idle window (e.g. PostgreSQL's counters), after an
/// extra settle time.
pub struct WindowProbe {
    pub settle: Duration,
    #[allow(clippy::type_complexity)]
    pub sample: Box<
        dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Probe>> + Send>>
            + Send
            + Sync,
    >,
}

/// Idle streams held open, with the probe's samples at the window's ends.
pub struct HeldStreams {
    pub idle: IdleResult,
    pub probe_start: Option<Probe>,
    pub probe_end: Option<Probe>,
}

pub async fn hold_idle_streams(
    n: usize,
    server: &Server,
    probe: Option<&WindowProbe>,
) -> Result<HeldStreams> {
    let client = load::client(n)?;
    let spec = Arc::new(RunSpec::new(&server.base, IDLE_APP, 64, 2));
    let fresh = proc_stats::sample(server.pid)?;
    let sessions: Vec<String> = futures::stream::iter(0..n)
        .map(|_| {
            let (client, spec) = (client.clone(), spec.clone());
            async move { load::create_session(&client, &spec).await }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = proc_stats::sample(server.pid)?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let opened = Arc::new(AtomicUsize::new(0));
    let keep_alives = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(64));
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for session in sessions {
        let (client, spec, opened, keep_alives, gate) = (
            client.clone(),
            spec.clone(),
            opened.clone(),
            keep_alives.clone(),
            gate.clone(),
        );
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let permit = gate.acquire_owned().await?;
            let resp = client
                .post(format!("{}/run", spec.base))
                .json(&spec.run_body(&session))
                .send()
                .await?;
            if !resp.status().is_success() {
                bail!("idle run: HTTP {}", resp.status());
            }
            let mut body = resp.bytes_stream();
            let first = body.next().await.ok_or_else(|| anyhow!("empty stream"))??;
            if !first.starts_with(b"data: ") {
                bail!("idle run: unexpected first frame");
            }
            opened.fetch_add(1, Ordering::Relaxed);
            drop(permit);
            loop {
                tokio::select! {
                    _ = stop.changed() => return Ok(()),
                    chunk = body.next() => match chunk {
                        Some(Ok(c)) if c.starts_with(b": keep-alive") => {
                            keep_alives.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => bail!("idle stream broke: {e}"),
                        None => bail!("idle stream ended early"),
                    },
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    while opened.load(Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            bail!(
                "only {} of {n} idle streams opened within 180 s",
                opened.load(Ordering::Relaxed)
            );
        }
        if tasks.iter().any(|t| t.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let open_secs = t0.elapsed().as_secs_f64();
    if opened.load(Ordering::Relaxed) < n {
        // A task ended: surface its error.
        for t in tasks {
            if t.is_finished() {
                t.await??;
            }
        }
        bail!("an idle stream ended before all were open");
    }

    // Settle, then a window long enough for agentd's 15 s keep-alives and several lease
    // renewals (every lease/3 ≈ 3.3 s per run).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut probe_start = None;
    if let Some(p) = probe {
        tokio::time::sleep(p.settle).await;
        probe_start = Some((p.sample)().await?);
    }
    let s0 = proc_stats::sample(server.pid)?;
    let p0 = proc_stats::sample_all("postgres");
    let mut rss_max = s0.rss_kib;
    let window_end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < window_end {
        tokio::time::sleep(Duration::from_millis(250)).await;
        rss_max = rss_max.max(proc_stats::sample(server.pid)?.rss_kib);
    }
    let s1 = proc_stats::sample(server.pid)?;
    let p1 = proc_stats::sample_all("postgres");
    rss_max = rss_max.max(s1.rss_kib);
    let probe_end = match probe {
        Some(p) => Some((p.sample)().await?),
        None => None,
    };

    let _ = stop_tx.send(true);
    for t in tasks {
        t.await??;
    }
    // Let agentd seal and record the cancelled runs before anything else is measured.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = IdleResult {
        streams: n,
        rss_fresh_kib: fresh.rss_kib,
        open_secs,
        rss_before_kib: before.rss_kib,
        rss_open_max_kib: rss_max,
        window_secs: s1.at.duration_since(s0.at).as_secs_f64(),
        server_cpu: proc_stats::cpu_percent(&s0, &s1),
        postgres_cpu: proc_stats::cpu_percent(&p0, &p1),
        keep_alives: keep_alives.load(Ordering::Relaxed),
    };
    Ok(HeldStreams {
        idle,
        probe_start,
        probe_end,
    })
}

pub fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

pub fn mib_s(bytes: usize, us: u64) -> f64 {
    if us == 0 {
        return 0.0;
    }
    mib(bytes as u64 / 1024) / (us as f64 / 1e6)
}
