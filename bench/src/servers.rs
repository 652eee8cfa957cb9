//! The servers under test, each a child process on its own port: agentd and the three ceilings.

use crate::pg::{Admin, AGENT_NAME};
use crate::{free_addr, Backend, BenchArgs};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// The app every measured run uses: the echo agent streaming `chunks` partials.
pub const APP: &str = "bench";
/// An echo agent that sends one partial, then waits an hour: a stream that stays open idle.
pub const IDLE_APP: &str = "idle";

/// One server process.
pub struct Server {
    pub name: &'static str,
    /// `http://127.0.0.1:<port>`
    pub base: String,
    pub pid: u32,
    child: Child,
    log: PathBuf,
}

impl Server {
    pub(crate) async fn spawn(
        name: &'static str,
        mut cmd: Command,
        log: PathBuf,
    ) -> Result<Server> {
        let addr = cmd_bind(&cmd)?;
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let pid = child.id().context("the child has no pid")?;
        let mut server = Server {
            name,
            base: format!("http://{addr}"),
            pid,
            child,
            log,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited during start-up ({status}); its log ({}):\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log)
                );
            }
            if let Ok(r) = client.get(format!("{}/health", self.base)).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not answer /health within 60 s; its log:\n{}",
                    self.name,
                    tail(&self.log)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then SIGKILL if it is still there after 20 s.
    pub async fn stop(mut self) {
        if let Ok(pid) = i32::try_from(self.pid) {
            // SAFETY: signalling our own child by its pid; it has not been reaped yet.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .is_err()
        {
            eprintln!("{} ignored SIGTERM for 20 s; killing it", self.name);
            let _ = self.child.kill().await;
        }
    }
}

fn cmd_bind(cmd: &Command) -> Result<String> {
    let args: Vec<_> = cmd.as_std().get_args().collect();
    args.windows(2)
        .find(|w| w[0] == "--bind")
        .and_then(|w| w[1].to_str())
        .map(str::to_string)
        .context("server command without --bind")
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Everything the benchmarks run against.
pub struct Env {
    pub agentd: Server,
    pub ceiling_a: Server,
    pub ceiling_b: Server,
    pub ceiling_c: Server,
    /// agentd's database URL (either backend).
    pub agentd_url: String,
    /// agentd's PostgreSQL database (None with the SQLite backend).
    pub agentd_db: Option<String>,
    pub ceiling_db: String,
    /// Ceiling (c)'s database: PostgreSQL, or a SQLite file with `--backend sqlite`.
    pub ceiling_c_url: String,
    pub apps_dir: PathBuf,
    pub work: tempfile::TempDir,
    agentd_bin: PathBuf,
    self_bin: PathBuf,
    args: BenchArgs,
}

impl Env {
    pub async fn new(
        args: &BenchArgs,
        admin: &Admin,
        agentd_bin: &Path,
        self_bin: &Path,
    ) -> Result<Env> {
        let work = tempfile::Builder::new()
            .prefix("agentd-bench-")
            .tempdir()
            .context("cannot create a temporary directory")?;
        let apps_dir = work.path().join("apps");
        write_app(
            &apps_dir,
            APP,
            &format!(
                "agent_class: EchoAgent\nname: {AGENT_NAME}\nchunks: {}\n",
                args.chunks
            ),
        )?;
        write_app(
            &apps_dir,
            IDLE_APP,
            &format!(
                "agent_class: EchoAgent\nname: {AGENT_NAME}\nchunks: 2\nchunk_delay_ms: 3600000\n"
            ),
        )?;

        let (agentd_url, agentd_db) = match args.backend {
            Backend::Postgres => {
                let url = admin.create_database("agentd").await?;
                (url.clone(), Some(url))
            }
            Backend::Sqlite => (
                format!("sqlite://{}", work.path().join("agentd.db").display()),
                None,
            ),
        };
        let ceiling_db = admin.create_database("ceiling").await?;
        let ceiling_c_url = match args.backend {
            Backend::Postgres => admin.create_database("ceiling_c").await?,
            Backend::Sqlite => format!("sqlite://{}", work.path().join("ceiling-c.db").display()),
        };

        eprintln!("starting agentd and ceilings (a), (b) and (c)…");
        let agentd = spawn_agentd(
            agentd_bin,
            &agentd_url,
            &apps_dir,
            args.db_max_connections,
            work.path().join("agentd.log"),
            args.auth,
        )
        .await?;
        let ceiling_a = spawn_ceiling(self_bin, "a", args, None, work.path()).await?;
        let ceiling_b = spawn_ceiling(self_bin, "b", args, Some(&ceiling_db), work.path()).await?;
        let ceiling_c =
            spawn_ceiling(self_bin, "c", args, Some(&ceiling_c_url), work.path()).await?;
        eprintln!(
            "  agentd pid {} at {}, ceiling (a) pid {}, (b) pid {}, (c) pid {}; logs in {}",
            agentd.pid,
            agentd.base,
            ceiling_a.pid,
            ceiling_b.pid,
            ceiling_c.pid,
            work.path().display()
        );
        Ok(Env {
            agentd,
            ceiling_a,
            ceiling_b,
            ceiling_c,
            agentd_url,
            agentd_db,
            ceiling_db,
            ceiling_c_url,
            apps_dir,
            work,
            agentd_bin: agentd_bin.to_path_buf(),
            self_bin: self_bin.to_path_buf(),
            args: args.clone(),
        })
    }

    /// Another agentd on the same apps, e.g. one whose database URL goes through a proxy.
    pub async fn extra_agentd(&self, database_url: &str, tag: &str, pool: u32) -> Result<Server> {
        spawn_agentd(
            &self.agentd_bin,
            database_url,
            &self.apps_dir,
            pool,
            self.work.path().join(format!("agentd-{tag}.log")),
            self.args.auth,
        )
        .await
    }

    /// Another ceiling (`mode` b or c) on `database_url`.
    pub async fn extra_ceiling(&self, mode: &str, database_url: &str, pool: u32) -> Result<Server> {
        let dir = self.work.path().join("extra");
        std::fs::create_dir_all(&dir)?;
        let mut args = self.args.clone();
        args.db_max_connections = pool;
        spawn_ceiling(&self.self_bin, mode, &args, Some(database_url), &dir).await
    }

    /// The servers of the run table, in the order each level measures them.
    pub fn measured(&self) -> [&Server; 4] {
        [
            &self.agentd,
            &self.ceiling_a,
            &self.ceiling_b,
            &self.ceiling_c,
        ]
    }

    /// Stops the servers; with `keep_logs`, leaves their logs (and the apps) on disk.
    pub async fn stop(self, keep_logs: bool) {
        self.agentd.stop().await;
        self.ceiling_a.stop().await;
        self.ceiling_b.stop().await;
        self.ceiling_c.stop().await;
        if keep_logs {
            eprintln!("server logs kept in {}", self.work.keep().display());
        }
    }
}

/// One agentd serving one app, for a single-app measurement: the app written under
/// `work/apps`, a fresh database of `backend` (PostgreSQL: `agentd_bench_<tag>` on the admin
/// server; SQLite: a file in `work`), its log in `work`. Returns it and its database URL.
#[allow(clippy::too_many_arguments)]
pub async fn single_app_agentd(
    args: &BenchArgs,
    admin: &Admin,
    agentd_bin: &Path,
    work: &Path,
    backend: Backend,
    tag: &str,
    app: &str,
    yaml: &str,
) -> Result<(Server, String)> {
    let apps = work.join("apps");
    write_app(&apps, app, yaml)?;
    let url = match backend {
        Backend::Postgres => admin.create_database(tag).await?,
        Backend::Sqlite => format!("sqlite://{}", work.join("agentd.db").display()),
    };
    let agentd = spawn_agentd(
        agentd_bin,
        &url,
        &apps,
        args.db_max_connections,
        work.join("agentd.log"),
        false,
    )
    .await?;
    Ok((agentd, url))
}

pub fn write_app(apps_dir: &Path, name: &str, yaml: &str) -> Result<()> {
    let dir = apps_dir.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(dir.join("root_agent.yaml"), yaml)
        .with_context(|| format!("cannot write {}/root_agent.yaml", dir.display()))
}

pub(crate) async fn spawn_agentd(
    bin: &Path,
    database_url: &str,
    apps_dir: &Path,
    db_max_connections: u32,
    log: PathBuf,
    auth: bool,
) -> Result<Server> {
    let mut cmd = Command::new(bin);
    if auth {
        // One admin key for the whole bench (the database is the bench's own).
        if crate::credentials::API_KEY.get().is_none() {
            let out = std::process::Command::new(bin)
                .args([
                    "keys",
                    "create",
                    "--user",
                    "bench",
                    "--admin",
                    "--database-url",
                ])
                .arg(database_url)
                .output()
                .context("cannot run agentd keys create")?;
            anyhow::ensure!(
                out.status.success(),
                "agentd keys create failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let key = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let _ = crate::credentials::API_KEY.set(key);
        }
    }
    cmd.arg("serve")
        // Stopped with SIGTERM when a measurement ends; nothing routes here to drain for.
        .arg("--drain-secs")
        .arg("0")
        .arg("--bind")
        .arg(free_addr()?.to_string())
        .arg("--database-url")
        .arg(database_url)
        .arg("--apps-dir")
        .arg(apps_dir)
        .arg("--db-max-connections")
        .arg(db_max_connections.to_string());
    if auth {
        cmd.arg("--auth").arg("api-key");
    }
    Server::spawn("agentd", cmd, log).await
}

async fn spawn_ceiling(
    self_bin: &Path,
    mode: &str,
    args: &BenchArgs,
    database_url: Option<&str>,
    work: &Path,
) -> Result<Server> {
    let mut cmd = Command::new(self_bin);
    cmd.arg("ceiling")
        .arg("--mode")
        .arg(mode)
        .arg("--bind")
        .arg(free_addr()?.to_string())
        .arg("--chunks")
        .arg(args.chunks.to_string())
        .arg("--db-max-connections")
        .arg(args.db_max_connections.to_string());
    if let Some(url) = database_url {
        cmd.arg("--database-url").arg(url);
    }
    let name = match mode {
        "a" => "ceiling (a)",
        "b" => "ceiling (b)",
        _ => "ceiling (c)",
    };
    Server::spawn(name, cmd, work.join(format!("ceiling-{mode}.log"))).await
}
