//! The same routes in one process on every backend: re-attach, panics, run limits, held replies.

use super::*;
use crate::both_backends;
use agentd::agent::{Agent, AgentResult, AgentTree, InvocationContext, PluginSet};
use async_trait::async_trait;

async fn re_attach_in_one_process_and_bad_input(backend: Backend) {
    let apps = Apps::new().echo("slow", "chunks: 10\nchunk_delay_ms: 50\ncall_tool: lookup");
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, |args| args.apps_dir = dir).await;
    json_with_status(
        s.post_json(
            &format!("/apps/slow/users/{USER}/sessions"),
            json!({"sessionId": "s1"}),
        )
        .await,
        200,
    )
    .await;
    let mut live = Sse::open(
        s.post_json("/run", run_body("slow", "s1", "same process"))
            .await,
    )
    .await;
    let run_id = live.run_id();
    let first = live.next_matching(Msg::is_committed).await;
    let resp = s
        .client
        .get(s.url(&format!("/runs/{run_id}/stream")))
        .header("Last-Event-ID", &first.id)
        .send()
        .await
        .unwrap();
    let mut attached = Sse::open(resp).await;
    let mut original = vec![first];
    original.extend(live.rest().await);
    let again = attached.rest().await;
    assert_eq!(committed(&again), committed(&original)[1..].to_vec());
    assert_eq!(done_of(&again), done_of(&original));

    // Bad input: a clear error, nothing changed.
    let bad = s
        .client
        .get(s.url(&format!("/runs/{run_id}/stream")))
        .header("Last-Event-ID", "seven")
        .send()
        .await
        .unwrap();
    assert_eq!(json_with_status(bad, 422).await["code"], "validation_error");
    let beyond = s.get(&format!("/runs/{run_id}/stream?after=999")).await;
    assert_eq!(
        json_with_status(beyond, 400).await["code"],
        "after_beyond_end"
    );
    let missing = s.get("/runs/run-nope/stream").await;
    assert_eq!(
        json_with_status(missing, 404).await["code"],
        "run_not_found"
    );
    let follow_missing = s
        .get(&format!("/apps/slow/users/{USER}/sessions/nope/stream"))
        .await;
    assert_eq!(
        json_with_status(follow_missing, 404).await["code"],
        "session_not_found"
    );
    let stop = s
        .post_json(
            &format!("/apps/slow/users/{USER}/sessions/s1/cancel"),
            json!({}),
        )
        .await;
    assert_eq!(json_with_status(stop, 409).await["code"], "no_active_run");
    let bad_body = s
        .post_json(
            &format!("/apps/slow/users/{USER}/sessions/s1/cancel"),
            json!({"why": 1}),
        )
        .await;
    assert_eq!(
        json_with_status(bad_body, 422).await["code"],
        "validation_error"
    );
    let nul = s
        .post_json(
            &format!("/apps/slow/users/{USER}/sessions/s1/cancel"),
            json!({"reason": "stop\u{0}"}),
        )
        .await;
    assert_eq!(json_with_status(nul, 422).await["code"], "nul_character");
}

struct Panics;

#[async_trait]
impl Agent for Panics {
    fn name(&self) -> &str {
        "panics"
    }
    fn description(&self) -> &str {
        "panics when asked"
    }
    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        if ctx.user_text().contains("panic") {
            panic!("deliberate panic in an agent");
        }
        ctx.emit(
            ctx.new_event()
                .with_content(agentd::event::Content::text("model", "fine")),
        )
        .await?;
        Ok(())
    }
}

async fn a_panicking_agent_fails_its_run_and_frees_the_session(backend: Backend) {
    let mut apps = agentd::apps::AppRegistry::default();
    apps.insert("p", AgentTree::new(Arc::new(Panics)).expect("tree"));
    let s = TestServer::start_embedded(backend, apps, PluginSet::default()).await;
    let body = |text: &str| {
        json!({"appName": "p", "userId": USER, "sessionId": "s1", "createSession": true,
               "newMessage": {"role": "user", "parts": [{"text": text}]}})
    };
    let msgs = Sse::open(s.post_json("/run", body("please panic")).await)
        .await
        .rest()
        .await;
    assert!(msgs.iter().any(|m| m.event == "error"), "{msgs:#?}");
    assert_eq!(done_of(&msgs)["status"], "failed");
    let msgs = Sse::open(s.post_json("/run", body("and now?")).await)
        .await
        .rest()
        .await;
    assert_eq!(
        done_of(&msgs)["status"],
        "completed",
        "the session is free again"
    );
}

/// `--max-run-secs` is a hard limit even when the client does not read: the run is timed out,
/// sealed and recorded on time, and a re-attach reads its end.
async fn a_client_that_never_reads_does_not_hold_the_run_past_its_limit(backend: Backend) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let apps = Apps::new().echo("big", "chunks: 3000");
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, |args| {
        args.apps_dir = dir;
        args.max_run_secs = 2;
    })
    .await;
    // Several MiB of partial frames: more than the socket buffers hold.
    let body = json!({"appName": "big", "userId": USER, "sessionId": "s1", "createSession": true,
        "newMessage": {"role": "user", "parts": [{"text": "z".repeat(6 * 1024 * 1024)}]}})
    .to_string();
    let addr: std::net::SocketAddr = s.base.trim_start_matches("http://").parse().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut conn = sock.connect(addr).await.unwrap();
    let req = format!(
        "POST /run HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 2048];
    let n = conn.read(&mut head).await.unwrap();
    let head = String::from_utf8_lossy(&head[..n]).to_string();
    let run_id = head
        .lines()
        .find_map(|l| l.strip_prefix("x-agentd-run-id: "))
        .unwrap_or_else(|| panic!("no run id in {head}"))
        .trim()
        .to_string();
    // Never read again. The run must still end on time.
    let deadline = Instant::now() + PATIENCE;
    let record = loop {
        let r = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
        if r["status"] != "running" {
            break r;
        }
        assert!(Instant::now() < deadline, "the run outlived its limit: {r}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(record["status"], "timed_out");
    let end = Sse::open(s.get(&format!("/runs/{run_id}/stream?after=0")).await)
        .await
        .rest()
        .await;
    assert_eq!(done_of(&end)["status"], "timed_out");
    drop(conn);
}

/// An event held back for the run's outcome (`emit_final`) reaches the client within the hold
/// limit when the run goes on without reporting anything: here the agent waits until the
/// client has seen it.
async fn a_held_reply_reaches_the_client_while_the_run_goes_on(backend: Backend) {
    let seen = Arc::new(tokio::sync::Notify::new());
    let agent = WaitsAfterReply { seen: seen.clone() };
    let s = TestServer::start_agent(backend, "held", Arc::new(agent), PluginSet::default()).await;
    let body = json!({"appName": "held", "userId": USER, "sessionId": "s1", "createSession": true,
        "newMessage": {"role": "user", "parts": [{"text": "hi"}]}});
    let mut sse = Sse::open(s.post_json("/run", body).await).await;
    let first = tokio::time::timeout(
        Duration::from_secs(30),
        sse.next_matching(Msg::is_committed),
    )
    .await
    .expect("the held reply never reached the client while its run went on");
    assert_eq!(first.id, "2");
    assert_eq!(first.data["content"]["parts"][0]["text"], "first");
    seen.notify_one();
    let rest = sse.rest().await;
    let committed: Vec<&Msg> = rest.iter().filter(|m| m.is_committed()).collect();
    assert_eq!(committed.len(), 1, "{rest:#?}");
    assert_eq!(committed[0].id, "3");
    assert_eq!(done_of(&rest)["status"], "completed");
    let session = json_with_status(
        s.get(&format!("/apps/held/users/{USER}/sessions/s1")).await,
        200,
    )
    .await;
    let texts: Vec<&str> = session["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["content"]["parts"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["hi", "first", "second"]);
    assert_eq!(session["state"]["replies"], 2, "both deltas stored");
}

/// Reports a final-looking reply, waits until the test saw it, then reports another.
struct WaitsAfterReply {
    seen: Arc<tokio::sync::Notify>,
}

#[async_trait]
impl Agent for WaitsAfterReply {
    fn name(&self) -> &str {
        "waits"
    }
    fn description(&self) -> &str {
        "replies, waits, replies again"
    }
    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        let mut first = ctx
            .new_event()
            .with_content(agentd::event::Content::text("model", "first"));
        first.actions.state_delta.insert("replies".into(), json!(1));
        ctx.emit_final(first).await?;
        // The run's state has the held event's delta at once.
        assert_eq!(ctx.state_get("replies"), Some(json!(1)));
        self.seen.notified().await;
        let mut second = ctx
            .new_event()
            .with_content(agentd::event::Content::text("model", "second"));
        second
            .actions
            .state_delta
            .insert("replies".into(), json!(2));
        ctx.emit_final(second).await
    }
}

both_backends!(
    a_held_reply_reaches_the_client_while_the_run_goes_on,
    a_client_that_never_reads_does_not_hold_the_run_past_its_limit,
    re_attach_in_one_process_and_bad_input,
    a_panicking_agent_fails_its_run_and_frees_the_session,
);
