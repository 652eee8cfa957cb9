//! `GET /metrics`: the Prometheus text exposition, parsed line by line, and its counters move
//! after a run. Label values stay bounded: no user or session id appears.

mod common;

use common::sse_client::read_all;
use common::{json_with_status, Backend, TestServer};
use serde_json::json;
use std::collections::BTreeMap;

type Samples = BTreeMap<String, f64>;

/// Parses the text format strictly: `# HELP`/`# TYPE` comments, then
/// `name{label="value",…} number` samples. Keys are `name{labels}` with labels sorted.
fn parse(text: &str) -> Samples {
    let mut out = Samples::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment: {line}");
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in: {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (
                n,
                rest.strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels: {line}")),
            ),
            None => (series, ""),
        };
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && !name.starts_with(|c: char| c.is_ascii_digit()),
            "bad metric name: {line}"
        );
        let mut pairs = vec![];
        let mut rest = labels;
        while !rest.is_empty() {
            let (k, after) = rest
                .split_once("=\"")
                .unwrap_or_else(|| panic!("bad label: {line}"));
            let end = after
                .find('"')
                .unwrap_or_else(|| panic!("unclosed label value: {line}"));
            pairs.push(format!(
                "{}=\"{}\"",
                k.trim_start_matches(','),
                &after[..end]
            ));
            rest = &after[end + 1..];
        }
        pairs.sort();
        out.insert(format!("{name}{{{}}}", pairs.join(",")), value);
    }
    out
}

async fn scrape(s: &TestServer) -> (Samples, String) {
    let resp = s.get("/metrics").await;
    assert_eq!(resp.status(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/plain"), "{ct}");
    let text = resp.text().await.unwrap();
    (parse(&text), text)
}

fn get(samples: &Samples, key: &str) -> f64 {
    samples.get(key).copied().unwrap_or(0.0)
}

async fn counters_move_after_a_run(backend: Backend) {
    let s = TestServer::start(backend).await;
    let (before, _) = scrape(&s).await;
    let session = format!("sess-{}", uuid::Uuid::new_v4().simple());
    let msgs = read_all(
        s.post_json(
            "/run",
            json!({"appName": "echo", "userId": "user-secret-id", "sessionId": session,
                   "createSession": true,
                   "newMessage": {"role": "user", "parts": [{"text": "count me"}]}}),
        )
        .await,
    )
    .await;
    assert_eq!(msgs.last().unwrap().data["status"], "completed");
    json_with_status(s.get("/health").await, 200).await;
    let (after, text) = scrape(&s).await;

    let delta = |key: &str| get(&after, key) - get(&before, key);
    assert!(
        delta(r#"agentd_http_requests_total{method="POST",route="/run",status="200"}"#) >= 1.0,
        "{text}"
    );
    assert!(
        delta(r#"agentd_http_requests_total{method="GET",route="/health",status="200"}"#) >= 1.0
    );
    assert!(
        delta(r#"agentd_runs_started_total{app="echo"}"#) >= 1.0,
        "{text}"
    );
    assert!(delta(r#"agentd_runs_finished_total{app="echo",status="completed"}"#) >= 1.0);
    assert!(delta(r#"agentd_run_duration_seconds_count{app="echo",status="completed"}"#) >= 1.0);
    assert!(delta(r#"agentd_run_time_to_first_event_seconds_count{app="echo"}"#) >= 1.0);
    assert!(
        delta("agentd_events_committed_total{}") >= 2.0,
        "user event and reply"
    );
    assert!(delta("agentd_commit_duration_seconds_count{}") >= 2.0);
    assert!(after
        .keys()
        .any(|k| k.starts_with("agentd_commit_duration_seconds_bucket{le=")));
    assert!(
        after.contains_key(r#"agentd_db_pool_connections{state="idle"}"#),
        "{text}"
    );
    assert!(after.contains_key("agentd_open_streams{}"));
    assert!(get(&after, "agentd_open_streams{}") >= 0.0);
    // Bounded labels: route templates, never raw paths or ids.
    assert!(
        !text.contains("user-secret-id") && !text.contains(&session),
        "{text}"
    );
    let sessions = format!("/apps/echo/users/user-secret-id/sessions/{session}");
    json_with_status(s.get(&sessions).await, 200).await;
    let (_, text) = scrape(&s).await;
    assert!(
        text.contains(r#"route="/apps/{app}/users/{user}/sessions/{session_id}""#)
            || text.contains("route=\"/apps/{app}/users/{user}/sessions/"),
        "{text}"
    );
    assert!(!text.contains("user-secret-id"));
}

both_backends!(counters_move_after_a_run);
