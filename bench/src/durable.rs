//! `agentd-bench durable`: runs that outlive their replica (docs/replicas.md, "Durable runs"),
//! on one PostgreSQL with three `agentd` processes (`--run-lease-secs 2`).
//!
//! - **Kill to resumed**: `--durable-runs` background runs on replica A (an echo app of
//!   40 partials, 100 ms apart: 4 s a run), `kill -9` of A one second in; for each run, the
//!   time from the kill until another replica owns it (its record's `owner`), and how each
//!   ended.
//! - **Rolling restart**: runs started continuously (three a second, on the live replicas in
//!   turn) while each of the three replicas is replaced in turn (SIGTERM with `--drain-secs
//!   1`, then a new process with a new id); how every run ended. A run lost is one that did
//!   not end `completed`.

use crate::pg::Admin;
use crate::servers::{self, Server};
use crate::{free_addr, BenchArgs};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

const APP: &str = "slowecho";
const USER: &str = "u1";

struct Cluster<'a> {
    bin: &'a Path,
    url: String,
    apps: std::path::PathBuf,
    work: &'a Path,
    client: reqwest::Client,
    spawned: usize,
}

impl Cluster<'_> {
    async fn replica(&mut self) -> Result<(String, Server)> {
        self.spawned += 1;
        let id = format!("r{}", self.spawned);
        let mut cmd = tokio::process::Command::new(self.bin);
        cmd.arg("serve")
            .args([
                "--bind",
                &free_addr()?.to_string(),
                "--database-url",
                &self.url,
            ])
            .arg("--apps-dir")
            .arg(&self.apps)
            .args(["--replica-id", &id, "--run-lease-secs", "2"])
            .args(["--drain-secs", "1", "--shutdown-grace-secs", "10"])
            .env("RUST_LOG", "agentd=warn");
        let server = Server::spawn("agentd", cmd, self.work.join(format!("{id}.log"))).await?;
        Ok((id, server))
    }

    async fn start_run(&self, on: &Server, n: usize) -> Result<String> {
        let session = format!("s{n}");
        let sessions = format!("{}/apps/{APP}/users/{USER}/sessions", on.base);
        self.client
            .post(&sessions)
            .json(&json!({"sessionId": session}))
            .send()
            .await?
            .error_for_status()?;
        let started: Value = self
            .client
            .post(format!("{sessions}/{session}/runs"))
            // At least as many characters as the app has chunks (one chunk is at least one).
            .json(&json!({"newMessage": {"role": "user", "parts": [{"text": "durable ".repeat(10)}]}}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        started["runId"]
            .as_str()
            .map(str::to_string)
            .context("a run id")
    }

    async fn record(&self, on: &Server, run: &str) -> Result<Value> {
        Ok(self
            .client
            .get(format!("{}/runs/{run}", on.base))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// How each run ended (waiting for those still running).
    async fn outcomes(&self, on: &Server, runs: &[String]) -> Result<BTreeMap<String, usize>> {
        let mut out = BTreeMap::new();
        for run in runs {
            let ended: Value = self
                .client
                .post(format!("{}/runs/{run}/wait", on.base))
                .json(&json!({}))
                .send()
                .await?
                .json()
                .await?;
            let status = ended["status"].as_str().unwrap_or("unknown").to_string();
            *out.entry(status).or_default() += 1;
        }
        Ok(out)
    }
}

pub async fn run(args: &BenchArgs, admin: &Admin, agentd_bin: &Path) -> Result<String> {
    if args.durable_runs == 0 {
        bail!("--durable-runs must be at least 1");
    }
    let work = tempfile::Builder::new()
        .prefix("agentd-bench-durable-")
        .tempdir()?;
    let apps = work.path().join("apps");
    servers::write_app(
        &apps,
        APP,
        "agent_class: EchoAgent\nname: slowecho\nchunks: 40\nchunk_delay_ms: 100\n",
    )?;
    let mut cluster = Cluster {
        bin: agentd_bin,
        url: admin.create_database("durable").await?,
        apps,
        work: work.path(),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()?,
        spawned: 0,
    };
    let mut out = String::new();

    // Kill to resumed.
    let (a_id, a) = cluster.replica().await?;
    let (_, b) = cluster.replica().await?;
    let (_, c) = cluster.replica().await?;
    let mut runs = vec![];
    for n in 0..args.durable_runs {
        runs.push(cluster.start_run(&a, n).await?);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = i32::try_from(a.pid)?;
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let killed = Instant::now();
    let mut resumed_after = vec![];
    for run in &runs {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = cluster.record(&b, run).await?;
            if r["owner"].as_str().is_some_and(|o| o != a_id) || r["status"] != "running" {
                resumed_after.push(killed.elapsed());
                break;
            }
            if Instant::now() > deadline {
                bail!("run {run} was not taken over within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    drop(a);
    let ended = cluster.outcomes(&b, &runs).await?;
    resumed_after.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    writeln!(
        out,
        "kill -9 of the replica running {} runs (lease 2 s): taken over after {:.0} ms (first) \
         to {:.0} ms (last); ended: {ended:?}",
        runs.len(),
        ms(resumed_after[0]),
        ms(resumed_after[resumed_after.len() - 1]),
    )?;

    // Rolling restart.
    let mut live = vec![b, c];
    let (_, d) = cluster.replica().await?;
    live.push(d);
    let started = Instant::now();
    let mut runs = vec![];
    let mut n = 10_000;
    let mut replaced = 0;
    while replaced < 3 {
        // A second of runs (three), then one replica replaced in the background of them.
        for _ in 0..3 {
            let on = &live[n % live.len()];
            runs.push(cluster.start_run(on, n).await?);
            n += 1;
            tokio::time::sleep(Duration::from_millis(330)).await;
        }
        let old = live.remove(0);
        let stopping = tokio::spawn(old.stop());
        for _ in 0..6 {
            let on = &live[n % live.len()];
            runs.push(cluster.start_run(on, n).await?);
            n += 1;
            tokio::time::sleep(Duration::from_millis(330)).await;
        }
        stopping.await?;
        let (_, fresh) = cluster.replica().await?;
        live.push(fresh);
        replaced += 1;
    }
    let ended = cluster.outcomes(&live[0], &runs).await?;
    let lost: usize = ended
        .iter()
        .filter(|(s, _)| s.as_str() != "completed")
        .map(|(_, n)| n)
        .sum();
    writeln!(
        out,
        "rolling restart of 3 replicas (SIGTERM, --drain-secs 1, a new replica each) over \
         {:.1} s under {} background runs of 4 s: ended {ended:?}; runs lost: {lost}",
        started.elapsed().as_secs_f64(),
        runs.len(),
    )?;
    for s in live {
        s.stop().await;
    }
    Ok(out)
}
