//! Real `agentd serve` child processes (the built binary) over a test database, and the app
//! folders they serve.
#![allow(dead_code)]

use super::{json_with_status, TestDb};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

pub const PATIENCE: Duration = Duration::from_secs(30);
pub const USER: &str = "u1";

/// App folders written for one test.
pub struct Apps(pub tempfile::TempDir);

impl Apps {
    pub fn new() -> Self {
        Apps(tempfile::tempdir().expect("temp dir"))
    }

    pub fn echo(self, app: &str, fields: &str) -> Self {
        let dir = self.0.path().join(app);
        std::fs::create_dir_all(&dir).expect("app dir");
        let yaml = format!("agent_class: EchoAgent\nname: {app}\n{fields}\n");
        std::fs::write(dir.join("root_agent.yaml"), yaml).expect("agent file");
        self
    }

    /// Writes `app`'s `agentd.yaml` (its server-side settings).
    pub fn settings(self, app: &str, yaml: &str) -> Self {
        let dir = self.0.path().join(app);
        std::fs::create_dir_all(&dir).expect("app dir");
        std::fs::write(dir.join("agentd.yaml"), yaml).expect("settings file");
        self
    }

    /// Writes `app`'s `root_agent.yaml` as given.
    pub fn agent(self, app: &str, yaml: &str) -> Self {
        let dir = self.0.path().join(app);
        std::fs::create_dir_all(&dir).expect("app dir");
        std::fs::write(dir.join("root_agent.yaml"), yaml).expect("agent file");
        self
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// One `agentd serve` child process.
pub struct Replica {
    pub child: tokio::process::Child,
    pub base: String,
    pub client: reqwest::Client,
}

impl Replica {
    pub async fn spawn(db: &TestDb, apps: &Apps, name: &str, extra: &[&str]) -> Replica {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let bind = format!("127.0.0.1:{port}");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
            .arg("serve")
            .args(["--bind", &bind, "--database-url", &db.url])
            .arg("--apps-dir")
            .arg(apps.path())
            .args(["--replica-id", name])
            .args(extra)
            .env("RUST_LOG", "agentd=warn")
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn agentd");
        let r = Replica {
            child,
            base: format!("http://{bind}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .expect("client"),
        };
        let deadline = Instant::now() + PATIENCE;
        while !matches!(r.client.get(r.url("/health")).send().await, Ok(x) if x.status() == 200) {
            assert!(Instant::now() < deadline, "replica {name} never answered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        r
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.expect("GET")
    }

    pub async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("POST")
    }

    pub async fn create_session(&self, app: &str, id: &str) {
        let path = format!("/apps/{app}/users/{USER}/sessions");
        json_with_status(self.post(&path, json!({ "sessionId": id })).await, 200).await;
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running child")
    }

    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success(), "kill {sig} failed");
    }
}
