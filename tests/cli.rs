//! The command line: `agentd healthcheck` (the container's HEALTHCHECK) against a real server.

mod common;

use common::{Backend, TestServer};

fn healthcheck(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .arg("healthcheck")
        .args(args)
        .env_remove("AGENTD_BIND")
        .output()
        .expect("run agentd healthcheck")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_exits_0_for_a_healthy_server_and_1_otherwise() {
    let s = TestServer::start(Backend::Sqlite).await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let base = s.base.clone();
    let ok = tokio::task::spawn_blocking(move || healthcheck(&["--url", &base]))
        .await
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // The same through the listen address, as in the image (0.0.0.0 means loopback).
    let port = addr.rsplit(':').next().unwrap().to_string();
    let bind = format!("0.0.0.0:{port}");
    let ok = tokio::task::spawn_blocking(move || healthcheck(&["--bind", &bind]))
        .await
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let bad =
        tokio::task::spawn_blocking(move || healthcheck(&["--url", &dead, "--timeout-secs", "1"]))
            .await
            .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unhealthy"));
}

/// Every environment variable agentd reads is in docs/configuration.md: each flag's (from the
/// command line's own definition), the model providers', and what the bundled apps' YAML and
/// the log and trace setup read.
#[test]
fn every_environment_variable_is_documented() {
    use clap::CommandFactory;
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .expect("docs/configuration.md");
    fn vars(cmd: &clap::Command, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if let Some(env) = arg.get_env() {
                out.push(env.to_string_lossy().into_owned());
            }
        }
        for sub in cmd.get_subcommands() {
            vars(sub, out);
        }
    }
    let mut read = vec![];
    vars(&agentd::config::Cli::command(), &mut read);
    assert!(read.len() > 40, "the flags' variables: {read:?}");
    read.extend(
        agentd::model::provider_env_vars()
            .iter()
            .map(|v| v.to_string()),
    );
    read.extend(["RUST_LOG", "OTEL_SERVICE_NAME"].map(String::from));
    // `${VAR}` and `${VAR:-default}` in the bundled apps.
    let apps = concat!(env!("CARGO_MANIFEST_DIR"), "/config/apps");
    for app in std::fs::read_dir(apps).expect("config/apps").flatten() {
        for file in std::fs::read_dir(app.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read_to_string(file.path()).unwrap_or_default();
            for (_, rest) in text.match_indices("${").map(|(i, _)| ((), &text[i + 2..])) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    read.push(name);
                }
            }
        }
    }
    let missing: Vec<&String> = read
        .iter()
        .filter(|v| !page.contains(&format!("`{v}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not name these variables: {missing:?}"
    );
}
