//! Starting and stopping the daemon: open the store, load apps, bind, serve, and shut down
//! gracefully on a signal (in-flight requests get `--shutdown-grace-secs` to finish). Also
//! `agentd eval` ([`eval_cli`]), which puts a runner, a store and the apps together the same
//! way, without a listener or background work, to run an eval set in process.

pub mod accept;
pub mod allocator;
pub mod eval_cli;

use crate::agent::PluginSet;
use crate::apps::AppRegistry;
use crate::auth::jwt::{JwtConfig, JwtVerifier};
use crate::auth::{Authenticator, KeyChanges, KEYS_CHANNEL};
use crate::config::ServeArgs;
use crate::http::{self, AppState};
use crate::runner::bus::ChannelListener;
use crate::runner::{Runner, RunnerConfig};
use crate::store::{self, StoreLimits};
use crate::webhook::SenderConfig;
use accept::AcceptConfig;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A running server. Dropping it does not stop it; call [`Server::shutdown`].
pub struct Server {
    pub addr: SocketAddr,
    pub state: AppState,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Opens the database (migrating it), loads apps, binds `args.bind` and starts serving.
    pub async fn start(args: ServeArgs) -> anyhow::Result<Server> {
        if args.max_memories_per_user == 0 {
            anyhow::bail!("--max-memories-per-user must be at least 1");
        }
        let store = open_store(&args).await?;
        let apps = Arc::new(AppRegistry::load(&args.apps_dir));
        Self::start_with(args, store, apps, PluginSet::default()).await
    }

    /// Starts with an explicit store, apps and plugins (embedding agentd with Rust agents).
    pub async fn start_with(
        args: ServeArgs,
        store: Arc<dyn crate::store::Store>,
        apps: Arc<AppRegistry>,
        mut plugins: PluginSet,
    ) -> anyhow::Result<Server> {
        let webhook_policy = args.background.webhook_policy()?;
        // The apps' own webhooks are checked against the server's policy before serving.
        let apps = {
            let mut registry = (*apps).clone();
            registry.apply_webhook_policy(&webhook_policy);
            Arc::new(registry)
        };
        warn_missing_keys(&apps);
        let mut runner_config = RunnerConfig {
            lease: Duration::from_secs(args.run_lease_secs.max(1)),
            max_run_duration: Duration::from_secs(args.max_run_secs.max(1)),
            enqueue_timeout: Duration::from_secs(args.enqueue_timeout_secs),
            idempotency_ttl: Duration::from_secs(args.idempotency_ttl_secs.max(1)),
            ..RunnerConfig::default()
        };
        if let Some(id) = &args.replica_id {
            // It prefixes every notification (PostgreSQL allows 8,000 bytes per payload).
            if id.is_empty() || id.len() > 64 || id.contains('\n') {
                anyhow::bail!("--replica-id must be 1 to 64 bytes without a newline");
            }
            runner_config.owner = id.clone();
        }
        runner_config.max_runs_per_user = args.security.max_runs_per_user;
        runner_config.max_message_parts = args.max_message_parts;
        runner_config.max_resumes = args.max_resumes;
        runner_config.drain_handover = args.drain_handover;
        runner_config.prices = Arc::new(load_prices(args.prices.as_deref())?);
        // Apps whose sessions are added to memory once they pause, and how often to look.
        let idle: Vec<_> = apps
            .entries()
            .filter_map(|a| a.memory.idle.map(|idle| (a.name.clone(), idle)))
            .collect();
        if args.memory_auto_ingest || !idle.is_empty() {
            let plugin = crate::agent::memory_ingest::MemoryIngestPlugin::new(
                runner_config.prices.clone(),
                args.memory_auto_ingest,
            );
            plugins
                .push(Arc::new(plugin))
                .map_err(|e| anyhow::anyhow!("cannot enable memory auto-ingest: {e}"))?;
        }
        let runner_config_prices = runner_config.prices.clone();
        let budgets = runner_config.budgets.clone();
        let run_ended = runner_config.run_ended.clone();
        // Checked before anything starts: a refused configuration leaves nothing running.
        let jwt = jwt_verifier(&args)?;
        check_public_url(&args)?;
        // With PostgreSQL, other replicas revoke keys too: their notifications (and any gap in
        // them) invalidate this replica's key cache. SQLite has no other process to hear from.
        let key_changes = store.pg_pool().map(|_| KeyChanges::default());
        let mut channels: Vec<ChannelListener> = key_changes
            .iter()
            .map(|changes| {
                let (on_notify, on_gap) = (changes.clone(), changes.clone());
                ChannelListener {
                    channel: KEYS_CHANNEL,
                    on_notify: Box::new(move |_| on_notify.changed()),
                    on_gap: Box::new(move || on_gap.changed()),
                }
            })
            .collect();
        // Budgets set on other replicas, likewise (docs/usage.md).
        if store.pg_pool().is_some() {
            let (on_notify, on_gap) = (budgets.on_change(), budgets.on_change());
            channels.push(ChannelListener {
                channel: crate::runner::budgets::BUDGETS_CHANNEL,
                on_notify: Box::new(move |_| on_notify()),
                on_gap: Box::new(on_gap),
            });
        }
        let runner = Runner::start(
            store.clone(),
            apps.clone(),
            plugins,
            runner_config,
            channels,
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot start the runner: {e}"))?;
        let authenticator =
            Authenticator::new(store.clone(), args.security.api_keys(), jwt, key_changes);
        let gate = Arc::new(http::auth::Gate::new(authenticator, &args));
        let state = AppState {
            store,
            apps,
            runner,
            metrics: crate::metrics::install(),
            gate,
            webhooks: Arc::new(webhook_policy.clone()),
            interop: Arc::new(http::frontend::a2a::Interop::new(&args)),
            schedules: crate::schedule::Limits::of(&args.background),
            json: http::json_shape::JsonLimits {
                max_values: args.max_json_values,
            },
            eval_wake: Arc::new(tokio::sync::Notify::new()),
        };
        let app = http::router(state.clone(), &args);

        let listener = tokio::net::TcpListener::bind(args.bind)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.bind))?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        // Histogram samples wait for upkeep or a scrape; nobody may be scraping.
        crate::metrics::spawn_upkeep(state.metrics.clone(), shutdown.clone());
        if let Some(ttl) = args.session_ttl {
            spawn_retention(state.store.clone(), ttl, shutdown.clone());
        }
        // Webhooks of runs that ended (here or on a dead replica), and schedules' ticks.
        let bg = &args.background;
        crate::webhook::Sender::new(
            state.store.clone(),
            SenderConfig {
                owner: state.runner.replica_id().to_string(),
                policy: webhook_policy,
                timeout: Duration::from_secs(bg.webhook_timeout_secs.max(1)),
                retry_for: Duration::from_secs_f64((bg.webhook_retry_hours * 3600.0).max(0.0)),
                poll: Duration::from_secs(1),
                in_flight: bg.webhook_in_flight.max(1),
                caps: crate::webhook::fair::Caps {
                    per_user: bg.webhook_in_flight_per_user,
                    per_host: bg.webhook_in_flight_per_host,
                },
            },
            run_ended,
        )
        .spawn(shutdown.clone());
        if bg.scheduler {
            crate::schedule::Ticker::new(
                state.runner.clone(),
                Duration::from_millis(bg.schedule_poll_ms.max(50)),
                bg.schedule_min_interval_secs,
            )
            .spawn(shutdown.clone());
        }
        // Memories of apps with an embedding model get their vectors.
        let embedded: Vec<_> = state
            .apps
            .entries()
            .filter_map(|a| {
                a.memory
                    .embedder
                    .clone()
                    .map(|embedder| crate::memory::embedder::EmbeddedApp {
                        app: a.name.clone(),
                        embedder,
                    })
            })
            .collect();
        if !embedded.is_empty() {
            crate::memory::embedder::MemoryEmbedder::new(
                state.store.clone(),
                embedded,
                runner_config_prices.clone(),
                Duration::from_secs(1),
            )
            .spawn(shutdown.clone());
        }
        // Memories of apps with `memory: ttl_days:` expire.
        let expiring: Vec<_> = state
            .apps
            .entries()
            .filter_map(|a| {
                a.memory.ttl.map(|ttl| crate::memory::retention::Expiring {
                    app: a.name.clone(),
                    ttl,
                })
            })
            .collect();
        if !expiring.is_empty() {
            crate::memory::retention::spawn(
                state.store.clone(),
                expiring,
                crate::memory::retention::PERIOD,
                shutdown.clone(),
            );
        }
        // Cases of stored eval sets' runs (any replica's) are run here.
        crate::eval::worker::Worker {
            store: state.store.clone(),
            runner: state.runner.clone(),
            lease: Duration::from_secs(args.run_lease_secs.max(1)),
            wake: state.eval_wake.clone(),
        }
        .spawn(shutdown.clone());
        // Sessions of those apps that paused are added to memory.
        if !idle.is_empty() {
            crate::memory::idle::Sweep {
                store: state.store.clone(),
                apps: state
                    .apps
                    .entries()
                    .filter_map(|a| Some((a, a.memory.idle?)))
                    .map(|(a, idle)| crate::memory::idle::IdleApp {
                        app: a.name.clone(),
                        idle,
                        embedder: a.memory.embedder.clone(),
                        extraction: a.memory.extraction.clone(),
                    })
                    .collect(),
                prices: runner_config_prices.clone(),
                every: crate::memory::idle::period(idle.iter().map(|(_, d)| *d)),
            }
            .spawn(shutdown.clone());
        }
        let accept = AcceptConfig {
            max_connections: accept::effective_max_connections(
                args.security.max_connections,
                args.database.db_max_connections,
            ),
            header_timeout: Duration::from_secs(args.security.header_timeout_secs.max(1)),
        };
        let task = tokio::spawn(accept::serve(listener, app, accept, shutdown.clone()));
        tracing::info!(%addr, backend = state.store.backend(), apps = state.apps.names().count(), "agentd listening");
        Ok(Server {
            addr,
            state,
            shutdown,
            task,
        })
    }

    /// Drains and stops: new runs are refused at once (`/ready` turns 503), in-flight runs get
    /// `drain` to finish, the rest are interrupted (sealed, status `interrupted`, their streams
    /// end with `event: done`); the listener stays open (answering 503) until `drain` is over;
    /// then HTTP connections get `grace` before they are dropped.
    pub async fn shutdown_with(self, drain: Duration, grace: Duration) -> anyhow::Result<()> {
        self.stop(drain, grace, true).await
    }

    /// [`Server::shutdown_with`]; `linger`: keep the listener open for the whole drain even
    /// when no run is left, so a balancer that still routes here for a moment (deregistration
    /// delay, no preStop hook) gets `/ready` 503 and new runs 503 `shutting_down` with
    /// `Retry-After`, on new and kept-alive connections alike, instead of refused connections.
    async fn stop(self, drain: Duration, grace: Duration, linger: bool) -> anyhow::Result<()> {
        let drained = tokio::time::Instant::now() + drain;
        // Runs first, so the HTTP server's graceful shutdown is not held up by open SSE
        // responses: each run's stream ends with its `done`.
        self.state.runner.drain_runs(drain, grace).await;
        if linger {
            // Streams and waits on other replicas' runs still work meanwhile: the bus runs.
            tokio::time::sleep_until(drained).await;
        }
        // Client streams of runs handed over follow them on their new replica until they
        // end, for up to the grace period; then they are cut and their clients re-attach.
        self.state.runner.wait_handover_streams(grace).await;
        self.state.runner.stop_background().await;
        // MCP servers started as child processes end with us.
        self.state.apps.close().await;
        self.shutdown.cancel();
        match tokio::time::timeout(grace, self.task).await {
            Ok(joined) => Ok(joined??),
            Err(_) => {
                tracing::warn!("shutdown grace period over; dropping remaining connections");
                Ok(())
            }
        }
    }

    /// Stops without a drain: runs are interrupted at once (tests, embedding).
    pub async fn shutdown(self, grace: Duration) -> anyhow::Result<()> {
        self.shutdown_with(Duration::ZERO, grace).await
    }

    /// Serves until SIGTERM or Ctrl-C, then drains and shuts down. SIGTERM keeps the listener
    /// open for the whole drain (a balancer may still route here); Ctrl-C, at a terminal where
    /// nothing routes traffic, lets in-flight runs finish within the drain and stops as soon
    /// as they have.
    pub async fn run_until_signal(self, drain: Duration, grace: Duration) -> anyhow::Result<()> {
        let signal = shutdown_signal().await;
        tracing::info!(
            drain_secs = drain.as_secs(),
            ?signal,
            "shutdown signal received; draining (not ready, new runs refused)"
        );
        // Both turn the replica not-ready first thing.
        match signal {
            Signal::Terminate => self.shutdown_with(drain, grace).await,
            Signal::Interrupt => self.stop(drain, grace, false).await,
        }
    }
}

/// Builds the JWT verifier from the flags, refusing what would be insecure by accident: no
/// authentication on an address other hosts can reach (unless `--allow-unauthenticated`),
/// a JWKS without an audience, and JWT settings that `--auth` does not enable.
/// `--public-url` is an http(s) URL, and public agent cards need it: a card served to anyone
/// must not take its URLs from the request's `Host` (an attacker's `Host` would end up in a
/// card a shared cache keeps).
fn check_public_url(args: &ServeArgs) -> anyhow::Result<()> {
    match &args.interop.public_url {
        Some(url) => {
            let parsed = reqwest::Url::parse(url)
                .map_err(|e| anyhow::anyhow!("--public-url {url:?} is not a URL: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                anyhow::bail!(
                    "--public-url must be an http(s) URL, e.g. https://agents.example.com"
                );
            }
            Ok(())
        }
        None if args.interop.a2a_public_cards => anyhow::bail!(
            "--a2a-public-cards needs --public-url: a card anyone may read must not take its \
             URL from the request's Host header"
        ),
        None => Ok(()),
    }
}

fn jwt_verifier(args: &ServeArgs) -> anyhow::Result<Option<JwtVerifier>> {
    let sec = &args.security;
    let jwt_flags =
        sec.jwt_jwks_url.is_some() || sec.jwt_public_key.is_some() || sec.jwt_secret.is_some();
    if jwt_flags && !sec.jwt() {
        anyhow::bail!("JWT settings are given but --auth does not include jwt");
    }
    let off = !sec.api_keys() && !sec.jwt();
    if off && !args.bind.ip().is_loopback() && !sec.allow_unauthenticated {
        anyhow::bail!(
            "refusing to listen on {} without authentication: use --auth api-key or --auth jwt, \
             or --allow-unauthenticated if anyone who reaches this port may use every session",
            args.bind
        );
    }
    if off && !args.bind.ip().is_loopback() {
        tracing::warn!(bind = %args.bind, "serving without authentication (--allow-unauthenticated)");
    }
    if !sec.jwt() {
        return Ok(None);
    }
    if sec.jwt_jwks_url.is_some() && sec.jwt_audience.is_empty() {
        // An identity provider signs tokens for all its clients with the same keys: without
        // an audience, a token minted for any other application would be accepted here.
        anyhow::bail!("--jwt-jwks-url needs --jwt-audience (the audience your tokens carry)");
    }
    if sec.jwt_issuer.is_none() {
        tracing::warn!(
            "--jwt-issuer is not set: tokens of any issuer the keys sign for are accepted"
        );
    }
    let public_key_pem = match &sec.jwt_public_key {
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            anyhow::anyhow!("cannot read --jwt-public-key {}: {e}", path.display())
        })?),
        None => None,
    };
    Ok(Some(JwtVerifier::new(JwtConfig {
        jwks_url: sec.jwt_jwks_url.clone(),
        public_key_pem,
        secret: sec.jwt_secret.clone(),
        issuer: sec.jwt_issuer.clone(),
        audience: sec.jwt_audience.clone(),
        user_claim: sec.jwt_user_claim.clone(),
        jwks_refresh_min: Duration::from_secs(sec.jwt_jwks_refresh_secs),
        jwks_max_stale: Duration::from_secs(sec.jwt_jwks_max_stale_secs.max(1)),
        leeway_secs: sec.jwt_leeway_secs,
    })?))
}

/// `--session-ttl`: prunes as `agentd prune --older-than <ttl> --keep-runs <ttl>` does, when
/// the server starts (a replica that was down a long time catches up at once) and then every
/// tenth of the TTL (between one minute and one hour). Several replicas may do it at once:
/// each deletion re-checks that its session is still idle and free.
fn spawn_retention(store: Arc<dyn crate::store::Store>, ttl: Duration, stop: CancellationToken) {
    let every = (ttl / 10).clamp(Duration::from_secs(60), Duration::from_secs(3600));
    tokio::spawn(async move {
        let mut first = true;
        loop {
            if !std::mem::take(&mut first) {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
            }
            let now = crate::event::now_ts();
            let req = crate::store::PruneRequest {
                sessions_before: now - ttl.as_secs_f64(),
                runs_before: now - ttl.as_secs_f64(),
                app: None,
                batch: 200,
                dry_run: false,
            };
            match store.prune(&req).await {
                Ok(r) if r.sessions + r.runs > 0 => tracing::info!(
                    sessions = r.sessions,
                    events = r.events,
                    artifacts = r.artifacts,
                    memory_entries = r.memory_entries,
                    runs = r.runs,
                    "retention: pruned"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "retention: prune failed"),
            }
        }
    });
}

/// Which signal asked agentd to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// Ctrl-C at a terminal: nobody routes traffic here.
    Interrupt,
    /// SIGTERM: an orchestrator or a balancer's deploy.
    Terminate,
}

async fn shutdown_signal() -> Signal {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => Signal::Interrupt, _ = term => Signal::Terminate }
}

/// Opens (and migrates) the database of `args`, with its limits.
async fn open_store(args: &ServeArgs) -> anyhow::Result<Arc<dyn crate::store::Store>> {
    store::open(
        &args.database.database_url,
        args.database.db_max_connections,
        StoreLimits {
            max_artifact_bytes: args.max_artifact_bytes,
            max_event_parts: args.max_message_parts,
            max_memories_per_user: args.max_memories_per_user,
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("cannot open the database: {e}"))
}

/// One warning line per app whose model has no credential to reach its provider (it starts
/// anyway: the app's runs fail until the variable is set, and the other apps work).
fn warn_missing_keys(apps: &AppRegistry) {
    for entry in apps.entries() {
        let Ok(tree) = &entry.tree else { continue };
        let mut vars: Vec<String> = tree.agents().flat_map(|a| a.missing_keys()).collect();
        vars.sort();
        vars.dedup();
        if !vars.is_empty() {
            tracing::warn!(
                app = %entry.name,
                "app {} has no model credential: set {} (its runs fail until then)",
                entry.name,
                vars.join(", ")
            );
        }
    }
}

/// The `--prices` table; a file that cannot be read or is wrong stops the start.
fn load_prices(path: Option<&std::path::Path>) -> anyhow::Result<crate::usage::Prices> {
    let Some(path) = path else {
        return Ok(crate::usage::Prices::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read --prices {}: {e}", path.display()))?;
    crate::usage::Prices::parse(&text)
        .map_err(|e| anyhow::anyhow!("--prices {}: {e}", path.display()))
}
