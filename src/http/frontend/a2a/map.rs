//! Pure mappings between agentd's runs and A2A's objects: a run is a task, its session the
//! task's context, committed events the task's history and artifacts, the runner's items a
//! task's stream. Nothing here reads the database or the clock beyond stamping a status.
//!
//! Parts follow ADK's own A2A converter, so an ADK `RemoteA2aAgent` reads agentd as it reads
//! ADK: text is text, inline data is `raw` bytes with their media type, a file reference is a
//! `url`, and function calls and responses are `data` parts tagged `adk_type` in their
//! metadata.

use super::error::{A2aError, A2aResult};
use crate::event::{Blob, Bytes64, Content, Event, FunctionCall, FunctionResponse, JsonMap};
use crate::store::{RunRecord, RunStatus};
use crate::transcript::RunItem;
use a2a_types as a2a;
use a2a_types::{part, stream_response};
use serde_json::Value;
use std::collections::BTreeMap;

/// The metadata key ADK's A2A converter tags data parts with.
pub const ADK_TYPE: &str = "adk_type";
const FUNCTION_CALL: &str = "function_call";
const FUNCTION_RESPONSE: &str = "function_response";

pub use crate::a2a_task::{is_terminal, task_state, text_part, timestamp};

fn now() -> pbjson_types::Timestamp {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    timestamp(secs)
}

fn struct_of(map: serde_json::Map<String, Value>) -> Option<pbjson_types::Struct> {
    serde_json::from_value(Value::Object(map)).ok()
}

fn data_part(value: Value, adk_type: &str) -> Option<a2a::Part> {
    let mut meta = serde_json::Map::new();
    meta.insert(ADK_TYPE.into(), Value::String(adk_type.into()));
    Some(a2a::Part {
        content: Some(part::Content::Data(serde_json::from_value(value).ok()?)),
        metadata: struct_of(meta),
        filename: String::new(),
        media_type: String::new(),
    })
}

/// An event's content as A2A parts (thoughts are the agent's own and stay out).
pub fn parts_of(event: &Event) -> Vec<a2a::Part> {
    let mut out = vec![];
    for p in event.content.iter().flat_map(|c| c.parts.iter()) {
        if p.thought == Some(true) {
            continue;
        }
        if let Some(text) = &p.text {
            out.push(text_part(text.clone()));
        }
        if let Some(blob) = &p.inline_data {
            out.push(a2a::Part {
                content: Some(part::Content::Raw(blob.data.0.clone())),
                metadata: None,
                filename: blob.display_name.clone().unwrap_or_default(),
                media_type: blob.mime_type.clone().unwrap_or_default(),
            });
        }
        if let Some(Value::Object(file)) = p.extra.get("fileData") {
            if let Some(uri) = file.get("fileUri").and_then(Value::as_str) {
                out.push(a2a::Part {
                    content: Some(part::Content::Url(uri.to_string())),
                    metadata: None,
                    filename: file
                        .get("displayName")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    media_type: file
                        .get("mimeType")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                });
            }
        }
        if let Some(call) = &p.function_call {
            out.extend(
                serde_json::to_value(call)
                    .ok()
                    .and_then(|v| data_part(v, FUNCTION_CALL)),
            );
        }
        if let Some(response) = &p.function_response {
            out.extend(
                serde_json::to_value(response)
                    .ok()
                    .and_then(|v| data_part(v, FUNCTION_RESPONSE)),
            );
        }
    }
    out
}

/// The agent's (non-thought) text of an event.
fn text_of(event: &Event) -> String {
    crate::http::frontend::kit::answer_text(event)
}

/// Where a user event keeps the A2A `messageId` its client sent.
const MESSAGE_ID: &str = "a2a:message_id";

/// What the user event of a run keeps of the client's message: its `messageId`.
pub fn message_metadata(message: &a2a::Message) -> Option<JsonMap> {
    (!message.message_id.is_empty() && message.message_id.len() <= 256).then(|| {
        let mut m = JsonMap::new();
        m.insert(MESSAGE_ID.into(), Value::String(message.message_id.clone()));
        m
    })
}

/// An event as an A2A message (none if it says nothing A2A can carry).
pub fn message_of(event: &Event, task_id: &str, context_id: &str) -> Option<a2a::Message> {
    let parts = parts_of(event);
    if parts.is_empty() {
        return None;
    }
    let role = if event.author == "user" {
        a2a::Role::User
    } else {
        a2a::Role::Agent
    };
    // The client's own id for its message, when it sent one (kept with the user event).
    let message_id = event
        .custom_metadata
        .as_ref()
        .and_then(|m| m.get(MESSAGE_ID))
        .and_then(|v| v.as_str())
        .filter(|_| role == a2a::Role::User)
        .unwrap_or(&event.id)
        .to_string();
    Some(a2a::Message {
        message_id,
        context_id: context_id.to_string(),
        task_id: task_id.to_string(),
        role: role.into(),
        parts,
        metadata: None,
        extensions: vec![],
        reference_task_ids: vec![],
    })
}

/// Whether an event's text is an artifact: the agent's (non-thought) text.
fn artifact_text(event: &Event) -> Option<String> {
    if event.author == "user" {
        return None;
    }
    Some(text_of(event)).filter(|t| !t.is_empty())
}

/// The id of a task's `n`th artifact (from 0). Ordinals, not event ids: a streamed answer's
/// partial events and its complete event have different ids, and the artifact a stream
/// builds chunk by chunk must be the one the stored task shows.
pub fn artifact_id(task_id: &str, n: usize) -> String {
    format!("{task_id}-artifact-{n}")
}

/// The artifacts a task's committed events make: one per agent event with text.
pub fn artifacts_of(task_id: &str, events: &[Event]) -> Vec<a2a::Artifact> {
    events
        .iter()
        .filter_map(|e| artifact_text(e).map(|t| (e, t)))
        .enumerate()
        .map(|(n, (e, text))| artifact(&artifact_id(task_id, n), &e.author, text))
        .collect()
}

fn artifact(id: &str, author: &str, text: String) -> a2a::Artifact {
    a2a::Artifact {
        artifact_id: id.to_string(),
        name: author.to_string(),
        description: String::new(),
        parts: vec![text_part(text)],
        metadata: None,
        extensions: vec![],
    }
}

/// The message a status carries: why a task failed, or the calls an input-required task
/// waits for (as `function_call` data parts, so the client knows what to answer).
fn status_message(
    task_id: &str,
    context_id: &str,
    error: Option<&str>,
    waiting: &[&FunctionCall],
) -> Option<a2a::Message> {
    let parts: Vec<a2a::Part> = match error {
        Some(e) => vec![text_part(e.to_string())],
        None => waiting
            .iter()
            .filter_map(|c| {
                serde_json::to_value(c)
                    .ok()
                    .and_then(|v| data_part(v, FUNCTION_CALL))
            })
            .collect(),
    };
    (!parts.is_empty()).then(|| crate::a2a_task::status_message(task_id, context_id, parts))
}

/// The calls in `events` still waiting for the client, in order.
pub fn waiting_calls(events: &[Event]) -> Vec<&FunctionCall> {
    let open = crate::http::frontend::kit::waiting_calls(events);
    events
        .iter()
        .flat_map(|e| e.function_calls())
        .filter(|c| c.id.as_ref().is_some_and(|id| open.contains_key(id)))
        .collect()
}

/// A task as the stored run says: its committed `events` (oldest first), the newest
/// `history_length` of them as history (all when `None`), artifacts if asked.
pub fn task_of(
    run: &RunRecord,
    events: &[Event],
    history_length: Option<usize>,
    with_artifacts: bool,
) -> a2a::Task {
    let waiting = waiting_calls(events);
    let state = task_state(run.status, !waiting.is_empty());
    let mut history: Vec<a2a::Message> = events
        .iter()
        .filter_map(|e| message_of(e, &run.run_id, &run.session_id))
        .collect();
    if let Some(n) = history_length {
        let skip = history.len().saturating_sub(n);
        history.drain(..skip);
    }
    let error = (state == a2a::TaskState::Failed).then(|| crate::a2a_task::failure(run));
    let at = run.finished_at.or(run.started_at).unwrap_or(run.created_at);
    a2a::Task {
        id: run.run_id.clone(),
        context_id: run.session_id.clone(),
        status: Some(a2a::TaskStatus {
            state: state.into(),
            message: status_message(&run.run_id, &run.session_id, error.as_deref(), &waiting),
            timestamp: Some(timestamp(at)),
        }),
        artifacts: if with_artifacts {
            artifacts_of(&run.run_id, events)
        } else {
            vec![]
        },
        history,
        metadata: usage_metadata(run),
    }
}

/// The run's token counts and cost as the task's metadata (`agentd_usage`, docs/usage.md),
/// once it has called a model.
fn usage_metadata(run: &RunRecord) -> Option<pbjson_types::Struct> {
    let usage = run.usage.as_ref().filter(|u| !u.is_empty())?;
    let mut meta = serde_json::Map::new();
    meta.insert(
        "agentd_usage".into(),
        serde_json::to_value(usage.totals()).ok()?,
    );
    struct_of(meta)
}

/// One A2A message's parts as agentd's: text as text, `raw` as inline data, `url` as a
/// file reference, `data` tagged as a function response as that response (the caller checks
/// it answers a waiting call), any other `data` as its JSON text (ADK's rule).
pub fn incoming_parts(message: &a2a::Message) -> A2aResult<Vec<crate::event::Part>> {
    let mut out = vec![];
    for p in &message.parts {
        let mut part = crate::event::Part::default();
        match &p.content {
            Some(part::Content::Text(t)) => part.text = Some(t.clone()),
            Some(part::Content::Raw(bytes)) => {
                part.inline_data = Some(Blob {
                    data: Bytes64(bytes.to_vec()),
                    mime_type: Some(if p.media_type.is_empty() {
                        "application/octet-stream".into()
                    } else {
                        p.media_type.clone()
                    }),
                    display_name: (!p.filename.is_empty()).then(|| p.filename.clone()),
                })
            }
            Some(part::Content::Url(url)) => {
                let mut file = JsonMap::new();
                file.insert("fileUri".into(), Value::String(url.clone()));
                if !p.media_type.is_empty() {
                    file.insert("mimeType".into(), Value::String(p.media_type.clone()));
                }
                part.extra.insert("fileData".into(), Value::Object(file));
            }
            Some(part::Content::Data(data)) => {
                let value = serde_json::to_value(data)
                    .map(whole_numbers)
                    .map_err(|e| A2aError::InvalidParams(format!("data part: {e}")))?;
                let tag = p
                    .metadata
                    .as_ref()
                    .and_then(|m| serde_json::to_value(m).ok())
                    .and_then(|m| m.get(ADK_TYPE).and_then(Value::as_str).map(str::to_string));
                if tag.as_deref() == Some(FUNCTION_RESPONSE) {
                    let response: FunctionResponse =
                        serde_json::from_value(value).map_err(|e| {
                            A2aError::InvalidParams(format!(
                                "a function_response data part needs name, id and response: {e}"
                            ))
                        })?;
                    part.function_response = Some(response);
                } else {
                    part.text = Some(value.to_string());
                }
            }
            None => {
                return Err(A2aError::InvalidParams(
                    "every part needs text, raw, url or data".into(),
                ))
            }
        }
        out.push(part);
    }
    if out.is_empty() {
        return Err(A2aError::InvalidParams("the message has no parts".into()));
    }
    Ok(out)
}

/// The message a `SendMessageRequest` sends, checked (present, from the user), and its parts
/// as ADK parts.
pub fn checked_input(
    req: &a2a::SendMessageRequest,
) -> A2aResult<(&a2a::Message, Vec<crate::event::Part>)> {
    let message = req
        .message
        .as_ref()
        .ok_or_else(|| A2aError::InvalidParams("params.message is required".into()))?;
    if message.role != i32::from(a2a::Role::User) && message.role != 0 {
        return Err(A2aError::InvalidParams(
            "a message sent to an agent has role ROLE_USER".into(),
        ));
    }
    Ok((message, incoming_parts(message)?))
}

/// ADK's run option, from the request's metadata: inline files become artifacts.
pub fn saves_blobs(req: &a2a::SendMessageRequest) -> bool {
    req.metadata
        .as_ref()
        .and_then(|m| serde_json::to_value(m).ok())
        .is_some_and(|m| {
            m.get("saveInputBlobsAsArtifacts")
                .or_else(|| m.get("save_input_blobs_as_artifacts"))
                == Some(&Value::Bool(true))
        })
}

/// The task a message just started: `SUBMITTED`, with the user's message as its history (a
/// message without an id gets one).
pub fn submitted(
    task_id: &str,
    context_id: &str,
    parts: &[crate::event::Part],
    message_id: &str,
) -> a2a::Task {
    let message_id = if message_id.is_empty() {
        uuid::Uuid::new_v4().to_string()
    } else {
        message_id.to_string()
    };
    a2a::Task {
        id: task_id.to_string(),
        context_id: context_id.to_string(),
        status: Some(a2a::TaskStatus {
            state: a2a::TaskState::Submitted.into(),
            message: None,
            timestamp: None,
        }),
        artifacts: vec![],
        history: user_message(parts, &message_id, task_id, context_id)
            .into_iter()
            .collect(),
        metadata: None,
    }
}

/// JSON from a protobuf `Value`, whose numbers are all doubles, with whole numbers written
/// as integers again (`1`, not `1.0`): what a tool or a model reads is what the client meant.
fn whole_numbers(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
                Value::Number((f as i64).into())
            }
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(whole_numbers).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, whole_numbers(v)))
                .collect(),
        ),
        other => other,
    }
}

/// The user's message as the task's first history entry.
pub fn user_message(
    parts: &[crate::event::Part],
    message_id: &str,
    task_id: &str,
    context_id: &str,
) -> Option<a2a::Message> {
    let mut e = Event::new("", "user");
    e.id = message_id.to_string();
    e.content = Some(Content {
        parts: parts.to_vec(),
        role: Some("user".into()),
        extra: JsonMap::new(),
    });
    message_of(&e, task_id, context_id)
}

fn wrap(payload: stream_response::Payload) -> a2a::StreamResponse {
    a2a::StreamResponse {
        payload: Some(payload),
    }
}

/// One task's stream: the runner's items, live or replayed, as A2A stream responses.
///
/// An artifact streams as chunks (`append` after the first) and ends with its whole text
/// (`append: false`, `lastChunk: true`): a client that joined in the middle, or whose chunks
/// an after-model callback rewrote, still ends with the stored text.
#[derive(Debug)]
pub struct TaskStream {
    task_id: String,
    context_id: String,
    /// Artifacts completed so far: the next one's ordinal.
    artifacts: usize,
    /// Chunks of the next artifact were sent.
    chunking: bool,
    /// Calls waiting for the client: id → the call.
    waiting: BTreeMap<String, FunctionCall>,
    error: Option<String>,
    /// The stream lost its source while the task goes on: it closes without a final status
    /// (the client resubscribes), never reporting a working task as failed.
    interrupted: bool,
}

impl TaskStream {
    pub fn new(task_id: &str, context_id: &str) -> Self {
        TaskStream {
            task_id: task_id.to_string(),
            context_id: context_id.to_string(),
            artifacts: 0,
            chunking: false,
            waiting: BTreeMap::new(),
            error: None,
            interrupted: false,
        }
    }

    /// The calls `events` (already sent, e.g. in a snapshot) leave waiting.
    pub fn seed(&mut self, events: &[Event]) {
        self.artifacts = events.iter().filter_map(artifact_text).count();
        for c in waiting_calls(events) {
            if let Some(id) = &c.id {
                self.waiting.insert(id.clone(), c.clone());
            }
        }
    }

    /// The stream's first response: the task as it is.
    pub fn start(&self, task: a2a::Task) -> a2a::StreamResponse {
        wrap(stream_response::Payload::Task(task))
    }

    fn status(&self, state: a2a::TaskState, message: Option<a2a::Message>) -> a2a::StreamResponse {
        wrap(stream_response::Payload::StatusUpdate(
            a2a::TaskStatusUpdateEvent {
                task_id: self.task_id.clone(),
                context_id: self.context_id.clone(),
                status: Some(a2a::TaskStatus {
                    state: state.into(),
                    message,
                    timestamp: Some(now()),
                }),
                metadata: None,
            },
        ))
    }

    fn artifact_update(
        &self,
        event: &Event,
        text: String,
        append: bool,
        last: bool,
    ) -> a2a::StreamResponse {
        let id = artifact_id(&self.task_id, self.artifacts);
        wrap(stream_response::Payload::ArtifactUpdate(
            a2a::TaskArtifactUpdateEvent {
                task_id: self.task_id.clone(),
                context_id: self.context_id.clone(),
                artifact: Some(artifact(&id, &event.author, text)),
                append,
                last_chunk: last,
                metadata: None,
            },
        ))
    }

    /// What one item adds to the stream.
    pub fn item(&mut self, item: &RunItem) -> Vec<a2a::StreamResponse> {
        match item {
            RunItem::Event { event, seq: None } => {
                let text = text_of(event);
                if text.is_empty() || event.author == "user" {
                    return vec![];
                }
                let update = self.artifact_update(event, text, self.chunking, false);
                self.chunking = true;
                vec![update]
            }
            RunItem::Event {
                event,
                seq: Some(_),
            } => {
                if event.author == "user" {
                    // The task's first response already carries the user's message.
                    return vec![];
                }
                let mut out = vec![];
                let long: &[String] = event.long_running_tool_ids.as_deref().unwrap_or(&[]);
                for c in event.function_calls() {
                    if let Some(id) = c.id.as_ref().filter(|id| long.contains(id)) {
                        self.waiting.insert(id.clone(), c.clone());
                    }
                }
                for r in event.function_responses() {
                    if let Some(id) = &r.id {
                        self.waiting.remove(id);
                    }
                }
                let text = artifact_text(event);
                let calls = event
                    .content
                    .iter()
                    .flat_map(|c| c.parts.iter())
                    .any(|p| p.function_call.is_some() || p.function_response.is_some());
                if calls {
                    // Tool traffic is progress: a working status carrying the calls.
                    let mut only_calls = (**event).clone();
                    if let Some(c) = &mut only_calls.content {
                        c.parts
                            .retain(|p| p.function_call.is_some() || p.function_response.is_some());
                    }
                    let message = message_of(&only_calls, &self.task_id, &self.context_id);
                    out.push(self.status(a2a::TaskState::Working, message));
                }
                if let Some(text) = text {
                    out.push(self.artifact_update(event, text, false, true));
                    self.artifacts += 1;
                }
                self.chunking = false;
                out
            }
            RunItem::Error { kind, .. } if kind == "stream_interrupted" => {
                self.interrupted = true;
                vec![]
            }
            RunItem::Error { message, .. } => {
                self.error = Some(message.clone());
                vec![]
            }
            RunItem::Done { .. } if self.interrupted => vec![],
            RunItem::Done { status, .. } => vec![self.end(*status)],
        }
    }

    /// The last response: the task's final state (input-required when calls wait).
    pub fn end(&self, status: RunStatus) -> a2a::StreamResponse {
        let state = task_state(status, !self.waiting.is_empty());
        let error = (state == a2a::TaskState::Failed).then(|| {
            self.error
                .clone()
                .unwrap_or_else(|| format!("the run ended {}", status.as_str()))
        });
        let waiting: Vec<&FunctionCall> = self.waiting.values().collect();
        let message = status_message(&self.task_id, &self.context_id, error.as_deref(), &waiting);
        self.status(state, message)
    }

    /// The working status a live stream sends after the task.
    pub fn working(&self) -> a2a::StreamResponse {
        self.status(a2a::TaskState::Working, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn agent_text(id: &str, text: &str, partial: bool) -> Event {
        let mut e = Event::new("e-1", "helper");
        e.id = id.into();
        e.partial = partial.then_some(true);
        e.content = Some(Content {
            parts: vec![crate::event::Part {
                text: Some(text.into()),
                ..Default::default()
            }],
            role: Some("model".into()),
            extra: JsonMap::new(),
        });
        e
    }

    #[test]
    fn a_task_carries_its_runs_usage_in_its_metadata() {
        let mut usage = crate::usage::RunUsage::default();
        let tokens = crate::usage::Tokens {
            input: 10,
            output: 5,
            cached: 0,
            reasoning: 0,
        };
        usage.record("m", tokens, &crate::usage::Prices::default());
        let mut run = RunRecord {
            run_id: "r1".into(),
            app_name: "a".into(),
            user_id: "u".into(),
            session_id: "s".into(),
            invocation_id: "e-1".into(),
            status: RunStatus::Completed,
            owner: "o".into(),
            cancel_requested: false,
            cancelled_by: None,
            cancel_reason: None,
            created_at: 1.0,
            started_at: Some(1.0),
            finished_at: Some(2.0),
            base_seq: Some(0),
            user_event: true,
            last_seq: Some(2),
            error: None,
            sealed: true,
            resumes: 0,
            resumed: vec![],
            usage: None,
            api_key: None,
        };
        assert!(task_of(&run, &[], None, false).metadata.is_none());
        run.usage = Some(usage);
        let task = serde_json::to_value(task_of(&run, &[], None, false)).unwrap();
        let u = &task["metadata"]["agentd_usage"];
        // Protobuf numbers are doubles.
        let n = |k: &str| u[k].as_f64();
        assert_eq!(
            (n("inputTokens"), n("outputTokens"), n("modelCalls")),
            (Some(10.0), Some(5.0), Some(1.0))
        );
        assert_eq!(u["cost"], Value::Null);
    }

    #[test]
    fn text_streams_as_chunks_then_the_whole_artifact() {
        let mut s = TaskStream::new("t1", "c1");
        let a = s.item(&RunItem::Event {
            event: Box::new(agent_text("ev1", "Hel", true)),
            seq: None,
        });
        let b = s.item(&RunItem::Event {
            event: Box::new(agent_text("ev1", "lo", true)),
            seq: None,
        });
        let c = s.item(&RunItem::Event {
            event: Box::new(agent_text("ev1", "Hello", false)),
            seq: Some(3),
        });
        let d = s.item(&RunItem::Done {
            status: RunStatus::Completed,
            last_seq: Some(3),
        });
        let v = |r: &a2a::StreamResponse| serde_json::to_value(r).unwrap();
        assert_eq!(
            v(&a[0]),
            json!({"artifactUpdate": {"taskId": "t1", "contextId": "c1",
                "artifact": {"artifactId": "t1-artifact-0", "name": "helper",
                             "parts": [{"text": "Hel"}]}}})
        );
        assert_eq!(v(&b[0])["artifactUpdate"]["append"], true);
        assert_eq!(
            v(&b[0])["artifactUpdate"]["artifact"]["artifactId"],
            "t1-artifact-0"
        );
        assert_eq!(v(&c[0])["artifactUpdate"]["lastChunk"], true);
        assert_eq!(
            v(&c[0])["artifactUpdate"]["artifact"]["artifactId"],
            "t1-artifact-0"
        );
        assert_eq!(
            v(&c[0])["artifactUpdate"]["artifact"]["parts"][0]["text"],
            "Hello"
        );
        assert!(v(&c[0])["artifactUpdate"].get("append").is_none());
        assert_eq!(
            v(&d[0])["statusUpdate"]["status"]["state"],
            "TASK_STATE_COMPLETED"
        );
    }

    #[test]
    fn a_stream_that_lost_its_source_closes_without_failing_the_task() {
        let mut s = TaskStream::new("t1", "c1");
        assert!(s
            .item(&RunItem::Error {
                kind: "stream_interrupted".into(),
                message: "this stream ended before the run did".into(),
            })
            .is_empty());
        let end = s.item(&RunItem::Done {
            status: RunStatus::Interrupted,
            last_seq: None,
        });
        assert!(end.is_empty(), "no final status: the task still works");
    }

    #[test]
    fn an_open_long_running_call_makes_the_task_input_required() {
        let mut s = TaskStream::new("t1", "c1");
        let mut e = Event::new("e-1", "helper");
        e.id = "ev2".into();
        e.long_running_tool_ids = Some(vec!["call-1".into()]);
        e.content = Some(Content {
            parts: vec![crate::event::Part {
                function_call: Some(FunctionCall {
                    id: Some("call-1".into()),
                    name: "approve".into(),
                    args: JsonMap::new(),
                    extra: JsonMap::new(),
                }),
                ..Default::default()
            }],
            role: Some("model".into()),
            extra: JsonMap::new(),
        });
        let out = s.item(&RunItem::Event {
            event: Box::new(e),
            seq: Some(2),
        });
        let working = serde_json::to_value(&out[0]).unwrap();
        assert_eq!(
            working["statusUpdate"]["status"]["message"]["parts"][0]["metadata"][ADK_TYPE],
            "function_call"
        );
        let end = serde_json::to_value(s.end(RunStatus::Completed)).unwrap();
        assert_eq!(
            end["statusUpdate"]["status"]["state"],
            "TASK_STATE_INPUT_REQUIRED"
        );
        assert_eq!(
            end["statusUpdate"]["status"]["message"]["parts"][0]["data"]["name"],
            "approve"
        );
    }

    #[test]
    fn incoming_parts_follow_adks_converter() {
        let m: a2a::Message = serde_json::from_value(json!({
            "messageId": "m1", "role": "ROLE_USER",
            "parts": [{"text": "hi"}, {"data": {"k": 1}},
                      {"raw": "AAE=", "mediaType": "image/png", "filename": "a.png"},
                      {"url": "https://x/y.pdf", "mediaType": "application/pdf"}]
        }))
        .unwrap();
        let parts = incoming_parts(&m).unwrap();
        assert_eq!(parts[0].text.as_deref(), Some("hi"));
        assert_eq!(parts[1].text.as_deref(), Some(r#"{"k":1}"#));
        let blob = parts[2].inline_data.as_ref().unwrap();
        assert_eq!(blob.data.0, vec![0, 1]);
        assert_eq!(blob.mime_type.as_deref(), Some("image/png"));
        assert_eq!(parts[3].extra["fileData"]["fileUri"], "https://x/y.pdf");
        let empty: a2a::Message =
            serde_json::from_value(json!({"messageId": "m2", "role": "ROLE_USER", "parts": []}))
                .unwrap();
        assert!(matches!(
            incoming_parts(&empty),
            Err(A2aError::InvalidParams(_))
        ));
    }
}
