//! The fourth stage: the agent's turn, under the run's cancel token and deadline. Plugins'
//! `before_run` may answer first; otherwise the agent that answers is selected
//! ([`super::super::selection`]) and run through the base wrapper. A panic is caught here,
//! at the agent boundary.

use super::super::control::StopCause;
use super::super::{lock, selection, Runner};
use super::begin::Begun;
use crate::invocation::{AgentError, AgentTree, InvocationContext};
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A run whose agent has returned (or was stopped): what [`Outcome::end`](super::end) makes
/// of it.
pub(in crate::runner) struct Outcome {
    pub(super) run: Begun,
    /// What the agent's turn returned (`Cancelled` when the token or the deadline stopped it).
    pub(super) result: Result<(), AgentError>,
    /// Why the run was stopped, if it was: read after the turn, so a stop that raced the
    /// agent's own return is seen.
    pub(super) cause: Option<StopCause>,
    pub(super) started: Instant,
    /// The run's limit (the request's, at most the server's).
    pub(super) max: Duration,
}

impl Begun {
    /// Runs the agent's turn to its end, bounded by the run's limit.
    pub(super) async fn drive(self) -> Outcome {
        let started = Instant::now();
        let max = self.runner.run_limit(self.max_duration);
        let turn = AssertUnwindSafe(run_turn(&self.runner, &self.ctx, &self.tree)).catch_unwind();
        // A stop that is ready when the turn is wins: the outcome follows the cause.
        let result = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(AgentError::Cancelled),
            _ = tokio::time::sleep(max) => {
                lock(&self.cause).get_or_insert(StopCause::Timeout);
                self.cancel.cancel();
                Err(AgentError::Cancelled)
            }
            r = turn => r.unwrap_or_else(|panic| {
                let message = panic_message(&panic);
                tracing::error!(%message, "agent panicked");
                Err(AgentError::failed("Panic", format!("the agent panicked: {message}")))
            }),
        };
        // An agent that returned because it was stopped (its stream ended with the cancel)
        // was stopped, whatever it returned.
        let result = match result {
            Ok(()) if self.cancel.is_cancelled() => Err(AgentError::Cancelled),
            r => r,
        };
        let cause = *lock(&self.cause);
        Outcome {
            run: self,
            result,
            cause,
            started,
            max,
        }
    }
}

/// Plugins' before-run hook, agent selection, the agent.
async fn run_turn(
    runner: &Runner,
    ctx: &InvocationContext,
    tree: &Arc<AgentTree>,
) -> Result<(), AgentError> {
    if let Some(content) = runner.plugins.before_run(ctx).await? {
        let root = ctx.for_agent(tree.root().name());
        root.emit_final(root.new_event().with_content(content))
            .await?;
        return Ok(());
    }
    // A tree of one agent has nothing to choose from: no history read.
    if tree.root().sub_agents().is_empty() {
        return crate::agent::run_agent(tree.root(), ctx).await;
    }
    let answered: Vec<String> = ctx
        .user_content()
        .map(|c| {
            c.parts
                .iter()
                .filter_map(|p| p.function_response.as_ref()?.id.clone())
                .collect()
        })
        .unwrap_or_default();
    let agent =
        selection::select_agent(runner.sessions.as_ref(), tree, ctx.session_key(), &answered)
            .await
            .map_err(AgentError::store)?;
    tracing::debug!(agent = agent.name(), "agent selected");
    crate::agent::run_agent(&agent, ctx).await
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}
