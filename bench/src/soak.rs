//! Soak: many echo runs with nobody scraping `/metrics`, and agentd's RSS along the way.
//!
//! The Prometheus recorder holds every histogram sample until a scrape or the recorder's
//! upkeep drains it into its buckets, and every label set it has seen for good. A replica
//! nobody scrapes (no Prometheus yet, a scraper that is down) still records a few samples per
//! request, run and commit, so what the upkeep does (or fails to do) shows as RSS that grows
//! with the number of runs instead of levelling off.
//!
//! `--soak-sessions` clients (8 by default) each run one echo run after the other on a
//! session of their own, `--soak-runs` in all (80,000 by default) or as many as
//! `--soak-max-secs` allows. Sessions are reused, so the database grows by events only, and
//! the echo agent reads no history, so a longer session costs it nothing. agentd's RSS is
//! sampled before the first run, every `--soak-every` completed runs, right after the last
//! one, after an idle pause longer than agentd's upkeep period, and after a single scrape.

use crate::load::{self, RunSpec};
use crate::proc_stats::{self, mib};
use crate::servers::{Env, APP};
use crate::BenchArgs;
use anyhow::{bail, Context, Result};
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Longest a single run may take before it counts as an error.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// Errors after which the soak stops early: the server is broken, there is nothing to measure.
const MAX_ERRORS: u64 = 100;
/// The idle pause before the last samples: two of agentd's upkeep periods (5 s).
const SETTLE: Duration = Duration::from_secs(10);
/// The most `--soak-max-secs` may ask for (a week): keeps the deadline's arithmetic in range.
const MAX_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// One RSS sample.
pub struct Row {
    /// What the moment is (`before the first run`, `running`, `10 s later, idle`…).
    pub label: String,
    /// Runs completed when it was taken.
    pub runs: u64,
    /// Since the first run started.
    pub at: Duration,
    pub rss_kib: u64,
    /// A milestone (every `--soak-every` runs): the rows the growth rate is computed from.
    pub milestone: bool,
}

pub struct SoakResult {
    pub target: u64,
    pub every: u64,
    pub sessions: usize,
    pub completed: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// From the first run to the end of the last one.
    pub elapsed: Duration,
    /// The runs were stopped by `--soak-max-secs` before `--soak-runs` were made.
    pub time_limit_hit: bool,
    pub rows: Vec<Row>,
    /// Bytes of the one `/metrics` answer at the end.
    pub metrics_bytes: usize,
}

/// Checks the soak's flags before anything starts; returns the time limit.
pub fn check_args(args: &BenchArgs) -> Result<Duration> {
    if args.soak_runs == 0 || args.soak_every == 0 || args.soak_sessions == 0 {
        bail!("--soak-runs, --soak-every and --soak-sessions must be positive");
    }
    if args.chunks == 0 || args.message_bytes < args.chunks {
        bail!("--message-bytes must be at least --chunks (each partial carries at least one byte)");
    }
    let secs = args.soak_max_secs;
    if secs.is_nan() || secs <= 0.0 || secs > MAX_SECS {
        bail!("--soak-max-secs must be more than 0 and at most {MAX_SECS} (a week)");
    }
    Duration::try_from_secs_f64(args.soak_max_secs).context("--soak-max-secs")
}

/// What the clients share: tickets for runs, counts, and the milestone samples.
struct Shared {
    /// Runs handed out so far (a client takes a ticket before each run, so no more than
    /// `target` runs start, however the clients interleave).
    tickets: AtomicU64,
    completed: AtomicU64,
    errors: AtomicU64,
    /// Set once too many runs failed: every client stops after its current run.
    stop: AtomicBool,
    first_error: OnceLock<String>,
    milestones: tokio::sync::Mutex<Vec<Row>>,
    target: u64,
    every: u64,
    pid: u32,
    started: Instant,
    deadline: Instant,
}

/// One client: runs on its session one after the other until the tickets, the time or the
/// error budget run out. The client that completes a milestone run samples agentd's RSS.
async fn client_loop(
    client: reqwest::Client,
    spec: Arc<RunSpec>,
    session: String,
    shared: Arc<Shared>,
) {
    loop {
        if shared.stop.load(Ordering::Relaxed) || Instant::now() >= shared.deadline {
            return;
        }
        if shared.tickets.fetch_add(1, Ordering::Relaxed) >= shared.target {
            return;
        }
        let outcome =
            tokio::time::timeout(RUN_TIMEOUT, load::run_on(&client, &spec, &session)).await;
        let failure = match outcome {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(_) => Some(format!("a run took over {RUN_TIMEOUT:?}")),
        };
        match failure {
            None => {
                let done = shared.completed.fetch_add(1, Ordering::Relaxed) + 1;
                if done % shared.every == 0 {
                    if let Ok(s) = proc_stats::sample(shared.pid) {
                        let at = shared.started.elapsed();
                        eprintln!(
                            "soak: {done} runs in {:.0} s, agentd RSS {:.1} MiB",
                            at.as_secs_f64(),
                            mib(s.rss_kib)
                        );
                        shared.milestones.lock().await.push(Row {
                            label: "running".into(),
                            runs: done,
                            at,
                            rss_kib: s.rss_kib,
                            milestone: true,
                        });
                    }
                }
            }
            Some(e) => {
                let _ = shared.first_error.set(e);
                if shared.errors.fetch_add(1, Ordering::Relaxed) + 1 >= MAX_ERRORS {
                    shared.stop.store(true, Ordering::Relaxed);
                }
                // A run that timed out may still hold the session for a moment.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

pub async fn run(args: &BenchArgs, env: &Env) -> Result<SoakResult> {
    let limit = check_args(args)?;
    let (target, every, sessions) = (args.soak_runs, args.soak_every, args.soak_sessions);
    eprintln!(
        "soak: {target} echo runs on {sessions} sessions (at most {:.0} s), nobody scraping /metrics…",
        limit.as_secs_f64()
    );
    let server = env
        .extra_agentd(&env.agentd_url, "soak", args.db_max_connections)
        .await?;
    let result = async {
        let client = load::client(sessions)?;
        let spec = Arc::new(RunSpec::new(
            &server.base,
            APP,
            args.message_bytes,
            args.chunks,
        ));
        let mut session_ids = Vec::with_capacity(sessions);
        for _ in 0..sessions {
            session_ids.push(load::create_session(&client, &spec).await?);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut rows = vec![Row {
            label: "before the first run".into(),
            runs: 0,
            at: Duration::ZERO,
            rss_kib: proc_stats::sample(server.pid)?.rss_kib,
            milestone: false,
        }];

        let started = Instant::now();
        let shared = Arc::new(Shared {
            tickets: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            first_error: OnceLock::new(),
            milestones: tokio::sync::Mutex::new(vec![]),
            target,
            every,
            pid: server.pid,
            started,
            deadline: started + limit,
        });
        let mut tasks = Vec::with_capacity(sessions);
        for session in session_ids {
            tasks.push(tokio::spawn(client_loop(
                client.clone(),
                spec.clone(),
                session,
                shared.clone(),
            )));
        }
        for t in tasks {
            t.await?;
        }
        let elapsed = started.elapsed();
        let completed = shared.completed.load(Ordering::Relaxed);
        let mut milestones = std::mem::take(&mut *shared.milestones.lock().await);
        milestones.sort_by_key(|r| r.runs);
        rows.extend(milestones);
        rows.push(Row {
            label: "right after the last run".into(),
            runs: completed,
            at: elapsed,
            rss_kib: proc_stats::sample(server.pid)?.rss_kib,
            milestone: false,
        });

        tokio::time::sleep(SETTLE).await;
        rows.push(Row {
            label: format!("{} s later, idle", SETTLE.as_secs()),
            runs: completed,
            at: started.elapsed(),
            rss_kib: proc_stats::sample(server.pid)?.rss_kib,
            milestone: false,
        });

        // One scrape at the very end: what a scraper that comes back would read, and whether
        // draining the samples then gives memory back.
        let resp = client
            .get(format!("{}/metrics", server.base))
            .send()
            .await
            .context("GET /metrics")?;
        if !resp.status().is_success() {
            bail!("GET /metrics: HTTP {}", resp.status());
        }
        let metrics_bytes = resp.bytes().await.context("GET /metrics body")?.len();
        tokio::time::sleep(Duration::from_secs(1)).await;
        rows.push(Row {
            label: "after one `/metrics` scrape".into(),
            runs: completed,
            at: started.elapsed(),
            rss_kib: proc_stats::sample(server.pid)?.rss_kib,
            milestone: false,
        });

        let errors = shared.errors.load(Ordering::Relaxed);
        anyhow::Ok(SoakResult {
            target,
            every,
            sessions,
            completed,
            errors,
            first_error: shared.first_error.get().cloned(),
            elapsed,
            // Every ticket below `target` ends as one completion or one error.
            time_limit_hit: completed + errors < target && !shared.stop.load(Ordering::Relaxed),
            rows,
            metrics_bytes,
        })
    }
    .await;
    server.stop().await;
    result
}

pub fn report(r: &SoakResult) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "## Soak: memory with nobody scraping `/metrics`\n");
    let _ = writeln!(
        t,
        "{} echo runs asked for, {} completed in {:.0} s ({:.0} runs/s): {} clients, each \
         running one after the other on a session of its own. Nobody scrapes `/metrics` until \
         the last row. RSS is agentd's (VmRSS), sampled every {} runs.\n",
        r.target,
        r.completed,
        r.elapsed.as_secs_f64(),
        r.completed as f64 / r.elapsed.as_secs_f64().max(f64::MIN_POSITIVE),
        r.sessions,
        r.every,
    );
    let _ = writeln!(t, "| when | runs | time | agentd RSS | since before |");
    let _ = writeln!(t, "|---|---:|---:|---:|---:|");
    let before = r.rows.first().map_or(0, |row| row.rss_kib);
    for row in &r.rows {
        let _ = writeln!(
            t,
            "| {} | {} | {:.0} s | {:.1} MiB | {:+.1} MiB |",
            row.label,
            row.runs,
            row.at.as_secs_f64(),
            mib(row.rss_kib),
            (row.rss_kib as f64 - before as f64) / 1024.0,
        );
    }
    let _ = writeln!(t);
    let marks: Vec<&Row> = r.rows.iter().filter(|row| row.milestone).collect();
    if let (Some(first), Some(last)) = (marks.first(), marks.last()) {
        if last.runs > first.runs {
            let per = (last.rss_kib as f64 - first.rss_kib as f64)
                / ((last.runs - first.runs) as f64 / r.every as f64);
            let _ = writeln!(
                t,
                "- RSS from {} to {} runs: {:+.1} MiB, **{:+.0} KiB per {} runs** (steady \
                 memory stays near 0)",
                first.runs,
                last.runs,
                (last.rss_kib as f64 - first.rss_kib as f64) / 1024.0,
                per,
                r.every,
            );
        }
    }
    let _ = writeln!(
        t,
        "- the one `/metrics` answer at the end: {:.1} KiB",
        r.metrics_bytes as f64 / 1024.0
    );
    if r.time_limit_hit {
        let _ = writeln!(
            t,
            "- **stopped by `--soak-max-secs`** before {} runs",
            r.target
        );
    }
    if r.errors > 0 {
        let _ = writeln!(
            t,
            "- **{} failed runs**{}; first: {}",
            r.errors,
            if r.errors >= MAX_ERRORS {
                " (the soak stopped there)"
            } else {
                ""
            },
            r.first_error.as_deref().unwrap_or("?"),
        );
    }
    t
}
