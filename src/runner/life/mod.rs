//! One run's life, stage by stage. Each stage is a value that owns what it needs and can only
//! become the next one:
//!
//! ```text
//!  RunRequest ──prepare──► Prepared ──admit──► Admitted ──begin──► Begun ──drive──► Outcome ──end
//!  (checks, no writes)    (the claim by onBusy) (guard held)  (context, outbox,    (the agent's   (seal, record,
//!                                                             user event)         result)         compaction, Done)
//! ```
//!
//! - [`prepare`]: everything that needs no write (draining, the app, the user's quota, a
//!   missing message, an edit's target), the run's ids and its user event.
//! - [`admit`]: the session taken in the database by the request's `onBusy`; from here on a
//!   [`RunGuard`] frees it however the task ends.
//! - [`begin`]: dead predecessors sealed, the starting state, the run's outbox and
//!   [`InvocationContext`](crate::invocation::InvocationContext), the user event committed
//!   (admission usually committed it already). Everything a request can get wrong fails up to
//!   here, before its first byte.
//! - [`drive`]: plugins, agent selection and the agent, under the run's cancel token and
//!   deadline; a panic is caught at this boundary.
//! - [`end`]: what happens when a run ends, in one place: the held final reply, the outcome and
//!   its cause, the seal of a stopped transcript, the error and `done` for the client, the
//!   record, metrics and the compaction hand-off.
//!
//! The task that carries a run through its stages runs on the runner's tracker, not in the
//! caller's future: a client that leaves mid-way cannot abandon a claim the database already
//! holds. The caller waits for the [`RunHandle`] (or the reason there is none).

mod admit;
mod begin;
mod drive;
mod end;
mod guard;
mod prepare;
pub(super) mod resume;
pub(super) mod seal;
mod stored_config;

pub(super) use guard::RunGuard;

use super::{RunError, RunHandle, RunRequest, Runner};
use prepare::Prepared;
use std::sync::Arc;
use tokio::sync::oneshot;
use tracing::Instrument;

/// Who waits for a run to start: the request that asked for it.
type Caller = oneshot::Sender<Result<RunHandle, RunError>>;

/// Starts `req`: prepares it here, then admits, begins and drives it on the runner's tracker.
/// Returns once the run has begun (its user event committed) or failed to.
pub(super) async fn start(runner: &Arc<Runner>, req: RunRequest) -> Result<RunHandle, RunError> {
    let prepared = Prepared::new(runner, req).await?;
    let span = prepared.span();
    let (caller, answer) = oneshot::channel();
    runner
        .tracker
        .spawn(live(prepared, caller).instrument(span));
    match answer.await {
        Ok(result) => result,
        Err(_) if runner.is_draining() => Err(RunError::ShuttingDown),
        Err(_) => Err(RunError::Internal(
            "the run's task ended before it started".into(),
        )),
    }
}

/// The run's task: each stage becomes the next; one that fails tells the caller why.
async fn live(prepared: Prepared, mut caller: Caller) {
    let admitted = match prepared.admit(&mut caller).await {
        Ok(admitted) => admitted,
        Err(e) => return drop(caller.send(Err(e))),
    };
    let mut begun = match admitted.begin().await {
        Ok(begun) => begun,
        Err(e) => return drop(caller.send(Err(e))),
    };
    // If the caller is gone, the handle comes back and is dropped here: with
    // `on_disconnect: cancel` that cancels the run, which then ends as usual.
    let _ = caller.send(Ok(begun.handle()));
    begun.drive().await.end().await;
}
