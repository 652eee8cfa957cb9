//! A run request as the run routes take it: ADK's `RunAgentRequest` plus agentd's fields,
//! bound to the caller; opening it (a repeat of its `Idempotency-Key`, else started through
//! [`crate::http::idempotency::start_keyed`]); and the JSON error for a run
//! that could not start. Shared by `/run`, `/run_sse` and background runs.

use crate::agent::RunConfig;
use crate::auth::Caller;
use crate::error_code::ErrorCode;
use crate::event::{Content, JsonMap};
use crate::http::auth::Gate;
use crate::http::error::{ApiError, ApiResult};
use crate::http::idempotency;
use crate::http::AppState;
use crate::runner::{EditPoint, OnBusy, OnDisconnect, RunError, RunHandle, RunRequest};
use crate::store::SessionKey;
use crate::webhook::WebhookSpec;
use axum::http::HeaderMap;
use serde::Deserialize;
use std::time::Duration;
use utoipa::ToSchema;

/// The most `customMetadata` a run may carry, as JSON bytes.
pub const MAX_CUSTOM_METADATA_BYTES: usize = 64 * 1024;

/// ADK's `RunAgentRequest` plus agentd's additive fields.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentRequest {
    #[serde(default, alias = "app_name")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    app_name: Option<String>,
    #[serde(alias = "user_id")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    user_id: String,
    #[serde(alias = "session_id")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    session_id: String,
    #[serde(default, alias = "new_message")]
    new_message: Option<Content>,
    #[serde(default)]
    streaming: bool,
    #[serde(default, alias = "state_delta")]
    #[schema(value_type = Option<Object>)]
    state_delta: Option<JsonMap>,
    #[serde(default, alias = "function_call_event_id")]
    pub(crate) function_call_event_id: Option<String>,
    /// ADK's resume of an interrupted invocation: with no `newMessage`, the same as
    /// `resume: true`.
    #[serde(default, alias = "invocation_id")]
    invocation_id: Option<String>,
    /// agentd: execute tool calls an interrupted run left without a response first, then
    /// continue the agent's loop (`newMessage` may then be omitted).
    #[serde(default)]
    resume: bool,
    #[serde(default, alias = "custom_metadata")]
    #[schema(value_type = Option<Object>)]
    custom_metadata: Option<JsonMap>,
    #[serde(default, alias = "service_tier")]
    #[allow(dead_code)]
    service_tier: Option<String>,
    /// agentd: `reject` (default, 409), `enqueue` or `interrupt`.
    #[serde(default, alias = "on_busy")]
    on_busy: OnBusy,
    /// agentd: `cancel` (default) or `continue` when the client disconnects.
    #[serde(default, alias = "on_disconnect")]
    on_disconnect: OnDisconnect,
    /// agentd: create the session if it does not exist.
    #[serde(default, alias = "create_session")]
    create_session: bool,
    /// agentd: store inline blobs of the message as artifacts.
    #[serde(default, alias = "save_input_blobs_as_artifacts")]
    save_input_blobs_as_artifacts: bool,
    /// agentd: a shorter limit than the server's `--max-run-secs`.
    #[serde(default, alias = "max_duration_secs")]
    max_duration_secs: Option<u64>,
    /// agentd: run without a client: answered 202 with the run once it is admitted; the run
    /// goes on (bounded by `--max-run-secs`), and `GET /runs/{id}?wait=`,
    /// `POST /runs/{id}/wait` and `GET /runs/{id}/stream` follow it from any replica.
    #[serde(default)]
    pub(crate) background: bool,
    /// agentd: tell this URL when the run ends (signed the Standard Webhooks way; the app's
    /// own webhooks apply too). See `docs/background.md`.
    #[serde(default)]
    webhook: Option<WebhookSpec>,
    /// agentd: go back to before the last user turn and run it again (its own message, or
    /// `newMessage` in its place). The rewind and the new user event are one commit.
    #[serde(default)]
    regenerate: bool,
    /// agentd: edit a turn: go back to before the turn this invocation began and run
    /// `newMessage` there (without `newMessage`, that turn's own message again).
    #[serde(default, alias = "edit_invocation_id")]
    #[schema(max_length = 128)]
    edit_invocation_id: Option<String>,
}

impl RunAgentRequest {
    /// Validates the body and binds it to the caller: another user's session, or an app the
    /// caller may not use, answers as if it did not exist.
    pub(crate) async fn into_run_request(
        self,
        caller: &Caller,
        state: &AppState,
    ) -> ApiResult<RunRequest> {
        let gate: &Gate = &state.gate;
        let app = self.app_name.ok_or_else(|| {
            ApiError::new(
                ErrorCode::AppNameRequired,
                "app_name is required when ADK_DEFAULT_APP_NAME is not set",
            )
        })?;
        // The same id rule as the session routes (a run may create its session).
        crate::http::extract::validate_id("appName", &app)?;
        crate::http::extract::validate_id("userId", &self.user_id)?;
        crate::http::extract::validate_id("sessionId", &self.session_id)?;
        if !caller.may_use_app(&app) || state.apps.get(&app).is_none() {
            return Err(crate::http::auth::app_hidden(&state.apps, caller, &app));
        }
        if !caller.may_act_as(&self.user_id) {
            return Err(ApiError::session_not_found());
        }
        if let Some(delta) = &self.state_delta {
            crate::http::auth::check_app_state(gate, caller, delta.keys())?;
        }
        // Copied onto every event of the run: bounded.
        if let Some(m) = &self.custom_metadata {
            let size = serde_json::to_vec(m).map(|v| v.len()).unwrap_or(usize::MAX);
            if size > MAX_CUSTOM_METADATA_BYTES {
                return Err(ApiError::validation(vec![crate::http::error::problem(
                    "value_error",
                    vec!["body".into(), "customMetadata".into()],
                    format!(
                        "customMetadata is {size} bytes as JSON; the limit is \
                         {MAX_CUSTOM_METADATA_BYTES} (it is copied onto every event of the run)"
                    ),
                )]));
            }
        }
        let custom_metadata = self.custom_metadata.map(|mut m| {
            m.retain(|k, _| {
                !k.starts_with("__adk_internal_")
                    && !k.starts_with(crate::agent::remote_a2a::METADATA_PREFIX)
            });
            m
        });
        let resume = self.resume || (self.invocation_id.is_some() && self.new_message.is_none());
        let edit = match (self.regenerate, self.edit_invocation_id) {
            (false, None) => None,
            (true, None) => Some(EditPoint::LastTurn),
            (false, Some(inv)) => {
                crate::http::extract::validate_id("editInvocationId", &inv)?;
                Some(EditPoint::Invocation(inv))
            }
            (true, Some(_)) => {
                return Err(ApiError::new(
                    ErrorCode::EditAmbiguous,
                    "send either regenerate or editInvocationId, not both",
                ))
            }
        };
        if edit.is_some() && resume {
            return Err(ApiError::new(
                ErrorCode::EditAmbiguous,
                "an edit (regenerate, editInvocationId) starts a new turn; it cannot resume one",
            ));
        }
        // Checked (URL, events, secret, and where its host resolves) before anything starts.
        let webhook = match &self.webhook {
            Some(spec) => {
                let target = state
                    .webhooks
                    .target(spec)
                    .map_err(|e| webhook_error(e, "webhook"))?;
                crate::webhook::check_resolves(&state.webhooks, &target)
                    .await
                    .map_err(|e| webhook_error(e, "webhook"))?;
                Some(target)
            }
            None => None,
        };
        Ok(RunRequest {
            key: SessionKey::new(app, self.user_id, self.session_id),
            new_message: self.new_message,
            state_delta: self.state_delta,
            run_config: RunConfig {
                streaming: self.streaming,
                save_input_blobs_as_artifacts: self.save_input_blobs_as_artifacts,
                custom_metadata,
                user_event_metadata: None,
                resume,
                client_tools: vec![],
                takeover: false,
            },
            on_busy: self.on_busy,
            on_disconnect: self.on_disconnect,
            create_session: self.create_session,
            max_duration: self.max_duration_secs.map(Duration::from_secs),
            webhook,
            run_id: None,
            edit,
            api_key: caller.api_key(),
        })
    }
}

/// A refused webhook: 422 with its stable code, nothing stored.
pub(crate) fn webhook_error(e: crate::webhook::TargetError, field: &str) -> ApiError {
    ApiError::problem(e.code, vec!["body".into(), field.into()], e.message)
}

/// How a run request opened: the same for `/run`, `/run_sse` and background runs.
pub(crate) enum Opening {
    /// A repeat of an `Idempotency-Key`: the first run, to replay.
    Repeat { user: String, run_id: String },
    /// A new run, or why it did not start.
    Started {
        key: SessionKey,
        started: Result<RunHandle, RunError>,
    },
}

/// Binds `req` to the caller, then with an `Idempotency-Key` finds a repeat, else starts the
/// run. A `background` run goes on without a reader: a client that goes away does not cancel
/// it.
pub(crate) async fn open_run(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    req: RunAgentRequest,
    raw: &[u8],
    (route, background): (&str, bool),
) -> ApiResult<Opening> {
    let mut run_req = req.into_run_request(caller, state).await?;
    if background {
        run_req.on_disconnect = OnDisconnect::Continue;
    }
    let key = run_req.key.clone();
    let (keyed, prior) = idempotency::prior_run(state, headers, &run_req, route, raw).await?;
    if let Some(run_id) = prior {
        let user = key.user_id;
        return Ok(Opening::Repeat { user, run_id });
    }
    let started = idempotency::start_keyed(state, run_req, keyed).await;
    Ok(Opening::Started { key, started })
}
