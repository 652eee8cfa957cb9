//! npm `ai`'s `useChat` at three majors: chats, regenerate and edit, resume and stop.

use super::*;
use crate::both_backends;

async fn ai_sdk(s: &TestServer, major: &str, scenario: &str, chat: &str) -> Value {
    clients::node(
        "node",
        "ai-sdk.mjs",
        &[major, scenario],
        &[
            ("AGENTD_URL", &s.base),
            ("AGENTD_APP", APP),
            ("AGENTD_USER", USER),
            ("AGENTD_CHAT_ID", chat),
        ],
    )
    .await
}

/// The parts of the chat's last message (the assistant's).
fn last_parts(out: &Value) -> Vec<Value> {
    let msgs = out["messages"].as_array().cloned().unwrap_or_default();
    let last = msgs.last().cloned().unwrap_or(Value::Null);
    assert_eq!(last["role"], "assistant", "{out}");
    last["parts"].as_array().cloned().unwrap_or_default()
}

fn text_parts(parts: &[Value]) -> Vec<String> {
    parts
        .iter()
        .filter(|p| p["type"] == "text")
        .map(|p| p["text"].as_str().unwrap_or("").to_string())
        .collect()
}

fn tool_part<'a>(parts: &'a [Value], name: &str) -> &'a Value {
    parts
        .iter()
        .find(|p| p["type"] == format!("tool-{name}"))
        .unwrap_or_else(|| panic!("no tool-{name} part in {parts:#?}"))
}

async fn ai_sdk_chats(backend: Backend) {
    let m = ScriptedModel::start().await;
    let s = server(backend, &m, "ai").await;
    for major in ["5", "6", "7"] {
        let chat = format!("text-{major}");
        m.push("ai", Reply::text(&["Hel", "lo"]));
        let out = ai_sdk(&s, major, "text", &chat).await;
        assert_eq!(out["status"], "ready", "v{major}: {out}");
        let parts = last_parts(&out);
        assert_eq!(text_parts(&parts), ["Hello"], "v{major}: {out}");
        assert!(
            parts
                .iter()
                .all(|p| p["state"].is_null() || p["state"] == "done"),
            "{out}"
        );

        // A server tool: its call and result, the state it wrote, then the answer.
        let chat = format!("tool-{major}");
        m.push(
            "ai",
            Reply::tool_calls(&[("c1", "get_weather", r#"{"city":"Paris"}"#)]),
        );
        m.push("ai", Reply::text(&["Sunny"]));
        let out = ai_sdk(&s, major, "tool", &chat).await;
        assert_eq!(out["status"], "ready", "v{major}: {out}");
        let parts = last_parts(&out);
        let tool = tool_part(&parts, "get_weather");
        assert_eq!(tool["state"], "output-available", "{out}");
        assert_eq!(tool["input"], json!({"city": "Paris"}));
        assert_eq!(tool["output"], json!({"city": "Paris", "temp": 21}));
        assert_eq!(text_parts(&parts), ["Sunny"]);
        assert!(
            parts
                .iter()
                .any(|p| p["type"] == "data-state-delta" && p["data"]["last_city"] == "Paris"),
            "{out}"
        );
        assert_eq!(
            parts.iter().filter(|p| p["type"] == "step-start").count(),
            2,
            "{out}"
        );

        // A tool the client answers: onToolCall + addToolOutput, sent back automatically.
        let chat = format!("client-{major}");
        m.push(
            "ai",
            Reply::tool_calls(&[("c5", "ask_user", r#"{"city":"Rome"}"#)]),
        );
        m.push("ai", Reply::text(&["Got ", "it"]));
        let out = ai_sdk(&s, major, "client-tool", &chat).await;
        assert_eq!(out["status"], "ready", "v{major}: {out}");
        assert_eq!(out["posts"], 2, "{out}");
        assert_eq!(out["toolCalls"][0]["toolName"], "ask_user", "{out}");
        let parts = last_parts(&out);
        assert_eq!(tool_part(&parts, "ask_user")["state"], "output-available");
        assert_eq!(text_parts(&parts), ["Got it"], "{out}");
        let answered = m
            .requests_for("ai")
            .last()
            .map(|r| r["messages"].to_string())
            .unwrap_or_default();
        assert!(
            answered.contains("c5") && answered.contains("42"),
            "{answered}"
        );
        // One conversation, one session: both turns are in it.
        let session = json_with_status(
            s.get(&format!("/apps/{APP}/users/{USER}/sessions/{chat}"))
                .await,
            200,
        )
        .await;
        assert_eq!(
            session["events"].as_array().map_or(0, Vec::len),
            4,
            "{session}"
        );
    }

    // Approvals (ai >= 6): the call waits for the user; approved it runs, denied it does not.
    for major in ["6", "7"] {
        m.push(
            "ai",
            Reply::tool_calls(&[("c3", "transfer_money", r#"{"amount":5}"#)]),
        );
        m.push("ai", Reply::text(&["Sent"]));
        let out = ai_sdk(&s, major, "approval", &format!("approve-{major}")).await;
        assert_eq!(out["status"], "ready", "v{major}: {out}");
        assert_eq!(out["posts"], 2, "{out}");
        let parts = last_parts(&out);
        let tool = tool_part(&parts, "transfer_money");
        assert_eq!(tool["state"], "output-available", "{out}");
        assert_eq!(tool["output"], json!({"sent": 5}));
        assert_eq!(text_parts(&parts), ["Sent"]);

        m.push(
            "ai",
            Reply::tool_calls(&[("c4", "transfer_money", r#"{"amount":7}"#)]),
        );
        m.push("ai", Reply::text(&["Not sent"]));
        let out = ai_sdk(&s, major, "deny", &format!("deny-{major}")).await;
        assert_eq!(out["status"], "ready", "v{major}: {out}");
        let parts = last_parts(&out);
        assert_eq!(
            tool_part(&parts, "transfer_money")["state"],
            "output-denied",
            "{out}"
        );
        assert_eq!(text_parts(&parts), ["Not sent"]);
    }
    assert_eq!(m.unused(), 0);
}

/// `regenerate()` and an edited user message with the real `useChat` (ai 5, 6, 7): the
/// session goes back to before that turn and runs it; the model is sent the conversation
/// without the replaced answers, and the chat ends with the new answer in their place.
async fn ai_sdk_regenerate_and_edit(backend: Backend) {
    let m = ScriptedModel::start().await;
    let s = server(backend, &m, "ai").await;
    let texts = |out: &Value| -> Vec<String> {
        out["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| text_parts(m["parts"].as_array().map_or(&[][..], |p| p)).join(""))
            .collect()
    };
    for major in ["5", "6", "7"] {
        let chat = format!("regenerate-{major}");
        for text in ["answer 1", "answer 2", "answer 2b", "answer 1b"] {
            m.push("ai", Reply::text(&[text]));
        }
        let out = ai_sdk(&s, major, "regenerate", &chat).await;
        assert_eq!(out["status"], "ready", "v{major}: {out}");
        assert_eq!(out["posts"], 4, "v{major}: {out}");
        assert_eq!(out["requests"][2]["body"]["trigger"], "regenerate-message");
        assert_eq!(
            texts(&json!({"messages": out["messagesAfterRegenerate"]})),
            ["first question", "answer 1", "second question", "answer 2b"],
            "v{major}: {out}"
        );
        assert_eq!(
            texts(&out),
            ["first question", "answer 1b"],
            "v{major}: {out}"
        );
        let sent = m.requests_for("ai");
        let regenerated = sent[sent.len() - 2].to_string();
        assert!(
            regenerated.contains("answer 1") && !regenerated.contains("answer 2"),
            "v{major}: {regenerated}"
        );
        let again = sent[sent.len() - 1].to_string();
        assert!(
            again.contains("first question") && !again.contains("second question"),
            "v{major}: {again}"
        );
        // The session keeps every event; what is live is the last turn.
        let session = json_with_status(
            s.get(&format!(
                "/apps/{APP}/users/{USER}/sessions/{chat}?includeRewound=false"
            ))
            .await,
            200,
        )
        .await;
        let live: Vec<&str> = session["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter_map(|e| e["content"]["parts"][0]["text"].as_str())
            .collect();
        assert_eq!(live, ["first question", "answer 1b"], "v{major}: {session}");

        let chat = format!("edit-{major}");
        for text in ["answer 1", "answer 2", "answer edited"] {
            m.push("ai", Reply::text(&[text]));
        }
        let out = ai_sdk(&s, major, "edit", &chat).await;
        assert_eq!(out["status"], "ready", "v{major}: {out}");
        assert_eq!(
            texts(&out),
            ["first question, edited", "answer edited"],
            "v{major}: {out}"
        );
        let sent = m.requests_for("ai").last().expect("a request").to_string();
        assert!(
            sent.contains("first question, edited")
                && !sent.contains("answer 1")
                && !sent.contains("second question"),
            "v{major}: {sent}"
        );
    }
    assert_eq!(m.unused(), 0);
}

/// Cut mid-message, then resume: the whole message arrives once; a stop cancels.
async fn ai_sdk_resume_and_stop(backend: Backend) {
    let m = ScriptedModel::start().await;
    let s = server(backend, &m, "ai-r").await;
    let pieces = ["Alpha ", "beta ", "gamma ", "delta ", "epsilon ", "zeta"];
    for (major, scenario) in [("6", "resume"), ("7", "resume"), ("5", "resume-reload")] {
        m.push(
            "ai-r",
            Reply::Slow(text_chunks(&pieces), Duration::from_millis(150)),
        );
        let out = ai_sdk(&s, major, scenario, &format!("resume-{major}")).await;
        assert_eq!(out["resumeStatus"], 200, "v{major}: {out}");
        assert_eq!(out["status"], "ready", "v{major}: {out}");
        let parts = last_parts(&out);
        assert_eq!(text_parts(&parts), [pieces.concat()], "v{major}: {out}");
    }
    // Nothing running: 204, and the client stays ready.
    let r = s
        .client
        .get(s.url(&format!("/apps/{APP}/chat/resume-6/stream")))
        .header("x-agentd-user-id", USER)
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status(), 204);

    for major in ["5", "7"] {
        m.push(
            "ai-r",
            Reply::Slow(text_chunks(&["x"; 60]), Duration::from_millis(200)),
        );
        let chat = format!("stop-{major}");
        let out = ai_sdk(&s, major, "cancel", &chat).await;
        assert_eq!(out["stopStatus"], 202, "v{major}: {out}");
        assert!(
            out["raw"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r.as_str() == Some(r#"{"type":"abort"}"#)),
            "{out}"
        );
        assert_eq!(out["status"], "ready", "an abort is not an error: {out}");
        let run = json_with_status(
            s.get(&format!(
                "/runs/{}",
                out["stopBody"]
                    .as_str()
                    .and_then(|b| serde_json::from_str::<Value>(b).ok())
                    .map(|b| b["runId"].as_str().unwrap_or("").to_string())
                    .unwrap_or_default()
            ))
            .await,
            200,
        )
        .await;
        assert_eq!(run["status"], "cancelled", "{run}");
    }
}

both_backends!(
    ai_sdk_chats,
    ai_sdk_resume_and_stop,
    ai_sdk_regenerate_and_edit,
);
