//! Reads an agentd `/run` (or ADK `/run_sse`) response to its end with a real SSE parser.
#![allow(dead_code)]

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use serde_json::Value;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One SSE message: its `event:` name (`message` by default), `id:` and JSON data.
#[derive(Debug, Clone)]
pub struct Msg {
    pub event: String,
    pub id: String,
    pub data: Value,
}

impl Msg {
    pub fn is_partial(&self) -> bool {
        self.data["partial"] == true
    }

    /// An agent event (not `done`, not an error message).
    pub fn is_event(&self) -> bool {
        self.event == "message" && self.data.get("author").is_some()
    }

    /// A committed agent event (SSE keeps the last `id:` for later messages, so the id alone
    /// does not tell).
    pub fn is_committed(&self) -> bool {
        self.is_event() && !self.is_partial()
    }
}

/// Upper bound on any single wait; only there so a broken server fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(30);

/// Every message of the stream; panics (with the body) on a non-200 answer or a stall.
pub async fn read_all(resp: reqwest::Response) -> Vec<Msg> {
    let status = resp.status();
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        panic!("run answered {status}: {body}");
    }
    let mut stream = resp.bytes_stream().eventsource();
    let mut out = vec![];
    loop {
        let next = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("the stream stalled for 30 s");
        let Some(item) = next else { break };
        let ev = item.expect("well-formed SSE");
        let data = serde_json::from_str(&ev.data)
            .unwrap_or_else(|e| panic!("message data is not JSON ({e}): {}", ev.data));
        out.push(Msg {
            event: ev.event,
            id: ev.id,
            data,
        });
    }
    out
}

/// Complete agent events among `msgs`.
pub fn complete(msgs: &[Msg]) -> Vec<Value> {
    msgs.iter()
        .filter(|m| m.is_event() && !m.is_partial())
        .map(|m| m.data.clone())
        .collect()
}

/// The concatenated text parts of an event.
pub fn text_of(event: &Value) -> String {
    event["content"]["parts"]
        .as_array()
        .map(|parts| {
            parts
                .iter()
                .filter(|p| p["thought"] != true)
                .filter_map(|p| p["text"].as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// The run status of the final `event: done` (asserting the stream ends with one).
pub fn done_status(msgs: &[Msg]) -> String {
    let last = msgs.last().expect("messages");
    assert_eq!(last.event, "done", "the stream ends with done: {msgs:#?}");
    last.data["status"].as_str().unwrap_or_default().to_string()
}

type SseItems = Pin<
    Box<
        dyn Stream<Item = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>>
            + Send,
    >,
>;

/// An open event stream, read message by message; every byte received is kept too.
pub struct Sse {
    headers: reqwest::header::HeaderMap,
    raw: Arc<Mutex<Vec<u8>>>,
    items: SseItems,
}

impl Sse {
    pub async fn open(resp: reqwest::Response) -> Sse {
        let status = resp.status();
        if status != 200 {
            let body = resp.text().await.unwrap_or_default();
            panic!("expected a 200 event stream, got {status}: {body}");
        }
        let headers = resp.headers().clone();
        let raw = Arc::new(Mutex::new(Vec::new()));
        let sink = raw.clone();
        let items = resp
            .bytes_stream()
            .inspect(move |chunk| {
                if let Ok(bytes) = chunk {
                    sink.lock().unwrap().extend_from_slice(bytes);
                }
            })
            .eventsource();
        Sse {
            headers,
            raw,
            items: Box::pin(items),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn run_id(&self) -> String {
        self.header("x-agentd-run-id")
            .expect("x-agentd-run-id header")
            .to_string()
    }

    /// The next message, `None` once the stream has ended.
    pub async fn next(&mut self) -> Option<Msg> {
        let item = tokio::time::timeout(PATIENCE, self.items.next())
            .await
            .expect("the stream stalled")?;
        let ev = item.expect("well-formed SSE");
        let data = serde_json::from_str(&ev.data)
            .unwrap_or_else(|e| panic!("message data is not JSON ({e}): {}", ev.data));
        Some(Msg {
            event: ev.event,
            id: ev.id,
            data,
        })
    }

    /// Reads until a message matches, returning everything read up to and including it.
    pub async fn until(&mut self, stop: impl Fn(&Msg) -> bool) -> Vec<Msg> {
        let mut read = vec![];
        loop {
            let msg = self
                .next()
                .await
                .expect("stream ended before the awaited message");
            let done = stop(&msg);
            read.push(msg);
            if done {
                return read;
            }
        }
    }

    /// Every remaining message, to the end of the stream.
    pub async fn rest(&mut self) -> Vec<Msg> {
        let mut read = vec![];
        while let Some(msg) = self.next().await {
            read.push(msg);
        }
        read
    }

    /// The raw SSE messages received so far (each without its terminating blank line).
    pub fn frames(&self) -> Vec<String> {
        let raw = String::from_utf8(self.raw.lock().unwrap().clone()).expect("UTF-8 stream");
        assert!(
            raw.is_empty() || raw.ends_with("\n\n"),
            "stream ends mid-message: {raw:?}"
        );
        raw.split_terminator("\n\n").map(str::to_string).collect()
    }
}

impl Sse {
    /// Reads until a message matches and returns that message.
    pub async fn next_matching(&mut self, stop: impl Fn(&Msg) -> bool) -> Msg {
        let mut read = self.until(stop).await;
        read.pop().expect("the awaited message")
    }
}
