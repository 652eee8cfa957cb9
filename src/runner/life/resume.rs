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
use super::stored_config::run_config;
use super::RunGuard;
use crate::event::Content;
use crate::store::{StoreResult, TakenOver};
use crate::usage::ChargedKey;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

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
    // Its budgets are checked before each of its model calls here too (it was admitted).
    // It stays charged to its key whatever happens to the key's record since (a key that is
    // gone or cannot be read is charged by its id, as acting for this run's user).
    let store = runner.store.as_ref();
    let api_key = match &taken.run.api_key {
        Some(id) => match crate::runner::budgets::charged_key(store, id).await {
            Ok(Some(k)) => Some(k),
            _ => Some(ChargedKey {
                id: id.clone(),
                user: Some(key.user_id.clone()),
            }),
        },
        None => None,
    };
    let budgets = &runner.config.budgets;
    let limits = budgets.limits(store, &key.app_name, &key.user_id, api_key.as_ref());
    let budget = match limits.await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the run's budgets; the run goes on unchecked");
            vec![]
        }
    };
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
        api_key,
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
            usage: taken.run.usage.clone(),
        }),
        budget,
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
        .sessions
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
