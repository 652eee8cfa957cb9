//! What one request can cost in memory, measured on a real `agentd` process by its peak
//! resident size (`VmHWM`): a body of tiny parts on every intake is refused before it is
//! parsed, and reading back a session full of events at the parts limit holds one page at a
//! time. Before these bounds, one 2.9 MiB body of 200,000 one-letter parts took the server
//! from 22 MiB to 744 MiB, and reading such a session back 1.1 GiB.

mod common;

use common::procs::{Apps, Replica, USER};
use common::{Backend, TestDb};
use serde_json::{json, Value};

/// What the server may reach, at its peak, over the whole test.
const CEILING_MIB: u64 = 256;

/// The server's peak resident memory so far, in MiB.
fn peak_mib(r: &Replica) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", r.pid())).expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb / 1024
}

/// `{"text":"a"}` (or with a `type`) repeated to fill about `bytes`.
fn tiny_parts(bytes: usize, part: &str) -> String {
    let n = bytes / (part.len() + 1);
    let mut s = String::with_capacity(bytes + 16);
    s.push('[');
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str(part);
    }
    s.push(']');
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_parts_cost_little_on_every_intake_and_on_every_read() {
    let db = TestDb::new(Backend::Postgres).await;
    let apps = Apps::new().echo("echo", "chunks: 1");
    let r = Replica::spawn(&db, &apps, "mem", &[]).await;
    r.create_session("echo", "s1").await;
    let start = peak_mib(&r);

    // 30 MiB of one-letter parts (just under the 32 MiB body limit) on every intake.
    let size = 30 * 1024 * 1024;
    let text = tiny_parts(size, r#"{"text":"a"}"#);
    let typed = tiny_parts(size, r#"{"type":"text","text":"a"}"#);
    let input = tiny_parts(size, r#"{"type":"input_text","text":"a"}"#);
    let numbers = tiny_parts(size, "1");
    let sessions = format!("/apps/echo/users/{USER}/sessions");
    let intakes: Vec<(String, String)> = vec![
        (
            "/run".into(),
            format!(
                r#"{{"appName":"echo","userId":"{USER}","sessionId":"s1","newMessage":{{"role":"user","parts":{text}}}}}"#
            ),
        ),
        (
            "/run_sse".into(),
            format!(
                r#"{{"appName":"echo","userId":"{USER}","sessionId":"s1","newMessage":{{"role":"user","parts":{text}}}}}"#
            ),
        ),
        (
            format!("{sessions}/s1/runs"),
            format!(r#"{{"newMessage":{{"role":"user","parts":{text}}}}}"#),
        ),
        (
            sessions.clone(),
            format!(
                r#"{{"sessionId":"big","events":[{{"author":"user","content":{{"role":"user","parts":{text}}}}}]}}"#
            ),
        ),
        (
            "/a2a/echo".into(),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{{"message":{{"messageId":"m1","role":"ROLE_USER","parts":{text}}}}}}}"#
            ),
        ),
        (
            "/a2a/echo/message:send".into(),
            format!(r#"{{"message":{{"messageId":"m2","role":"ROLE_USER","parts":{text}}}}}"#),
        ),
        (
            "/apps/echo/chat".into(),
            format!(r#"{{"id":"c1","messages":[{{"id":"m3","role":"user","parts":{typed}}}]}}"#),
        ),
        (
            "/apps/echo/ag-ui".into(),
            format!(
                r#"{{"threadId":"t1","runId":"r1","messages":[{{"id":"m4","role":"user","content":{typed}}}]}}"#
            ),
        ),
        (
            "/v1/chat/completions".into(),
            format!(r#"{{"model":"echo","messages":[{{"role":"user","content":{typed}}}]}}"#),
        ),
        (
            "/v1/responses".into(),
            format!(r#"{{"model":"echo","input":[{{"role":"user","content":{input}}}]}}"#),
        ),
        (
            "/mcp".into(),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"prompt":"x","filler":{numbers}}}}}}}"#
            ),
        ),
    ];
    for (path, body) in intakes {
        let resp = r
            .client
            .post(r.url(&path))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("x-agentd-user-id", USER)
            .body(body)
            .send()
            .await
            .expect("POST");
        let status = resp.status().as_u16();
        let got: String = resp
            .text()
            .await
            .unwrap_or_default()
            .chars()
            .take(300)
            .collect();
        assert_eq!(status, 413, "{path}: {got}");
        assert!(got.contains("body_too_complex"), "{path}: {got}");
        let peak = peak_mib(&r);
        assert!(
            peak < CEILING_MIB,
            "{path}: the server peaked at {peak} MiB (started at {start} MiB)"
        );
    }

    // A session of 600 events at the parts limit (1,000 parts each): 600,000 parts, read back
    // whole, by the newest 1,000, and as a page of 1,000 events.
    let store = db.store().await;
    let event = |i: usize| -> agentd::event::Event {
        serde_json::from_value(json!({"author": "user", "id": format!("ev-{i}"),
            "content": {"role": "user", "parts": (0..1000).map(|_| json!({"text": "a"})).collect::<Vec<Value>>()}}))
        .expect("event")
    };
    store
        .create_session(agentd::store::NewSession {
            app_name: "echo".into(),
            user_id: USER.into(),
            session_id: Some("full".into()),
            events: (0..100).map(event).collect(),
            ..Default::default()
        })
        .await
        .expect("seeded");
    let key = agentd::store::SessionKey::new("echo", USER, "full");
    for i in 100..600 {
        store
            .append_fenced(&key, event(i), vec![], agentd::store::Fence::Unfenced)
            .await
            .expect("appended");
    }
    drop(store);
    let base = format!("{sessions}/full");
    for path in [
        base.clone(),
        format!("{base}?limit=1000"),
        format!("{base}/events?limit=1000"),
    ] {
        let resp = r.get(&path).await;
        assert_eq!(resp.status(), 200, "{path}");
        let body = resp.bytes().await.expect("body");
        assert!(body.len() > 10_000, "{path}: {} bytes", body.len());
        let peak = peak_mib(&r);
        assert!(
            peak < CEILING_MIB,
            "reading {path}: the server peaked at {peak} MiB (started at {start} MiB)"
        );
    }
    let whole: Value =
        serde_json::from_slice(&r.get(&base).await.bytes().await.expect("body")).expect("json");
    assert_eq!(
        whole["events"].as_array().map(Vec::len),
        Some(600),
        "the whole session is all there, streamed page by page"
    );
}
