//! Driving a started run to its end: the agent under the run's deadline and cancel token,
//! then the run's end in one place: a held final reply committed with the outcome, a seal
//! for a stopped transcript, the error and `done` for the client, metrics.

use super::guard::RunGuard;
use super::*;
use crate::agent::{run_agent, AgentError, AgentTree, InvocationContext};
use crate::run::{Outbox, RunItem};
use crate::store::RunStatus;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a run that has ended waits for a client that does not read to take its error and
/// `done`; after that the client is dropped as a reader (its stream still ends with a `done`
/// read from the database, and it can re-attach).
const POST_RUN_DELIVERY: Duration = Duration::from_secs(10);

impl Runner {
    /// Runs the agent of a started run to its end and records the outcome.
    pub(super) async fn drive(self: Arc<Self>, run: ActiveRun, guard: RunGuard) {
        let ActiveRun {
            tree,
            ctx,
            outbox,
            max_duration,
            cancel,
            cause,
        } = run;
        let started = std::time::Instant::now();
        let max = max_duration.map_or(self.config.max_run_duration, |d| {
            d.min(self.config.max_run_duration)
        });
        let turn = AssertUnwindSafe(self.run_turn(&ctx, &tree)).catch_unwind();
        let result = tokio::select! {
            r = turn => r.unwrap_or_else(|panic| {
                let message = panic_message(&panic);
                tracing::error!(%message, "agent panicked");
                Err(AgentError::failed("Panic", format!("the agent panicked: {message}")))
            }),
            _ = cancel.cancelled() => Err(AgentError::Cancelled),
            _ = tokio::time::sleep(max) => {
                lock(&cause).get_or_insert(StopCause::Timeout);
                cancel.cancel();
                Err(AgentError::Cancelled)
            }
        };
        let cause = *lock(&cause);
        // How long a slow client may take the run's last event from here: what is left of the
        // run's time, and at least the post-run limit (it waited as long while the agent ran).
        let deliver_within = max.saturating_sub(started.elapsed()).max(POST_RUN_DELIVERY);
        // The agent is done. A hold timer may own the emit lock, handing its event to a client
        // that does not read; past that limit the run's token cuts that client loose.
        let mut st = tokio::select! {
            st = outbox.emit() => st,
            _ = tokio::time::sleep(deliver_within) => {
                cancel.cancel();
                outbox.emit().await
            }
        };
        // A final response held back for the outcome (`emit_final`): a completed run commits
        // the two together; any other end commits it first, before a seal or an error. The
        // client must take it within `deliver_within`: nothing else bounds the wait now.
        let completed = result.is_ok();
        let settled = outbox
            .settle_held(&mut st, completed, Some(deliver_within))
            .await;
        // A held event that could not be committed fails the run, whatever else ended it.
        let finished = completed && matches!(settled, Ok(true));
        let result = match settled {
            Err(e) => Err(e.into()),
            Ok(_) => result,
        };
        let mut status = match (&result, cause) {
            (Ok(()), _) => RunStatus::Completed,
            (Err(AgentError::Cancelled), Some(c)) => c.status(),
            (Err(AgentError::Cancelled), None) => RunStatus::Cancelled,
            (Err(_), _) => RunStatus::Failed,
        };
        // Whether a summary is due, with the final event committed (its token counts count).
        let compaction = match status {
            RunStatus::Completed => self.compaction_due(ctx.session_key()).await,
            _ => None,
        };
        let lost = st.lost;
        if !lost
            && matches!(
                status,
                RunStatus::Cancelled | RunStatus::TimedOut | RunStatus::Interrupted
            )
        {
            let reason = match status {
                RunStatus::TimedOut => format!(
                    "Invocation exceeded its maximum duration of {} s.",
                    max.as_secs()
                ),
                RunStatus::Interrupted => "Invocation was interrupted: the server shut down \
                     before it ended. Resume it with a new run and \"resume\": true."
                    .to_string(),
                _ => "Invocation was aborted by client.".to_string(),
            };
            seal::seal_live(&ctx, &outbox, &mut st, tree.root().name(), &reason).await;
        }
        let error = match &result {
            Err(e @ (AgentError::Failed { .. } | AgentError::Commit(_))) if !lost => {
                tracing::warn!(error = %e, "run failed");
                outbox
                    .deliver_within(
                        &mut st,
                        RunItem::Error {
                            kind: e.kind().to_string(),
                            message: e.message(),
                        },
                        POST_RUN_DELIVERY,
                    )
                    .await;
                Some(e.to_string())
            }
            _ => None,
        };
        let last_seq = st.last_seq;
        drop(st);
        self.plugins.after_run(&ctx).await;
        let run_id = guard.run_id().to_string();
        if finished {
            guard.finished();
        } else if !guard.finish(status, last_seq, error.as_deref()).await {
            // Taken over (or finished by reconciliation): report what the database says.
            status = match self
                .store
                .get_user_run(&ctx.session_key().user_id, &run_id)
                .await
            {
                Ok(Some(r)) if r.status != RunStatus::Running => r.status,
                _ => RunStatus::Abandoned,
            };
        }
        tracing::info!(status = status.as_str(), last_seq, "run finished");
        let app = ctx.session_key().app_name.clone();
        metrics::counter!("agentd_runs_finished_total", "app" => app.clone(), "status" => status.as_str())
            .increment(1);
        metrics::histogram!("agentd_run_duration_seconds", "app" => app, "status" => status.as_str())
            .record(started.elapsed().as_secs_f64());
        if let Some(c) = compaction.filter(|_| status == RunStatus::Completed) {
            self.compact_after(ctx.session_key(), c).await;
        }
        let mut st = outbox.emit().await;
        outbox
            .deliver_within(
                &mut st,
                RunItem::Done { status, last_seq },
                POST_RUN_DELIVERY,
            )
            .await;
    }

    /// Plugins' before-run hook, agent selection, the agent.
    pub(super) async fn run_turn(
        &self,
        ctx: &InvocationContext,
        tree: &Arc<AgentTree>,
    ) -> Result<(), AgentError> {
        if let Some(content) = self.plugins.before_run(ctx).await? {
            let root = ctx.for_agent(tree.root().name());
            root.emit_final(root.new_event().with_content(content))
                .await?;
            return Ok(());
        }
        // A tree of one agent has nothing to choose from: no history read.
        if tree.root().sub_agents().is_empty() {
            return run_agent(tree.root(), ctx).await;
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
            selection::select_agent(self.store.as_ref(), tree, ctx.session_key(), &answered)
                .await
                .map_err(AgentError::store)?;
        tracing::debug!(agent = agent.name(), "agent selected");
        run_agent(&agent, ctx).await
    }
}

/// A started run (user event committed), moved into its task.
pub(super) struct ActiveRun {
    pub(super) tree: Arc<AgentTree>,
    pub(super) ctx: InvocationContext,
    pub(super) outbox: Arc<Outbox>,
    pub(super) max_duration: Option<Duration>,
    pub(super) cancel: CancellationToken,
    pub(super) cause: Arc<Mutex<Option<StopCause>>>,
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}
