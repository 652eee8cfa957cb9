//! Webhook delivery latency: how long after a run's end its receiver has the webhook.
//!
//! One agentd (the backend of `--backend`) and a receiver in this process on 127.0.0.1. The
//! runs are echo runs made one after the other with `POST /run`, each with its own webhook
//! (`--webhook-runs` of them); a run's end is `finishedAt` as the database recorded it, the
//! arrival is the receiver's clock when the request's head was read (one machine, one clock).
//! What is measured is the whole path: the trigger writing the delivery with the run's end,
//! the runner waking the sender, the claim, building and signing the body, and the POST.

use crate::pg::Admin;
use crate::servers::single_app_agentd;
use crate::BenchArgs;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

type Arrivals = Arc<Mutex<HashMap<String, f64>>>;

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

pub async fn run(args: &BenchArgs, admin: &Admin, agentd_bin: &std::path::Path) -> Result<String> {
    let work = tempfile::Builder::new().prefix("agentd-bench-").tempdir()?;
    // The receiver is on loopback: allowed for this agentd only (it inherits the variable).
    std::env::set_var("AGENTD_WEBHOOK_ALLOW_PRIVATE", "127.0.0.1");
    let (agentd, _) = single_app_agentd(
        args,
        admin,
        agentd_bin,
        work.path(),
        args.backend,
        "webhooks",
        "hooks",
        "agent_class: EchoAgent\nname: hooks\nchunks: 2\n",
    )
    .await?;

    let arrivals: Arrivals = Arc::default();
    let recorded = arrivals.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let at = now();
            let recorded = recorded.clone();
            async move {
                if let Some(id) = headers.get("webhook-id").and_then(|v| v.to_str().ok()) {
                    recorded
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(id.to_string())
                        .or_insert(at);
                }
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hook = format!("http://{}/hook", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = reqwest::Client::new();
    let n = args.webhook_runs;
    let mut runs = Vec::with_capacity(n);
    for i in 0..n {
        let body = serde_json::json!({
            "appName": "hooks", "userId": "u1", "sessionId": format!("s{}", i % 8),
            "createSession": true,
            "newMessage": {"role": "user", "parts": [{"text": format!("run {i}")}]},
            "webhook": {"url": hook, "secret": SECRET, "includeText": true},
        });
        let resp = client
            .post(format!("{}/run", agentd.base))
            .json(&body)
            .send()
            .await?;
        let run_id = resp
            .headers()
            .get("x-agentd-run-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .context("no run id")?;
        if !resp.status().is_success() {
            bail!("run {i} answered {}", resp.status());
        }
        let _ = resp.bytes().await?;
        runs.push(run_id);
    }
    // Every delivery, then each run's end as recorded.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while arrivals.lock().unwrap_or_else(|p| p.into_inner()).len() < n {
        if tokio::time::Instant::now() > deadline {
            bail!("not every webhook arrived within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = arrivals.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut latencies = Vec::with_capacity(n);
    for run_id in &runs {
        let run: serde_json::Value = client
            .get(format!("{}/runs/{run_id}", agentd.base))
            .send()
            .await?
            .json()
            .await?;
        let finished = run["finishedAt"].as_f64().context("finishedAt")?;
        let id = run["webhooks"][0]["id"].as_str().context("delivery id")?;
        let at = got.get(id).context("delivery arrived")?;
        latencies.push((at - finished) * 1000.0);
    }
    agentd.stop().await;
    latencies.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];
    let mut out = String::new();
    writeln!(
        out,
        "webhook delivery latency after the run's end ({:?} backend, {n} runs one after the \
         other, receiver on loopback): p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        args.backend,
        pct(0.5),
        pct(0.9),
        pct(0.99),
        latencies[latencies.len() - 1]
    )?;
    Ok(out)
}
