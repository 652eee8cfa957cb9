//! A2A end to end: the official Python `a2a-sdk` client (pinned in
//! `tests/clients/python/requirements.txt`) over both bindings and both backends against real
//! `agentd` processes; a stream cut on one replica resumed on another, and a cancel from the
//! other; bad input answered with the spec's errors, storing nothing.

#[path = "../common/mod.rs"]
mod common;
mod remote;

use common::clients::a2a;
use common::procs::{Apps, Replica};
use common::{json_with_status, Backend, TestDb};
use serde_json::{json, Value};

/// A message `long` (100 chunks, 100 ms apart) answers in ten seconds: the echo splits no
/// finer than a character, so a shorter one ends sooner.
const LONG: &str = "long work long work long work long work long work long work long work long work long work long work long work long work ";

/// A slow echo (so a stream can be cut and a task cancelled mid-way) that waits for its user
/// when a message starts with `ask:`.
const SLOW: &str =
    "description: Echoes slowly\nchunks: 5\nchunk_delay_ms: 80\nask_prefix: \"ask:\"";

async fn driver(scenario: &str, r: &Replica, binding: &str, extra: &[(&str, &str)]) -> Value {
    let mut env = vec![
        ("AGENTD_URL", r.base.as_str()),
        ("AGENTD_APP", "slow"),
        ("AGENTD_BINDING", binding),
    ];
    env.extend_from_slice(extra);
    let out = a2a(scenario, &env).await;
    assert!(
        out.get("error").is_none(),
        "{scenario} over {binding}: {out}"
    );
    out
}

async fn the_python_sdk_drives_an_app_over_both_bindings(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("slow", SLOW);
    // Push notifications go to a receiver on this machine.
    let r = Replica::spawn(&db, &apps, "a", &["--webhook-allow-private", "127.0.0.1"]).await;
    for (binding, transport) in [
        ("JSONRPC", "JsonRpcTransport"),
        ("HTTP+JSON", "RestTransport"),
    ] {
        let card = driver("card", &r, binding, &[]).await;
        assert_eq!(card["name"], "slow");
        assert_eq!(card["description"], "Echoes slowly");
        assert_eq!(card["bindings"], json!(["JSONRPC", "HTTP+JSON"]));
        assert_eq!(
            (card["streaming"].clone(), card["push"].clone()),
            (json!(true), json!(true))
        );
        assert_eq!(
            card["transport"], transport,
            "the client took the binding asked for"
        );

        let sent = driver("send", &r, binding, &[]).await;
        assert_eq!(sent["state"], "TASK_STATE_COMPLETED");
        assert_eq!(sent["artifact_text"], "hello");
        assert_eq!(sent["history_roles"], json!(["ROLE_USER", "ROLE_AGENT"]));
        assert_eq!(sent["get_history"], 1, "historyLength keeps the newest");
        assert_eq!(
            sent["listed"],
            json!([sent["task_id"]]),
            "the context's one task"
        );
        // The context is an agentd session of the anonymous A2A user, the task its run.
        let ctx = sent["context_id"].as_str().expect("context id");
        let session = json_with_status(
            r.get(&format!("/apps/slow/users/a2a/sessions/{ctx}")).await,
            200,
        )
        .await;
        assert_eq!(session["events"][0]["content"]["parts"][0]["text"], "hello");
        let run_id = sent["task_id"].as_str().expect("task id");
        let run = json_with_status(r.get(&format!("/runs/{run_id}")).await, 200).await;
        assert_eq!(run["status"], "completed");

        let streamed = driver("stream", &r, binding, &[]).await;
        let kinds = streamed["kinds"].as_array().expect("kinds");
        assert_eq!(kinds.first(), Some(&json!("task")));
        assert_eq!(kinds.get(1), Some(&json!("status_update")));
        assert_eq!(kinds.last(), Some(&json!("status_update")));
        let chunks = kinds.iter().filter(|k| *k == "artifact_update").count();
        assert!(chunks >= 2, "the answer streamed in chunks: {kinds:?}");
        assert_eq!(streamed["text"], "hello");
        assert_eq!(streamed["final_state"], "TASK_STATE_COMPLETED");
        assert_eq!(streamed["second_context_same"], true);
        assert_eq!(streamed["second_task_differs"], true);
        assert_eq!(streamed["second_text"], "hello again");

        let cancelled = driver("cancel", &r, binding, &[]).await;
        assert_eq!(cancelled["cancel_state"], "TASK_STATE_CANCELED");
        assert_eq!(cancelled["final_state"], "TASK_STATE_CANCELED");
        assert_eq!(cancelled["get_state"], "TASK_STATE_CANCELED");

        let input = driver("input", &r, binding, &[("AGENTD_PROMPT", "ask: ship it?")]).await;
        assert_eq!(input["state"], "TASK_STATE_INPUT_REQUIRED");
        assert_eq!(input["waiting_call"], "ask_user");
        assert_eq!(input["answer_state"], "TASK_STATE_COMPLETED");
        assert_eq!(input["answer_context_same"], true);
        assert_eq!(
            input["first_after"], "TASK_STATE_COMPLETED",
            "answered, it is done"
        );

        let errors = driver("errors", &r, binding, &[]).await;
        assert_eq!(errors["unknown_task"], "TaskNotFoundError");
        assert_eq!(errors["not_cancelable"], "TaskNotCancelableError");
        assert_eq!(errors["terminal"], "UnsupportedOperationError");

        let push = driver("push", &r, binding, &[]).await;
        assert_eq!(push["pushed_state"], "TASK_STATE_COMPLETED", "{push}");
        assert_eq!(push["pushed_task"], true);
        assert_eq!(push["token"], "tok-1");
        assert_eq!(push["authorization"], "Bearer s3cret");
        assert_eq!(push["created"], "c2");
        assert_eq!(push["got"], true);
        assert_eq!(push["got_token"], "", "a token is never read back");
        assert_eq!(push["listed_tokens"], json!([""]));
        assert_eq!(push["listed"], json!(["c2"]));
        assert_eq!(push["listed_after_delete"], json!([]));
        assert_eq!(
            push["private_url"], "InvalidParamsError",
            "SSRF rules apply"
        );
    }
}

/// A client cut from its stream on replica A subscribes on replica B and sees the task to its
/// end; a cancel sent to B stops a task streaming from A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_streamed_from_one_replica_is_followed_and_cancelled_from_another() {
    let db = TestDb::postgres().await;
    let apps = Apps::new().echo("slow", SLOW);
    let a = Replica::spawn(&db, &apps, "a", &[]).await;
    let b = Replica::spawn(&db, &apps, "b", &[]).await;
    let env = [("AGENTD_URL2", b.base.as_str())];
    let resumed = driver("resubscribe", &a, "JSONRPC", &env).await;
    assert_eq!(
        resumed["cut_after"].as_array().and_then(|k| k.last()),
        Some(&json!("artifact_update"))
    );
    assert_eq!(
        resumed["first_kind"], "task",
        "a subscription starts with the task"
    );
    assert_eq!(
        resumed["text"], "hello",
        "the snapshot and the live chunks make the answer"
    );
    assert_eq!(resumed["final_state"], "TASK_STATE_COMPLETED");
    let cancelled = driver("cancel", &a, "HTTP+JSON", &env).await;
    assert_eq!(cancelled["cancel_state"], "TASK_STATE_CANCELED");
    assert_eq!(cancelled["final_state"], "TASK_STATE_CANCELED");
}

async fn rpc(r: &Replica, user: &str, body: Value) -> Value {
    rpc_to(r, "slow", user, body).await
}

async fn rpc_to(r: &Replica, app: &str, user: &str, body: Value) -> Value {
    let resp = r
        .client
        .post(r.url(&format!("/a2a/{app}")))
        .header("x-agentd-user-id", user)
        .json(&body)
        .send()
        .await
        .expect("POST");
    json_with_status(resp, 200).await
}

fn send(id: u64, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "SendMessage", "params": params})
}

fn text(t: &str) -> Value {
    json!({"messageId": format!("m-{t}"), "role": "ROLE_USER", "parts": [{"text": t}]})
}

/// Everything agentd stored for `user`: their sessions and runs of the app.
async fn stored(r: &Replica, user: &str) -> Value {
    json!([
        json_with_status(
            r.get(&format!("/apps/slow/users/{user}/sessions")).await,
            200
        )
        .await,
        json_with_status(r.get(&format!("/apps/slow/users/{user}/runs")).await, 200).await,
    ])
}

async fn bad_input_gets_the_specs_errors_and_stores_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    // `long` works for ten seconds on a message of 100 characters or more (`LONG`): long
    // enough to add configs to it while it works.
    let apps = Apps::new()
        .echo("slow", SLOW)
        .echo("long", "chunks: 100\nchunk_delay_ms: 100");
    let r = Replica::spawn(&db, &apps, "a", &["--max-body-bytes", "65536"]).await;
    let before = stored(&r, "carol").await;
    let code = |v: &Value| v["error"]["code"].as_i64();

    // A body not labelled JSON is 415, on both bindings, as on every other route: a page's
    // `no-cors` form post runs nothing.
    let message = serde_json::to_string(&send(9, json!({"message": text("x")}))).expect("json");
    for (path, content_type) in [
        ("/a2a/slow", Some("text/plain")),
        ("/a2a/slow", None),
        ("/a2a/slow/message:send", Some("text/plain")),
        (
            "/a2a/slow/message:send",
            Some("application/x-www-form-urlencoded"),
        ),
    ] {
        let mut req = r
            .client
            .post(r.url(path))
            .header("x-agentd-user-id", "carol")
            .body(message.clone());
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let resp = req.send().await.expect("POST");
        let got = json_with_status(resp, 415).await;
        // JSON-RPC answers agentd's error (no JSON-RPC envelope was read); HTTP+JSON its
        // `google.rpc.Status` with agentd's code in the `ErrorInfo`.
        let code = match path.ends_with(":send") {
            true => &got["error"]["details"][0]["metadata"]["agentdCode"],
            false => &got["code"],
        };
        assert_eq!(
            code, "unsupported_content_type",
            "{path} {content_type:?}: {got}"
        );
    }

    // Malformed JSON-RPC.
    let resp = r
        .client
        .post(r.url("/a2a/slow"))
        .header("x-agentd-user-id", "carol")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("POST");
    let parse = json_with_status(resp, 200).await;
    assert_eq!(
        (code(&parse), parse["id"].clone()),
        (Some(-32700), Value::Null)
    );
    let batch = rpc(&r, "carol", json!([send(1, json!({"message": text("x")}))])).await;
    assert_eq!(code(&batch), Some(-32600));
    let unknown = rpc(
        &r,
        "carol",
        json!({"jsonrpc": "2.0", "id": 2, "method": "Frobnicate"}),
    )
    .await;
    assert_eq!(
        (code(&unknown), unknown["id"].clone()),
        (Some(-32601), json!(2))
    );
    // Wrong params: a part that is nothing, a field the spec does not have, a bad context.
    for params in [
        json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{}]}}),
        json!({"message": text("x"), "colour": "blue"}),
        json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}],
                           "contextId": "a/b"}}),
        json!({"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "x"}]}}),
        json!({}),
    ] {
        let bad = rpc(&r, "carol", send(3, params.clone())).await;
        assert_eq!(code(&bad), Some(-32602), "{params}: {bad}");
        assert_eq!(bad["error"]["data"][0]["reason"], "INVALID_PARAMS");
    }
    // A push notification config to a private address, or not http(s): refused before
    // anything runs.
    for url in [
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest",
        "ftp://example.com/x",
    ] {
        let config = json!({"taskPushNotificationConfig": {"url": url}});
        let push = rpc(
            &r,
            "carol",
            send(4, json!({"message": text("x"), "configuration": config})),
        )
        .await;
        assert_eq!(code(&push), Some(-32602), "{url}: {push}");
    }
    // An unsupported protocol version.
    let resp = r
        .client
        .post(r.url("/a2a/slow"))
        .header("x-agentd-user-id", "carol")
        .header("A2A-Version", "9.9")
        .json(&send(5, json!({"message": text("x")})))
        .send()
        .await
        .expect("POST");
    assert_eq!(code(&json_with_status(resp, 200).await), Some(-32009));
    // A huge message: the body limit answers before any work.
    let huge = "x".repeat(100_000);
    let resp = r
        .client
        .post(r.url("/a2a/slow"))
        .header("x-agentd-user-id", "carol")
        .json(&send(6, json!({"message": text(&huge)})))
        .send()
        .await
        .expect("POST");
    assert_eq!(resp.status(), 413);
    assert_eq!(
        stored(&r, "carol").await,
        before,
        "nothing was stored for carol"
    );

    // Another user's task is not found, over both bindings; so is a nonsense id.
    let alice = rpc(&r, "alice", send(7, json!({"message": text("mine")}))).await;
    let task = alice["result"]["task"]["id"]
        .as_str()
        .expect("task id")
        .to_string();
    let get =
        |id: &str| json!({"jsonrpc": "2.0", "id": 8, "method": "GetTask", "params": {"id": id}});
    // The client's messageId is the message's id in the task's history, as it sent it.
    let mine = rpc(&r, "alice", get(&task)).await;
    assert_eq!(
        mine["result"]["history"][0]["messageId"], "m-mine",
        "{mine}"
    );
    assert_eq!(code(&rpc(&r, "bob", get(&task)).await), Some(-32001));
    assert_eq!(
        code(&rpc(&r, "bob", get(&"x".repeat(5000))).await),
        Some(-32001)
    );
    let resp = r
        .client
        .get(r.url(&format!("/a2a/slow/tasks/{task}")))
        .header("x-agentd-user-id", "bob")
        .send()
        .await
        .expect("GET");
    let rest = json_with_status(resp, 404).await;
    assert_eq!(rest["error"]["details"][0]["reason"], "TASK_NOT_FOUND");
    let resp = r
        .client
        .post(r.url(&format!("/a2a/slow/tasks/{task}:frobnicate")))
        .header("x-agentd-user-id", "alice")
        .send()
        .await
        .expect("POST");
    json_with_status(resp, 404).await;
    let mine = rpc(&r, "alice", get(&task)).await;
    assert_eq!(mine["result"]["status"]["state"], "TASK_STATE_COMPLETED");

    // Push configs belong to a working task: at most ten, and none once it ended.
    let working = rpc_to(
        &r,
        "long",
        "erin",
        send(
            10,
            json!({"message": {"messageId": "m-long", "role": "ROLE_USER",
            "parts": [{"text": LONG}]}, "configuration": {"returnImmediately": true}}),
        ),
    )
    .await;
    let working = working["result"]["task"]["id"]
        .as_str()
        .expect("task id")
        .to_string();
    let create = |id: String| {
        json!({"jsonrpc": "2.0", "id": 11, "method": "CreateTaskPushNotificationConfig",
               "params": {"taskId": working.clone(), "id": id, "url": "https://93.184.216.34/hook"}})
    };
    for n in 0..10 {
        let made = rpc_to(&r, "long", "erin", create(format!("c{n}"))).await;
        assert_eq!(made["result"]["id"], format!("c{n}"), "{made}");
    }
    assert_eq!(
        code(&rpc_to(&r, "long", "erin", create("c10".into())).await),
        Some(-32602)
    );
    assert_eq!(
        code(&rpc_to(&r, "long", "erin", create("c3".into())).await),
        Some(-32602),
        "ids are unique"
    );
    assert_eq!(
        code(&rpc_to(&r, "long", "frank", create("c11".into())).await),
        Some(-32001)
    );
    let delete = json!({"jsonrpc": "2.0", "id": 12, "method": "DeleteTaskPushNotificationConfig",
                        "params": {"taskId": working.clone(), "id": "nope"}});
    assert_eq!(
        code(&rpc_to(&r, "long", "erin", delete).await),
        Some(-32001)
    );
    let cancel = json!({"jsonrpc": "2.0", "id": 13, "method": "CancelTask",
                        "params": {"id": working.clone()}});
    let cancelled = rpc_to(&r, "long", "erin", cancel).await;
    assert_eq!(
        cancelled["result"]["status"]["state"],
        "TASK_STATE_CANCELED"
    );
    assert_eq!(
        code(&rpc_to(&r, "long", "erin", create("late".into())).await),
        Some(-32004),
        "an ended task takes no more configs"
    );

    // 0.3's push config methods keep the config's token and credentials (each push carries
    // them) but never answer them: they are the receiver's secrets.
    let long = rpc_to(
        &r,
        "long",
        "gina",
        json!({"jsonrpc": "2.0", "id": 20, "method": "message/send", "params": {
            "message": {"kind": "message", "messageId": "m-old-long", "role": "user",
                        "parts": [{"kind": "text", "text": LONG}]},
            "configuration": {"blocking": false}}}),
    )
    .await;
    let old_task = long["result"]["id"]
        .as_str()
        .expect("0.3 task id")
        .to_string();
    let set = rpc_to(
        &r,
        "long",
        "gina",
        json!({"jsonrpc": "2.0", "id": 21, "method": "tasks/pushNotificationConfig/set",
            "params": {"taskId": old_task.clone(), "pushNotificationConfig": {
                "id": "p1", "url": "https://93.184.216.34/hook", "token": "tok-03",
                "authentication": {"schemes": ["Bearer"], "credentials": "s3cret"}}}}),
    )
    .await;
    let config = &set["result"]["pushNotificationConfig"];
    assert_eq!(config["url"], "https://93.184.216.34/hook", "{set}");
    assert!(config.get("token").is_none(), "{set}");
    assert!(
        config["authentication"].get("credentials").is_none(),
        "{set}"
    );
    let got = rpc_to(
        &r,
        "long",
        "gina",
        json!({"jsonrpc": "2.0", "id": 22, "method": "tasks/pushNotificationConfig/get",
            "params": {"id": old_task.clone(), "pushNotificationConfigId": "p1"}}),
    )
    .await;
    assert_eq!(
        got["result"]["pushNotificationConfig"]["authentication"]["schemes"],
        json!(["Bearer"]),
        "{got}"
    );
    assert!(!got.to_string().contains("tok-03") && !got.to_string().contains("s3cret"));
    let cancelled = rpc_to(
        &r,
        "long",
        "gina",
        json!({"jsonrpc": "2.0", "id": 23, "method": "tasks/cancel", "params": {"id": old_task}}),
    )
    .await;
    assert_eq!(
        cancelled["result"]["status"]["state"], "canceled",
        "{cancelled}"
    );

    // A2A 0.3's method names and shapes.
    let old = rpc(
        &r,
        "dave",
        json!({"jsonrpc": "2.0", "id": 9, "method": "message/send", "params": {"message": {
            "kind": "message", "messageId": "m03", "role": "user",
            "parts": [{"kind": "text", "text": "old client"}]}}}),
    )
    .await;
    assert_eq!(old["result"]["kind"], "task", "{old}");
    assert_eq!(old["result"]["status"]["state"], "completed");
    assert_eq!(
        old["result"]["artifacts"][0]["parts"][0],
        json!({"kind": "text", "text": "old client"})
    );
    assert_eq!(old["result"]["history"][0]["role"], "user");
}

both_backends!(
    the_python_sdk_drives_an_app_over_both_bindings,
    bad_input_gets_the_specs_errors_and_stores_nothing,
);

async fn node(scenario: &str, r: &Replica, binding: &str, extra: &[(&str, &str)]) -> Value {
    let mut env = vec![
        ("AGENTD_URL", r.base.as_str()),
        ("AGENTD_APP", "slow"),
        ("AGENTD_BINDING", binding),
    ];
    env.extend_from_slice(extra);
    let out = common::clients::node("node", "a2a.mjs", &[scenario], &env).await;
    assert!(
        out.get("error").is_none(),
        "{scenario} over {binding}: {out}"
    );
    out
}

/// The official JavaScript client (`@a2a-js/sdk`) over both bindings.
async fn the_js_sdk_drives_an_app_over_both_bindings(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("slow", SLOW);
    let r = Replica::spawn(&db, &apps, "a", &[]).await;
    for (binding, transport) in [
        ("JSONRPC", "JsonRpcTransport"),
        ("HTTP+JSON", "_RestTransport"),
    ] {
        let sent = node("send", &r, binding, &[]).await;
        assert_eq!(sent["transport"], transport);
        assert_eq!(sent["state"], "TASK_STATE_COMPLETED");
        assert_eq!(sent["text"], "hello");
        assert_eq!(sent["getState"], "TASK_STATE_COMPLETED");
        let streamed = node("stream", &r, binding, &[]).await;
        assert_eq!(streamed["kinds"][0], "task");
        assert_eq!(streamed["text"], "hello");
        assert_eq!(streamed["final"], "TASK_STATE_COMPLETED");
        assert_eq!(streamed["secondText"], "hello again");
        assert_eq!(streamed["secondContextSame"], true);
        let cancelled = node("cancel", &r, binding, &[]).await;
        assert_eq!(cancelled["cancelState"], "TASK_STATE_CANCELED");
        assert_eq!(cancelled["final"], "TASK_STATE_CANCELED");
        let resumed = node("resubscribe", &r, binding, &[]).await;
        assert_eq!(resumed["firstKind"], "task");
        assert_eq!(resumed["text"], "hello");
        assert_eq!(resumed["final"], "TASK_STATE_COMPLETED");
    }
}

both_backends!(the_js_sdk_drives_an_app_over_both_bindings);

/// A file sent as a `raw` part is inline data for the agent, or a session artifact when the
/// request's metadata asks for ADK's `saveInputBlobsAsArtifacts`.
async fn raw_parts_become_artifacts_when_asked(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("slow", SLOW);
    let r = Replica::spawn(&db, &apps, "a", &[]).await;
    let file = |save: bool| {
        json!({"message": {"messageId": format!("m-file-{save}"), "role": "ROLE_USER",
            "contextId": format!("files-{save}"),
            "parts": [{"text": "see the file"},
                      {"raw": "aGVsbG8=", "mediaType": "text/plain", "filename": "hello.txt"}]},
            "metadata": {"saveInputBlobsAsArtifacts": save}})
    };
    for save in [true, false] {
        let sent = rpc(&r, "hana", send(30, file(save))).await;
        assert_eq!(
            sent["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{sent}"
        );
        let artifacts = json_with_status(
            r.get(&format!(
                "/apps/slow/users/hana/sessions/files-{save}/artifacts"
            ))
            .await,
            200,
        )
        .await;
        let names: Vec<String> = artifacts
            .as_array()
            .expect("artifact names")
            .iter()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        assert_eq!(names.len(), usize::from(save), "{names:?}");
        if save {
            assert!(names[0].starts_with("artifact_e-"), "{names:?}");
        }
    }
}

/// A rewind of a context holds its session like a run, but it is not a task: ListTasks shows
/// the two messages sent, not the rewind.
async fn a_rewind_is_not_a_task(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("slow", SLOW);
    let r = Replica::spawn(&db, &apps, "a", &[]).await;
    for (i, t) in ["first", "second"].iter().enumerate() {
        let mut message = text(t);
        message["contextId"] = json!("edited");
        let sent = rpc(&r, "hana", send(40 + i as u64, json!({"message": message}))).await;
        assert_eq!(
            sent["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{sent}"
        );
    }
    let session = json_with_status(r.get("/apps/slow/users/hana/sessions/edited").await, 200).await;
    let second = session["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["author"] == "user")
        .nth(1)
        .expect("the second message")["invocationId"]
        .clone();
    let rewound = r
        .client
        .post(r.url("/apps/slow/users/hana/sessions/edited/rewind"))
        .json(&json!({"beforeInvocationId": second}))
        .send()
        .await
        .expect("POST");
    json_with_status(rewound, 200).await;
    let listed = rpc(
        &r,
        "hana",
        json!({"jsonrpc": "2.0", "id": 50, "method": "ListTasks", "params": {"contextId": "edited"}}),
    )
    .await;
    let tasks = listed["result"]["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 2, "{listed}");
}

both_backends!(
    raw_parts_become_artifacts_when_asked,
    a_rewind_is_not_a_task
);
