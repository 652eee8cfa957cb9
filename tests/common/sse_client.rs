//! Reads an agentd `/run` (or ADK `/run_sse`) response to its end with a real SSE parser.
#![allow(dead_code)]

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::Value;
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
}

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
