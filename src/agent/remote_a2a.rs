//! `RemoteA2aAgent`: another A2A agent (agentd or any A2A 1.0 server) as a sub-agent. Its
//! answer streams back as partial events (the remote task's artifact chunks) and is committed
//! as one event carrying the remote context and task ids (`customMetadata`); the next turn
//! continues the same remote context. A cancelled local run cancels the remote task (a drop
//! guard sends `CancelTask`, however the run stopped).
//!
//! ```yaml
//! agent_class: RemoteA2aAgent
//! name: billing
//! description: Answers billing questions.
//! agent_card: https://agents.example.com/a2a/billing/.well-known/agent-card.json
//! auth_header_env: BILLING_AUTH      # optional: the Authorization header's value
//! allow_private: [10.0.0.0/8]        # optional: as for HTTP tools (SSRF rules)
//! ```

use super::{Agent, AgentError, AgentResult};
use crate::event::{Content, Event, JsonMap};
use crate::invocation::InvocationContext;
use crate::store::EventRange;
use crate::tools::egress::{EgressPolicy, Resolver};
use async_trait::async_trait;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `customMetadata` keys of the committed answer (ADK's names).
/// The prefix of the metadata a remote A2A agent keeps on its events: agentd writes it, and a
/// client may not (a run's `customMetadata`, imported events).
pub const METADATA_PREFIX: &str = "a2a:";
pub const CONTEXT_ID: &str = "a2a:context_id";
pub const TASK_ID: &str = "a2a:task_id";
const STATE: &str = "a2a:state";

/// Events read back to find the remote context of the last turn.
const HISTORY: u32 = 200;
/// The longest answer kept (bytes of text, all artifacts together).
const MAX_TEXT: usize = 1 << 20;
/// The most a remote agent may send: its card, an error body, a whole stream.
const MAX_CARD: usize = 1 << 20;
const MAX_STREAM: usize = 64 << 20;
/// Artifacts of one answer remembered.
const MAX_ARTIFACTS: usize = 256;
/// How long reading the card may take.
const CARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the agent card is: a URL, or the card itself.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum CardSource {
    Url(String),
    Inline(Value),
}

/// The YAML settings of a `RemoteA2aAgent`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteA2aSettings {
    pub agent_card: CardSource,
    /// An environment variable holding the `Authorization` header's value (`Bearer …`).
    #[serde(default)]
    pub auth_header_env: Option<String>,
    /// Private addresses the agent may reach (addresses, CIDR blocks, host names, `*`).
    #[serde(default)]
    pub allow_private: Vec<String>,
    /// The longest a remote answer may take, in seconds (default 600).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

pub struct RemoteA2aAgent {
    pub name: String,
    pub description: String,
    settings: RemoteA2aSettings,
    egress: EgressPolicy,
    client: reqwest::Client,
    /// The JSON-RPC URL, once the card was read.
    endpoint: tokio::sync::OnceCell<String>,
}

impl RemoteA2aAgent {
    pub fn new(
        name: String,
        description: String,
        settings: RemoteA2aSettings,
    ) -> Result<Self, String> {
        let egress = EgressPolicy::parse(&settings.allow_private)?;
        if let CardSource::Url(url) = &settings.agent_card {
            let parsed =
                reqwest::Url::parse(url).map_err(|e| format!("agent_card: not a URL: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err("agent_card: an http(s) URL".into());
            }
            egress
                .check_url(&parsed)
                .map_err(|e| format!("agent_card: {e}"))?;
        }
        // Redirects are not followed (a redirect would lead around the egress rule and
        // replay the credential elsewhere); no proxy (it would resolve the target itself).
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(Resolver(egress.clone())))
            .user_agent(concat!("agentd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(RemoteA2aAgent {
            name,
            description,
            settings,
            egress,
            client,
            endpoint: tokio::sync::OnceCell::new(),
        })
    }

    fn auth(&self) -> Option<String> {
        let var = self.settings.auth_header_env.as_ref()?;
        std::env::var(var).ok().filter(|v| !v.is_empty())
    }

    fn request(&self, url: &str) -> reqwest::RequestBuilder {
        let mut r = self.client.post(url).header("A2A-Version", "1.0");
        if let Some(auth) = self.auth() {
            r = r.header("authorization", auth);
        }
        r
    }

    /// The remote agent's JSON-RPC URL, from its card (read once).
    async fn endpoint(&self) -> AgentResult<&str> {
        self.endpoint
            .get_or_try_init(|| async {
                let card = match &self.settings.agent_card {
                    CardSource::Inline(card) => card.clone(),
                    CardSource::Url(url) => {
                        let mut req = self.client.get(url);
                        if let Some(auth) = self.auth() {
                            req = req.header("authorization", auth);
                        }
                        let resp = req.timeout(CARD_TIMEOUT).send().await.map_err(|e| {
                            card_error("it could not be read", format!(
                                "cannot read the agent card at {url}: {}",
                                cause(&e)
                            ))
                        })?;
                        if !resp.status().is_success() {
                            return Err(card_error("it could not be read", format!(
                                "the agent card at {url} answered {}",
                                resp.status()
                            )));
                        }
                        let body = read_bounded(resp, MAX_CARD).await.map_err(|e| {
                            card_error("it could not be read", format!("cannot read the agent card at {url}: {e}"))
                        })?;
                        serde_json::from_slice::<Value>(&body).map_err(|e| {
                            card_error("it is not JSON", format!("the agent card at {url} is not JSON: {e}"))
                        })?
                    }
                };
                let url = jsonrpc_url(&card).ok_or_else(|| {
                    card_error("it offers no A2A 1.0 JSON-RPC interface", "the agent card offers no A2A 1.0 JSON-RPC interface".into())
                })?;
                let parsed = reqwest::Url::parse(&url)
                    .map_err(|e| card_error("it could not be read", format!("the card's URL is not a URL: {e}")))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(card_error("its interface is not http(s)", "the card's interface is not http(s)".into()));
                }
                self.egress
                    .check_url(&parsed)
                    .map_err(|e| card_error("its interface is not an address agents may reach", e.to_string()))?;
                // The credential goes only where the card came from: a card must not send
                // it to another host (or from https down to http).
                if let (CardSource::Url(card_url), Some(_)) =
                    (&self.settings.agent_card, self.auth())
                {
                    let card_url = reqwest::Url::parse(card_url)
                        .map_err(|e| card_error("it could not be read", format!("agent_card: {e}")))?;
                    if card_url.origin() != parsed.origin() {
                        return Err(card_error("its interface is on another origin than the card, and the credential goes only to the card's origin", format!(
                            "the card names an interface on another origin ({}) than the card's \
                             ({}); the credential of auth_header_env is only sent to the card's \
                             origin",
                            parsed.origin().ascii_serialization(),
                            card_url.origin().ascii_serialization()
                        )));
                    }
                }
                Ok(url)
            })
            .await
            .map(String::as_str)
    }
}

/// A response body, refused once it passes `limit` bytes.
async fn read_bounded(resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| cause(&e))?;
        if body.len() + chunk.len() > limit {
            return Err(format!("it is over {limit} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn remote(message: String) -> AgentError {
    AgentError::failed("RemoteA2aError", message)
}

/// What a remote agent said about a failure, cut to a bounded length for the run's error.
fn bounded(text: &str) -> String {
    text.chars().take(1024).collect()
}

/// A card that could not be read or used: the run's error says why in words of its own; the
/// details (URLs of the operator's network, what a resolver said) go to the log only.
fn card_error(reason: &str, detail: String) -> AgentError {
    tracing::warn!(%detail, "a remote A2A agent's card could not be used");
    remote(format!(
        "the remote agent's card could not be used: {reason} (details in the server log)"
    ))
}

/// The innermost cause of a request error (a refused address, a DNS failure).
fn cause(e: &reqwest::Error) -> String {
    let mut source: &dyn std::error::Error = e;
    while let Some(s) = source.source() {
        source = s;
    }
    source.to_string()
}

/// The card's JSON-RPC interface for protocol 1.0 (`supportedInterfaces`).
pub fn jsonrpc_url(card: &Value) -> Option<String> {
    card.get("supportedInterfaces")?
        .as_array()?
        .iter()
        .find(|i| {
            i.get("protocolBinding").and_then(Value::as_str) == Some("JSONRPC")
                && i.get("protocolVersion")
                    .and_then(Value::as_str)
                    .is_none_or(|v| v.starts_with('1'))
        })
        .and_then(|i| i.get("url")?.as_str().map(str::to_string))
}

/// The text of A2A parts.
fn text_of(parts: &Value) -> String {
    parts
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default()
}

/// What a stream told so far: the task, its artifacts (in order), its last state.
#[derive(Default)]
struct Answer {
    task_id: Option<String>,
    context_id: Option<String>,
    artifacts: BTreeMap<usize, (String, String)>,
    state: Option<String>,
    status_text: String,
}

impl Answer {
    /// Records a chunk (`append`) or a whole artifact; beyond [`MAX_TEXT`] bytes in all, or
    /// [`MAX_ARTIFACTS`] artifacts, the rest is dropped.
    fn artifact(&mut self, id: &str, text: &str, append: bool) {
        let total: usize = self.artifacts.values().map(|(_, t)| t.len()).sum();
        let n = self.artifacts.len();
        let slot = self
            .artifacts
            .values_mut()
            .find(|(aid, _)| aid == id)
            .map(|(_, t)| t);
        let room = |used: usize| MAX_TEXT.saturating_sub(used);
        match slot {
            Some(t) if append => {
                let cut = prefix(text, room(total));
                t.push_str(cut);
            }
            Some(t) => {
                let others = total - t.len();
                *t = prefix(text, room(others)).to_string();
            }
            None if n < MAX_ARTIFACTS => {
                let cut = prefix(text, room(total));
                self.artifacts.insert(n, (id.to_string(), cut.to_string()));
            }
            None => {}
        }
    }

    fn text(&self) -> String {
        let t: String = self.artifacts.values().map(|(_, t)| t.as_str()).collect();
        if t.is_empty() {
            self.status_text.clone()
        } else {
            t
        }
    }

    fn ended(&self) -> bool {
        matches!(
            self.state.as_deref(),
            Some(
                "TASK_STATE_COMPLETED"
                    | "TASK_STATE_FAILED"
                    | "TASK_STATE_CANCELED"
                    | "TASK_STATE_REJECTED"
                    | "TASK_STATE_INPUT_REQUIRED"
                    | "TASK_STATE_AUTH_REQUIRED"
            )
        )
    }
}

/// The longest prefix of `text` of at most `max` bytes, on a character boundary.
fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

/// Cancels the remote task if the local run stops before it ended (dropped with the run's
/// future, or on a cancel).
struct CancelGuard {
    client: reqwest::Client,
    url: String,
    auth: Option<String>,
    task: Arc<Mutex<Option<String>>>,
    armed: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Some(task) = self.task.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut req = self.client.post(&self.url).header("A2A-Version", "1.0");
        if let Some(auth) = &self.auth {
            req = req.header("authorization", auth);
        }
        let body = json!({"jsonrpc": "2.0", "id": "cancel", "method": "CancelTask",
                          "params": {"id": task}});
        rt.spawn(async move {
            let sent = tokio::time::timeout(Duration::from_secs(30), req.json(&body).send()).await;
            match sent {
                Ok(Ok(r)) if r.status().is_success() => {
                    tracing::info!(remote_task = %task, "remote A2A task cancel sent")
                }
                _ => tracing::warn!(remote_task = %task, "could not cancel the remote A2A task"),
            }
        });
    }
}

impl RemoteA2aAgent {
    /// The remote context of this agent's last answer in the session, if any, and its task
    /// when that task waits for input (the next message answers it).
    async fn last_context(&self, ctx: &InvocationContext) -> Option<(String, Option<String>)> {
        let key = ctx.session_key();
        let head = ctx.store().session_head(key).await.ok()??;
        let page = ctx
            .store()
            .list_events(
                key,
                EventRange {
                    after: None,
                    before: Some(head.last_seq + 1),
                    limit: HISTORY,
                },
            )
            .await
            .ok()??;
        // Only what this server's own runs of the session wrote, and not an error or an abort:
        // an imported event, or a run's client-chosen metadata on a seal, must not steer the
        // remote context this agent's credential reaches.
        let ours = ctx.store().run_invocations(key).await.ok()?;
        page.events.iter().rev().find_map(|e| {
            let trusted = ours.contains(&e.event.invocation_id)
                && e.event.error_code.is_none()
                && e.event.interrupted != Some(true);
            if e.event.author != self.name || !trusted {
                return None;
            }
            let meta = e.event.custom_metadata.as_ref()?;
            let context = meta.get(CONTEXT_ID)?.as_str()?.to_string();
            let waiting =
                meta.get(STATE).and_then(Value::as_str) == Some("TASK_STATE_INPUT_REQUIRED");
            let task = meta
                .get(TASK_ID)
                .and_then(Value::as_str)
                .filter(|_| waiting)
                .map(str::to_string);
            Some((context, task))
        })
    }

    async fn call(&self, ctx: &InvocationContext) -> AgentResult {
        // One deadline for everything: the card, the request, the whole answer.
        let limit = Duration::from_secs(self.settings.timeout_secs.unwrap_or(600));
        let deadline = tokio::time::Instant::now() + limit;
        let late = || remote(format!("no answer within {} s", limit.as_secs()));
        let url = tokio::time::timeout_at(deadline, self.endpoint())
            .await
            .map_err(|_| late())??
            .to_string();
        let (context_id, task_id) = self.last_context(ctx).await.unwrap_or_default();
        let text = ctx.user_text();
        let message = json!({
            "messageId": uuid::Uuid::new_v4().to_string(),
            "role": "ROLE_USER",
            "parts": [{"text": text}],
            "contextId": context_id,
            "taskId": task_id.unwrap_or_default(),
        });
        let body = json!({"jsonrpc": "2.0", "id": ctx.invocation_id(),
            "method": "SendStreamingMessage", "params": {"message": message}});
        let task = Arc::new(Mutex::new(None));
        let mut guard = CancelGuard {
            client: self.client.clone(),
            url: url.clone(),
            auth: self.auth(),
            task: task.clone(),
            armed: true,
        };
        let send = self
            .request(&url)
            .header("accept", "text/event-stream")
            .json(&body)
            .send();
        let resp = tokio::select! {
            r = tokio::time::timeout_at(deadline, send) => r
                .map_err(|_| late())?
                .map_err(|e| {
                    tracing::warn!(error = %cause(&e), "a remote A2A agent could not be reached");
                    remote("cannot reach the remote agent (the reason is in the server log)".into())
                })?,
            _ = ctx.cancellation().cancelled() => return Err(AgentError::Cancelled),
        };
        if !resp.status().is_success() {
            return Err(remote(format!(
                "the remote agent answered {}",
                resp.status()
            )));
        }
        let is_sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_sse {
            // A JSON-RPC error before the stream.
            let body = read_bounded(resp, MAX_CARD).await.unwrap_or_default();
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            guard.armed = false;
            return Err(remote(format!(
                "the remote agent refused the message: {}",
                bounded(v["error"]["message"].as_str().unwrap_or("no reason given"))
            )));
        }
        // The whole stream is bounded: a remote agent cannot grow agentd's memory without end.
        let received = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = received.clone();
        let bytes = resp.bytes_stream().map(move |chunk| {
            let chunk = chunk?;
            counted.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
            Ok::<_, reqwest::Error>(chunk)
        });
        let mut events = eventsource_stream::Eventsource::eventsource(bytes);
        let mut answer = Answer::default();
        while !answer.ended() {
            if received.load(std::sync::atomic::Ordering::Relaxed) > MAX_STREAM {
                return Err(remote(format!(
                    "the remote answer passed {MAX_STREAM} bytes"
                )));
            }
            let next = tokio::select! {
                next = events.next() => next,
                _ = ctx.cancellation().cancelled() => return Err(AgentError::Cancelled),
                _ = tokio::time::sleep_until(deadline) => return Err(late()),
            };
            let Some(event) = next else { break };
            let event = event.map_err(|e| remote(format!("the remote stream broke: {e}")))?;
            let Ok(v) = serde_json::from_str::<Value>(&event.data) else {
                continue;
            };
            if let Some(err) = v.get("error") {
                return Err(remote(format!(
                    "the remote agent failed: {}",
                    bounded(err["message"].as_str().unwrap_or("no reason given"))
                )));
            }
            let r = &v["result"];
            // Every kind of response names its task and context (a server need not send the
            // task first): the cancel guard and the next turn need them.
            for kind in ["task", "statusUpdate", "artifactUpdate", "message"] {
                let (task_key, context_key) = if kind == "task" {
                    ("id", "contextId")
                } else {
                    ("taskId", "contextId")
                };
                if let Some(obj) = r.get(kind) {
                    if let Some(t) = obj[task_key].as_str().filter(|t| !t.is_empty()) {
                        answer.task_id = Some(t.to_string());
                        *task.lock().unwrap_or_else(|p| p.into_inner()) = answer.task_id.clone();
                    }
                    if let Some(c) = obj[context_key].as_str().filter(|c| !c.is_empty()) {
                        answer.context_id = Some(c.to_string());
                    }
                }
            }
            if let Some(t) = r.get("task") {
                answer.state = t["status"]["state"].as_str().map(str::to_string);
            } else if let Some(m) = r.get("message") {
                // A direct answer, without a task: the message is the whole answer.
                answer.status_text = prefix(&text_of(&m["parts"]), MAX_TEXT).to_string();
                answer.state = Some("TASK_STATE_COMPLETED".into());
            } else if let Some(a) = r.get("artifactUpdate") {
                let chunk = text_of(&a["artifact"]["parts"]);
                let id = a["artifact"]["artifactId"].as_str().unwrap_or("");
                let append = a["append"].as_bool().unwrap_or(false);
                let last = a["lastChunk"].as_bool().unwrap_or(false);
                answer.artifact(id, &chunk, append);
                // Chunks stream on as partial events (when the run streams); a whole
                // artifact is in the final one.
                if !last && !chunk.is_empty() && ctx.run_config().streaming {
                    let mut ev = ctx.new_event().with_content(Content::text("model", chunk));
                    ev.partial = Some(true);
                    ctx.emit(ev).await?;
                }
            } else if let Some(s) = r.get("statusUpdate") {
                answer.state = s["status"]["state"].as_str().map(str::to_string);
                let said = text_of(&s["status"]["message"]["parts"]);
                if !said.is_empty() {
                    answer.status_text = prefix(&said, MAX_TEXT).to_string();
                }
            }
        }
        guard.armed = !answer.ended();
        let state = answer.state.clone().unwrap_or_default();
        match state.as_str() {
            "TASK_STATE_COMPLETED" | "TASK_STATE_INPUT_REQUIRED" => {}
            "" => return Err(remote("the remote stream ended without a state".into())),
            other => {
                return Err(remote(format!(
                    "the remote task ended {other}: {}",
                    answer.status_text
                )))
            }
        }
        let mut reply: Event = ctx
            .new_event()
            .with_content(Content::text("model", answer.text()));
        let mut meta = JsonMap::new();
        meta.insert(CONTEXT_ID.into(), json!(answer.context_id));
        meta.insert(TASK_ID.into(), json!(answer.task_id));
        meta.insert(STATE.into(), json!(state));
        reply.custom_metadata = Some(meta);
        ctx.emit_final(reply).await
    }
}

#[async_trait]
impl Agent for RemoteA2aAgent {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn agent_class(&self) -> &str {
        "RemoteA2aAgent"
    }

    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        self.call(ctx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jsonrpc_interface_of_a_card() {
        let card = json!({"supportedInterfaces": [
            {"url": "http://h/a2a/x", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
            {"url": "http://h/a2a/x", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]});
        assert_eq!(jsonrpc_url(&card).as_deref(), Some("http://h/a2a/x"));
        let old = json!({"url": "http://h/", "preferredTransport": "JSONRPC"});
        assert_eq!(jsonrpc_url(&old), None, "a 0.3 card is not spoken");
    }

    #[test]
    fn an_answer_aggregates_chunks_and_whole_artifacts() {
        let mut a = Answer::default();
        a.artifact("a0", "Hel", false);
        a.artifact("a0", "lo", true);
        assert_eq!(a.text(), "Hello");
        a.artifact("a0", "Hello!", false);
        a.artifact("a1", " Bye", false);
        assert_eq!(a.text(), "Hello! Bye");
        a.state = Some("TASK_STATE_WORKING".into());
        assert!(!a.ended());
        a.state = Some("TASK_STATE_INPUT_REQUIRED".into());
        assert!(a.ended());
    }

    #[test]
    fn an_answer_is_bounded() {
        let mut a = Answer::default();
        let big = "é".repeat(MAX_TEXT); // 2 bytes each: twice the bound
        a.artifact("a0", &big, false);
        assert!(a.text().len() <= MAX_TEXT && a.text().len() > MAX_TEXT - 2);
        a.artifact("a0", "more", true);
        assert!(a.text().len() <= MAX_TEXT, "appends stop at the bound");
        let mut b = Answer::default();
        for i in 0..MAX_ARTIFACTS + 50 {
            b.artifact(&format!("a{i}"), "x", false);
        }
        assert_eq!(b.artifacts.len(), MAX_ARTIFACTS);
    }

    /// A card that names an interface on another origin does not get the credential.
    #[tokio::test]
    async fn the_credential_goes_only_to_the_cards_origin() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let card = json!({"supportedInterfaces": [{"url": format!("http://127.0.0.1:{}/a2a/x", port + 1),
            "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]});
        let app = axum::Router::new().route(
            "/card.json",
            axum::routing::get(move || {
                let card = card.clone();
                async move { axum::Json(card) }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        std::env::set_var("AGENTD_TEST_REMOTE_AUTH", "Bearer secret");
        let settings = |auth: Option<&str>| RemoteA2aSettings {
            agent_card: CardSource::Url(format!("http://127.0.0.1:{port}/card.json")),
            auth_header_env: auth.map(str::to_string),
            allow_private: vec!["127.0.0.1".into()],
            timeout_secs: None,
        };
        let with = RemoteA2aAgent::new(
            "r".into(),
            String::new(),
            settings(Some("AGENTD_TEST_REMOTE_AUTH")),
        )
        .unwrap();
        let err = with.endpoint().await.unwrap_err().message();
        assert!(err.contains("another origin"), "{err}");
        let without = RemoteA2aAgent::new("r".into(), String::new(), settings(None)).unwrap();
        assert_eq!(
            without.endpoint().await.unwrap(),
            format!("http://127.0.0.1:{}/a2a/x", port + 1),
            "without a credential another origin is fine"
        );
    }

    #[test]
    fn settings_refuse_a_private_card_unless_allowed() {
        let s = |allow: Vec<String>| RemoteA2aSettings {
            agent_card: CardSource::Url(
                "http://127.0.0.1:9/a2a/x/.well-known/agent-card.json".into(),
            ),
            auth_header_env: None,
            allow_private: allow,
            timeout_secs: None,
        };
        assert!(RemoteA2aAgent::new("r".into(), String::new(), s(vec![])).is_err());
        assert!(
            RemoteA2aAgent::new("r".into(), String::new(), s(vec!["127.0.0.1".into()])).is_ok()
        );
    }
}
