//! Durable runs: a run outlives the replica that runs it. Real processes, real kills, an LLM
//! app on a scripted model whose tools take seconds (a GET, safe to repeat, and a POST, not):
//! a replica killed mid-call has its runs taken over by another and finished there, the GET
//! run again and the POST answered `interrupted`; a draining replica hands its run over at a
//! commit boundary and its client's stream goes on to the end; a run whose replicas keep dying
//! fails after `--max-resumes`; on SQLite a run in flight at a kill goes on at restart.

use super::*;
use crate::postgres_backends;
use common::model_server::{Reply, ScriptedModel};
use std::sync::atomic::{AtomicUsize, Ordering};

const MODEL: &str = "durable";
/// The scheduled app's model: its replies are queued apart from `desk`'s.
const CRON_MODEL: &str = "durable-cron";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The tools' server: `GET /slow` and `POST /charge`, each taking `ms`, each call counted when
/// it starts (a call the replica died in counts too).
struct ToolApi {
    base: String,
    slow: Arc<AtomicUsize>,
    charge: Arc<AtomicUsize>,
}

impl ToolApi {
    async fn start(ms: u64) -> ToolApi {
        let (slow, charge) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let counter = |n: Arc<AtomicUsize>| {
            move || {
                let n = n.clone();
                async move {
                    n.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    axum::Json(json!({"ok": true}))
                }
            }
        };
        let api = axum::Router::new()
            .route("/slow", axum::routing::get(counter(slow.clone())))
            .route("/charge", axum::routing::post(counter(charge.clone())));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, api).await });
        ToolApi { base, slow, charge }
    }

    fn counts(&self) -> (usize, usize) {
        (
            self.slow.load(Ordering::SeqCst),
            self.charge.load(Ordering::SeqCst),
        )
    }

    /// Until `slow` and `charge` calls have started.
    async fn wait(&self, slow: usize, charge: usize) {
        let deadline = Instant::now() + PATIENCE;
        while self.counts().0 < slow || self.counts().1 < charge {
            assert!(Instant::now() < deadline, "tool calls: {:?}", self.counts());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A webhook receiver that counts the deliveries of each run.
#[derive(Clone, Default)]
struct Hooks(Arc<std::sync::Mutex<Vec<Value>>>);

impl Hooks {
    async fn start(&self) -> String {
        let hooks = self.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                let hooks = hooks.clone();
                async move {
                    hooks.0.lock().unwrap().push(body);
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn of(&self, run: &str) -> Vec<Value> {
        let all = self.0.lock().unwrap();
        all.iter()
            .filter(|d| d["data"]["runId"] == run)
            .cloned()
            .collect()
    }
}

/// `desk` (and `cron`, the same on its own model name): an LLM agent with `lookup` (GET) and
/// `charge` (POST); `echo` beside them.
fn apps(model: &ScriptedModel, api: &ToolApi) -> Apps {
    let tool = |name: &str, method: &str, path: &str| {
        format!(
            "  - name: HttpTool\n    args:\n      name: {name}\n      description: {name}.\n\
             \x20     method: {method}\n      url: {}{path}\n      allow_private: [\"127.0.0.1\"]\n",
            api.base
        )
    };
    let yaml = |name: &str, model_name: &str| {
        format!(
            "agent_class: LlmAgent\nname: {name}\nmodel: openai/{model_name}\n\
             model_options:\n  base_url: {}\n  retry_backoff_ms: 5\n\
             instruction: Help.\ntools:\n{}{}",
            model.base_url,
            tool("lookup", "GET", "/slow"),
            tool("charge", "POST", "/charge"),
        )
    };
    Apps::new()
        .agent("desk", &yaml("desk", MODEL))
        .agent("cron", &yaml("cron", CRON_MODEL))
        .echo("echo", "chunks: 1")
}

fn message(text: &str) -> Value {
    json!({"role": "user", "parts": [{"text": text}]})
}

/// The function responses of `events` by tool name.
fn responses<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events
        .iter()
        .flat_map(|e| e["content"]["parts"].as_array().into_iter().flatten())
        .filter(|p| p["functionResponse"]["name"] == name)
        .map(|p| &p["functionResponse"]["response"])
        .collect()
}

/// The session's events are one whole invocation: every call answered, nothing aborted.
fn assert_whole(events: &[Value]) {
    assert!(unanswered_calls(events).is_empty(), "{events:#?}");
    assert!(
        events.iter().all(|e| e["errorCode"].is_null()),
        "nothing aborted: {events:#?}"
    );
    let invocations: std::collections::BTreeSet<&str> = events
        .iter()
        .filter_map(|e| e["invocationId"].as_str())
        .collect();
    assert_eq!(invocations.len(), 1, "one invocation: {events:#?}");
}

/// `kill -9` of the replica running four runs (a background run with a webhook, a streamed
/// run, an A2A task and a scheduled run) while they are in their tool calls: the other replica
/// takes them over and finishes them. The client re-attaches there and sees one run end once; the A2A task
/// completes; the GET tool ran again, the POST tool did not (the model is told its effect is
/// unknown); one webhook delivery.
async fn a_run_goes_on_when_its_replica_is_killed(backend: Backend) {
    let model = ScriptedModel::start().await;
    let api = ToolApi::start(3000).await;
    let hooks = Hooks::default();
    let hook_url = hooks.start().await;
    let calls = [("c1", "lookup", "{}"), ("c2", "charge", "{}")];
    for _ in 0..3 {
        model.push(MODEL, Reply::tool_calls(&calls));
    }
    for _ in 0..3 {
        model.push(MODEL, Reply::text(&["all ", "done"]));
    }
    model.push(CRON_MODEL, Reply::tool_calls(&calls));
    model.push(CRON_MODEL, Reply::text(&["all ", "done"]));
    let db = TestDb::new(backend).await;
    let apps = apps(&model, &api);
    let flags = [
        "--run-lease-secs",
        "2",
        "--webhook-allow-private",
        "127.0.0.1",
        "--schedule-poll-ms",
        "100",
        "--schedule-min-interval-secs",
        "1",
    ];
    let mut a = Replica::spawn(&db, &apps, "a", &flags).await;
    // B fires no schedule: the scheduled run starts on A.
    let b = Replica::spawn(
        &db,
        &apps,
        "b",
        &[&flags[..], &["--scheduler", "false"][..]].concat(),
    )
    .await;
    let scheduled = scheduled_run(&a).await;
    a.create_session("desk", "s1").await;
    a.create_session("desk", "s2").await;
    let started = json_with_status(
        a.post(
            &format!("/apps/desk/users/{USER}/sessions/s1/runs"),
            json!({"newMessage": message("in the background"),
                   "webhook": {"url": hook_url, "secret": SECRET}}),
        )
        .await,
        202,
    )
    .await;
    let background = started["runId"].as_str().expect("runId").to_string();
    let mut streamed = Sse::open(a.post("/run", run_body("desk", "s2", "streamed")).await).await;
    let streamed_id = streamed.run_id();
    // An A2A task, answered at once while it works.
    let sent = a
        .client
        .post(a.url("/a2a/desk"))
        .header("x-agentd-user-id", USER)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": {"messageId": "m-a2a", "role": "ROLE_USER", "parts": [{"text": "as a task"}]},
            "configuration": {"returnImmediately": true}}}))
        .send()
        .await
        .expect("SendMessage");
    let sent = json_with_status(sent, 200).await;
    let task = sent["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {sent}"))
        .to_string();
    api.wait(4, 4).await;
    let seen = committed(&[streamed.next_matching(Msg::is_committed).await]);

    a.child.start_kill().expect("kill -9");
    a.child.wait().await.expect("A exits");

    // The client re-attaches on B after what it had, and sees the run to its end.
    let path = format!("/runs/{streamed_id}/stream");
    let req = b
        .client
        .get(b.url(&path))
        .header("last-event-id", seen[0].0.to_string());
    let mut again = Sse::open(req.send().await.expect("GET")).await;
    let rest = again.rest().await;
    assert_eq!(done_of(&rest)["status"], "completed", "{rest:#?}");
    for run in [&background, &streamed_id, &task, &scheduled.0] {
        let ended =
            json_with_status(b.post(&format!("/runs/{run}/wait"), json!({})).await, 200).await;
        assert_eq!(ended["status"], "completed", "{ended}");
        assert_eq!(ended["resumes"], 1, "{ended}");
        assert_eq!(ended["resumed"][0]["from"], "a");
        assert_eq!(ended["resumed"][0]["to"], "b");
        assert_eq!(ended["resumed"][0]["reason"], "replica_lost");
        assert_eq!(ended["owner"], "b");
    }
    assert_eq!(
        api.counts(),
        (8, 4),
        "lookup (GET) ran again, charge (POST) did not"
    );
    // The A2A task is one task that completed, seen from the other replica.
    let got = b
        .client
        .post(b.url("/a2a/desk"))
        .header("x-agentd-user-id", USER)
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task}}))
        .send()
        .await
        .expect("GetTask");
    let got = json_with_status(got, 200).await;
    assert_eq!(
        got["result"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{got}"
    );
    for (app, session) in [
        ("desk", "s1"),
        ("desk", "s2"),
        ("cron", scheduled.1.as_str()),
    ] {
        let events = events_of(&b, app, session).await;
        assert_whole(&events);
        let charged = responses(&events, "charge");
        assert_eq!(charged.len(), 1, "{events:#?}");
        assert_eq!(charged[0]["error"], "interrupted");
        let looked = responses(&events, "lookup");
        assert_eq!(looked.len(), 1, "{events:#?}");
        assert_eq!(looked[0]["ok"], true, "the repeated call's own answer");
    }
    // The model that went on was told: its request holds the interrupted answer.
    let told = [MODEL, CRON_MODEL]
        .iter()
        .flat_map(|m| model.requests_for(m))
        .filter(|r| r.to_string().contains("its effect is unknown"))
        .count();
    assert_eq!(told, 4, "every taken-over run told the model");
    assert_eq!(model.unused(), 0, "no model call more than the script");
    // One end, one webhook.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let delivered = hooks.of(&background);
    assert_eq!(delivered.len(), 1, "{delivered:#?}");
    assert_eq!(delivered[0]["type"], "run.completed");
}

/// A schedule of `cron` on `a` that fires once (paused after its first tick): that tick's run
/// id and session.
async fn scheduled_run(a: &Replica) -> (String, String) {
    let path = format!("/apps/cron/users/{USER}/schedules");
    let created = json_with_status(
        a.post(
            &path,
            json!({"cron": "*/2 * * * * *", "message": "on schedule", "session": "new"}),
        )
        .await,
        201,
    )
    .await;
    let id = created["id"].as_str().expect("schedule id").to_string();
    let deadline = Instant::now() + PATIENCE;
    let run = loop {
        let page = json_with_status(a.get(&format!("{path}/{id}/runs")).await, 200).await;
        if let Some(run) = page["ticks"][0]["runId"].as_str() {
            break run.to_string();
        }
        assert!(Instant::now() < deadline, "no tick fired: {page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let paused = a
        .client
        .patch(a.url(&format!("{path}/{id}")))
        .json(&json!({"enabled": false}))
        .send()
        .await
        .expect("PATCH");
    json_with_status(paused, 200).await;
    let page = json_with_status(a.get(&format!("{path}/{id}/runs")).await, 200).await;
    assert_eq!(
        page["ticks"].as_array().map(Vec::len),
        Some(1),
        "one tick before the pause: {page}"
    );
    // The tick names its run when it is claimed; the run exists once it is admitted.
    let record = loop {
        let resp = a.get(&format!("/apps/cron/users/{USER}/runs/{run}")).await;
        if resp.status() == 200 {
            break resp.json::<Value>().await.expect("JSON");
        }
        assert!(Instant::now() < deadline, "the tick's run never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let session = record["sessionId"].as_str().expect("session").to_string();
    (run, session)
}

/// SIGTERM with another replica live: the run still in its tool call at the end of the drain
/// is handed over when the call's answer is committed (the call is not run again), the other
/// replica finishes it, and the client's stream on the draining replica goes on to `done:
/// completed` with the whole answer.
async fn a_draining_replica_hands_its_run_over(backend: Backend) {
    let model = ScriptedModel::start().await;
    let api = ToolApi::start(3000).await;
    model.push(MODEL, Reply::tool_calls(&[("c1", "lookup", "{}")]));
    model.push(MODEL, Reply::text(&["handed ", "over"]));
    let db = TestDb::new(backend).await;
    let apps = apps(&model, &api);
    let a = Replica::spawn(
        &db,
        &apps,
        "a",
        &[
            "--run-lease-secs",
            "2",
            "--drain-secs",
            "1",
            "--shutdown-grace-secs",
            "20",
        ],
    )
    .await;
    let mut a = a;
    let b = Replica::spawn(&db, &apps, "b", &["--run-lease-secs", "2"]).await;
    a.create_session("desk", "s1").await;
    let mut on_a = Sse::open(a.post("/run", run_body("desk", "s1", "drain me")).await).await;
    let run_id = on_a.run_id();
    api.wait(1, 0).await;
    a.signal("-TERM");
    let rest = on_a.rest().await;
    assert_eq!(done_of(&rest)["status"], "completed", "{rest:#?}");
    let texts: String = rest
        .iter()
        .filter(|m| m.is_committed())
        .flat_map(|m| {
            m.data["content"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(texts, "handed over", "{rest:#?}");
    assert_eq!(api.counts(), (1, 0), "the call was not run again");
    let record = json_with_status(b.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(record["status"], "completed");
    assert_eq!(record["owner"], "b");
    assert_eq!(record["resumed"][0]["reason"], "drain", "{record}");
    assert_whole(&events_of(&b, "desk", "s1").await);
    let exited = a.child.wait().await.expect("A exits");
    assert!(exited.success(), "{exited:?}");
}

/// A run whose replicas keep dying under it (killed here, as a poison run kills them) is
/// resumed `--max-resumes` times, then failed by the next replica without running it, with
/// `MAX_RESUMES_EXCEEDED`; that replica serves on.
async fn a_run_that_keeps_killing_its_replicas_fails(backend: Backend) {
    let model = ScriptedModel::start().await;
    let api = ToolApi::start(60_000).await;
    model.push(MODEL, Reply::tool_calls(&[("c1", "lookup", "{}")]));
    let db = TestDb::new(backend).await;
    let apps = apps(&model, &api);
    let flags = ["--run-lease-secs", "2", "--max-resumes", "1"];
    let mut replicas = vec![];
    for name in ["a", "b", "c"] {
        replicas.push((name, Replica::spawn(&db, &apps, name, &flags).await));
    }
    replicas[0].1.create_session("desk", "s1").await;
    let started = json_with_status(
        replicas[0]
            .1
            .post(
                &format!("/apps/desk/users/{USER}/sessions/s1/runs"),
                json!({"newMessage": message("poison")}),
            )
            .await,
        202,
    )
    .await;
    let run_id = started["runId"].as_str().expect("runId").to_string();
    // Kill whoever runs it, twice.
    for round in 1..=2 {
        api.wait(round, 0).await;
        let owner = loop {
            let probe = &replicas.last().expect("a replica").1;
            let r = json_with_status(probe.get(&format!("/runs/{run_id}")).await, 200).await;
            let owner = r["owner"].as_str().unwrap_or_default().to_string();
            if r["resumes"].as_i64().unwrap_or(0) == round as i64 - 1 {
                break owner;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let i = replicas
            .iter()
            .position(|(n, _)| *n == owner)
            .expect("a live owner");
        let (_, mut dying) = replicas.remove(i);
        dying.child.start_kill().expect("kill -9");
        dying.child.wait().await.expect("exits");
        if round == 1 {
            // The next owner has started the call again before it is killed in turn.
            api.wait(2, 0).await;
        }
    }
    let (_, last) = &replicas[0];
    let ended = json_with_status(
        last.post(&format!("/runs/{run_id}/wait"), json!({})).await,
        200,
    )
    .await;
    assert_eq!(ended["status"], "failed", "{ended}");
    assert!(
        ended["error"]
            .as_str()
            .is_some_and(|e| e.contains("--max-resumes 1")),
        "{ended}"
    );
    let events = events_of(last, "desk", "s1").await;
    assert!(unanswered_calls(&events).is_empty(), "{events:#?}");
    assert_eq!(
        events.last().expect("events")["errorCode"],
        agentd::runner::MAX_RESUMES_EXCEEDED
    );
    assert_eq!(api.counts().0, 2, "not run a third time");
    // The replica that failed it serves on.
    json_with_status(last.get("/health").await, 200).await;
    last.create_session("echo", "s2").await;
    let next = Sse::open(
        last.post("/run", run_body("echo", "s2", "still here"))
            .await,
    )
    .await
    .rest()
    .await;
    assert_eq!(done_of(&next)["status"], "completed");
}

postgres_backends!(
    a_run_goes_on_when_its_replica_is_killed,
    a_draining_replica_hands_its_run_over,
    a_run_that_keeps_killing_its_replicas_fails,
);

/// SQLite has one process: a run in flight when it is killed goes on when it starts again
/// (with the same replica id at once; with another, once the old one's lease is over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_a_run_goes_on_after_a_restart() {
    let model = ScriptedModel::start().await;
    let api = ToolApi::start(3000).await;
    model.push(MODEL, Reply::tool_calls(&[("c1", "lookup", "{}")]));
    model.push(MODEL, Reply::text(&["after ", "the restart"]));
    let db = TestDb::sqlite().await;
    let apps = apps(&model, &api);
    let flags = ["--run-lease-secs", "2"];
    let mut first = Replica::spawn(&db, &apps, "one", &flags).await;
    first.create_session("desk", "s1").await;
    let started = json_with_status(
        first
            .post(
                &format!("/apps/desk/users/{USER}/sessions/s1/runs"),
                json!({"newMessage": message("survive")}),
            )
            .await,
        202,
    )
    .await;
    let run_id = started["runId"].as_str().expect("runId").to_string();
    api.wait(1, 0).await;
    first.child.start_kill().expect("kill -9");
    first.child.wait().await.expect("exits");

    let again = Replica::spawn(&db, &apps, "one", &flags).await;
    let ended = json_with_status(
        again.post(&format!("/runs/{run_id}/wait"), json!({})).await,
        200,
    )
    .await;
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(ended["resumed"][0]["reason"], "restart", "{ended}");
    assert_eq!(api.counts(), (2, 0), "the GET ran again");
    assert_whole(&events_of(&again, "desk", "s1").await);
}
