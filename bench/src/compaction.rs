//! Prompt size over a long conversation, with and without compaction: `--compaction-turns`
//! turns (200 by default) of one session through `/run`, against an LLM app whose model is a
//! scripted OpenAI-compatible server on loopback that speaks the streaming wire format and
//! reports a prompt token count for every request (its characters / 4, rounded up). The same
//! conversation runs on an app without compaction and on one with `compaction: {interval: 10,
//! overlap: 1}` whose summariser is the same server; the report gives the prompt tokens the
//! chat model was sent at a few turns, their mean, and what the summaries cost.

use crate::pg::Admin;
use crate::servers::{spawn_agentd, write_app};
use crate::BenchArgs;
use anyhow::{ensure, Context, Result};
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use std::fmt::Write;
use std::sync::{Arc, Mutex};

/// What the scripted model saw: `(model, prompt tokens)` per request, in order.
type Seen = Arc<Mutex<Vec<(String, u64)>>>;

/// One answer: a few sentences, so the history grows as a real chat's does.
const ANSWER: &str = "Here is what I found about that. The first point matters most, the \
second follows from it, and the third is a detail worth checking before you decide. Let me \
know which one to expand on.";

async fn completions(State(seen): State<Seen>, body: axum::body::Bytes) -> impl IntoResponse {
    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = req["model"].as_str().unwrap_or("").to_string();
    let chars: usize = req["messages"]
        .as_array()
        .map(|m| m.iter().map(|m| m["content"].to_string().len()).sum())
        .unwrap_or(0);
    let prompt = chars.div_ceil(4) as u64;
    if let Ok(mut s) = seen.lock() {
        s.push((model.clone(), prompt));
    }
    let text = if model == "summarizer" {
        "Conversation language: English. The user asked a series of questions; the agent \
         answered each with three points. Nothing is open."
    } else {
        ANSWER
    };
    let completion = text.len().div_ceil(4) as u64;
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let frames = [
        chunk(json!({"role": "assistant", "content": text}), None),
        chunk(json!({}), Some("stop")),
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model,
               "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
               "total_tokens": prompt + completion}}),
    ];
    let mut out = String::new();
    for f in frames {
        out.push_str(&format!("data: {f}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    ([("content-type", "text/event-stream")], out)
}

pub async fn run(args: &BenchArgs, admin: &Admin, agentd_bin: &std::path::Path) -> Result<String> {
    let seen: Seen = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base_url = format!("http://{}/v1", listener.local_addr()?);
    let app = Router::new()
        .route("/v1/chat/completions", post(completions))
        .with_state(seen.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let work = tempfile::Builder::new().prefix("agentd-bench-").tempdir()?;
    let apps = work.path().join("apps");
    let agent = |name: &str| {
        format!(
            "agent_class: LlmAgent\nname: {name}\nmodel: openai/chat\ninstruction: Help the user.\n\
             model_options:\n  base_url: {base_url}\n"
        )
    };
    write_app(&apps, "plain", &agent("plain"))?;
    write_app(&apps, "compacted", &agent("compacted"))?;
    std::fs::write(
        apps.join("compacted").join("agentd.yaml"),
        format!(
            "compaction:\n  interval: 10\n  overlap: 1\n  model: openai/summarizer\n  \
             modelOptions:\n    base_url: {base_url}\n"
        ),
    )?;
    let url = admin.create_database("compaction").await?;
    let agentd = spawn_agentd(
        agentd_bin,
        &url,
        &apps,
        args.db_max_connections,
        work.path().join("agentd.log"),
        false,
    )
    .await?;
    let client = reqwest::Client::new();
    let turns = args.compaction_turns.max(1);
    let mut report = String::new();
    writeln!(
        report,
        "prompt tokens sent to the chat model per turn, {turns} turns of one session \
         (tokens = characters / 4 as the scripted model counts them):"
    )?;
    for app in ["plain", "compacted"] {
        let start = seen.lock().map(|s| s.len()).unwrap_or(0);
        for i in 0..turns {
            let body = json!({
                "appName": app, "userId": "u1", "sessionId": "long", "createSession": true,
                "onBusy": "enqueue",
                "newMessage": {"role": "user", "parts": [{"text": format!(
                    "Question {i}: what should I know about option {i}, and how does it compare \
                     with the one before?")}]},
            });
            let resp = client
                .post(format!("{}/run", agentd.base))
                .json(&body)
                .send()
                .await
                .context("run")?;
            ensure!(
                resp.status().is_success(),
                "{app} turn {i}: {}",
                resp.status()
            );
            resp.bytes().await?;
        }
        // The last summary may still be on its way.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let calls: Vec<(String, u64)> =
            seen.lock().map(|s| s[start..].to_vec()).unwrap_or_default();
        let chat: Vec<u64> = calls
            .iter()
            .filter(|(m, _)| m == "chat")
            .map(|(_, n)| *n)
            .collect();
        let summaries: Vec<u64> = calls
            .iter()
            .filter(|(m, _)| m == "summarizer")
            .map(|(_, n)| *n)
            .collect();
        ensure!(chat.len() == turns, "{app}: {} chat calls", chat.len());
        let at = |t: usize| chat.get(t.saturating_sub(1)).copied().unwrap_or(0);
        let mean = chat.iter().sum::<u64>() as f64 / chat.len() as f64;
        writeln!(
            report,
            "  {app:<9} turn 1: {}, turn 50: {}, turn 100: {}, turn {turns}: {}; max {}, mean {:.0}, \
             total {}; summaries: {} calls, {} prompt tokens",
            at(1),
            at(50),
            at(100),
            at(turns),
            chat.iter().max().copied().unwrap_or(0),
            mean,
            chat.iter().sum::<u64>(),
            summaries.len(),
            summaries.iter().sum::<u64>(),
        )?;
    }
    // How the compactions went, as agentd counts them.
    let metrics = client
        .get(format!("{}/metrics", agentd.base))
        .send()
        .await?
        .text()
        .await?;
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("agentd_compactions_total"))
    {
        writeln!(report, "  {line}")?;
    }
    agentd.stop().await;
    Ok(report)
}
