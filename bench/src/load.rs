//! The load generator: concurrent clients, each doing runs one after the other. A run is
//! `POST /apps/{app}/users/{u}/sessions` (a fresh session), then `POST /run` with the user
//! message, reading the SSE stream to its end and checking every frame.

use crate::proc_stats::{self, Sample};
use crate::servers::{Env, Server, APP};
use crate::BenchArgs;
use anyhow::{anyhow, bail, Context, Result};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a single run may take before it counts as an error.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

use crate::credentials::API_KEY;

pub fn client(max_idle: usize) -> Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = API_KEY.get() {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {key}").parse().context("API key header")?,
        );
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .tcp_nodelay(true)
        .http1_only()
        .pool_max_idle_per_host(max_idle)
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
        .context("cannot build the HTTP client")
}

/// What every run sends and expects.
#[derive(Clone)]
pub struct RunSpec {
    pub base: String,
    pub app: String,
    pub user: String,
    pub message: String,
    pub chunks: usize,
}

impl RunSpec {
    pub fn new(base: &str, app: &str, message_bytes: usize, chunks: usize) -> RunSpec {
        // Printable ASCII, so every chunk is exactly message_bytes / chunks bytes.
        let pattern = "The quick brown fox jumps over the lazy dog. ";
        let message: String = pattern.chars().cycle().take(message_bytes).collect();
        RunSpec {
            base: base.to_string(),
            app: app.to_string(),
            user: "bench-user".into(),
            message,
            chunks,
        }
    }

    pub fn run_body(&self, session: &str) -> Value {
        json!({
            "appName": self.app, "userId": self.user, "sessionId": session,
            "newMessage": {"role": "user", "parts": [{"text": self.message}]},
        })
    }
}

/// Timings of one successful `POST /run`.
#[derive(Debug, Clone, Copy)]
pub struct RunTiming {
    /// From sending `POST /run` to the first byte of the SSE body.
    pub ttfb: Duration,
    /// From sending `POST /run` to the end of the stream.
    pub end: Duration,
    /// From the first partial event to the last one (as parsed by the client).
    pub partials: Duration,
}

pub async fn create_session(client: &reqwest::Client, spec: &RunSpec) -> Result<String> {
    let session = uuid::Uuid::new_v4().to_string();
    let resp = client
        .post(format!(
            "{}/apps/{}/users/{}/sessions",
            spec.base, spec.app, spec.user
        ))
        .json(&json!({ "sessionId": session }))
        .send()
        .await
        .context("create session")?;
    if !resp.status().is_success() {
        let status = resp.status();
        bail!(
            "create session: HTTP {status}: {}",
            resp.text().await.unwrap_or_default()
        );
    }
    resp.bytes().await.context("create session body")?;
    Ok(session)
}

/// `POST /run` on `session`, reading and checking the whole stream: `chunks` partial events
/// whose texts concatenate to the message, one complete event with an `id:` and the whole
/// message, then `event: done` with status `completed` and that id as `lastSeq`, then EOF.
pub async fn run_on(client: &reqwest::Client, spec: &RunSpec, session: &str) -> Result<RunTiming> {
    let t0 = Instant::now();
    let resp = client
        .post(format!("{}/run", spec.base))
        .json(&spec.run_body(session))
        .send()
        .await
        .context("POST /run")?;
    if !resp.status().is_success() {
        let status = resp.status();
        bail!(
            "POST /run: HTTP {status}: {}",
            resp.text().await.unwrap_or_default()
        );
    }
    let mut body = resp.bytes_stream();
    let first = body
        .next()
        .await
        .ok_or_else(|| anyhow!("empty SSE body"))?
        .context("reading the SSE body")?;
    let ttfb = t0.elapsed();
    let mut events = futures::stream::iter([Ok(first)]).chain(body).eventsource();

    let mut partial_text = String::new();
    let mut partials = 0;
    let (mut first_partial, mut last_partial) = (None, None);
    let mut complete_seq: Option<i64> = None;
    let mut done = false;
    while let Some(ev) = events.next().await {
        let ev = ev.map_err(|e| anyhow!("SSE stream: {e}"))?;
        if done {
            bail!("a frame after `event: done`: {} {}", ev.event, ev.data);
        }
        let data: Value = serde_json::from_str(&ev.data)
            .with_context(|| format!("frame data is not JSON: {}", ev.data))?;
        match ev.event.as_str() {
            "message" if data.get("partial") == Some(&Value::Bool(true)) => {
                if complete_seq.is_some() {
                    bail!("a partial event after the complete one");
                }
                if !ev.id.is_empty() {
                    bail!("a partial event with an id");
                }
                partials += 1;
                partial_text.push_str(event_text(&data));
                let now = Instant::now();
                first_partial.get_or_insert(now);
                last_partial = Some(now);
            }
            "message" => {
                if complete_seq.is_some() {
                    bail!("two complete events");
                }
                let seq: i64 = ev
                    .id
                    .parse()
                    .with_context(|| format!("complete event without a numeric id: {:?}", ev.id))?;
                if event_text(&data) != spec.message {
                    bail!("the complete event's text differs from the message");
                }
                complete_seq = Some(seq);
            }
            "done" => {
                if data["status"] != "completed" {
                    bail!("run ended {}", ev.data);
                }
                if data["lastSeq"].as_i64() != complete_seq {
                    bail!(
                        "done.lastSeq {} != the complete event's id",
                        data["lastSeq"]
                    );
                }
                done = true;
            }
            other => bail!("unexpected `event: {other}`: {}", ev.data),
        }
    }
    let end = t0.elapsed();
    if !done {
        bail!("the stream ended without `event: done`");
    }
    if partials != spec.chunks {
        bail!("{partials} partial events, expected {}", spec.chunks);
    }
    if partial_text != spec.message {
        bail!("the partial events do not add up to the message");
    }
    let partials = match (first_partial, last_partial) {
        (Some(a), Some(b)) => b.duration_since(a),
        _ => Duration::ZERO,
    };
    Ok(RunTiming {
        ttfb,
        end,
        partials,
    })
}

fn event_text(event: &Value) -> &str {
    event
        .pointer("/content/parts/0/text")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// One full run: a fresh session, then the streamed run.
pub async fn one_run(client: &reqwest::Client, spec: &RunSpec) -> Result<RunTiming> {
    let session = create_session(client, spec).await?;
    run_on(client, spec, &session).await
}

fn histogram() -> Histogram<u64> {
    // Microseconds, 1 µs to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// Results of one server at one concurrency level.
pub struct LevelResult {
    pub server: &'static str,
    pub concurrency: usize,
    pub window: Duration,
    pub completed: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub ttfb: Histogram<u64>,
    pub end: Histogram<u64>,
    /// First partial → last partial.
    pub partials: Histogram<u64>,
    pub server_cpu: f64,
    pub server_rss_max_kib: u64,
    pub client_cpu: f64,
    pub postgres_cpu: f64,
}

impl LevelResult {
    pub fn runs_per_sec(&self) -> f64 {
        self.completed as f64 / self.window.as_secs_f64()
    }

    /// CPU milliseconds per completed run, from a CPU percentage over the window.
    pub fn cpu_ms_per_run(&self, percent: f64) -> f64 {
        if self.completed == 0 {
            return 0.0;
        }
        percent / 100.0 * self.window.as_secs_f64() * 1000.0 / self.completed as f64
    }
}

struct Worker {
    completed: u64,
    errors: u64,
    first_error: Option<String>,
    ttfb: Histogram<u64>,
    end: Histogram<u64>,
    partials: Histogram<u64>,
}

/// Drives `server` with `concurrency` clients for warmup + duration. Counted: runs that
/// complete inside the measured window (latencies of exactly those).
pub async fn run_level(
    server: &Server,
    spec: &RunSpec,
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
) -> Result<LevelResult> {
    let client = client(concurrency)?;
    let start = Instant::now();
    let window_start = start + warmup;
    let window_end = window_start + duration;
    let spec = Arc::new(spec.clone());
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (client, spec) = (client.clone(), spec.clone());
        tasks.push(tokio::spawn(async move {
            let mut w = Worker {
                completed: 0,
                errors: 0,
                first_error: None,
                ttfb: histogram(),
                end: histogram(),
                partials: histogram(),
            };
            while Instant::now() < window_end {
                let r = tokio::time::timeout(RUN_TIMEOUT, one_run(&client, &spec)).await;
                let now = Instant::now();
                let counted = now >= window_start && now <= window_end;
                match r {
                    Ok(Ok(t)) if counted => {
                        w.completed += 1;
                        let _ = w.ttfb.record(t.ttfb.as_micros() as u64);
                        let _ = w.end.record(t.end.as_micros() as u64);
                        let _ = w.partials.record(t.partials.as_micros() as u64);
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        w.errors += u64::from(counted);
                        w.first_error.get_or_insert_with(|| format!("{e:#}"));
                    }
                    Err(_) => {
                        w.errors += u64::from(counted);
                        w.first_error
                            .get_or_insert_with(|| format!("a run took over {RUN_TIMEOUT:?}"));
                    }
                }
            }
            w
        }));
    }

    tokio::time::sleep_until(window_start.into()).await;
    let (s0, c0, p0) = samples(server.pid)?;
    let pid = server.pid;
    let rss_sampler = tokio::spawn(async move {
        let mut max = 0;
        while Instant::now() < window_end {
            if let Ok(s) = proc_stats::sample(pid) {
                max = max.max(s.rss_kib);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        max
    });
    tokio::time::sleep_until(window_end.into()).await;
    let (s1, c1, p1) = samples(server.pid)?;
    let rss_max = rss_sampler.await?.max(s1.rss_kib);

    let mut result = LevelResult {
        server: server.name,
        concurrency,
        window: s1.at.duration_since(s0.at),
        completed: 0,
        errors: 0,
        first_error: None,
        ttfb: histogram(),
        end: histogram(),
        partials: histogram(),
        server_cpu: proc_stats::cpu_percent(&s0, &s1),
        server_rss_max_kib: rss_max,
        client_cpu: proc_stats::cpu_percent(&c0, &c1),
        postgres_cpu: proc_stats::cpu_percent(&p0, &p1),
    };
    for t in tasks {
        let w = t.await?;
        result.completed += w.completed;
        result.errors += w.errors;
        if result.first_error.is_none() {
            result.first_error = w.first_error;
        }
        result.ttfb.add(&w.ttfb)?;
        result.end.add(&w.end)?;
        result.partials.add(&w.partials)?;
    }
    if let Some(e) = &result.first_error {
        eprintln!(
            "  {} c={concurrency}: {} errors; first: {e}",
            server.name, result.errors
        );
    }
    Ok(result)
}

/// (server, this process, all PostgreSQL processes).
fn samples(pid: u32) -> Result<(Sample, Sample, Sample)> {
    Ok((
        proc_stats::sample(pid)?,
        proc_stats::sample(std::process::id())?,
        proc_stats::sample_all("postgres"),
    ))
}

/// The run table: every level, each server in turn (agentd, (a), (b), (c)) so that slow drift
/// of the machine affects all of them alike.
pub async fn run_table(args: &BenchArgs, env: &mut Env) -> Result<Vec<LevelResult>> {
    // Steady state, not a cold start: a few seconds of load fill the tables, then
    // PostgreSQL's statistics are gathered, as autovacuum does within its first minute
    // (autovacuum_naptime). Without statistics PostgreSQL 15 plans agentd's session lookups
    // on `sessions_by_update_time`, scanning every session of the user (see docs/storage.md).
    eprintln!("runs: warming up every server…");
    for server in env.measured() {
        let spec = RunSpec::new(&server.base, APP, args.message_bytes, args.chunks);
        run_level(server, &spec, 8, Duration::ZERO, Duration::from_secs(3)).await?;
    }
    let dbs = if args.skip_analyze {
        vec![]
    } else {
        env.agentd_db
            .iter()
            .chain([&env.ceiling_db, &env.ceiling_c_url])
            .filter(|url| url.starts_with("postgres"))
            .collect()
    };
    for db in dbs {
        let pool = crate::pg::connect(db, 1).await?;
        sqlx::query("ANALYZE").execute(&pool).await?;
        pool.close().await;
    }

    let mut out = vec![];
    for &c in &args.levels {
        for server in env.measured() {
            eprintln!(
                "runs: {} at concurrency {c} ({:.0} s + {:.0} s warm-up)…",
                server.name, args.duration, args.warmup
            );
            let spec = RunSpec::new(&server.base, APP, args.message_bytes, args.chunks);
            let r = run_level(server, &spec, c, args.warmup(), args.duration()).await?;
            eprintln!(
                "  {:.1} runs/s, ttfb p50 {:.2} ms, end p50 {:.2} ms, errors {}",
                r.runs_per_sec(),
                r.ttfb.value_at_quantile(0.5) as f64 / 1000.0,
                r.end.value_at_quantile(0.5) as f64 / 1000.0,
                r.errors
            );
            out.push(r);
        }
    }
    Ok(out)
}
