//! The last stage: what happens when a run ends, in one place.
//!
//! 1. The emit lock is taken (a hold timer may own it, handing its event to a client that does
//!    not read; past the delivery limit the run's token cuts that client loose).
//! 2. A final reply held back for the outcome (`emit_final`) is settled: a completed run
//!    commits the two together (`Fence::RunEnd`), any other end commits it first.
//! 3. The outcome follows its cause: completed, cancelled, timed out, interrupted or failed.
//! 4. A stopped transcript is sealed (every open call answered, `INVOCATION_ABORTED`); a
//!    failure reaches the client as an error item.
//! 5. Plugins' `after_run`; the outcome is recorded through the guard (the session freed, the
//!    webhook deliveries written by the same statement), unless the reply already did.
//! 6. Metrics, the compaction hand-off (the session is claimed for a summary before the
//!    client hears of the end), then `done`.

use super::super::control::StopCause;
use super::drive::Outcome;
use super::seal;
use crate::invocation::AgentError;
use crate::store::RunStatus;
use crate::transcript::RunItem;
use std::time::Duration;

/// How long a run that has ended waits for a client that does not read to take its error and
/// `done`; after that the client is dropped as a reader (its stream still ends with a `done`
/// read from the database, and it can re-attach).
const POST_RUN_DELIVERY: Duration = Duration::from_secs(10);

impl Outcome {
    /// Ends the run: see the module docs for the order.
    pub(super) async fn end(self) {
        let Outcome {
            mut run,
            result,
            cause,
            started,
            max,
        } = self;
        let (runner, ctx, outbox, tree) = (&run.runner, &run.ctx, &run.outbox, &run.tree);
        // How long a slow client may take the run's last event from here: what is left of the
        // run's time, and at least the post-run limit (it waited as long while the agent ran).
        let deliver_within = max.saturating_sub(started.elapsed()).max(POST_RUN_DELIVERY);
        let mut st = tokio::select! {
            st = outbox.emit() => st,
            _ = tokio::time::sleep(deliver_within) => {
                run.cancel.cancel();
                outbox.emit().await
            }
        };
        // The client must take a held reply within `deliver_within`: nothing else bounds the
        // wait now.
        let completed = result.is_ok();
        let settled = outbox
            .settle_held(&mut st, completed, Some(deliver_within))
            .await;
        // A held event that could not be committed fails the run, whatever else ended it; one
        // refused as the last because a cancel came first was committed alone, and the run is
        // cancelled.
        let finished = completed && matches!(settled, Ok(true)) && !st.cancel_requested;
        let result = match settled {
            Err(e) => Err(e.into()),
            Ok(_) if st.cancel_requested => Err(AgentError::Cancelled),
            Ok(_) => result,
        };
        let mut status = status_of(&result, cause);
        // Handed over by a draining replica: stopped at a commit boundary, it goes on on a live
        // replica. Nothing is sealed or recorded here; the client's stream follows the run
        // where it now runs (`http::sse::run`).
        let handing_over = cause == Some(StopCause::Handover)
            && !completed
            && !st.lost
            && !st.cancel_requested
            && matches!(result, Err(AgentError::Cancelled));
        if handing_over {
            drop(st);
            match run.guard.release().await {
                Ok(()) => {
                    tracing::info!("run handed over to another replica");
                    metrics::counter!("agentd_runs_handed_over_total").increment(1);
                    return;
                }
                Err(guard) => {
                    run.guard = guard;
                    st = outbox.emit().await;
                }
            }
        }
        // Whether a summary is due, with the final event committed (its token counts count).
        let compaction = match status {
            RunStatus::Completed => runner.compaction_due(ctx.session_key()).await,
            _ => None,
        };
        let lost = st.lost;
        if let Some(reason) = seal_reason(status, max).filter(|_| !lost) {
            seal::seal_live(ctx, outbox, &mut st, tree.root().name(), &reason).await;
        }
        let error = match &result {
            Err(e @ (AgentError::Failed { .. } | AgentError::Commit(_))) if !lost => {
                tracing::warn!(error = %e, "run failed");
                let item = RunItem::Error {
                    kind: e.kind().to_string(),
                    message: e.message(),
                };
                outbox
                    .deliver_within(&mut st, item, POST_RUN_DELIVERY)
                    .await;
                Some(e.to_string())
            }
            _ => None,
        };
        let mut last_seq = st.last_seq;
        drop(st);
        runner.plugins.after_run(ctx).await;
        let user = ctx.session_key().user_id.clone();
        let run_id = run.guard.run_id().to_string();
        let recorded = match finished {
            true => {
                run.guard.finished();
                Ok(true)
            }
            false => match run.guard.finish(status, last_seq, error.as_deref()).await {
                // `completed` refused: a cancel of the run came first. It ends cancelled,
                // sealed as a cancelled run is.
                Err(guard) => {
                    status = RunStatus::Cancelled;
                    let mut st = outbox.emit().await;
                    if let Some(reason) = seal_reason(status, max) {
                        seal::seal_live(ctx, outbox, &mut st, tree.root().name(), &reason).await;
                    }
                    last_seq = st.last_seq;
                    drop(st);
                    guard.finish(status, last_seq, None).await.or(Ok(false))
                }
                owned => owned,
            },
        };
        if let Ok(false) = recorded {
            // Taken over (or finished by reconciliation): report what the database says. A run
            // another replica took over goes on there: no end here, the client's stream
            // follows it (`http::sse::run`).
            status = match runner.runs.get_user_run(&user, &run_id).await {
                Ok(Some(r)) if r.status == RunStatus::Running && r.owner != runner.config.owner => {
                    tracing::warn!(owner = %r.owner, "run taken over by another replica; it goes on there");
                    return;
                }
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
            runner
                .compact_after(ctx.session_key(), c, run.api_key.clone())
                .await;
        }
        let mut st = outbox.emit().await;
        let done = RunItem::Done { status, last_seq };
        outbox
            .deliver_within(&mut st, done, POST_RUN_DELIVERY)
            .await;
    }
}

/// The outcome of a turn that returned `result`, stopped by `cause` (if it was).
fn status_of(result: &Result<(), AgentError>, cause: Option<StopCause>) -> RunStatus {
    match (result, cause) {
        (Ok(()), _) => RunStatus::Completed,
        (Err(AgentError::Cancelled), Some(c)) => c.status(),
        (Err(AgentError::Cancelled), None) => RunStatus::Cancelled,
        (Err(_), _) => RunStatus::Failed,
    }
}

/// Why a run that ended `status` is sealed (its open calls answered, `INVOCATION_ABORTED`),
/// if it is: a run that was stopped.
fn seal_reason(status: RunStatus, max: Duration) -> Option<String> {
    match status {
        RunStatus::TimedOut => Some(format!(
            "Invocation exceeded its maximum duration of {} s.",
            max.as_secs()
        )),
        RunStatus::Interrupted => Some(
            "Invocation was interrupted: the server shut down before it ended. Resume it \
             with a new run and \"resume\": true."
                .to_string(),
        ),
        RunStatus::Cancelled => Some("Invocation was aborted by client.".to_string()),
        _ => None,
    }
}
