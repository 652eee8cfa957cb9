//! The spans a real `agentd serve` keeps for ADK's web UI (`/dev/apps/{app}/debug/trace/…`):
//! their shape, bounds and who sees them, and the web UI's Trace tab and an event's request
//! and response in headless Chromium.

use super::*;
use std::time::Instant;

const WEATHER: &str = "weather";

/// `agentd serve` on SQLite with the app `weather` (an LLM agent over the scripted model with
/// an HTTP tool `get_weather`), and `extra` flags.
struct Served {
    child: tokio::process::Child,
    base: String,
    /// Sent as `Authorization: Bearer` when set.
    key: Option<String>,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

/// A fresh SQLite database's folder and URL.
fn database() -> (tempfile::TempDir, String) {
    let data = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/a.db", data.path().display());
    (data, url)
}

impl Served {
    async fn start(model: &ScriptedModel, tool: &str, extra: &[&str]) -> Served {
        Self::start_on(database(), model, tool, extra).await
    }

    async fn start_on(
        (data, url): (tempfile::TempDir, String),
        model: &ScriptedModel,
        tool: &str,
        extra: &[&str],
    ) -> Served {
        let apps = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(apps.path().join(WEATHER)).expect("app dir");
        std::fs::write(
            apps.path().join(WEATHER).join("root_agent.yaml"),
            format!(
                "name: forecaster\nmodel: openai/trace-model\nmodel_options:\n  base_url: {}\n\
                 instruction: Report the weather.\ntools:\n  - name: HttpTool\n    args:\n\
                 \x20     name: get_weather\n      url: {tool}/weather\n\
                 \x20     allow_private: [\"127.0.0.1\"]\n",
                model.base_url
            ),
        )
        .expect("agent file");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let base = format!("http://127.0.0.1:{port}");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
            .arg("serve")
            .args(["--drain-secs", "0", "--bind", &format!("127.0.0.1:{port}")])
            .arg("--database-url")
            .arg(&url)
            .arg("--apps-dir")
            .arg(apps.path())
            .args(extra)
            .env("OPENAI_API_KEY", "test-key")
            .env("RUST_LOG", "agentd=warn")
            .kill_on_drop(true)
            .spawn()
            .expect("agentd starts");
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(client.get(format!("{base}/health")).send().await, Ok(r) if r.status() == 200)
        {
            assert!(Instant::now() < deadline, "agentd never answered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Served {
            child,
            base,
            key: None,
            _dirs: (apps, data),
        }
    }

    /// The same server, called with `key`.
    fn with_key(&mut self, key: &str) -> &Self {
        self.key = Some(key.to_string());
        self
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.key {
            Some(k) => req.bearer_auth(k),
            None => req,
        }
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.authed(reqwest::Client::new().get(format!("{}{path}", self.base)))
            .send()
            .await
            .expect("GET")
    }

    /// One run in `session` ("Weather?") as [`USER`]: the events it answered.
    async fn run(&self, session: &str) -> Vec<Value> {
        self.run_as(USER, session).await
    }

    async fn run_as(&self, user: &str, session: &str) -> Vec<Value> {
        let r = self
            .authed(reqwest::Client::new().post(format!("{}/run", self.base)))
            .header("accept", "application/json")
            .json(
                &json!({"appName": WEATHER, "userId": user, "sessionId": session,
                "createSession": true,
                "newMessage": {"role": "user", "parts": [{"text": "Weather?"}]}}),
            )
            .send()
            .await
            .expect("POST /run");
        let events = json_with_status(r, 200).await;
        events.as_array().cloned().unwrap_or_default()
    }

    /// The session's trace once its run's span has closed (a run's span closes last, a moment
    /// after its stream ended).
    async fn settled_trace(&self, session: &str) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans = self.session_trace(session).await;
            if !named(&spans, "invocation").is_empty() {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "the run's span never closed: {spans:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn session_trace(&self, session: &str) -> Vec<Value> {
        let path = format!("/dev/apps/{WEATHER}/debug/trace/session/{session}");
        let v = json_with_status(self.get(&path).await, 200).await;
        v.as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// The tool's endpoint.
async fn weather_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = axum::Router::new().route(
        "/weather",
        axum::routing::get(|| async { axum::Json(json!({"temperature": 21})) }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn push_run(m: &ScriptedModel) {
    m.push(
        "trace-model",
        Reply::tool_calls(&[("w1", "get_weather", "{}")]).with_usage(json!({
            "prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14})),
    );
    m.push("trace-model", Reply::text(&["It is ", "21 degrees."]));
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// A run's spans as ADK's dev server answers them: one trace, the invocation at its root,
/// the agent under it, both model calls and the tool call under the agent, each model call
/// tied to the event it made, with its request and response; the event's own trace; and
/// nothing for an event or session without spans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_spans_are_kept_in_adks_shape() {
    let m = ScriptedModel::start().await;
    let tool = weather_endpoint().await;
    let s = Served::start(&m, &tool, &["--trace-spans", "1000"]).await;
    push_run(&m);
    let events = s.run("s1").await;
    let calling = events
        .iter()
        .find(|e| e["content"]["parts"][0]["functionCall"].is_object())
        .expect("the model's tool call event");
    let answer = events.last().expect("the final answer");
    assert!(answer.to_string().contains("21 degrees"), "{answer}");

    let spans = s.settled_trace("s1").await;
    let invocation = named(&spans, "invocation");
    assert_eq!(invocation.len(), 1, "{spans:?}");
    let root = invocation[0];
    assert_eq!(root["parent_span_id"], Value::Null, "{root}");
    assert_eq!(root["attributes"]["gen_ai.conversation.id"], "s1");
    assert_eq!(root["attributes"]["user.id"], USER);
    let invocation_id = answer["invocationId"].clone();
    assert_eq!(
        root["attributes"]["gcp.vertex.agent.invocation_id"],
        invocation_id
    );
    for s in &spans {
        assert_eq!(s["trace_id"], root["trace_id"], "one trace per run: {s}");
        assert!(
            s["span_id"].as_u64().is_some_and(|i| i > 0 && i < 1 << 53),
            "{s}"
        );
        assert!(s["end_time"].as_u64() >= s["start_time"].as_u64(), "{s}");
        assert_eq!(s["logs"], json!([]), "{s}");
    }
    let agent = named(&spans, "invoke_agent forecaster");
    assert_eq!(agent.len(), 1, "{spans:?}");
    assert_eq!(agent[0]["parent_span_id"], root["span_id"]);
    assert_eq!(
        agent[0]["attributes"]["gen_ai.operation.name"],
        "invoke_agent"
    );
    assert_eq!(agent[0]["attributes"]["gen_ai.conversation.id"], "s1");

    let calls = named(&spans, "generate_content trace-model");
    assert_eq!(calls.len(), 2, "{spans:?}");
    let made: Vec<&Value> = calls
        .iter()
        .map(|c| &c["attributes"]["gcp.vertex.agent.event_id"])
        .collect();
    assert_eq!(made, vec![&calling["id"], &answer["id"]], "{calls:?}");
    for c in &calls {
        assert_eq!(c["parent_span_id"], agent[0]["span_id"], "{c}");
        let a = &c["attributes"];
        assert_eq!(a["gen_ai.operation.name"], "generate_content");
        assert_eq!(a["gcp.vertex.agent.invocation_id"], invocation_id);
        assert_eq!(a["gen_ai.request.model"], "trace-model");
        let request: Value =
            serde_json::from_str(a["gcp.vertex.agent.llm_request"].as_str().unwrap_or(""))
                .expect("the request as JSON text");
        assert_eq!(
            request["config"]["system_instruction"]
                .as_str()
                .map(|s| s.contains("Report the weather.")),
            Some(true),
            "{request}"
        );
        assert_eq!(
            request["contents"][0]["parts"][0]["text"], "Weather?",
            "{request}"
        );
        assert!(a["gcp.vertex.agent.llm_response"].is_string(), "{a}");
    }
    assert_eq!(calls[0]["attributes"]["gen_ai.usage.input_tokens"], 11);
    let response: Value = serde_json::from_str(
        calls[1]["attributes"]["gcp.vertex.agent.llm_response"]
            .as_str()
            .unwrap_or(""),
    )
    .expect("the response as JSON text");
    assert_eq!(
        response["content"]["parts"][0]["text"], "It is 21 degrees.",
        "{response}"
    );
    let tool_span = named(&spans, "execute_tool get_weather");
    assert_eq!(tool_span.len(), 1, "{spans:?}");
    assert_eq!(tool_span[0]["attributes"]["gen_ai.tool.call.id"], "w1");
    assert_eq!(tool_span[0]["parent_span_id"], agent[0]["span_id"]);

    let responses = events
        .iter()
        .find(|e| e["content"]["parts"][0]["functionResponse"].is_object())
        .expect("the tool's response event");
    assert_eq!(
        tool_span[0]["attributes"]["gcp.vertex.agent.event_id"],
        responses["id"]
    );
    assert_eq!(
        tool_span[0]["attributes"]["gen_ai.agent.name"],
        "forecaster"
    );

    // The shape ADK's own dev server gives the same spans (recorded from `adk web`):
    // the same keys on each span, and the attributes its web UI reads wherever ADK sets them.
    let adk: Vec<Value> = serde_json::from_str(include_str!(
        "../fixtures/adk-wire/trace/session_trace.json"
    ))
    .expect("the recorded trace");
    let keys = |v: &Value| -> std::collections::BTreeSet<String> {
        v.as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    };
    const READ_BY_THE_UI: &[&str] = &[
        "gen_ai.operation.name",
        "gen_ai.agent.name",
        "gen_ai.conversation.id",
        "gen_ai.request.model",
        "gen_ai.tool.name",
        "gen_ai.tool.call.id",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gcp.vertex.agent.event_id",
        "gcp.vertex.agent.invocation_id",
    ];
    for prefix in ["invoke_agent ", "generate_content ", "execute_tool "] {
        let starts = |s: &&Value| s["name"].as_str().is_some_and(|n| n.starts_with(prefix));
        let theirs = adk.iter().find(starts).expect("ADK's span");
        let ours = spans.iter().find(starts).expect("agentd's span");
        assert_eq!(
            keys(ours),
            keys(theirs),
            "{prefix}: {ours} vs ADK's {theirs}"
        );
        for k in keys(&theirs["attributes"]) {
            if READ_BY_THE_UI.contains(&k.as_str()) {
                assert!(
                    ours["attributes"].get(&k).is_some(),
                    "{prefix}: no {k} in {ours} (ADK: {theirs})"
                );
            }
        }
    }
    let adk_event: Value =
        serde_json::from_str(include_str!("../fixtures/adk-wire/trace/event_trace.json"))
            .expect("the recorded event trace");
    assert!(adk_event["trace_id"].is_number() && adk_event["span_id"].is_number());

    // The span that made an event, as `debug/trace/{event_id}` answers it.
    let id = answer["id"].as_str().expect("event id");
    let traced = json_with_status(
        s.get(&format!("/dev/apps/{WEATHER}/debug/trace/{id}"))
            .await,
        200,
    )
    .await;
    assert_eq!(traced["gcp.vertex.agent.event_id"], id, "{traced}");
    assert_eq!(traced["span_id"], calls[1]["span_id"], "{traced}");
    assert_eq!(traced["trace_id"], root["trace_id"], "{traced}");

    // Nothing kept: an empty session trace, and 404 for an event, as ADK answers.
    assert_eq!(s.session_trace("nobody").await, Vec::<Value>::new());
    let missing = s
        .get(&format!("/dev/apps/{WEATHER}/debug/trace/no-such-event"))
        .await;
    let body = json_with_status(missing, 404).await;
    assert_eq!(body["code"], "trace_not_found", "{body}");
    assert_eq!(body["detail"], "Trace not found", "{body}");
    let other = s.get("/dev/apps/nope/debug/trace/session/s1").await;
    assert_eq!(other.status(), 404);
}

/// The buffer keeps the latest `--trace-spans` spans; without the flag or the web UI a
/// replica keeps none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_spans_are_bounded_and_off_by_default() {
    let m = ScriptedModel::start().await;
    let tool = weather_endpoint().await;
    let small = Served::start(&m, &tool, &["--trace-spans", "3"]).await;
    push_run(&m);
    small.run("s1").await;
    push_run(&m);
    small.run("s2").await;
    let last = small.settled_trace("s2").await;
    assert_eq!(small.session_trace("s1").await, Vec::<Value>::new());
    assert_eq!(last.len(), 3, "{last:?}");
    // The run's span ends last.
    assert_eq!(last[2]["name"], "invocation", "{last:?}");

    let off = Served::start(&m, &tool, &[]).await;
    push_run(&m);
    off.run("s1").await;
    // Time for the run's spans to close, had they been kept.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(off.session_trace("s1").await, Vec::<Value>::new());
}

/// ADK's web UI over `agentd serve --web-ui-dir`: after a chat, its Trace tab shows the
/// invocation's spans, and the reply's event shows the model call's request and response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_uis_trace_tab_shows_the_run() {
    let bundle = web_ui_bundle();
    let m = ScriptedModel::start().await;
    let tool = weather_endpoint().await;
    let dir = bundle.to_str().expect("utf-8 path");
    let s = Served::start(&m, &tool, &["--web-ui-dir", dir]).await;
    push_run(&m);
    let shot = std::env::temp_dir().join("agentd-trace-tab.png");
    let out = clients::node(
        "web-ui",
        "trace-tab.mjs",
        &[],
        &[
            ("AGENTD_URL", &s.base),
            ("AGENTD_APP", WEATHER),
            ("AGENTD_MESSAGE", "Weather?"),
            ("AGENTD_EXPECT_REPLY", "21 degrees"),
            ("AGENTD_SHOT", shot.to_str().unwrap_or_default()),
        ],
    )
    .await;
    assert_eq!(out["replySeen"], true, "{out}");
    assert_eq!(out["traceShown"], true, "{out}");
    for r in out["traceRequests"].as_array().expect("requests") {
        assert_eq!(r["status"], 200, "the UI's trace call failed: {out}");
    }
    let trace = out["traceText"].as_str().unwrap_or("");
    // The root span is the header; the agent, its model calls, the tool call and the commits
    // are rows.
    for shown in [
        "INVOCATION ID: e-",
        "forecaster",
        "generate_content trace-model",
        "get_weather",
        "commit",
    ] {
        assert!(
            trace.contains(shown),
            "the Traces view does not show {shown}: {out}"
        );
    }
    // A model call's span opened: its details and the event it made.
    let span = out["spanText"].as_str().unwrap_or("");
    for shown in ["generate_content trace-model", "Parent ID", "Event ID"] {
        assert!(
            span.contains(shown),
            "the span's details lack {shown}: {out}"
        );
    }
    // The reply's request: the instruction and the conversation the model was sent.
    let event = out["eventText"].as_str().unwrap_or("");
    assert!(
        event.contains("Report the weather.") && event.contains("functionResponse"),
        "the event's request is not shown: {out}"
    );
    assert_eq!(out.get("error"), None, "{out}");
    // What the UI showed is this replica's record of the session.
    let session = out["sessionId"].as_str().unwrap_or("");
    assert!(!session.is_empty(), "{out}");
    assert_eq!(
        named(&s.settled_trace(session).await, "invocation").len(),
        1
    );
}

/// `agentd keys create --user USER` on the database at `url`: the key.
fn create_key(url: &str, user: &str, more: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["keys", "create", "--user", user, "--database-url", url])
        .args(more)
        .output()
        .expect("agentd keys create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// With authentication on, a caller sees the spans of the users it may act as, in the apps it
/// may use: another user's session has an empty trace and its events none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_sees_only_its_own_users_spans() {
    let m = ScriptedModel::start().await;
    let tool = weather_endpoint().await;
    let (data, url) = database();
    // `keys create` makes the schema when the file is new.
    let alice = create_key(&url, "alice", &[]);
    let bob = create_key(&url, "bob", &[]);
    let elsewhere = create_key(&url, "alice", &["--apps", "other"]);
    let mut s = Served::start_on(
        (data, url),
        &m,
        &tool,
        &["--auth", "api-key", "--trace-spans", "1000"],
    )
    .await;
    push_run(&m);
    let events = s.with_key(&alice).run_as("alice", "private").await;
    let id = events
        .last()
        .and_then(|e| e["id"].as_str())
        .expect("an event")
        .to_string();
    let spans = s.settled_trace("private").await;
    assert!(spans.len() > 3, "{spans:?}");
    let event = format!("/dev/apps/{WEATHER}/debug/trace/{id}");
    json_with_status(s.get(&event).await, 200).await;

    s.with_key(&bob);
    assert_eq!(s.session_trace("private").await, Vec::<Value>::new());
    let body = json_with_status(s.get(&event).await, 404).await;
    assert_eq!(body["code"], "trace_not_found", "{body}");
    // A key for other apps does not see this app at all.
    s.with_key(&elsewhere);
    let body = json_with_status(
        s.get(&format!("/dev/apps/{WEATHER}/debug/trace/session/private"))
            .await,
        404,
    )
    .await;
    assert_eq!(body["code"], "app_not_found", "{body}");
    // No key: the door.
    s.key = None;
    assert_eq!(s.get(&event).await.status(), 401);
}
