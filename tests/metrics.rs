//! `GET /metrics`: the Prometheus text exposition, parsed line by line, and its counters move
//! after a run. Label values stay bounded: no user or session id appears, and a client's
//! method name is never a label of its own. The recorder's upkeep runs with nobody scraping.

mod common;

use common::sse_client::{read_all, Sse};
use common::{json_with_status, Backend, TestServer};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

type Samples = BTreeMap<String, f64>;

/// The tests of this file, one at a time: the metrics recorder is one per process, shared by
/// every server in it, so `agentd_open_streams` counts the streams of every test running.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// Scrapes until `agentd_open_streams` reads `want` (a stream is counted until the server
/// drops its body, just after the client has read its end); fails after a generous wait.
async fn open_streams_reach(s: &TestServer, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (samples, text) = scrape(s).await;
        let got = samples.get("agentd_open_streams{}").copied();
        if got == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "agentd_open_streams never read {want} (last: {got:?}):\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn counters_move_after_a_run(backend: Backend) {
    let _alone = ONE_AT_A_TIME.lock().await;
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
    // The run's stream has ended: none is open.
    open_streams_reach(&s, 0.0).await;
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

    // A session follower is an open stream while it lasts; it ends when its session is
    // deleted, and the gauge comes back down.
    let follow = format!("{sessions}/stream");
    let mut follower = Sse::open(s.get(&follow).await).await;
    open_streams_reach(&s, 1.0).await;
    json_with_status(s.delete(&sessions).await, 200).await;
    follower.rest().await; // returns once the server has ended the stream
    open_streams_reach(&s, 0.0).await;
}

both_backends!(counters_move_after_a_run);

/// The metrics middleware runs before authentication and hyper accepts any method token up
/// to the size of the request head, so a method name is anyone's input: unusual ones (here
/// five short ones and one of 30 KB) must all be counted under `method="other"`, never as
/// series of their own, which would grow the process's memory and every `/metrics` answer
/// for good.
async fn unusual_methods_are_counted_as_other(backend: Backend) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let s = TestServer::start(backend).await;
    let (before, _) = scrape(&s).await;
    let long = format!("LONGMETHOD{}", "X".repeat(30_000));
    let mut names: Vec<String> = (1..=5).map(|i| format!("FOOMETHOD{i}")).collect();
    names.push(long);
    for (i, name) in names.iter().enumerate() {
        let method = reqwest::Method::from_bytes(name.as_bytes()).expect("a valid method token");
        // A route that exists (405) and one that does not (404): the middleware counts both,
        // whatever the door then decides.
        let path = if i % 2 == 0 {
            "/health"
        } else {
            "/no/such/route"
        };
        let resp = s
            .client
            .request(method, s.url(path))
            .send()
            .await
            .expect("request with an unusual method");
        assert!(
            resp.status().is_client_error(),
            "{:.20} {path}: {}",
            name,
            resp.status()
        );
    }
    let (after, text) = scrape(&s).await;

    for name in &names {
        let head = &name[..name.len().min(12)];
        assert!(
            !text.contains(head),
            "the method {head}… became a label:\n{text:.2000}"
        );
    }
    // Every method label in the whole exposition is one of the bounded set.
    let allowed = [
        "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "other",
    ];
    for key in after.keys() {
        if let Some((_, rest)) = key.split_once("method=\"") {
            let value = rest.split('"').next().unwrap_or("");
            assert!(
                allowed.contains(&value),
                "unbounded method label: {key:.200}"
            );
        }
    }
    let other = |samples: &Samples, metric: &str| -> f64 {
        samples
            .iter()
            .filter(|(k, _)| {
                k.starts_with(&format!("{metric}{{")) && k.contains(r#"method="other""#)
            })
            .map(|(_, v)| *v)
            .sum()
    };
    let counted =
        other(&after, "agentd_http_requests_total") - other(&before, "agentd_http_requests_total");
    assert!(
        counted >= names.len() as f64,
        "{counted} requests counted as method=\"other\", expected {}:\n{text}",
        names.len()
    );
    let timed = other(&after, "agentd_http_request_duration_seconds_count")
        - other(&before, "agentd_http_request_duration_seconds_count");
    assert!(
        timed >= names.len() as f64,
        "{timed} timed as other:\n{text}"
    );
}

both_backends!(unusual_methods_are_counted_as_other);

/// Histogram samples wait in the recorder until upkeep or a scrape drains them; agentd
/// installs the recorder without the exporter's own upkeep task, so each server runs one
/// (`agentd::metrics::spawn_upkeep`). Memory cannot be observed reliably from here, and no
/// scrape shows whether upkeep ran (a scrape drains the samples itself), so this checks the
/// process-wide pass counter: it moves within a few periods with nobody scraping, and stops
/// moving once the server has shut down (the task ends with its server). The counter is
/// shared by every server in the process; `ONE_AT_A_TIME` keeps this file's other servers
/// out meanwhile (each test's runtime, and its tasks, end with the test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upkeep_runs_without_a_scrape_and_stops_with_the_server() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let mut s = TestServer::start(Backend::Sqlite).await;
    let every = agentd::metrics::UPKEEP_EVERY;
    let started = agentd::metrics::upkeep_runs();
    // Record a few histogram samples (request durations), and never scrape.
    for _ in 0..3 {
        json_with_status(s.get("/health").await, 200).await;
    }
    let deadline = Instant::now() + every * 3;
    while agentd::metrics::upkeep_runs() == started {
        assert!(
            Instant::now() < deadline,
            "no upkeep pass in {:?} without a scrape",
            every * 3
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let server = s.server.take().expect("the server is running");
    server
        .shutdown(Duration::from_secs(5))
        .await
        .expect("the server shuts down");
    // A pass that had already begun when the server stopped may still count itself.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopped = agentd::metrics::upkeep_runs();
    tokio::time::sleep(every + Duration::from_secs(1)).await;
    assert_eq!(
        agentd::metrics::upkeep_runs(),
        stopped,
        "an upkeep task outlived its server"
    );
}
