//! The ADK wire model: [`Session`], [`Event`], [`Content`], [`Part`], [`EventActions`].
//!
//! These types serialize exactly as Google ADK's `api_server` does (the exchanges recorded
//! from it are in `tests/fixtures/adk-wire/`): camelCase keys, `null`s omitted, the
//! always-present `actions` maps, base64url bytes, float epoch timestamps. Input accepts
//! camelCase and snake_case. Fields this crate does not model are kept in `extra` maps and
//! round-tripped untouched, so a newer ADK client never loses data by talking to agentd.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A JSON object: state, state deltas, function arguments, custom metadata.
pub type JsonMap = Map<String, Value>;

/// Seconds since the Unix epoch as a float, the way ADK stamps events and sessions.
pub fn now_ts() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A fresh event id (uuid4, like ADK).
pub fn new_event_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A fresh invocation id for a run: `e-<uuid4>`.
/// The response of a tool call that was in flight when the replica running it stopped, given
/// by the replica that takes the run over when the tool is not safe to run again: nobody
/// knows whether it took effect (docs/replicas.md, "Durable runs").
pub fn interrupted_response() -> Value {
    serde_json::json!({
        "error": "interrupted",
        "message": "the replica running this tool stopped; its effect is unknown",
    })
}

pub fn new_invocation_id() -> String {
    format!("e-{}", uuid::Uuid::new_v4())
}

/// A persistent conversation: merged state plus its complete events, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    pub id: String,
    #[serde(alias = "app_name")]
    pub app_name: String,
    #[serde(alias = "user_id")]
    pub user_id: String,
    /// The merged view: session keys, then `app:`- and `user:`-prefixed shared state.
    #[schema(value_type = Object)]
    pub state: JsonMap,
    pub events: Vec<Event>,
    #[serde(alias = "last_update_time")]
    pub last_update_time: f64,
}

/// One step of a conversation, authored by the user or an agent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "model_version"
    )]
    pub model_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Content>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "turn_complete"
    )]
    pub turn_complete: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "finish_reason"
    )]
    pub finish_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "error_code")]
    pub error_code: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "error_message"
    )]
    pub error_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "custom_metadata"
    )]
    #[schema(value_type = Option<Object>)]
    pub custom_metadata: Option<JsonMap>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "usage_metadata"
    )]
    pub usage_metadata: Option<Value>,
    /// Always present on the wire; `""` when a client restores an event without one.
    #[serde(default, alias = "invocation_id")]
    pub invocation_id: String,
    /// `"user"` or the name of the agent that produced the event.
    #[serde(default)]
    pub author: String,
    #[serde(default)]
    pub actions: EventActions,
    /// Always present on the wire (`{"path":""}` at least).
    #[serde(default = "empty_node_info", alias = "node_info")]
    pub node_info: Value,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "long_running_tool_ids"
    )]
    pub long_running_tool_ids: Option<Vec<String>>,
    /// Dot path of agent names (`root.child`); absent for root-only apps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub timestamp: f64,
    /// Every other field ADK defines (grounding, transcriptions, ...), kept verbatim.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: JsonMap,
}

/// `nodeInfo` of events that are not workflow nodes: `{"path": ""}`, always on the wire.
pub fn empty_node_info() -> Value {
    serde_json::json!({ "path": "" })
}

impl Event {
    /// A new complete event by `author` in `invocation_id`, stamped now.
    pub fn new(invocation_id: impl Into<String>, author: impl Into<String>) -> Self {
        Event {
            invocation_id: invocation_id.into(),
            author: author.into(),
            node_info: empty_node_info(),
            id: new_event_id(),
            timestamp: now_ts(),
            ..Default::default()
        }
    }

    pub fn with_content(mut self, content: Content) -> Self {
        self.content = Some(content);
        self
    }

    /// Partial events are token chunks: streamed to the client, never stored.
    pub fn is_partial(&self) -> bool {
        self.partial == Some(true)
    }

    /// Every function call in this event's content.
    pub fn function_calls(&self) -> impl Iterator<Item = &FunctionCall> {
        self.parts().filter_map(|p| p.function_call.as_ref())
    }

    /// Every function response in this event's content.
    pub fn function_responses(&self) -> impl Iterator<Item = &FunctionResponse> {
        self.parts().filter_map(|p| p.function_response.as_ref())
    }

    /// Every part of this event's content.
    pub fn parts(&self) -> impl Iterator<Item = &Part> {
        self.content.iter().flat_map(|c| c.parts.iter())
    }

    /// The concatenated text of the content's text parts (thoughts excluded).
    pub fn text(&self) -> String {
        self.parts()
            .filter(|p| p.thought != Some(true))
            .filter_map(|p| p.text.as_deref())
            .collect()
    }

    /// Bytes of text in the content's parts (thoughts included): a cheap size measure.
    pub fn text_len(&self) -> usize {
        self.parts()
            .filter_map(|p| p.text.as_deref())
            .map(str::len)
            .sum()
    }

    /// Gives the event an id and timestamp if it has none (restored or agent-built events).
    pub fn fill_defaults(&mut self) {
        if self.id.is_empty() {
            self.id = new_event_id();
        }
        if self.timestamp <= 0.0 {
            self.timestamp = now_ts();
        }
        if self.node_info.is_null() {
            self.node_info = empty_node_info();
        }
    }
}

/// `content` of an event: parts plus the role (`user` or `model`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, utoipa::ToSchema)]
pub struct Content {
    #[serde(default)]
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: JsonMap,
}

impl Content {
    pub fn text(role: &str, text: impl Into<String>) -> Self {
        Content {
            parts: vec![Part::text(text)],
            role: Some(role.to_string()),
            extra: JsonMap::new(),
        }
    }
}

/// One piece of content: text, bytes, a function call or response, or anything else ADK knows.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thought: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "thought_signature"
    )]
    pub thought_signature: Option<Bytes64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "inline_data"
    )]
    pub inline_data: Option<Blob>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "function_call"
    )]
    pub function_call: Option<FunctionCall>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "function_response"
    )]
    pub function_response: Option<FunctionResponse>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: JsonMap,
}

impl Part {
    pub fn text(text: impl Into<String>) -> Self {
        Part {
            text: Some(text.into()),
            ..Default::default()
        }
    }

    /// True when the part carries nothing ADK can store as an artifact.
    pub fn is_empty(&self) -> bool {
        self.text.is_none()
            && self.inline_data.is_none()
            && self.function_call.is_none()
            && self.function_response.is_none()
            && self.extra.is_empty()
    }
}

/// Inline bytes with their MIME type.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Blob {
    pub data: Bytes64,
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "mime_type")]
    pub mime_type: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "display_name"
    )]
    pub display_name: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, utoipa::ToSchema)]
pub struct FunctionCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub args: JsonMap,
    pub name: String,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: JsonMap,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, utoipa::ToSchema)]
pub struct FunctionResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub name: String,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub response: JsonMap,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: JsonMap,
}

/// What an event does besides its content. The four maps are always serialized.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventActions {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "skip_summarization"
    )]
    pub skip_summarization: Option<bool>,
    #[serde(default, alias = "state_delta")]
    #[schema(value_type = Object)]
    pub state_delta: JsonMap,
    /// `{filename: version}` of artifacts saved by this event.
    #[serde(default, alias = "artifact_delta")]
    pub artifact_delta: BTreeMap<String, i64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "transfer_to_agent"
    )]
    pub transfer_to_agent: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "transfer_reason"
    )]
    pub transfer_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate: Option<bool>,
    #[serde(default, alias = "requested_auth_configs")]
    #[schema(value_type = Object)]
    pub requested_auth_configs: JsonMap,
    #[serde(default, alias = "requested_tool_confirmations")]
    #[schema(value_type = Object)]
    pub requested_tool_confirmations: JsonMap,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "end_of_agent"
    )]
    pub end_of_agent: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "agent_state"
    )]
    pub agent_state: Option<Value>,
    /// Only on a rewind event: the invocation whose first event the session went back to
    /// before (ADK's `rewind_before_invocation_id`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "rewind_before_invocation_id"
    )]
    pub rewind_before_invocation_id: Option<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: JsonMap,
}

impl EventActions {
    /// True when the actions carry nothing (ADK's "default actions").
    pub fn is_default(&self) -> bool {
        *self == EventActions::default()
    }
}

/// Bytes that travel as base64: written url-safe with padding, read in either alphabet.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Bytes64(pub Vec<u8>);

/// Base64 text on the wire (standard or URL-safe alphabet, padding optional, when read).
impl utoipa::PartialSchema for Bytes64 {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .content_encoding("base64")
            .into()
    }
}

impl utoipa::ToSchema for Bytes64 {}

impl std::fmt::Debug for Bytes64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes64({} bytes)", self.0.len())
    }
}

impl Serialize for Bytes64 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine;
        s.serialize_str(&base64::engine::general_purpose::URL_SAFE.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        decode_base64_any(&s)
            .map(Bytes64)
            .ok_or_else(|| serde::de::Error::custom("invalid base64 data"))
    }
}

/// Decodes standard or url-safe base64, with or without padding.
pub fn decode_base64_any(s: &str) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine;
    const LENIENT: GeneralPurposeConfig =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    const STD: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::STANDARD, LENIENT);
    const URL: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::URL_SAFE, LENIENT);
    if s.contains(['-', '_']) {
        URL.decode(s).ok()
    } else {
        STD.decode(s).ok()
    }
}

/// Where a state key lives, by its prefix (ADK's `State` prefixes: `app:`, `user:`, `temp:`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SplitState {
    /// Plain keys: stored on the session row.
    pub session: JsonMap,
    /// `app:` keys, prefix removed: shared by every session of the app.
    pub app: JsonMap,
    /// `user:` keys, prefix removed: shared by every session of (app, user).
    pub user: JsonMap,
}

pub const APP_PREFIX: &str = "app:";
pub const USER_PREFIX: &str = "user:";
pub const TEMP_PREFIX: &str = "temp:";

impl SplitState {
    /// Splits a delta by prefix; `temp:` keys are dropped (they are never stored).
    pub fn split(delta: &JsonMap) -> Self {
        let mut out = SplitState::default();
        for (k, v) in delta {
            if let Some(rest) = k.strip_prefix(APP_PREFIX) {
                out.app.insert(rest.to_string(), v.clone());
            } else if let Some(rest) = k.strip_prefix(USER_PREFIX) {
                out.user.insert(rest.to_string(), v.clone());
            } else if !k.starts_with(TEMP_PREFIX) {
                out.session.insert(k.clone(), v.clone());
            }
        }
        out
    }

    /// The merged read view: session keys, then `app:` + key, then `user:` + key.
    pub fn merge(session: JsonMap, app: JsonMap, user: JsonMap) -> JsonMap {
        let mut out = session;
        for (k, v) in app {
            out.insert(format!("{APP_PREFIX}{k}"), v);
        }
        for (k, v) in user {
            out.insert(format!("{USER_PREFIX}{k}"), v);
        }
        out
    }
}

/// Removes `temp:` keys from a delta in place (they must not be stored or streamed).
pub fn strip_temp_keys(delta: &mut JsonMap) {
    delta.retain(|k, _| !k.starts_with(TEMP_PREFIX));
}

/// Shallow per-key overwrite, ADK's state update rule (`null` is stored, not deleted).
pub fn apply_delta(target: &mut JsonMap, delta: &JsonMap) {
    for (k, v) in delta {
        target.insert(k.clone(), v.clone());
    }
}

// ---------------------------------------------------------------- reserved function names

/// The function ADK uses to ask the client to approve a tool call.
pub const REQUEST_CONFIRMATION: &str = "adk_request_confirmation";
/// ADK's response to a call waiting for the client's approval.
pub const CONFIRMATION_REQUIRED: &str =
    "This tool call requires confirmation, please approve or reject.";
/// ADK's response to a call the client rejected.
pub const CONFIRMATION_REJECTED: &str = "This tool call is rejected.";

/// ADK function names that drive internal flows (confirmation, credentials, input,
/// transfer): a client may not restore events carrying them, and they are not memories.
pub const INTERNAL_FUNCTIONS: &[&str] = &[
    "adk_request_credential",
    REQUEST_CONFIRMATION,
    "adk_request_input",
    "transfer_to_agent",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_roundtrips_unknown_fields_and_omits_nulls() {
        let raw = r#"{"content":{"parts":[{"text":"hi","videoMetadata":{"fps":2}}],"role":"user"},
            "invocationId":"e-1","author":"user","groundingMetadata":{"x":1},
            "actions":{"stateDelta":{"a":1},"artifactDelta":{},"compaction":{"startTimestamp":1.0}},
            "id":"x","timestamp":1.5}"#;
        let ev: Event = serde_json::from_str(raw).unwrap();
        let out = serde_json::to_value(&ev).unwrap();
        assert_eq!(out["groundingMetadata"]["x"], 1);
        assert_eq!(out["content"]["parts"][0]["videoMetadata"]["fps"], 2);
        assert_eq!(out["actions"]["compaction"]["startTimestamp"], 1.0);
        assert_eq!(
            out["actions"]["requestedAuthConfigs"],
            serde_json::json!({})
        );
        assert_eq!(out["nodeInfo"], serde_json::json!({"path": ""}));
        assert!(out.get("partial").is_none());
        assert!(out.get("branch").is_none());
    }

    #[test]
    fn snake_case_input_is_accepted() {
        let raw = r#"{"invocation_id":"e-1","author":"a","actions":{"state_delta":{"k":1}},
            "content":{"parts":[{"inline_data":{"mime_type":"text/plain","data":"aGk="}}]}}"#;
        let ev: Event = serde_json::from_str(raw).unwrap();
        assert_eq!(ev.invocation_id, "e-1");
        assert_eq!(ev.actions.state_delta["k"], 1);
        let blob = ev.content.unwrap().parts[0].inline_data.clone().unwrap();
        assert_eq!(blob.data.0, b"hi");
        assert_eq!(blob.mime_type.as_deref(), Some("text/plain"));
    }

    #[test]
    fn bytes_read_both_alphabets_and_write_url_safe() {
        let b: Bytes64 = serde_json::from_str(r#""+/+/AA==""#).unwrap();
        assert_eq!(serde_json::to_string(&b).unwrap(), r#""-_-_AA==""#);
        let b: Bytes64 = serde_json::from_str(r#""-_-_AA""#).unwrap();
        assert_eq!(b.0, vec![0xfb, 0xff, 0xbf, 0x00]);
        assert!(serde_json::from_str::<Bytes64>(r#""not base64!""#).is_err());
    }

    #[test]
    fn state_split_and_merge() {
        let delta: JsonMap = serde_json::from_str(
            r#"{"k":1,"app:theme":"dark","user:lang":"en","temp:t":3,"n":null}"#,
        )
        .unwrap();
        let s = SplitState::split(&delta);
        assert_eq!(s.session.len(), 2);
        assert_eq!(s.app["theme"], "dark");
        assert_eq!(s.user["lang"], "en");
        let merged = SplitState::merge(s.session, s.app, s.user);
        assert_eq!(merged["app:theme"], "dark");
        assert_eq!(merged["user:lang"], "en");
        assert!(merged["n"].is_null());
        assert!(!merged.contains_key("temp:t"));
    }
}
