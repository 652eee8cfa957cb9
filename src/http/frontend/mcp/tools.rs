//! The MCP handler: `tools/list` answers the apps the caller may use as tools, `tools/call`
//! runs one (partial text as progress notifications when the client sent a progress token),
//! `notifications/cancelled` cancels the call's run wherever it runs.

use super::map;
use crate::auth::Caller;
use crate::http::frontend::kit::{self, USER_HEADER};
use crate::http::AppState;
use crate::runner::OnDisconnect;
use crate::store::{CancelRequest, RunStatus, SessionKey};
use axum::http::request::Parts;
use futures::StreamExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock, ErrorData, Implementation, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{RoleServer, ServerHandler};
use serde_json::Value;
use tracing::Instrument;

/// The user of an unauthenticated call that names none (an MCP host has no field for it).
pub const ANONYMOUS: &str = "mcp";

/// `/apps/{app}/mcp` serves this app only.
#[derive(Debug, Clone)]
pub struct OneApp(pub String);

/// The MCP server over the app registry and the runner.
#[derive(Clone)]
pub struct AgentTools {
    pub state: AppState,
}

/// Who calls and what they may see, from the HTTP request rmcp hands over.
struct Call<'a> {
    caller: Caller,
    user: String,
    only: Option<&'a str>,
    session: Option<&'a str>,
}

fn call_of(parts: Option<&Parts>) -> Result<Call<'_>, ErrorData> {
    let parts = parts.ok_or_else(|| ErrorData::internal_error("no HTTP request", None))?;
    let caller = parts
        .extensions
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| ErrorData::internal_error("unauthenticated", None))?;
    let user = if caller.user_id.is_none() && !parts.headers.contains_key(USER_HEADER) {
        ANONYMOUS.to_string()
    } else {
        kit::resolve_user(&caller, &parts.headers, None)
            .map_err(|e| ErrorData::invalid_request(detail(&e), None))?
    };
    Ok(Call {
        caller,
        user,
        only: parts.extensions.get::<OneApp>().map(|a| a.0.as_str()),
        session: parts
            .headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok()),
    })
}

fn detail(e: &crate::http::error::ApiError) -> String {
    match &e.detail {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl AgentTools {
    /// The apps this call may use, as (name, description), sorted.
    fn apps(&self, call: &Call<'_>) -> Vec<(String, String)> {
        self.state
            .apps
            .entries()
            .filter(|e| call.only.is_none_or(|only| only == e.name))
            .filter(|e| call.caller.may_use_app(&e.name) && map::is_tool_name(&e.name))
            .filter_map(|e| {
                let tree = e.tree.as_ref().ok()?;
                Some((e.name.clone(), tree.root().description().to_string()))
            })
            .collect()
    }

    async fn run(
        &self,
        call: &Call<'_>,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let app = request.name.to_string();
        if !self.apps(call).iter().any(|(name, _)| *name == app) {
            return Err(ErrorData::invalid_params(
                format!("no tool named {app:?}"),
                None,
            ));
        }
        let args = request.arguments.unwrap_or_default();
        let (message, session) = match map::arguments(&args) {
            Ok(parsed) => parsed,
            Err(refused) => return Ok(refused),
        };
        let progress = context.meta.get_progress_token();
        let request_id = serde_json::to_value(&context.id).unwrap_or(Value::Null);
        let run_id = map::run_id(call.session, &call.user, &request_id);
        // A request id the client already used in this session names a run that exists: a
        // second run cannot take its id (and must not disturb the first).
        if let Ok(Some(_)) = self.state.runner.get_user_run(&call.user, &run_id).await {
            return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "request id {request_id} was already used in this MCP session; \
                 send each call with a new id"
            ))]));
        }
        let key = SessionKey::new(&app, &call.user, &session);
        // The client going away cancels the run: rmcp then cancels `context.ct` (see
        // `follow`), and a dropped handler drops the handle's guard.
        let streaming = progress.is_some();
        let parts = vec![crate::event::Part::text(message)];
        let api_key = call.caller.api_key();
        let mut req = kit::turn(api_key, key, parts, streaming, vec![], OnDisconnect::Cancel);
        req.run_id = Some(run_id.clone());
        let handle = match kit::start_run(&self.state, req).await {
            Ok(h) => h,
            Err(e) => return Ok(map::refused(&detail(&e), e.code)),
        };
        let span = tracing::info_span!("mcp_call", app = %app, user = %call.user,
            session = %session, run = %run_id);
        self.follow(handle, &call.user, &run_id, &session, progress, context)
            .instrument(span)
            .await
    }

    /// Follows the call's run to its end: progress notifications for partial text, the final
    /// text and status as the result. rmcp cancels `context.ct` when the client went away (or
    /// it saw a cancel for the request): the run is cancelled once, and followed to its end.
    async fn follow(
        &self,
        handle: crate::runner::RunHandle,
        user: &str,
        run_id: &str,
        session: &str,
        progress: Option<rmcp::model::ProgressToken>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut items = crate::http::sse::run::items(&self.state, handle);
        let mut fold = map::CallFold::default();
        let mut cancelled = false;
        loop {
            let item = tokio::select! {
                item = items.next() => item,
                _ = context.ct.cancelled(), if !cancelled => {
                    cancelled = true;
                    let why = cancel_request("the MCP client went away or cancelled the request");
                    if let Err(e) = self.state.runner.cancel(user, run_id, &why).await {
                        tracing::warn!(run = %run_id, error = %e, "could not cancel an MCP call's run");
                    }
                    continue;
                }
            };
            let Some(item) = item else { break };
            let (chunk, done) = fold.item(&item);
            if let (Some(token), Some(chunk)) = (&progress, chunk) {
                let note = ProgressNotificationParam::new(token.clone(), f64::from(fold.chunks))
                    .with_message(chunk);
                // A client that stopped listening is not a reason to stop the run.
                let _ = context.peer.notify_progress(note).await;
            }
            if done {
                break;
            }
        }
        Ok(fold.result(session, run_id))
    }
}

impl AgentTools {
    /// A `notifications/cancelled` for an earlier request: its run (found from the client's
    /// session and the request id) is cancelled wherever it runs, if it is this user's and
    /// still running. rmcp's stateless mode drops notifications, so [`super::routes`] hands
    /// this one over itself.
    pub async fn cancel_call(&self, parts: &Parts, request_id: &Value, reason: Option<String>) {
        let Ok(call) = call_of(Some(parts)) else {
            return;
        };
        let Some(session) = call.session else {
            tracing::debug!("an MCP cancel without Mcp-Session-Id names no run");
            return;
        };
        let run_id = map::run_id(Some(session), &call.user, request_id);
        match self.state.runner.get_user_run(&call.user, &run_id).await {
            // Only a call this caller may make on this route: an app its key may use, the
            // route's own app (as `/runs/{id}/cancel` and A2A bind a cancel).
            Ok(Some(run))
                if run.status == RunStatus::Running
                    && call.caller.may_use_app(&run.app_name)
                    && call.only.is_none_or(|only| only == run.app_name) =>
            {
                let reason = reason.unwrap_or_else(|| "cancelled by the MCP client".into());
                let reason: String = reason.chars().take(1000).collect();
                if let Err(e) = self
                    .state
                    .runner
                    .cancel(&call.user, &run_id, &cancel_request(&reason))
                    .await
                {
                    tracing::warn!(run = %run_id, error = %e, "could not cancel an MCP call's run");
                }
            }
            Ok(Some(run)) if run.status == RunStatus::Running => {
                tracing::debug!(run = %run_id, app = %run.app_name, "an MCP cancel of a call this route or key may not make is ignored");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(run = %run_id, error = %e, "could not read an MCP call's run"),
        }
    }
}

fn cancel_request(reason: &str) -> CancelRequest {
    CancelRequest {
        by: Some("mcp".into()),
        reason: Some(reason.into()),
    }
}

impl ServerHandler for AgentTools {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("agentd", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Each tool is an agentd app: call it with a message (and a session_id to \
                 continue a conversation); it answers the agent's final text.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let call = call_of(context.extensions.get::<Parts>())?;
        Ok(ListToolsResult::with_all_items(
            self.apps(&call)
                .iter()
                .map(|(name, description)| map::tool(name, description))
                .collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let call = call_of(context.extensions.get::<Parts>())?;
        self.run(&call, request, &context).await.map(Into::into)
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        context: NotificationContext<RoleServer>,
    ) {
        if let (Some(parts), Some(id)) =
            (context.extensions.get::<Parts>(), notification.request_id)
        {
            let id = serde_json::to_value(&id).unwrap_or(Value::Null);
            self.cancel_call(parts, &id, notification.reason).await;
        }
    }
}
