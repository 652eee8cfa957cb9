//! A scripted OpenAI-compatible model server on a real port, speaking the real Chat
//! Completions streaming wire format (`data: {chunk}` SSE messages, tool-call argument
//! deltas split across chunks, a usage chunk, `data: [DONE]`), plus error statuses.
//!
//! Replies are queued per model name (`push`), so agents using different model names can
//! run concurrently and still get their own scripts. Every request body is recorded.
#![allow(dead_code)]

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// SSE chunks (JSON), then `[DONE]`.
    Stream(Vec<Value>),
    /// Like `Stream`, pausing between chunks.
    Slow(Vec<Value>, Duration),
    /// An HTTP error with a JSON body (and `Retry-After: 0` for 429).
    Status(u16, Value),
    /// SSE chunks, then the connection ends mid-stream with an `error` chunk.
    StreamThenError(Vec<Value>, String),
}

fn chunk(model: &str, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1, "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
}

fn usage_chunk(model: &str) -> Value {
    json!({
        "id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1, "model": model,
        "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    })
}

impl Reply {
    /// Text streamed in `pieces`, then `finish_reason: stop` and usage.
    pub fn text(pieces: &[&str]) -> Reply {
        let m = "scripted-1";
        let mut chunks = vec![chunk(m, json!({"role": "assistant", "content": ""}), None)];
        for p in pieces {
            chunks.push(chunk(m, json!({"content": p}), None));
        }
        chunks.push(chunk(m, json!({}), Some("stop")));
        chunks.push(usage_chunk(m));
        Reply::Stream(chunks)
    }

    /// Tool calls `(id, name, arguments JSON text)`; each call's arguments arrive split in
    /// three chunks, calls interleaved, as OpenAI streams them.
    pub fn tool_calls(calls: &[(&str, &str, &str)]) -> Reply {
        let m = "scripted-1";
        let mut chunks = vec![chunk(
            m,
            json!({"role": "assistant", "content": null}),
            None,
        )];
        for (i, (id, name, _)) in calls.iter().enumerate() {
            chunks.push(chunk(
                m,
                json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                                        "function": {"name": name, "arguments": ""}}]}),
                None,
            ));
        }
        for round in 0..3 {
            for (i, (_, _, args)) in calls.iter().enumerate() {
                let chars: Vec<char> = args.chars().collect();
                let third = chars.len().div_ceil(3);
                let piece: String = chars.iter().skip(round * third).take(third).collect();
                chunks.push(chunk(
                    m,
                    json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}),
                    None,
                ));
            }
        }
        chunks.push(chunk(m, json!({}), Some("tool_calls")));
        chunks.push(usage_chunk(m));
        Reply::Stream(chunks)
    }

    /// The same reply with `usage` (OpenAI's `usage` object) in its usage chunk.
    pub fn with_usage(self, usage: Value) -> Reply {
        match self {
            Reply::Stream(mut chunks) => {
                if let Some(last) = chunks.iter_mut().rev().find(|c| c.get("usage").is_some()) {
                    last["usage"] = usage;
                }
                Reply::Stream(chunks)
            }
            other => other,
        }
    }

    pub fn status(code: u16, message: &str) -> Reply {
        Reply::Status(
            code,
            json!({"error": {"message": message, "type": "invalid_request_error"}}),
        )
    }
}

#[derive(Default)]
struct Script {
    /// Word groups of the deterministic embeddings (see [`ScriptedModel::concepts`]).
    concepts: Vec<Vec<String>>,
    /// Embedding requests answered 503 before the next succeeds.
    embed_failures: u32,
    /// Embedding request bodies, in order.
    embed_requests: Vec<Value>,
    queues: HashMap<String, VecDeque<Reply>>,
    requests: Vec<Value>,
    auth: Vec<Option<String>>,
    traceparents: Vec<Option<String>>,
}

/// The server. Dropping it does not stop it (the test runtime ends it).
#[derive(Clone)]
pub struct ScriptedModel {
    /// `http://127.0.0.1:<port>/v1`, the `base_url` for agents.
    pub base_url: String,
    script: Arc<Mutex<Script>>,
}

impl ScriptedModel {
    pub async fn start() -> ScriptedModel {
        let script = Arc::new(Mutex::new(Script::default()));
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .route("/v1/embeddings", post(embeddings))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind model server");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ScriptedModel {
            base_url: format!("http://{addr}/v1"),
            script,
        }
    }

    /// An agentd model (OpenAI-compatible provider) talking to this server as `name`, with
    /// quick retries.
    pub fn model(&self, name: &str) -> Arc<dyn agentd::model::Model> {
        agentd::model::resolve(
            &format!("openai/{name}"),
            &agentd::model::ModelOptions {
                base_url: Some(self.base_url.clone()),
                max_retries: Some(2),
                retry_backoff_ms: Some(5),
                ..Default::default()
            },
        )
        .expect("model")
    }

    /// Queues `reply` for requests naming `model`.
    pub fn push(&self, model: &str, reply: Reply) -> &Self {
        self.script
            .lock()
            .unwrap()
            .queues
            .entry(model.to_string())
            .or_default()
            .push_back(reply);
        self
    }

    /// Request bodies received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.script.lock().unwrap().requests.clone()
    }

    /// Request bodies for `model`.
    pub fn requests_for(&self, model: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r["model"] == model)
            .collect()
    }

    /// `Authorization` headers received, in order.
    pub fn auth_headers(&self) -> Vec<Option<String>> {
        self.script.lock().unwrap().auth.clone()
    }

    /// `traceparent` headers received, in order.
    pub fn traceparents(&self) -> Vec<Option<String>> {
        self.script.lock().unwrap().traceparents.clone()
    }

    /// The concepts of `/v1/embeddings`: a text's vector has, for each group, one unit per
    /// word of the text in that group (lower-cased, a trailing `s` ignored), on the group's
    /// own axis, plus a small constant on the last axis (no text has a zero vector). So texts
    /// sharing no word but a concept are near, and rankings are exact. Groups beyond the
    /// vector's size wrap around.
    pub fn concepts(&self, groups: &[&[&str]]) -> &Self {
        self.script.lock().unwrap().concepts = groups
            .iter()
            .map(|g| g.iter().map(|w| w.to_lowercase()).collect())
            .collect();
        self
    }

    /// The next `n` embedding requests fail with 503.
    pub fn fail_embeddings(&self, n: u32) -> &Self {
        self.script.lock().unwrap().embed_failures = n;
        self
    }

    /// Embedding request bodies received so far, in order.
    pub fn embedding_requests(&self) -> Vec<Value> {
        self.script.lock().unwrap().embed_requests.clone()
    }

    /// Replies not consumed yet (a test that expects all used asserts this is 0).
    pub fn unused(&self) -> usize {
        self.script
            .lock()
            .unwrap()
            .queues
            .values()
            .map(VecDeque::len)
            .sum()
    }
}

/// The deterministic vector of `text` (see [`ScriptedModel::concepts`]).
pub fn concept_vector(concepts: &[Vec<String>], text: &str, dims: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; dims.max(2)];
    let last = v.len() - 1;
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let w = word.to_lowercase();
        let stem = w.strip_suffix('s').unwrap_or(&w);
        for (i, group) in concepts.iter().enumerate() {
            if group.iter().any(|g| g == &w || g == stem) {
                v[i % last] += 1.0;
            }
        }
    }
    v[last] = 0.05;
    v
}

async fn embeddings(State(script): State<Arc<Mutex<Script>>>, Json(body): Json<Value>) -> Response {
    let mut s = script.lock().unwrap();
    s.embed_requests.push(body.clone());
    if s.embed_failures > 0 {
        s.embed_failures -= 1;
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": {"message": "scripted outage", "type": "server_error"}})),
        )
            .into_response();
    }
    let dims = body["dimensions"].as_u64().unwrap_or(8) as usize;
    let inputs: Vec<String> = match &body["input"] {
        Value::String(t) => vec![t.clone()],
        Value::Array(a) => a
            .iter()
            .map(|t| t.as_str().unwrap_or("").to_string())
            .collect(),
        _ => vec![],
    };
    // A text the model refuses (as a real one refuses one over its input limit).
    if inputs.iter().any(|t| t.contains("UNEMBEDDABLE")) {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": "input too long", "type": "invalid_request_error"}})),
        )
            .into_response();
    }
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": concept_vector(&s.concepts, t, dims)}))
        .collect();
    let tokens: usize = inputs.iter().map(|t| t.split_whitespace().count()).sum();
    Json(json!({
        "object": "list", "data": data, "model": body["model"],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response()
}

fn sse_frame(v: &Value) -> String {
    format!("data: {v}\n\n")
}

async fn completions(
    State(script): State<Arc<Mutex<Script>>>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let model = body["model"].as_str().unwrap_or_default().to_string();
    let reply = {
        let mut s = script.lock().unwrap();
        s.requests.push(body.clone());
        s.auth.push(
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
        );
        s.traceparents.push(
            headers
                .get("traceparent")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
        );
        s.queues.get_mut(&model).and_then(VecDeque::pop_front)
    };
    let Some(reply) = reply else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": {"message": format!("the test script has no reply left for model {model}")}})),
        )
            .into_response();
    };
    let (chunks, pause, tail) = match reply {
        Reply::Status(code, body) => {
            let mut resp = (StatusCode::from_u16(code).unwrap(), Json(body)).into_response();
            if code == 429 {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, "0".parse().unwrap());
            }
            return resp;
        }
        Reply::Stream(c) => (c, Duration::ZERO, "data: [DONE]\n\n".to_string()),
        Reply::Slow(c, d) => (c, d, "data: [DONE]\n\n".to_string()),
        Reply::StreamThenError(c, msg) => (
            c,
            Duration::ZERO,
            sse_frame(&json!({"error": {"message": msg, "type": "server_error"}})),
        ),
    };
    let stream = async_stream(chunks, pause, tail);
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn async_stream(
    chunks: Vec<Value>,
    pause: Duration,
    tail: String,
) -> impl futures::Stream<Item = Result<String, std::convert::Infallible>> {
    let frames: Vec<String> = chunks
        .iter()
        .map(sse_frame)
        .chain(std::iter::once(tail))
        .collect();
    futures::stream::unfold(
        (frames.into_iter(), true),
        move |(mut it, first)| async move {
            let frame = it.next()?;
            if !first && !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            Some((Ok(frame), (it, false)))
        },
    )
}
