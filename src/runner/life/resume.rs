//! A run that starts from stored events: one this replica took over from a replica that
//! stopped (it died, or handed the run over while draining). It enters the stages at
//! [`Admitted`]: the takeover statement was its admission, with the same run and invocation
//! and one epoch more. Its user event is already committed; the agent goes on from the
//! committed events as `"resume": true` does, and a tool call that was in flight runs again
//! only if its tool is safe to repeat (`agent::llm::approvals`). Nobody reads its items
//! here: its clients follow it through the database and the bus, as they follow any run.

use super::super::control::Registration;
use super::super::{OnBusy, OnDisconnect, RunRequest, Runner};
use super::admit::{Admitted, Resumed};
use super::RunGuard;
use crate::event::{Content, JsonMap};
use crate::invocation::RunConfig;
use crate::model::ToolDeclaration;
use crate::store::{StoreResult, TakenOver};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// A run's configuration as admission stores it, for a replica that takes the run over.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct StoredConfig {
    streaming: bool,
    save_input_blobs_as_artifacts: bool,
    custom_metadata: Option<JsonMap>,
    resume: bool,
    client_tools: Vec<StoredTool>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct StoredTool {
    name: String,
    description: String,
    parameters: Option<serde_json::Value>,
}

/// `config` as admission stores it (`None`: all defaults, nothing to store).
pub(in crate::runner) fn stored_config(config: &RunConfig) -> Option<serde_json::Value> {
    let stored = StoredConfig {
        streaming: config.streaming,
        save_input_blobs_as_artifacts: config.save_input_blobs_as_artifacts,
        custom_metadata: config.custom_metadata.clone(),
        resume: config.resume,
        client_tools: config
            .client_tools
            .iter()
            .map(|t| StoredTool {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.clone(),
            })
            .collect(),
    };
    (stored != StoredConfig::default())
        .then(|| serde_json::to_value(stored).ok())
        .flatten()
}

/// The configuration a taken-over run continues with.
fn run_config(stored: Option<serde_json::Value>) -> RunConfig {
    let stored: StoredConfig = stored
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    RunConfig {
        streaming: stored.streaming,
        save_input_blobs_as_artifacts: stored.save_input_blobs_as_artifacts,
        custom_metadata: stored.custom_metadata,
        user_event_metadata: None,
        resume: true,
        client_tools: stored
            .client_tools
            .into_iter()
            .map(|t| ToolDeclaration {
                name: t.name,
                description: t.description,
                parameters: t.parameters,
            })
            .collect(),
        takeover: true,
    }
}

/// Continues `taken` (registered here as `local` before the takeover) on the runner's tracker.
pub(in crate::runner) fn spawn(runner: &Arc<Runner>, taken: TakenOver, local: Registration) {
    let key = taken.run.key();
    let span = tracing::info_span!(
        "run",
        app = %key.app_name, user = %key.user_id, session = %key.session_id,
        run = %taken.run.run_id, invocation = %taken.run.invocation_id,
        resumes = taken.run.resumes,
    );
    let runner = runner.clone();
    runner
        .tracker
        .clone()
        .spawn(continue_run(runner, taken, local).instrument(span));
}

async fn continue_run(runner: Arc<Runner>, taken: TakenOver, local: Registration) {
    let key = taken.run.key();
    let tree = match runner.apps.get(&key.app_name).map(|a| a.tree.clone()) {
        Some(Ok(tree)) => tree,
        // The app went away between the decision and the takeover: the run ends here, failed,
        // through its guard.
        _ => {
            let guard = RunGuard::new(runner.clone(), key.clone(), taken.has_webhooks, local)
                .at_epoch(taken.run.resumes);
            let e = super::super::RunError::AppNotFound(key.app_name.clone());
            guard.never_began(&e).await;
            return;
        }
    };
    let user_content = match user_content(&runner, &taken).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the taken-over run's user message");
            None
        }
    };
    tracing::warn!(
        owner = %taken.run.owner,
        resumes = taken.run.resumes,
        "took over a run whose replica stopped; continuing it"
    );
    let (cancel, cause) = (local.cancel.clone(), local.cause.clone());
    let boundary = local.boundary.clone();
    let req = RunRequest {
        key: key.clone(),
        new_message: None,
        state_delta: None,
        run_config: run_config(taken.config.clone()),
        on_busy: OnBusy::Reject,
        on_disconnect: OnDisconnect::Continue,
        create_session: false,
        max_duration: Some(Duration::from_secs_f64(taken.remaining.max(0.0))),
        webhook: None,
        run_id: Some(taken.run.run_id.clone()),
        edit: None,
    };
    let guard =
        RunGuard::new(runner.clone(), key, taken.has_webhooks, local).at_epoch(taken.run.resumes);
    let admitted = Admitted {
        runner,
        req,
        tree,
        run_id: taken.run.run_id.clone(),
        invocation_id: taken.run.invocation_id.clone(),
        guard,
        unsealed: false,
        opened: None,
        user: None,
        cancel,
        cause,
        boundary,
        resumed: Some(Resumed {
            session_seq: taken.session_seq,
            user_content,
        }),
    };
    match admitted.begin().await {
        Ok(mut begun) => {
            // Nobody reads this run's items here: its clients follow it.
            drop(begun.handle());
            begun.drive().await.end().await;
        }
        Err(e) => tracing::warn!(error = %e, "a taken-over run could not go on"),
    }
}

/// The run's user message, as committed by its first owner (what agents and plugins read as
/// the turn's input).
async fn user_content(runner: &Runner, taken: &TakenOver) -> StoreResult<Option<Content>> {
    if !taken.run.user_event {
        return Ok(None);
    }
    let page = runner
        .store
        .invocation_events(
            &taken.run.key(),
            &taken.run.invocation_id,
            taken.run.base_seq.unwrap_or(0),
            1,
        )
        .await?;
    Ok(page
        .events
        .into_iter()
        .find(|e| e.event.author == "user")
        .and_then(|e| e.event.content))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_goes_through_the_database_and_back() {
        assert_eq!(
            stored_config(&RunConfig::default()),
            None,
            "defaults: nothing stored"
        );
        let config = RunConfig {
            streaming: true,
            custom_metadata: Some(serde_json::from_str(r#"{"k": 1}"#).unwrap()),
            client_tools: vec![ToolDeclaration {
                name: "pick".into(),
                description: "d".into(),
                parameters: None,
            }],
            ..Default::default()
        };
        let back = run_config(stored_config(&config));
        assert!(back.streaming && back.resume && back.takeover);
        assert_eq!(back.custom_metadata, config.custom_metadata);
        assert_eq!(back.client_tools, config.client_tools);
    }
}
