//! A2A push notification configs: stored on the task's run as webhook targets
//! (`runs.webhooks`), so the run's end writes their deliveries in its own transaction and
//! any replica sends them, retried with backoff (the outbox of `docs/background.md`). The
//! receiver gets the task's final status as a `StreamResponse`, with the config's token
//! (`X-A2A-Notification-Token`) and credentials (`Authorization: <scheme> <credentials>`).

use super::error::{A2aError, A2aResult};
use super::scope::{task_run, Scope};
use crate::http::AppState;
use crate::store::push::AddTarget;
use crate::webhook::{check_resolves, A2aPush, WebhookTarget};
use a2a_types as a2a;
use serde_json::Value;

/// Push configs one task may have.
pub const MAX_CONFIGS: usize = 10;

/// A config as the client sent it, checked as a webhook target is (URL, SSRF rules, DNS).
pub async fn target(
    state: &AppState,
    task_id: &str,
    config: &a2a::TaskPushNotificationConfig,
) -> A2aResult<WebhookTarget> {
    let (scheme, credentials) = config
        .authentication
        .as_ref()
        .map(|a| (a.scheme.clone(), a.credentials.clone()))
        .unwrap_or_default();
    let push = A2aPush {
        id: if config.id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            config.id.clone()
        },
        task_id: task_id.to_string(),
        token: config.token.clone(),
        scheme,
        credentials,
    };
    let refused = |e: crate::webhook::TargetError| {
        A2aError::InvalidParams(format!("push notification config: {}", e.message))
    };
    let target = state
        .webhooks
        .a2a_target(&config.url, push)
        .map_err(refused)?;
    check_resolves(&state.webhooks, &target)
        .await
        .map_err(refused)?;
    Ok(target)
}

/// A stored target as the config it is. Neither the token nor the credentials are echoed back:
/// the client chose them, and a read of the config (by anyone holding the user's key) must not
/// hand out what lets a receiver trust a notification.
fn config_of(target: &WebhookTarget) -> Option<a2a::TaskPushNotificationConfig> {
    let push = target.a2a.as_ref()?;
    Some(a2a::TaskPushNotificationConfig {
        tenant: String::new(),
        id: push.id.clone(),
        task_id: push.task_id.clone(),
        url: target.url.clone(),
        token: String::new(),
        authentication: (!push.scheme.is_empty()).then(|| a2a::AuthenticationInfo {
            scheme: push.scheme.clone(),
            credentials: String::new(),
        }),
    })
}

async fn configs(state: &AppState, scope: &Scope, task_id: &str) -> A2aResult<Vec<WebhookTarget>> {
    let run = task_run(state, scope, task_id).await?;
    let targets = state
        .store
        .run_targets(&run.user_id, &run.run_id)
        .await?
        .unwrap_or_default();
    Ok(targets
        .into_iter()
        .filter_map(|t: Value| serde_json::from_value::<WebhookTarget>(t).ok())
        .filter(|t| t.a2a.is_some())
        .collect())
}

/// `CreateTaskPushNotificationConfig`: only while the task works (its end is what is sent).
pub async fn create(
    state: &AppState,
    scope: &Scope,
    config: &a2a::TaskPushNotificationConfig,
) -> A2aResult<a2a::TaskPushNotificationConfig> {
    let run = task_run(state, scope, &config.task_id).await?;
    let target = target(state, &run.run_id, config).await?;
    let stored = serde_json::to_value(&target)
        .map_err(|e| A2aError::Internal(format!("serializing a push config: {e}")))?;
    if configs(state, scope, &run.run_id)
        .await?
        .iter()
        .any(|t| t.a2a.as_ref().map(|p| &p.id) == target.a2a.as_ref().map(|p| &p.id))
    {
        return Err(A2aError::InvalidParams(
            "this task already has a push notification config with that id".into(),
        ));
    }
    match state
        .store
        .add_run_target(&run.user_id, &run.run_id, &stored, MAX_CONFIGS)
        .await?
    {
        AddTarget::Added => config_of(&target)
            .ok_or_else(|| A2aError::Internal("a push config without its A2A part".into())),
        AddTarget::Ended => Err(A2aError::Unsupported(format!(
            "task {:?} has ended: there is nothing left to notify",
            run.run_id
        ))),
        AddTarget::Full => Err(A2aError::InvalidParams(format!(
            "a task has at most {MAX_CONFIGS} push notification configs"
        ))),
    }
}

/// `GetTaskPushNotificationConfig`.
pub async fn get(
    state: &AppState,
    scope: &Scope,
    task_id: &str,
    id: &str,
) -> A2aResult<a2a::TaskPushNotificationConfig> {
    configs(state, scope, task_id)
        .await?
        .iter()
        .filter_map(config_of)
        .find(|c| c.id == id)
        .ok_or_else(|| {
            A2aError::TaskNotFound(format!(
                "task {task_id:?} has no push notification config {id:?}"
            ))
        })
}

/// `ListTaskPushNotificationConfigs` (one page: a task has few).
pub async fn list(
    state: &AppState,
    scope: &Scope,
    task_id: &str,
) -> A2aResult<a2a::ListTaskPushNotificationConfigsResponse> {
    Ok(a2a::ListTaskPushNotificationConfigsResponse {
        configs: configs(state, scope, task_id)
            .await?
            .iter()
            .filter_map(config_of)
            .collect(),
        next_page_token: String::new(),
    })
}

/// `DeleteTaskPushNotificationConfig`: deliveries already written (the task ended) are sent.
pub async fn delete(state: &AppState, scope: &Scope, task_id: &str, id: &str) -> A2aResult<()> {
    let run = task_run(state, scope, task_id).await?;
    if state
        .store
        .remove_push_config(&run.user_id, &run.run_id, id)
        .await?
    {
        Ok(())
    } else {
        Err(A2aError::TaskNotFound(format!(
            "task {task_id:?} has no push notification config {id:?}"
        )))
    }
}
