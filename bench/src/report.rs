//! The markdown report.

use crate::extra::{mib_s, ms, Extra, Timed};
use crate::load::LevelResult;
use crate::pg::Admin;
use crate::proc_stats::mib;
use crate::proxy::Profile;
use crate::BenchArgs;
use anyhow::Result;
use std::fmt::Write;

pub struct Report {
    text: String,
    warmup: f64,
    /// (target, measured, met)
    targets: Vec<(String, String, bool)>,
    /// agentd (and ceiling (c)) on PostgreSQL: the PostgreSQL CPU target applies.
    postgres: bool,
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn mem_total_gib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0)
}

fn ms_h(h: &hdrhistogram::Histogram<u64>, q: f64) -> f64 {
    ms(h.value_at_quantile(q))
}

impl Report {
    pub async fn new(args: &BenchArgs, admin: &Admin) -> Result<Report> {
        let mut text = String::new();
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let _ = writeln!(text, "# agentd benchmark\n");
        let _ = writeln!(
            text,
            "- command: `agentd-bench {}`",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        );
        let _ = writeln!(
            text,
            "- machine: {cores} cores ({}), {:.0} GiB RAM, Linux {}",
            cpu_model(),
            mem_total_gib(),
            kernel.trim()
        );
        let _ = writeln!(
            text,
            "- PostgreSQL {} on the same machine (fsync={}, synchronous_commit={}); agentd backend: {:?}, pool {} connections (ceilings (b) and (c) the same)",
            admin.server_version().await?,
            admin.setting("fsync").await?,
            admin.setting("synchronous_commit").await?,
            args.backend,
            args.db_max_connections,
        );
        let workers = admin.citus_workers().await?;
        if !workers.is_empty() {
            let _ = writeln!(
                text,
                "- Citus: agentd's database distributed by user over {} worker(s) on this machine (coordinator + workers: every `postgres` process counts as PostgreSQL CPU); the ceilings' tables are distributed by user on the same cluster (ceiling (c) writes its reply as single-table statements in one transaction)",
                workers.len()
            );
        }
        let _ = writeln!(
            text,
            "- each run: create a session, `POST /run` with a {}-byte message; the echo agent streams {} partial events of {} bytes of text and one complete event, then `event: done`; every frame is parsed and checked",
            args.message_bytes,
            args.chunks,
            args.message_bytes / args.chunks
        );
        let _ = writeln!(
            text,
            "- load generator, servers and PostgreSQL share the machine's cores; CPU is % of one core (200% = 2 cores)\n"
        );
        if args.skip_analyze {
            let _ = writeln!(
                text,
                "- **cold database**: no `ANALYZE` after the warm-up (`--skip-analyze`)\n"
            );
        }
        Ok(Report {
            text,
            warmup: args.warmup,
            targets: vec![],
            postgres: args.backend == crate::Backend::Postgres,
        })
    }

    pub fn run_table(&mut self, rows: &[LevelResult]) {
        let t = &mut self.text;
        let _ = writeln!(t, "## Runs: agentd vs the ceilings\n");
        let _ = writeln!(
            t,
            "(a) = bare axum SSE, no database; (b) = (a) + one durable PostgreSQL commit per run; \
             (c) = an ADK-shaped durable server (session row, user event, reply + state delta: \
             three durable commits per session + run, on agentd's backend). \
             TTFB = `POST /run` sent → first SSE byte; end = → end of stream. \
             {:.0} s measured per cell after {:.0} s warm-up.\n",
            rows.first().map_or(0.0, |r| r.window.as_secs_f64()),
            self.warmup
        );
        let _ = writeln!(
            t,
            "| conc. | server | runs/s | TTFB p50 | TTFB p99 | end p50 | end p99 | errors | server RSS | server CPU | PG CPU | client CPU | server CPU/run | PG CPU/run |"
        );
        let _ = writeln!(
            t,
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for r in rows {
            let _ = writeln!(
                t,
                "| {} | {} | {:.0} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {} | {:.1} MiB | {:.0}% | {:.0}% | {:.0}% | {:.2} ms | {:.2} ms |",
                r.concurrency,
                r.server,
                r.runs_per_sec(),
                ms_h(&r.ttfb, 0.5),
                ms_h(&r.ttfb, 0.99),
                ms_h(&r.end, 0.5),
                ms_h(&r.end, 0.99),
                r.errors,
                mib(r.server_rss_max_kib),
                r.server_cpu,
                r.postgres_cpu,
                r.client_cpu,
                r.cpu_ms_per_run(r.server_cpu),
                r.cpu_ms_per_run(r.postgres_cpu),
            );
        }
        let _ = writeln!(t);
        let find = |server: &str, c: usize| {
            rows.iter()
                .find(|r| r.server == server && r.concurrency == c)
        };
        if let (Some(a), Some(b)) = (find("agentd", 32), find("ceiling (b)", 32)) {
            let ratio = a.runs_per_sec() / b.runs_per_sec().max(f64::MIN_POSITIVE);
            let _ = writeln!(
                t,
                "- runs/s at concurrency 32: agentd {:.0}, ceiling (b) {:.0}: **{:.0}%** of (b)",
                a.runs_per_sec(),
                b.runs_per_sec(),
                100.0 * ratio
            );
            self.targets.push((
                "runs/s at c=32 ≥ 50% of ceiling (b)".into(),
                format!("{:.0}%", 100.0 * ratio),
                ratio >= 0.5,
            ));
        }
        if let (Some(a), Some(c)) = (find("agentd", 32), find("ceiling (c)", 32)) {
            let ratio = a.runs_per_sec() / c.runs_per_sec().max(f64::MIN_POSITIVE);
            let pg = a.cpu_ms_per_run(a.postgres_cpu)
                / c.cpu_ms_per_run(c.postgres_cpu).max(f64::MIN_POSITIVE);
            let pg_text = if self.postgres {
                format!(
                    "; PostgreSQL CPU per run {:.2} vs {:.2} ms: **{pg:.2}×** (c)'s",
                    a.cpu_ms_per_run(a.postgres_cpu),
                    c.cpu_ms_per_run(c.postgres_cpu),
                )
            } else {
                format!(
                    "; server CPU per run (the database works inside it) {:.2} vs {:.2} ms",
                    a.cpu_ms_per_run(a.server_cpu),
                    c.cpu_ms_per_run(c.server_cpu),
                )
            };
            let _ = writeln!(
                t,
                "- runs/s at concurrency 32: agentd {:.0}, ceiling (c) {:.0}: **{:.0}%** of (c){pg_text}",
                a.runs_per_sec(),
                c.runs_per_sec(),
                100.0 * ratio,
            );
            self.targets.push((
                "runs/s at c=32 ≥ 80% of ceiling (c)".into(),
                format!("{:.0}%", 100.0 * ratio),
                ratio >= 0.8,
            ));
            if self.postgres {
                self.targets.push((
                    "PostgreSQL CPU per run at c=32 ≤ 1.5 × ceiling (c)'s".into(),
                    format!("{pg:.2}×"),
                    pg <= 1.5,
                ));
            }
        }
        if let (Some(a), Some(c)) = (find("agentd", 1), find("ceiling (a)", 1)) {
            let delta = ms_h(&a.ttfb, 0.5) - ms_h(&c.ttfb, 0.5);
            let _ = writeln!(
                t,
                "- TTFB p50 at concurrency 1: agentd {:.2} ms, ceiling (a) {:.2} ms: **{:+.2} ms**",
                ms_h(&a.ttfb, 0.5),
                ms_h(&c.ttfb, 0.5),
                delta
            );
            self.targets.push((
                "TTFB p50 at c=1 within 2 ms of ceiling (a)".into(),
                format!("{delta:+.2} ms"),
                delta <= 2.0,
            ));
            if let Some(b) = find("ceiling (b)", 1) {
                let _ = writeln!(
                    t,
                    "- stream time after the first byte at concurrency 1 (end p50 − TTFB p50; the partials, the complete event and `done`): agentd {:.2} ms, (a) {:.2} ms, (b) {:.2} ms",
                    ms_h(&a.end, 0.5) - ms_h(&a.ttfb, 0.5),
                    ms_h(&c.end, 0.5) - ms_h(&c.ttfb, 0.5),
                    ms_h(&b.end, 0.5) - ms_h(&b.ttfb, 0.5),
                );
                let _ = writeln!(
                    t,
                    "- first partial → last partial at concurrency 1 (p50 / p99), as the client parses them: agentd {:.3} / {:.3} ms, (a) {:.3} / {:.3} ms, (b) {:.3} / {:.3} ms",
                    ms_h(&a.partials, 0.5),
                    ms_h(&a.partials, 0.99),
                    ms_h(&c.partials, 0.5),
                    ms_h(&c.partials, 0.99),
                    ms_h(&b.partials, 0.5),
                    ms_h(&b.partials, 0.99),
                );
            }
        }
        let _ = writeln!(t);
    }

    pub fn profile(&mut self, p: &Profile) {
        let t = &mut self.text;
        let _ = writeln!(t, "## Database work per request\n");
        let _ = writeln!(
            t,
            "Sequential requests through a proxy that reads the PostgreSQL wire protocol (warm pool and \
             prepared statements): a round trip is a `Sync` or simple `Query` answered by `ReadyForQuery`; \
             a durable commit is a `COMMIT` or a writing statement outside a transaction, an async commit \
             one that turns `synchronous_commit` off for itself (it does not wait for the WAL flush); DB time is \
             PostgreSQL's answer time as the proxy sees it.\n"
        );
        let _ = writeln!(
            t,
            "| request | round trips | durable commits | async commits | WAL bytes | DB time |"
        );
        let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|");
        for ph in &p.phases {
            let n = ph.requests.max(1) as f64;
            let _ = writeln!(
                t,
                "| {} | {:.2} | {:.2} | {:.2} | {:.0} | {:.2} ms |",
                ph.what,
                ph.counts.round_trips() as f64 / n,
                ph.counts.commits() as f64 / n,
                ph.counts.async_commits() as f64 / n,
                ph.wal_bytes as f64 / n,
                ph.counts.db_time().as_secs_f64() * 1000.0 / n
            );
        }
        let _ = writeln!(t);
        for ph in &p.phases {
            let n = ph.requests.max(1) as f64;
            let _ = writeln!(t, "{} — per request:\n", ph.what);
            let _ = writeln!(t, "| statement | count | commits | mean time |");
            let _ = writeln!(t, "|---|---:|---:|---:|");
            let mut rows: Vec<_> = ph.counts.by_statement.iter().collect();
            rows.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
            for (sql, s) in rows {
                let _ = writeln!(
                    t,
                    "| `{}` | {:.2} | {:.2} | {:.3} ms |",
                    sql.replace('|', "\\|"),
                    s.count as f64 / n,
                    s.commits as f64 / n,
                    s.total.as_secs_f64() * 1000.0 / s.count.max(1) as f64
                );
            }
            let _ = writeln!(t);
        }
    }

    pub fn extra(&mut self, x: &Extra) {
        let t = &mut self.text;
        for note in &x.notes {
            let _ = writeln!(t, "> {note}\n");
        }
        if !x.reads.is_empty() {
            let _ = writeln!(t, "## Reading long sessions (agentd)\n");
            let _ = writeln!(
                t,
                "Sessions seeded with SQL rows identical to appended ones; sequential requests.\n"
            );
            let _ = writeln!(t, "| events | request | p50 | p99 | response |");
            let _ = writeln!(t, "|---:|---|---:|---:|---:|");
            for (n, timed) in &x.reads {
                for r in timed {
                    let _ = writeln!(
                        t,
                        "| {n} | {} (×{}) | {:.2} ms | {:.2} ms | {} |",
                        r.what,
                        r.reps,
                        ms_h(&r.hist, 0.5),
                        ms_h(&r.hist, 0.99),
                        human_bytes(r.bytes)
                    );
                }
            }
            let _ = writeln!(t);
            if let Some(kib) = x.rss_after_reads_kib {
                let _ = writeln!(
                    t,
                    "- agentd's RSS after serving these (the benchmark's main agentd process, whole 100,000-event sessions included): {:.1} MiB\n",
                    mib(kib)
                );
            }
            let first_page = |n: usize| -> Option<&Timed> {
                x.reads
                    .iter()
                    .find(|(k, _)| *k == n)
                    .and_then(|(_, v)| v.first())
            };
            if let (Some(small), Some(big)) = (first_page(1_000), first_page(100_000)) {
                let ratio = ms_h(&big.hist, 0.5) / ms_h(&small.hist, 0.5).max(1e-9);
                let _ = writeln!(
                    t,
                    "- first page p50: {:.2} ms at 1,000 events, {:.2} ms at 100,000: **{ratio:.2}×**\n",
                    ms_h(&small.hist, 0.5),
                    ms_h(&big.hist, 0.5)
                );
                self.targets.push((
                    "first events page at 100k events within 2× of 1k".into(),
                    format!("{ratio:.2}×"),
                    ratio <= 2.0,
                ));
            }
        }
        if let Some(h) = &x.history {
            let _ = writeln!(t, "## A run on a long session (agentd)\n");
            let _ = writeln!(
                t,
                "100 runs each, interleaved, concurrency 1: on a fresh session vs on one session with {} stored events.\n",
                h.events
            );
            let _ = writeln!(t, "| session | TTFB p50 | TTFB p99 | end p50 |");
            let _ = writeln!(t, "|---|---:|---:|---:|");
            let _ = writeln!(
                t,
                "| fresh | {:.2} ms | {:.2} ms | {:.2} ms |",
                ms_h(&h.fresh, 0.5),
                ms_h(&h.fresh, 0.99),
                ms_h(&h.fresh_end, 0.5)
            );
            let _ = writeln!(
                t,
                "| {} events | {:.2} ms | {:.2} ms | {:.2} ms |",
                h.events,
                ms_h(&h.long, 0.5),
                ms_h(&h.long, 0.99),
                ms_h(&h.long_end, 0.5)
            );
            let ratio = ms_h(&h.long, 0.5) / ms_h(&h.fresh, 0.5).max(1e-9);
            let _ = writeln!(t, "\n- TTFB p50 ratio: **{ratio:.2}×**\n");
            self.targets.push((
                format!(
                    "run TTFB at {} events within 2× of a fresh session",
                    h.events
                ),
                format!("{ratio:.2}×"),
                ratio <= 2.0,
            ));
        }
        let _ = writeln!(t, "## Artifacts (agentd)\n");
        let _ = writeln!(
            t,
            "Incompressible bytes, base64 in JSON as ADK's API has it; 10 sequential saves (new versions) and 10 loads each.\n"
        );
        let _ = writeln!(t, "| size | save p50 | save | load p50 | load |");
        let _ = writeln!(t, "|---:|---:|---:|---:|---:|");
        for a in &x.artifacts {
            let (s, l) = (
                a.save.hist.value_at_quantile(0.5),
                a.load.hist.value_at_quantile(0.5),
            );
            let _ = writeln!(
                t,
                "| {} MiB | {:.1} ms | {:.0} MiB/s | {:.1} ms | {:.0} MiB/s |",
                a.size >> 20,
                ms(s),
                mib_s(a.size, s),
                ms(l),
                mib_s(a.size, l)
            );
        }
        let _ = writeln!(t);
        let i = &x.idle;
        let _ = writeln!(t, "## Idle streams (agentd)\n");
        let rss = mib(i.rss_open_max_kib);
        let _ = writeln!(
            t,
            "{} concurrent `POST /run` streams, each on its own session, each after its first partial event waiting \
             (an echo agent with a one-hour `chunk_delay_ms`), opened in {:.1} s. Over {:.0} s of idling:\n",
            i.streams, i.open_secs, i.window_secs
        );
        let _ = writeln!(
            t,
            "- agentd RSS (a fresh process): {:.1} MiB at start, {:.1} MiB after creating the sessions, **{rss:.1} MiB** (max) with all streams open: {:.1} KiB per stream",
            mib(i.rss_fresh_kib),
            mib(i.rss_before_kib),
            (i.rss_open_max_kib.saturating_sub(i.rss_before_kib)) as f64 / i.streams.max(1) as f64
        );
        let _ = writeln!(
            t,
            "- agentd CPU {:.1}%, PostgreSQL CPU {:.1}% (each run renews its lease every 3.3 s); {} keep-alive comments received\n",
            i.server_cpu, i.postgres_cpu, i.keep_alives
        );
        self.targets.push((
            format!("{} idle streams under 100 MiB RSS", i.streams),
            format!("{rss:.1} MiB"),
            rss < 100.0,
        ));
    }

    pub fn finish(mut self) -> String {
        if !self.targets.is_empty() {
            let _ = writeln!(self.text, "## Targets\n");
            let _ = writeln!(self.text, "| target | measured | |");
            let _ = writeln!(self.text, "|---|---:|---|");
            for (what, measured, met) in &self.targets {
                let _ = writeln!(
                    self.text,
                    "| {what} | {measured} | {} |",
                    if *met { "met" } else { "**missed**" }
                );
            }
        }
        self.text
    }
}

fn human_bytes(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}
