//! Who an A2A call is for — the caller's user and the app — and the tasks that caller may
//! see (another user's or another app's task is "not found", never a leak).

use super::error::{A2aError, A2aResult};
use crate::auth::Caller;
use crate::http::frontend::kit::{check_app, resolve_user, USER_HEADER};
use crate::http::AppState;
use crate::store::RunRecord;
use axum::http::HeaderMap;

/// The user of an unauthenticated call that names none: without authentication anyone may
/// act for any user anyway, and an A2A client has no field to say who it is.
pub const ANONYMOUS: &str = "a2a";

/// Who calls, for which app.
#[derive(Debug, Clone)]
pub struct Scope {
    pub app: String,
    pub user: String,
    /// The caller's API key, charged with the runs it starts.
    pub api_key: Option<crate::usage::ChargedKey>,
}

/// Checks `A2A-Version`: 1.0 (or 1), and 0.3, whose method names the JSON-RPC binding also
/// answers; none means 1.0.
pub fn check_version(headers: &HeaderMap) -> A2aResult<()> {
    let Some(v) = headers.get("a2a-version") else {
        return Ok(());
    };
    match v.to_str().map(str::trim) {
        Ok("" | "1" | "1.0" | "0.3") => Ok(()),
        _ => Err(A2aError::VersionNotSupported(format!(
            "A2A-Version {:?} is not supported; this agent speaks 1.0 (and 0.3)",
            String::from_utf8_lossy(v.as_bytes())
        ))),
    }
}

impl Scope {
    /// [`check_version`], then [`Scope::new`]: what every A2A call checks first.
    pub fn for_call(
        state: &AppState,
        caller: &Caller,
        headers: &HeaderMap,
        app: &str,
    ) -> A2aResult<Self> {
        check_version(headers)?;
        Scope::new(state, caller, headers, app)
    }

    /// The app (404 if hidden or unknown, as everywhere) and the caller's user.
    pub fn new(
        state: &AppState,
        caller: &Caller,
        headers: &HeaderMap,
        app: &str,
    ) -> A2aResult<Self> {
        check_app(&state.apps, caller, app)?;
        let user = if caller.user_id.is_none() && !headers.contains_key(USER_HEADER) {
            ANONYMOUS.to_string()
        } else {
            resolve_user(caller, headers, None)?
        };
        Ok(Scope {
            app: app.to_string(),
            user,
            api_key: caller.api_key(),
        })
    }
}

/// The run behind task `id`, if this caller's: another user's or another app's task is not
/// found, never a leak.
pub async fn task_run(state: &AppState, scope: &Scope, id: &str) -> A2aResult<RunRecord> {
    let not_found = || A2aError::TaskNotFound(format!("no task {id:?}"));
    // No id agentd gives is longer or holds control characters (PostgreSQL refuses NUL).
    if id.is_empty() || id.len() > 128 || id.chars().any(char::is_control) {
        return Err(not_found());
    }
    state
        .runner
        .get_user_run(&scope.user, id)
        .await?
        .filter(|r| r.app_name == scope.app)
        .ok_or_else(not_found)
}
