use agentd::config::{Cli, Command, KeysArgs, KeysCommand};
use agentd::server::Server;
use clap::Parser;
use std::time::Duration;

/// Logs only (the one-shot commands).
/// Logging for the one-shot commands: to standard error (standard output is their answer).
fn init_tracing() {
    if let Err(e) = agentd::telemetry::init_cli() {
        eprintln!("cannot set up logging: {e}");
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    agentd::server::allocator::tune();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let otlp = args
                .otlp_endpoint
                .as_ref()
                .filter(|e| !e.is_empty())
                .map(|endpoint| agentd::telemetry::OtlpConfig {
                    endpoint: endpoint.clone(),
                    protocol: args.otlp_protocol.clone(),
                });
            let telemetry =
                agentd::telemetry::init(args.log_format, otlp.as_ref(), args.kept_spans())?;
            let drain = Duration::from_secs(args.drain_secs);
            let grace = Duration::from_secs(args.shutdown_grace_secs);
            // Every open stream is a socket: the soft limit (often 1,024) would cap them.
            match rlimit::increase_nofile_limit(u64::MAX) {
                Ok(n) => tracing::info!(limit = n, "open-file limit"),
                Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
            }
            let served = match Server::start(*args).await {
                Ok(server) => server.run_until_signal(drain, grace).await,
                Err(e) => Err(e),
            };
            // The spans of the last requests and runs are still buffered. The exporter's
            // blocking HTTP client must not be dropped on an async worker thread.
            if let Err(e) = tokio::task::spawn_blocking(move || telemetry.shutdown()).await {
                eprintln!("trace export shutdown failed: {e}");
            }
            served
        }
        Command::Prune(args) => {
            init_tracing();
            if args.older_than.is_zero() {
                anyhow::bail!(
                    "--older-than must be more than 0 (it would delete every idle session)"
                );
            }
            let store = agentd::store::open(
                &args.database.database_url,
                args.database.db_max_connections.min(4),
                agentd::store::StoreLimits::default(),
            )
            .await
            .map_err(|e| anyhow::anyhow!("cannot open the database: {e}"))?;
            let now = agentd::event::now_ts();
            let report = store
                .prune(&agentd::store::PruneRequest {
                    sessions_before: now - args.older_than.as_secs_f64(),
                    runs_before: now - args.keep_runs.as_secs_f64(),
                    app: args.app,
                    batch: args.batch.max(1),
                    dry_run: args.dry_run,
                })
                .await
                .map_err(|e| anyhow::anyhow!("prune failed: {e}"))?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        Command::Healthcheck(args) => {
            let url = args.health_url();
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(args.timeout_secs.max(1)))
                .build()?;
            match client.get(&url).send().await {
                Ok(resp) if resp.status().is_success() => Ok(()),
                Ok(resp) => {
                    eprintln!("unhealthy: {url} answered {}", resp.status());
                    std::process::exit(1)
                }
                Err(e) => {
                    eprintln!("unhealthy: {url}: {e}");
                    std::process::exit(1)
                }
            }
        }
        Command::Keys(args) => keys(args).await,
        Command::Eval(args) => {
            init_tracing();
            let code = agentd::server::eval_cli::run(args).await;
            std::process::exit(code);
        }
        Command::Migrate(args) => {
            init_tracing();
            agentd::store::migrate(&args.database.database_url, args.citus)
                .await
                .map_err(|e| anyhow::anyhow!("migration failed: {e}"))?;
            tracing::info!("migrations applied");
            Ok(())
        }
    }
}

/// `agentd keys create|list|revoke`.
async fn keys(args: KeysArgs) -> anyhow::Result<()> {
    init_tracing();
    let store = agentd::store::open(&args.database_url, 2, agentd::store::StoreLimits::default())
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the database: {e}"))?;
    let now = agentd::event::now_ts();
    match args.command {
        KeysCommand::Create {
            user,
            apps,
            admin,
            name,
            expires,
            budget_tokens_per_day,
            budget_cost_per_month,
        } => {
            agentd::http::extract::validate_id("--user", &user)
                .map_err(|e| anyhow::anyhow!("{}", e.detail))?;
            let budget = agentd::usage::Budget {
                tokens_per_day: budget_tokens_per_day,
                cost_per_month: budget_cost_per_month,
            };
            if !budget.valid() {
                anyhow::bail!("--budget-cost-per-month must be a number at or above zero");
            }
            let apps = match apps {
                None => None,
                Some(list) => {
                    let list: Vec<String> = list
                        .into_iter()
                        .map(|a| a.trim().to_string())
                        .filter(|a| !a.is_empty())
                        .collect();
                    if list.is_empty() {
                        anyhow::bail!("--apps names no app (leave it out for every app)");
                    }
                    Some(list)
                }
            };
            let key = agentd::auth::keys::generate(
                agentd::auth::keys::KeySpec {
                    user_id: user,
                    apps,
                    admin,
                    name,
                    expires_at: expires.map(|d| now + d.as_secs_f64()),
                },
                now,
            )?;
            store
                .insert_api_key(&key.record)
                .await
                .map_err(|e| anyhow::anyhow!("cannot store the key: {e}"))?;
            // A key whose budget could not be stored is never shown, so never used.
            if budget != agentd::usage::Budget::default() {
                let payer = agentd::usage::Payer::Key {
                    id: key.record.id.clone(),
                    user: (!key.record.admin).then(|| key.record.user_id.clone()),
                };
                store
                    .set_budget(&payer, &budget, now)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot store the key's budget: {e}"))?;
            }
            eprintln!(
                "created key {} for user {:?}{}; it is shown only now:",
                key.record.id,
                key.record.user_id,
                if key.record.admin { " (admin)" } else { "" }
            );
            println!("{}", key.plaintext);
        }
        KeysCommand::List => {
            for k in store
                .list_api_keys()
                .await
                .map_err(|e| anyhow::anyhow!("cannot list keys: {e}"))?
            {
                println!("{}", serde_json::to_string(&k)?);
            }
        }
        KeysCommand::Revoke { key_id } => {
            let id = key_id.trim().trim_start_matches("agentd_");
            let id = id.split('_').next().unwrap_or(id);
            if store
                .revoke_api_key(id, now)
                .await
                .map_err(|e| anyhow::anyhow!("cannot revoke: {e}"))?
            {
                eprintln!("revoked key {id}");
                // Its schedules stop now (a replica would also pause them at their next tick).
                let paused = store
                    .pause_schedules_of_key(id, agentd::schedule::PAUSED_KEY_REVOKED)
                    .await
                    .map_err(|e| anyhow::anyhow!("revoked, but cannot pause its schedules: {e}"))?;
                if paused > 0 {
                    eprintln!("paused {paused} schedule(s) the key made");
                }
            } else {
                anyhow::bail!("no active key {id:?}");
            }
        }
    }
    Ok(())
}
