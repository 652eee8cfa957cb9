//! Command-line flags, each with an environment-variable fallback (flags win).

use crate::telemetry::LogFormat;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The default of `--max-json-values`: a long AI SDK or AG-UI conversation (every message
/// sent again each turn) holds a few ten thousand; parsed, this many values stay in tens of
/// MiB.
pub const DEFAULT_MAX_JSON_VALUES: usize = 100_000;

/// What a draining replica does with its runs when another replica is live
/// (`--drain-handover`, docs/replicas.md). A flag's value, so it lives with the flags; the
/// runner acts on it (`crate::runner::DrainHandover` is this type).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum DrainHandover {
    /// Runs still going when `--drain-secs` is over are handed over at their next commit.
    #[default]
    End,
    /// Runs are handed over at their next commit as soon as the drain starts.
    Immediate,
    /// Runs still going when `--drain-secs` is over are sealed `interrupted`.
    Off,
}

/// agentd: serve AI agents over HTTP/SSE, wire-compatible with Google ADK's api_server.
#[derive(Debug, Parser)]
#[command(name = "agentd", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP server (migrates the database first).
    Serve(Box<ServeArgs>),
    /// Apply database migrations and exit.
    Migrate(MigrateArgs),
    /// Delete idle sessions (with their events, session artifacts, memory entries and runs)
    /// and old finished runs, in small batches; prints what it removed (JSON).
    Prune(PruneArgs),
    /// Exit 0 if the local server answers `GET /health` with 200, else 1 (a container
    /// HEALTHCHECK that needs no curl in the image).
    Healthcheck(HealthcheckArgs),
    /// Manage API keys (`--auth api-key`).
    Keys(KeysArgs),
    /// Run an ADK eval set against an app, in this process, and score it (docs/evals.md):
    /// exit 0 when every case passes, 1 when one does not, 2 when nothing could be run.
    Eval(EvalArgs),
}

#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// Directory with one folder per app (as `serve --apps-dir`).
    #[arg(long, default_value = "config/apps")]
    pub apps_dir: PathBuf,

    /// The app to evaluate (a folder of the apps directory).
    pub app: String,

    /// The eval set: an ADK `*.evalset.json` (or an old-format `*.test.json`).
    pub eval_set: PathBuf,

    /// ADK's `test_config.json` (`{"criteria": {...}}`). Default: the `test_config.json`
    /// beside the set if there is one, else ADK's default criteria
    /// (`tool_trajectory_avg_score` 1.0, `response_match_score` 0.8).
    #[arg(long)]
    pub config: Option<PathBuf>,

    /// Where the runs go. Default: an embedded SQLite database in a temporary directory,
    /// removed afterwards.
    #[arg(long)]
    pub database_url: Option<String>,

    /// Where the result JSON is written. Default: `<eval_set_id>.evalset_result.json` in the
    /// current directory.
    #[arg(long)]
    pub output: Option<PathBuf>,

    /// Cases run at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
}

#[derive(Debug, Clone, Args)]
pub struct KeysArgs {
    /// As `serve --database-url` (accepted before or after the subcommand).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://data/agentd.db",
        global = true
    )]
    pub database_url: String,

    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum KeysCommand {
    /// Create a key and print it (the only time it is shown; only its hash is stored).
    Create {
        /// The user the key acts as.
        #[arg(long)]
        user: String,
        /// Restrict the key to these apps (comma-separated). Default: every app.
        #[arg(long, value_delimiter = ',')]
        apps: Option<Vec<String>>,
        /// A service key: may act for any user and write `app:` state.
        #[arg(long)]
        admin: bool,
        /// A label for `keys list`.
        #[arg(long)]
        name: Option<String>,
        /// Expire after this long (`90d`, `12h`, …). Default: never.
        #[arg(long, value_parser = parse_duration)]
        expires: Option<std::time::Duration>,
        /// The key's budget: input plus output tokens per UTC day, in every app it may use
        /// (docs/usage.md#budgets; `PUT /keys/{key}/budget` changes it).
        #[arg(long)]
        budget_tokens_per_day: Option<u64>,
        /// The key's budget: cost per UTC calendar month, in the prices' currency.
        #[arg(long)]
        budget_cost_per_month: Option<f64>,
    },
    /// List keys (never their secrets), as JSON lines.
    List,
    /// Revoke a key by its id (the 16 hex digits after `agentd_`); effective at once.
    Revoke { key_id: String },
}

/// How callers authenticate (`--auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    None,
    ApiKey,
    Jwt,
}

#[derive(Debug, Clone, Args)]
pub struct SecurityArgs {
    /// How callers authenticate: `none`, `api-key`, `jwt`, or `api-key,jwt`. `none` is refused
    /// on a non-loopback bind unless `--allow-unauthenticated` is given.
    #[arg(
        long,
        env = "AGENTD_AUTH",
        value_enum,
        value_delimiter = ',',
        default_value = "none"
    )]
    pub auth: Vec<AuthMode>,

    /// Serve without authentication on a non-loopback address: anyone who can reach the port
    /// can read, change and delete every user's sessions.
    #[arg(
        long,
        env = "AGENTD_ALLOW_UNAUTHENTICATED",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub allow_unauthenticated: bool,

    /// JWKS URL of the identity provider (e.g. `https://<issuer>/.well-known/jwks.json`).
    #[arg(long, env = "AGENTD_JWT_JWKS_URL")]
    pub jwt_jwks_url: Option<String>,

    /// A PEM file with the public key tokens are signed with (RSA, EC or Ed25519).
    #[arg(long, env = "AGENTD_JWT_PUBLIC_KEY")]
    pub jwt_public_key: Option<PathBuf>,

    /// HMAC secret tokens are signed with (HS256/384/512; at least 32 bytes).
    #[arg(long, env = "AGENTD_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,

    /// Required `iss` claim.
    #[arg(long, env = "AGENTD_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// Accepted `aud` values (comma-separated); the token's `aud` must name one.
    #[arg(long, env = "AGENTD_JWT_AUDIENCE", value_delimiter = ',')]
    pub jwt_audience: Vec<String>,

    /// The claim that holds the user id.
    #[arg(long, env = "AGENTD_JWT_USER_CLAIM", default_value = "sub")]
    pub jwt_user_claim: String,

    /// Least seconds between two JWKS fetches (a token with an unknown `kid` triggers one).
    #[arg(long, env = "AGENTD_JWT_JWKS_REFRESH_SECS", default_value_t = 30)]
    pub jwt_jwks_refresh_secs: u64,

    /// Longest the last good JWKS is trusted while the identity provider cannot be reached:
    /// after that, tokens are refused (503) until a fetch succeeds, so keys the provider removed
    /// do not stay valid for ever behind a blocked fetch.
    #[arg(long, env = "AGENTD_JWT_JWKS_MAX_STALE_SECS", default_value_t = 86_400)]
    pub jwt_jwks_max_stale_secs: u64,

    /// Clock skew tolerated on `exp` and `nbf`, in seconds.
    #[arg(long, env = "AGENTD_JWT_LEEWAY_SECS", default_value_t = 30)]
    pub jwt_leeway_secs: u64,

    /// `GET /metrics` needs an admin caller too (it is open by default, like `/health`).
    #[arg(long, env = "AGENTD_PROTECT_METRICS", value_parser = clap::builder::BoolishValueParser::new())]
    pub protect_metrics: bool,

    /// Requests per second per caller (API key, JWT user, or client address without auth);
    /// 0: no limit. Per replica.
    #[arg(long, env = "AGENTD_RATE_LIMIT_RPS", default_value_t = 0)]
    pub rate_limit_rps: u32,

    /// Burst above `--rate-limit-rps` (default: one second's worth).
    #[arg(long, env = "AGENTD_RATE_LIMIT_BURST")]
    pub rate_limit_burst: Option<u32>,

    /// Failed authentications per second per client address (burst: five seconds' worth);
    /// over it the address gets 429 without a lookup. 0: off. Behind a proxy every client has
    /// the proxy's address: use it only where clients connect directly.
    #[arg(long, env = "AGENTD_AUTH_FAILURES_PER_IP", default_value_t = 0)]
    pub auth_failures_per_ip: u32,

    /// Concurrent runs per user; 0: no limit. Per replica.
    #[arg(long, env = "AGENTD_MAX_RUNS_PER_USER", default_value_t = 0)]
    pub max_runs_per_user: usize,

    /// Let any caller write `app:` state (shared by every user of an app and rendered into
    /// their instructions). Off: only admin keys may.
    #[arg(long, env = "AGENTD_ALLOW_CLIENT_APP_STATE", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_client_app_state: bool,

    /// Open connections at most; more wait in the listen backlog (a line is logged).
    #[arg(long, env = "AGENTD_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,

    /// Seconds a client has to send a request's header; also how long an idle keep-alive
    /// connection is kept (keep a load balancer's idle timeout below it).
    #[arg(long, env = "AGENTD_HEADER_TIMEOUT_SECS", default_value_t = 30)]
    pub header_timeout_secs: u64,

    /// Seconds a client has to send a whole request body (in total, not per chunk).
    #[arg(long, env = "AGENTD_BODY_TIMEOUT_SECS", default_value_t = 60)]
    pub body_timeout_secs: u64,
}

impl SecurityArgs {
    pub fn defaults() -> Self {
        SecurityArgs {
            auth: vec![AuthMode::None],
            allow_unauthenticated: false,
            jwt_jwks_url: None,
            jwt_public_key: None,
            jwt_secret: None,
            jwt_issuer: None,
            jwt_audience: vec![],
            jwt_user_claim: "sub".into(),
            jwt_jwks_refresh_secs: 30,
            jwt_jwks_max_stale_secs: 86_400,
            jwt_leeway_secs: 30,
            protect_metrics: false,
            rate_limit_rps: 0,
            rate_limit_burst: None,
            max_runs_per_user: 0,
            auth_failures_per_ip: 0,
            allow_client_app_state: false,
            max_connections: 10_000,
            header_timeout_secs: 30,
            body_timeout_secs: 60,
        }
    }

    pub fn api_keys(&self) -> bool {
        self.auth.contains(&AuthMode::ApiKey)
    }

    pub fn jwt(&self) -> bool {
        self.auth.contains(&AuthMode::Jwt)
    }
}

#[derive(Debug, Clone, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Delete sessions not updated for this long: `30d`, `12h`, `90m`, `3600s` (or seconds).
    #[arg(long, value_parser = parse_duration)]
    pub older_than: std::time::Duration,

    /// Finished runs are kept this long (runs of deleted sessions go with them).
    #[arg(long, value_parser = parse_duration, default_value = "7d")]
    pub keep_runs: std::time::Duration,

    /// Only this app's sessions and runs.
    #[arg(long)]
    pub app: Option<String>,

    /// Report what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Sessions per transaction (each a short one).
    #[arg(long, default_value_t = 200)]
    pub batch: u32,
}

/// `30d`, `12h`, `90m`, `45s`, `2w`, or a number of seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| (&s[..i], &s[i..]));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 30d, 12h, 90m, 3600s)"))?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 604_800,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (use s, m, h, d or w)"
            ))
        }
    };
    n.checked_mul(secs)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long"))
}

#[derive(Debug, Clone, Args)]
pub struct HealthcheckArgs {
    /// The server's base URL (default: from the listen address, `0.0.0.0`/`[::]` → loopback).
    #[arg(long)]
    pub url: Option<String>,

    /// The listen address of the server to check (as `serve --bind`).
    #[arg(long, env = "AGENTD_BIND", default_value = "127.0.0.1:8000")]
    pub bind: SocketAddr,

    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 3)]
    pub timeout_secs: u64,
}

impl HealthcheckArgs {
    /// The URL to ask: `--url`, else the bind address with an unspecified IP made loopback.
    pub fn health_url(&self) -> String {
        if let Some(url) = &self.url {
            return format!("{}/health", url.trim_end_matches('/'));
        }
        let mut addr = self.bind;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        format!("http://{addr}/health")
    }
}

#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Create the `citus` extension first (it must be installed and preloaded), then
    /// distribute the tables by user (docs/citus.md). A database that already has the
    /// extension is distributed without this flag, by every `migrate` and server start.
    #[arg(long)]
    pub citus: bool,
}

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// `sqlite://path/file.db` (created on demand) or `postgres://user@host/db`.
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://data/agentd.db")]
    pub database_url: String,

    /// Upper bound on pooled database connections.
    #[arg(long, env = "AGENTD_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "AGENTD_BIND", default_value = "127.0.0.1:8000")]
    pub bind: SocketAddr,

    #[command(flatten)]
    pub database: DatabaseArgs,

    #[command(flatten)]
    pub security: SecurityArgs,

    #[command(flatten)]
    pub background: BackgroundArgs,

    #[command(flatten)]
    pub interop: InteropArgs,

    /// Directory with one folder per app (ADK's convention).
    #[arg(long, env = "AGENTD_APPS_DIR", default_value = "config/apps")]
    pub apps_dir: PathBuf,

    /// Log line format.
    #[arg(long, env = "AGENTD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Serve ADK's dev UI from this directory (the `google/adk/cli/browser` folder of the
    /// `google-adk` wheel) at `/dev-ui/`. A development tool: the UI sends no credentials,
    /// so it works only with `--auth none`.
    #[arg(long, env = "AGENTD_WEB_UI_DIR")]
    pub web_ui_dir: Option<PathBuf>,

    /// Keep the spans of this many recent run steps in memory, for the web UI's Trace tab and an
    /// event's request and response (`/dev/apps/{app}/debug/trace/…`; docs/evals.md). Default:
    /// 10,000 with `--web-ui-dir`, else 0 (none kept, and nothing recorded). Kept per replica,
    /// at most 32 MiB of them; OTLP export is for traces across replicas.
    #[arg(long, env = "AGENTD_TRACE_SPANS")]
    pub trace_spans: Option<usize>,

    /// Export traces over OTLP/HTTP to this collector (`http://collector:4318`). Off when unset.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// OTLP encoding: `http/protobuf` or `http/json`.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        default_value = "http/protobuf"
    )]
    pub otlp_protocol: String,

    /// Allow browser requests from this origin (CORS). Repeat or comma-separate; `*` allows any.
    /// Off by default.
    #[arg(
        long = "allow-origin",
        env = "AGENTD_ALLOW_ORIGINS",
        value_delimiter = ','
    )]
    pub allow_origins: Vec<String>,

    /// Largest request body accepted, in bytes (larger gets 413).
    #[arg(long, env = "AGENTD_MAX_BODY_BYTES", default_value_t = 32 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Largest artifact stored, in decoded bytes (larger gets 413).
    #[arg(long, env = "AGENTD_MAX_ARTIFACT_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_artifact_bytes: usize,

    /// JSON values (objects, arrays, strings, numbers) one request body may hold, counted
    /// before it is parsed (more gets 413 `body_too_complex`): what parsing a body costs grows
    /// with its values, not its bytes.
    #[arg(long, env = "AGENTD_MAX_JSON_VALUES", default_value_t = DEFAULT_MAX_JSON_VALUES)]
    pub max_json_values: usize,

    /// Parts one message or stored event may have (more gets 422 `too_many_parts`).
    #[arg(long, env = "AGENTD_MAX_MESSAGE_PARTS", default_value_t = crate::store::DEFAULT_MAX_EVENT_PARTS)]
    pub max_message_parts: usize,

    /// This replica's liveness lease in seconds: a replica that dies mid-run frees its
    /// sessions after at most this long (plus one sweep). One heartbeat per replica every third
    /// of it, whatever the number of open runs.
    #[arg(long, env = "AGENTD_RUN_LEASE_SECS", default_value_t = 10)]
    pub run_lease_secs: u64,

    /// Longest a run may take, in seconds; then it is cancelled and sealed (`timed_out`).
    #[arg(long, env = "AGENTD_MAX_RUN_SECS", default_value_t = 600)]
    pub max_run_secs: u64,

    /// Longest a request with `"onBusy": "enqueue"` waits for its session, in seconds.
    #[arg(long, env = "AGENTD_ENQUEUE_TIMEOUT_SECS", default_value_t = 60)]
    pub enqueue_timeout_secs: u64,

    /// This replica's name in the runs table (default: a random id per process).
    #[arg(long, env = "AGENTD_REPLICA_ID")]
    pub replica_id: Option<String>,

    /// On SIGTERM/Ctrl-C: seconds in-flight runs may go on (new runs get 503 and `GET /ready`
    /// answers 503 at once). Runs still going after that are handed over to another replica
    /// (`--drain-handover`), or sealed as `interrupted` when none is live.
    #[arg(long, env = "AGENTD_DRAIN_SECS", default_value_t = 20)]
    pub drain_secs: u64,

    /// What a draining replica does with its runs when another replica is live: `end` hands
    /// the runs still going at the end of `--drain-secs` over at their next commit;
    /// `immediate` hands them over at their next commit at once; `off` seals them
    /// `interrupted` (docs/replicas.md).
    #[arg(long, env = "AGENTD_DRAIN_HANDOVER", value_enum, default_value_t = DrainHandover::End)]
    pub drain_handover: DrainHandover,

    /// Times a run may be resumed on another replica after its replica died; then it fails
    /// (`MAX_RESUMES_EXCEEDED`). Hand-overs by a draining replica do not count.
    #[arg(long, env = "AGENTD_MAX_RESUMES", default_value_t = 3)]
    pub max_resumes: u32,

    /// After the drain: seconds interrupted runs get to record their end and open HTTP
    /// responses to finish before connections are dropped.
    #[arg(long, env = "AGENTD_SHUTDOWN_GRACE_SECS", default_value_t = 10)]
    pub shutdown_grace_secs: u64,

    /// Delete sessions idle for this long (and runs finished this long ago) in the background,
    /// as `agentd prune` does (`30d`, `12h`, …). Off by default.
    #[arg(long, env = "AGENTD_SESSION_TTL", value_parser = parse_duration)]
    pub session_ttl: Option<std::time::Duration>,

    /// How long an `Idempotency-Key` is remembered, in seconds.
    #[arg(long, env = "AGENTD_IDEMPOTENCY_TTL_SECS", default_value_t = 86_400)]
    pub idempotency_ttl_secs: u64,

    /// Add each run's session to memory when the run ends (as `PATCH …/memory` does), so
    /// memory search finds every conversation. Off by default.
    #[arg(
        long,
        env = "AGENTD_MEMORY_AUTO_INGEST",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub memory_auto_ingest: bool,

    /// Memories one user may have in one app; adding past it forgets the user's oldest
    /// (docs/memory.md#bounds).
    #[arg(long, env = "AGENTD_MAX_MEMORIES_PER_USER", default_value_t = crate::store::DEFAULT_MAX_MEMORIES_PER_USER)]
    pub max_memories_per_user: usize,

    /// A YAML price table: per model, what a million input, output and cached input tokens
    /// cost, and in what currency (docs/usage.md). Without it every run's cost is `null`.
    #[arg(long, env = "AGENTD_PRICES")]
    pub prices: Option<PathBuf>,
}

/// How other agents reach this server (`docs/a2a.md`).
#[derive(Debug, Clone, Default, Args)]
pub struct InteropArgs {
    /// The URL clients reach this server at (`https://agents.example.com`), used in A2A agent
    /// cards; without it the request's `Host` (and `X-Forwarded-Proto`) decide.
    #[arg(long, env = "AGENTD_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// The app `GET /.well-known/agent-card.json` describes (without it: the only app, if
    /// exactly one is served).
    #[arg(long, env = "AGENTD_A2A_DEFAULT_APP")]
    pub a2a_default_app: Option<String>,

    /// Serve A2A agent cards without credentials (public discovery); without it a card needs
    /// what every route needs, and a key sees only its apps' cards.
    #[arg(
        long,
        env = "AGENTD_A2A_PUBLIC_CARDS",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub a2a_public_cards: bool,
}

/// Webhooks and schedules (`docs/background.md`).
#[derive(Clone, Args)]
pub struct BackgroundArgs {
    /// The secret (`whsec_<base64>`, 24 to 64 bytes) of webhooks that name none. Without it,
    /// every webhook must bring its own.
    #[arg(long, env = "AGENTD_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,

    /// What webhooks may reach besides public addresses: IP addresses, CIDR blocks, host
    /// names or `*` (as HTTP tools' `allow_private`). Repeat or comma-separate.
    #[arg(
        long = "webhook-allow-private",
        env = "AGENTD_WEBHOOK_ALLOW_PRIVATE",
        value_delimiter = ','
    )]
    pub webhook_allow_private: Vec<String>,

    /// One delivery attempt's limit, in seconds (connect, send, answer).
    #[arg(long, env = "AGENTD_WEBHOOK_TIMEOUT_SECS", default_value_t = 10)]
    pub webhook_timeout_secs: u64,

    /// How long a failing delivery is retried (exponential backoff) before it is `failed`.
    #[arg(long, env = "AGENTD_WEBHOOK_RETRY_HOURS", default_value_t = 24.0)]
    pub webhook_retry_hours: f64,

    /// Deliveries in flight at a time on one replica.
    #[arg(long, env = "AGENTD_WEBHOOK_IN_FLIGHT", default_value_t = 16)]
    pub webhook_in_flight: usize,

    /// Of them, at most this many for one user (0: no limit): one tenant's slow receivers
    /// cannot hold every slot.
    #[arg(long, env = "AGENTD_WEBHOOK_IN_FLIGHT_PER_USER", default_value_t = 4)]
    pub webhook_in_flight_per_user: usize,

    /// And at most this many to one receiving host (scheme, host and port; 0: no limit); a
    /// host that let an attempt time out gets one for a minute.
    #[arg(long, env = "AGENTD_WEBHOOK_IN_FLIGHT_PER_HOST", default_value_t = 4)]
    pub webhook_in_flight_per_host: usize,

    /// Fire schedules from this replica (any number of replicas may; each tick fires once).
    #[arg(
        long,
        env = "AGENTD_SCHEDULER",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub scheduler: bool,

    /// How often the scheduler looks for due ticks, in milliseconds.
    #[arg(long, env = "AGENTD_SCHEDULE_POLL_MS", default_value_t = 500)]
    pub schedule_poll_ms: u64,

    /// Schedules one user may have in one app; 0: no limit.
    #[arg(long, env = "AGENTD_MAX_SCHEDULES_PER_USER", default_value_t = 20)]
    pub max_schedules_per_user: u32,

    /// The shortest period a schedule's pattern may have, in seconds (`* * * * * *` fires
    /// every second, so it is refused unless this is 1 or less).
    #[arg(long, env = "AGENTD_SCHEDULE_MIN_INTERVAL_SECS", default_value_t = 60)]
    pub schedule_min_interval_secs: u64,
}

// Not derived: the webhook secret stays out of logs.
impl std::fmt::Debug for BackgroundArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundArgs")
            .field(
                "webhook_secret",
                &self.webhook_secret.as_ref().map(|_| "<set>"),
            )
            .field("webhook_allow_private", &self.webhook_allow_private)
            .field("webhook_timeout_secs", &self.webhook_timeout_secs)
            .field("webhook_retry_hours", &self.webhook_retry_hours)
            .field("webhook_in_flight", &self.webhook_in_flight)
            .field(
                "webhook_in_flight_per_user",
                &self.webhook_in_flight_per_user,
            )
            .field(
                "webhook_in_flight_per_host",
                &self.webhook_in_flight_per_host,
            )
            .field("scheduler", &self.scheduler)
            .field("schedule_poll_ms", &self.schedule_poll_ms)
            .field("max_schedules_per_user", &self.max_schedules_per_user)
            .field(
                "schedule_min_interval_secs",
                &self.schedule_min_interval_secs,
            )
            .finish()
    }
}

impl BackgroundArgs {
    pub fn defaults() -> Self {
        BackgroundArgs {
            webhook_secret: None,
            webhook_allow_private: vec![],
            webhook_timeout_secs: 10,
            webhook_retry_hours: 24.0,
            webhook_in_flight: 16,
            webhook_in_flight_per_user: 4,
            webhook_in_flight_per_host: 4,
            scheduler: true,
            schedule_poll_ms: 500,
            max_schedules_per_user: 20,
            schedule_min_interval_secs: 60,
        }
    }

    /// The webhook policy, or why the flags are wrong.
    pub fn webhook_policy(&self) -> anyhow::Result<crate::webhook::WebhookPolicy> {
        if let Some(secret) = &self.webhook_secret {
            crate::webhook::sign::decode_secret(secret)
                .map_err(|e| anyhow::anyhow!("--webhook-secret: {e}"))?;
        }
        crate::tools::egress::EgressPolicy::parse(&self.webhook_allow_private)
            .map_err(|e| anyhow::anyhow!("--webhook-allow-private: {e}"))?;
        Ok(crate::webhook::WebhookPolicy {
            allow_private: self.webhook_allow_private.clone(),
            default_secret: self.webhook_secret.clone(),
        })
    }
}

impl ServeArgs {
    /// How many spans to keep for the web UI ([`crate::telemetry::traces`]).
    pub fn kept_spans(&self) -> usize {
        self.trace_spans
            .unwrap_or(if self.web_ui_dir.is_some() { 10_000 } else { 0 })
    }

    /// Defaults for tests and embedding: SQLite file, port 0.
    pub fn for_database(database_url: impl Into<String>) -> Self {
        ServeArgs {
            bind: "127.0.0.1:0".parse().expect("valid literal address"),
            database: DatabaseArgs {
                database_url: database_url.into(),
                db_max_connections: 16,
            },
            security: SecurityArgs::defaults(),
            background: BackgroundArgs::defaults(),
            interop: InteropArgs::default(),
            apps_dir: PathBuf::from("config/apps"),
            log_format: LogFormat::Text,
            web_ui_dir: None,
            trace_spans: None,
            otlp_endpoint: None,
            otlp_protocol: "http/protobuf".into(),
            allow_origins: vec![],
            max_body_bytes: 32 * 1024 * 1024,
            max_artifact_bytes: 16 * 1024 * 1024,
            max_json_values: DEFAULT_MAX_JSON_VALUES,
            max_message_parts: crate::store::DEFAULT_MAX_EVENT_PARTS,
            shutdown_grace_secs: 10,
            drain_secs: 20,
            drain_handover: DrainHandover::End,
            max_resumes: 3,
            idempotency_ttl_secs: 86_400,
            session_ttl: None,
            run_lease_secs: 10,
            max_run_secs: 600,
            enqueue_timeout_secs: 60,
            replica_id: None,
            memory_auto_ingest: false,
            max_memories_per_user: crate::store::DEFAULT_MAX_MEMORIES_PER_USER,
            prices: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_duration("90m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("45s"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("2w"), Ok(Duration::from_secs(1_209_600)));
        assert_eq!(parse_duration("3600"), Ok(Duration::from_secs(3_600)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("10y").is_err());
        assert!(parse_duration("-5d").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }
}
