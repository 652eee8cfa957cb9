//! The first stage: a run request checked as far as it can be without writing anything, with
//! the run's ids, its user event and its claim ([`NewRun`]) built.

use super::super::control::Registration;
use super::super::{EditPoint, RunError, RunRequest, Runner};
use crate::event::{new_invocation_id, Content, Event, JsonMap, Part};
use crate::invocation::{AgentTree, RunConfig};
use crate::store::{ArtifactWrite, Durable, NewRun, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// A run that may be admitted: nothing of it is stored yet.
pub(in crate::runner) struct Prepared {
    pub(super) runner: Arc<Runner>,
    pub(super) req: RunRequest,
    pub(super) tree: Arc<AgentTree>,
    /// What admission claims the session with.
    pub(super) new_run: NewRun,
    /// The user event as built from the request, with the input blobs it stages as artifacts.
    pub(super) user: Option<(Event, Vec<ArtifactWrite>)>,
    /// The run in this process's registry (cancel, drain, reconciliation) and its place in the
    /// user's quota, from before admission on: reconciliation never mistakes it for a leak.
    pub(super) local: Registration,
    /// The budgets the run is held to (its user's in the app, the app's, its API key's),
    /// checked again before each model call of the run.
    pub(super) budget: Vec<crate::usage::Limit>,
}

impl Prepared {
    /// Checks what needs no write: draining, an unknown or broken app, the user's quota, a
    /// missing message (after a missing session, as ADK reports them), an edit naming an
    /// unknown turn.
    pub(super) async fn new(runner: &Arc<Runner>, req: RunRequest) -> Result<Self, RunError> {
        if runner.is_draining() {
            return Err(RunError::ShuttingDown);
        }
        let entry = runner
            .apps
            .get(&req.key.app_name)
            .ok_or_else(|| RunError::AppNotFound(req.key.app_name.clone()))?;
        let tree = entry.tree.clone().map_err(RunError::AppBroken)?;
        // Refused before anything is held (the store refuses such an event too).
        let parts = req.new_message.as_ref().map_or(0, |m| m.parts.len());
        let limit = runner.config.max_message_parts;
        if parts > limit {
            return Err(StoreError::TooManyParts { parts, limit }.into());
        }
        let slot = runner
            .quota
            .take(&req.key.user_id)
            .ok_or(RunError::TooManyRuns(runner.config.max_runs_per_user))?;
        let sessions = &runner.sessions;
        if req.new_message.is_none() && !req.run_config.resume && req.edit.is_none() {
            return Err(
                if req.create_session || sessions.session_head(&req.key).await?.is_some() {
                    RunError::NoMessage
                } else {
                    RunError::SessionNotFound(req.key.session_id.clone())
                },
            );
        }
        if let Some(EditPoint::Invocation(inv)) = &req.edit {
            if sessions
                .invocation_events(&req.key, inv, -1, 1)
                .await?
                .events
                .is_empty()
            {
                return Err(match sessions.session_head(&req.key).await? {
                    Some(_) => RunError::InvocationNotFound(inv.clone()),
                    None => RunError::SessionNotFound(req.key.session_id.clone()),
                });
            }
        }
        // After the request's own mistakes, before anything is stored.
        let budget = budget_gate(runner, &req.key, req.api_key.as_ref()).await?;
        let run_id = req
            .run_id
            .clone()
            .unwrap_or_else(|| format!("run-{}", uuid::Uuid::new_v4()));
        // The request's webhook, then the app's: the run's end writes their deliveries.
        let webhooks: Vec<&crate::webhook::WebhookTarget> =
            req.webhook.iter().chain(entry.webhooks.iter()).collect();
        let webhooks = (!webhooks.is_empty())
            .then(|| serde_json::to_value(&webhooks).ok())
            .flatten();
        let invocation_id = new_invocation_id();
        let user = req
            .new_message
            .clone()
            .map(|m| user_event(&invocation_id, m, &req.state_delta, &req.run_config));
        let new_run = NewRun {
            run_id: run_id.clone(),
            key: req.key.clone(),
            invocation_id,
            owner: runner.config.owner.clone(),
            // An edit commits a user event too (a regenerate's is built after admission).
            user_event: user.is_some() || req.edit.is_some(),
            queue_ttl: runner.config.enqueue_timeout + Duration::from_secs(30),
            // Committed by the admission statement itself where the backend can; an event
            // with staged artifacts (input blobs) needs their transaction, and an edit's
            // comes after its rewind, in one commit.
            opening: user
                .as_ref()
                .filter(|(_, artifacts)| artifacts.is_empty() && req.edit.is_none())
                .map(|(event, _)| event.clone()),
            webhooks,
            // Another replica goes on with it if this one dies, unless the app says never.
            durable: (entry.resume == crate::apps::settings::Resume::Always).then(|| Durable {
                config: super::stored_config::stored_config(&req.run_config),
                max_secs: runner.run_limit(req.max_duration).as_secs_f64(),
            }),
            api_key: req.api_key.as_ref().map(|k| k.id.clone()),
        };
        Ok(Prepared {
            local: runner.register(&run_id, slot),
            runner: runner.clone(),
            req,
            tree,
            new_run,
            user,
            budget,
        })
    }

    /// The run's span: every log line and trace span of the run carries its ids.
    pub(super) fn span(&self) -> tracing::Span {
        let key = &self.req.key;
        tracing::info_span!(
            "run",
            app = %key.app_name, user = %key.user_id, session = %key.session_id,
            run = %self.new_run.run_id, invocation = %self.new_run.invocation_id,
        )
    }
}

/// The budgets the run is held to, refused when one is spent (before anything is stored). No
/// read for a run without budgets (they are cached: [`super::super::budgets`]), one per
/// budget otherwise (docs/usage.md).
async fn budget_gate(
    runner: &Runner,
    key: &crate::store::SessionKey,
    api_key: Option<&crate::usage::ChargedKey>,
) -> Result<Vec<crate::usage::Limit>, RunError> {
    let store = runner.store.as_ref();
    let limits = runner
        .config
        .budgets
        .limits(store, &key.app_name, &key.user_id, api_key)
        .await?;
    match crate::store::usage::exhausted(store, &limits, (0, 0.0)).await? {
        Some(spent) => Err(RunError::BudgetExhausted(spent)),
        None => Ok(limits),
    }
}

/// The user event: role forced to `user`, the request's state delta and metadata attached,
/// inline blobs moved to artifacts (`artifact_<invocation>_<n>`) when the run config says so.
pub(super) fn user_event(
    invocation_id: &str,
    mut content: Content,
    state_delta: &Option<JsonMap>,
    config: &RunConfig,
) -> (Event, Vec<ArtifactWrite>) {
    content.role = Some("user".into());
    let mut artifacts = vec![];
    if config.save_input_blobs_as_artifacts {
        for (i, part) in content.parts.iter_mut().enumerate() {
            if part.inline_data.is_some() {
                let filename = format!("artifact_{invocation_id}_{i}");
                artifacts.push(ArtifactWrite {
                    filename: filename.clone(),
                    part: std::mem::take(part),
                    custom_metadata: JsonMap::new(),
                });
                *part = Part::text(format!(
                    "Uploaded file: {filename}. It is saved into artifacts"
                ));
            }
        }
    }
    let mut event = Event::new(invocation_id, "user").with_content(content);
    if let Some(delta) = state_delta {
        event.actions.state_delta = delta.clone();
    }
    event.custom_metadata = config.custom_metadata.clone();
    if let Some(extra) = &config.user_event_metadata {
        event
            .custom_metadata
            .get_or_insert_with(JsonMap::new)
            .extend(extra.clone());
    }
    (event, artifacts)
}
