//! `agentd-bench`: agentd's load generator, its two ceiling servers and the other
//! measurements in docs/performance.md.
//!
//! `agentd-bench all` reproduces everything: it starts `target/release/agentd` and the three
//! ceilings (`agentd-bench ceiling --mode a|b|c`) as child processes (so each one's RSS and CPU
//! are its own), each on a fresh PostgreSQL database, drives them with real HTTP and real SSE
//! parsing, and prints markdown.

mod a2a;
mod ceiling;
mod compaction;
mod credentials;
mod durable;
mod extra;
mod fork;
mod load;
mod memory;
mod pg;
mod proc_stats;
mod proxy;
mod report;
mod scale_out;
mod servers;
mod slow;
mod soak;
mod webhooks;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "agentd-bench",
    about = "Benchmarks agentd against three ceiling servers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Everything: the run table (agentd vs both ceilings), DB round trips per run, and the
    /// other measurements (event pages, whole sessions, artifacts, idle streams, long history).
    All(BenchArgs),
    /// Only the run table (agentd vs ceilings (a), (b) and (c) at each concurrency).
    Runs(BenchArgs),
    /// Only the measurements besides the run table.
    Extra(BenchArgs),
    /// Only the database work per request (round trips, commits, WAL bytes), through a
    /// counting proxy: agentd and ceilings (b) and (c).
    Profile(BenchArgs),
    /// Several replicas on one database: cancel across replicas, re-attach, follower
    /// overhead, and database writes/RSS with many open streams (PostgreSQL only).
    ScaleOut(BenchArgs),
    /// Slow readers: many clients reading a long reply a few bytes at a time (agentd's RSS
    /// while they read and after they hang up; other clients' TTFB meanwhile).
    SlowReaders(BenchArgs),
    /// Soak: many echo runs (80,000 by default) on 8 sessions with nobody scraping /metrics,
    /// and agentd's RSS before, every 10,000 runs and after (what metrics cost a replica
    /// nobody scrapes).
    Soak(BenchArgs),
    /// Webhook delivery latency: from a run's end (as the database recorded it) to its
    /// webhook's arrival at a receiver on loopback, p50/p90/p99 over `--webhook-runs` runs.
    Webhooks(BenchArgs),
    /// Time to the first answer chunk over A2A (both bindings) and over `/run_sse`, for the
    /// same echo app, `--a2a-runs` requests of each, interleaved.
    A2a(BenchArgs),
    /// Forking a long session (100,000 events by default): the fork's time and agentd's peak
    /// RSS while it runs (PostgreSQL).
    Fork(BenchArgs),
    /// Prompt tokens per turn over a long conversation (200 turns by default) with and
    /// without compaction, against a scripted OpenAI-compatible model that counts them.
    Compaction(BenchArgs),
    /// Durable runs: the time from a replica's `kill -9` until another owns its runs, and a
    /// rolling restart of three replicas under load (how many runs end other than
    /// `completed`), PostgreSQL.
    Durable(BenchArgs),
    /// Memory search at scale: one user with `--memories` memories (vectors of
    /// `--memory-dims`), search latency through agentd's store (hybrid, and by vector alone)
    /// against the ceiling of pgvector's (or sqlite-vec's) own query, and the HNSW index's
    /// recall against an exact scan; PostgreSQL (or Citus) and SQLite.
    Memory(BenchArgs),
    /// Serve a ceiling (started by the harness as a child process).
    Ceiling(ceiling::CeilingArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// Parameters shared by the benchmark subcommands.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// PostgreSQL server (a role that may CREATE DATABASE). Each benchmark run creates fresh
    /// databases `agentd_bench_*` there and drops them at the end. Ceiling (b) always uses it.
    #[arg(
        long,
        env = "AGENTD_BENCH_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub(crate) database_url: String,

    /// agentd's backend: `postgres` (a fresh database on --database-url) or `sqlite` (a fresh
    /// file in a temporary directory).
    #[arg(long, value_enum, default_value_t = Backend::Postgres)]
    pub(crate) backend: Backend,

    /// Concurrency levels (concurrent clients, each doing one run after the other).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    levels: Vec<usize>,

    /// Measured seconds per level and server.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,

    /// Unmeasured seconds before each measurement.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,

    /// Partial events per run (the echo agent's `chunks`).
    #[arg(long, default_value_t = 20)]
    pub(crate) chunks: usize,

    /// Bytes of the user message (echoed back: `chunks` partials of message/chunks bytes).
    #[arg(long, default_value_t = 320)]
    pub(crate) message_bytes: usize,

    /// Concurrent idle SSE streams to hold open.
    #[arg(long, default_value_t = 1000)]
    idle_streams: usize,

    /// The agentd binary (default: `agentd` next to this executable, i.e. target/release).
    #[arg(long)]
    pub(crate) agentd_bin: Option<PathBuf>,

    /// agentd's `--db-max-connections`; ceiling (b) uses the same pool size.
    #[arg(long, default_value_t = 16)]
    pub(crate) db_max_connections: u32,

    /// Skip the `ANALYZE` after the warm-up: measure a cold database, whose tables have no
    /// statistics yet (as in the first minute of a new deployment).
    #[arg(long)]
    skip_analyze: bool,

    /// scale-out: open-stream counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    pub(crate) scale_streams: Vec<usize>,

    /// scale-out: which parts to measure (`cancel`, `reattach`, `follow`, `streams`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cancel,reattach,follow,streams"
    )]
    pub(crate) scale_parts: Vec<String>,

    /// scale-out: cancels to time across replicas.
    #[arg(long, default_value_t = 200)]
    pub(crate) cancels: usize,

    /// scale-out: committed events of the run that is re-attached to.
    #[arg(long, default_value_t = 1000)]
    pub(crate) replay_events: usize,

    /// scale-out: concurrent clients for the follower-overhead runs.
    #[arg(long, default_value_t = 8)]
    pub(crate) follow_concurrency: usize,

    /// Run agentd with `--auth api-key`: every request carries an admin key (what
    /// authentication costs; the ceilings ignore the header).
    #[arg(long)]
    pub(crate) auth: bool,

    /// slow-readers: how many slow clients.
    #[arg(long, default_value_t = 201)]
    pub(crate) slow_readers: usize,
    /// slow-readers: bytes of the echo reply each slow client reads (its message).
    #[arg(long, default_value_t = 262_144)]
    pub(crate) slow_reply_bytes: usize,
    /// soak: echo runs to make in all (nobody scrapes /metrics meanwhile).
    #[arg(long, default_value_t = 80_000)]
    pub(crate) soak_runs: u64,
    /// soak: sample agentd's RSS every this many completed runs.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) soak_every: u64,
    /// soak: sessions, one client each (its runs follow one another on its session).
    #[arg(long, default_value_t = 8)]
    pub(crate) soak_sessions: usize,
    /// soak: the longest the runs may go on, in seconds; the report says how far they got.
    #[arg(long, default_value_t = 1800.0)]
    pub(crate) soak_max_secs: f64,
    /// fork: events in the session that is forked.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) fork_events: u64,
    /// compaction: turns of the conversation.
    #[arg(long, default_value_t = 200)]
    pub(crate) compaction_turns: usize,
    /// webhooks: runs (each with its own webhook) whose delivery latency is measured.
    #[arg(long, default_value_t = 500)]
    pub(crate) webhook_runs: usize,

    /// durable: background runs on the replica that is killed.
    #[arg(long, default_value_t = 10)]
    pub(crate) durable_runs: usize,
    /// a2a: requests per protocol whose time to the first answer chunk is measured.
    #[arg(long, default_value_t = 200)]
    pub(crate) a2a_runs: usize,
    /// memory: memories of the one user whose searches are timed.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) memories: usize,
    /// memory: the size of their vectors.
    #[arg(long, default_value_t = 384)]
    pub(crate) memory_dims: usize,
    /// memory: searches timed per measure.
    #[arg(long, default_value_t = 300)]
    pub(crate) memory_queries: usize,
    /// Also write the markdown report to this file.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
}

impl BenchArgs {
    pub(crate) fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration)
    }
    pub(crate) fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.warmup)
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    match cli.command {
        Command::Ceiling(args) => rt.block_on(ceiling::serve(args)),
        Command::All(args) => rt.block_on(bench(args, Parts::ALL)),
        Command::Runs(args) => rt.block_on(bench(
            args,
            Parts {
                extras: false,
                ..Parts::ALL
            },
        )),
        Command::Profile(args) => rt.block_on(bench(
            args,
            Parts {
                runs: false,
                profile: true,
                extras: false,
            },
        )),
        Command::SlowReaders(args) => rt.block_on(slow_readers(args)),
        Command::Soak(args) => rt.block_on(soak(args)),
        Command::Fork(args) => rt.block_on(async {
            let (agentd_bin, _) = binaries(&args)?;
            let admin = pg::Admin::connect(&args.database_url).await?;
            let result = fork::run(&args, &admin, &agentd_bin).await;
            admin.drop_created().await;
            let text = result?;
            println!("{text}");
            Ok(())
        }),
        Command::Compaction(args) => rt.block_on(on_own_databases(&args, |args, admin, bin| {
            Box::pin(compaction::run(args, admin, bin))
        })),
        Command::A2a(args) => rt.block_on(on_own_databases(&args, |args, admin, bin| {
            Box::pin(a2a::run(args, admin, bin))
        })),
        Command::Durable(args) => rt.block_on(on_own_databases(&args, |args, admin, bin| {
            Box::pin(durable::run(args, admin, bin))
        })),
        Command::Webhooks(args) => rt.block_on(on_own_databases(&args, |args, admin, bin| {
            Box::pin(webhooks::run(args, admin, bin))
        })),
        Command::Extra(args) => rt.block_on(bench(
            args,
            Parts {
                runs: false,
                profile: false,
                extras: true,
            },
        )),
        Command::Memory(args) => rt.block_on(on_own_databases(&args, |args, admin, _| {
            Box::pin(memory::run(args, admin))
        })),
        Command::ScaleOut(args) => {
            let agentd_bin = match &args.agentd_bin {
                Some(p) => p.clone(),
                None => sibling_binary("agentd")?,
            };
            rt.block_on(scale_out::run(args, &agentd_bin))
        }
    }
}

/// Which measurements a subcommand makes.
#[derive(Clone, Copy)]
struct Parts {
    runs: bool,
    profile: bool,
    extras: bool,
}

impl Parts {
    const ALL: Parts = Parts {
        runs: true,
        profile: true,
        extras: true,
    };
}

/// Runs the selected measurements and prints (and optionally writes) the markdown report.
async fn bench(args: BenchArgs, parts: Parts) -> Result<()> {
    if args.levels.is_empty() || args.levels.contains(&0) {
        bail!("--levels needs positive concurrency levels, e.g. 1,8,32,128");
    }
    if args.chunks == 0 || args.message_bytes < args.chunks {
        bail!("--message-bytes must be at least --chunks (each partial carries at least one byte)");
    }
    raise_fd_limit(args.idle_streams)?;
    let (agentd_bin, self_bin) = binaries(&args)?;

    let admin = pg::Admin::connect(&args.database_url).await?;
    let mut report = report::Report::new(&args, &admin).await?;
    let result = async {
        let mut env = servers::Env::new(&args, &admin, &agentd_bin, &self_bin).await?;
        let outcome = async {
            if parts.runs {
                let table = load::run_table(&args, &mut env).await?;
                report.run_table(&table);
            }
            if parts.profile {
                let profile = proxy::profile(&args, &env, &admin).await?;
                report.profile(&profile);
            }
            if parts.extras {
                let x = extra::measure(&args, &env).await?;
                report.extra(&x);
            }
            anyhow::Ok(())
        }
        .await;
        env.stop(outcome.is_err()).await;
        outcome
    }
    .await;
    admin.drop_created().await;

    let text = report.finish();
    if result.is_err() {
        eprintln!("the benchmark failed; what it measured before that:\n");
    }
    println!("{text}");
    if let Some(path) = &args.out {
        std::fs::write(path, &text)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
        eprintln!("report written to {}", path.display());
    }
    result
}

/// The slow-readers measurement alone (on a fresh agentd process).
async fn slow_readers(args: BenchArgs) -> Result<()> {
    raise_fd_limit(args.slow_readers)?;
    let (agentd_bin, self_bin) = binaries(&args)?;
    let admin = pg::Admin::connect(&args.database_url).await?;
    let result = async {
        let env = servers::Env::new(&args, &admin, &agentd_bin, &self_bin).await?;
        let outcome = slow::run(&args, &env).await;
        env.stop(outcome.is_err()).await;
        outcome
    }
    .await;
    admin.drop_created().await;
    let text = slow::report(&result?);
    println!("{text}");
    if let Some(path) = &args.out {
        std::fs::write(path, &text)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    Ok(())
}

/// The soak alone (on a fresh agentd process).
async fn soak(args: BenchArgs) -> Result<()> {
    // Bad flags fail before any server starts.
    soak::check_args(&args)?;
    raise_fd_limit(args.soak_sessions)?;
    let (agentd_bin, self_bin) = binaries(&args)?;
    let admin = pg::Admin::connect(&args.database_url).await?;
    let result = async {
        let env = servers::Env::new(&args, &admin, &agentd_bin, &self_bin).await?;
        let outcome = soak::run(&args, &env).await;
        env.stop(outcome.is_err()).await;
        outcome
    }
    .await;
    admin.drop_created().await;
    let text = soak::report(&result?);
    println!("{text}");
    if let Some(path) = &args.out {
        std::fs::write(path, &text)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    Ok(())
}

/// A measurement that makes its own databases: `measure` runs against agentd, the databases
/// it created are dropped whatever it returns, and its report is printed (and written to
/// `--out`).
async fn on_own_databases(
    args: &BenchArgs,
    measure: impl for<'a> FnOnce(
        &'a BenchArgs,
        &'a pg::Admin,
        &'a std::path::Path,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<String>> + 'a>,
    >,
) -> Result<()> {
    let (agentd_bin, _) = binaries(args)?;
    let admin = pg::Admin::connect(&args.database_url).await?;
    let result = measure(args, &admin, &agentd_bin).await;
    admin.drop_created().await;
    let text = result?;
    println!("{text}");
    if let Some(path) = &args.out {
        std::fs::write(path, &text)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    Ok(())
}

/// The agentd binary to measure (`--agentd-bin`, or the one built next to this one) and this
/// executable (it serves the ceilings).
fn binaries(args: &BenchArgs) -> Result<(PathBuf, PathBuf)> {
    let agentd_bin = match &args.agentd_bin {
        Some(p) => p.clone(),
        None => sibling_binary("agentd")?,
    };
    let self_bin = std::env::current_exe().context("cannot find this executable's path")?;
    Ok((agentd_bin, self_bin))
}

/// The path of a binary built next to this one (cargo puts all of a profile's binaries in
/// one directory).
fn sibling_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this executable's path")?;
    let dir = exe
        .parent()
        .context("this executable's path has no parent directory")?;
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{} does not exist: build it first with `cargo build --release -p agentd -p agentd-bench`, \
             or pass --agentd-bin",
            path.display()
        );
    }
    Ok(path)
}

/// Idle streams need one descriptor each in this process (its socket) and one each in the
/// server (which inherits the limit; each process counts its own), plus some slack for the
/// pools, logs and the runtime: raise the soft limit to the hard one if it is short.
pub(crate) fn raise_fd_limit(streams: usize) -> Result<()> {
    let want = streams as u64 + 1024;
    let (soft, hard) =
        rlimit::getrlimit(rlimit::Resource::NOFILE).context("cannot read the open-files limit")?;
    if soft >= want {
        return Ok(());
    }
    if hard < want {
        bail!(
            "the open-files limit is {soft} (hard {hard}); {streams} idle streams need about {want}: \
             raise it (ulimit -n {want}) or pass a smaller --idle-streams"
        );
    }
    rlimit::setrlimit(rlimit::Resource::NOFILE, hard, hard)
        .context("cannot raise the open-files limit")?;
    Ok(())
}

/// `127.0.0.1:<free port>`: binds port 0 and releases it (the child binds it right after).
pub fn free_addr() -> Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("cannot bind a local port")?;
    Ok(l.local_addr()?)
}
