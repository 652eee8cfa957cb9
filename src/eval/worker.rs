//! Runs of stored eval sets (docs/evals.md#running-a-stored-set): every replica runs this
//! worker, which takes the cases due ([`crate::store::EvalRunStore`]) and runs each as
//! `agentd eval` does ([`super::replay`]), in a new session, through this replica's runner.
//!
//! A case is claimed for one lease (the replica's run lease) and renewed every third of it
//! while it runs; its result is written by the attempt that claimed it, fenced by that
//! attempt in the same statement. A replica killed mid-case stops renewing: once the lease
//! has run out another replica claims the case, cancels the run the dead attempt left (the
//! runner may have taken it over), and runs the case again from the start in a new session,
//! so a result is always one whole replay. A renewal that finds the case gone (cancelled,
//! deleted, or claimed elsewhere after a stall) stops the attempt and cancels its run. After
//! [`MAX_ATTEMPTS`] claims the case ends with an error in its result.
//!
//! The read of the cases due spans every app (on Citus every shard), so an idle worker takes
//! the `evals` turn first ([`crate::store::turns`]); the route that creates a run wakes its
//! own replica's worker, which reads at once.

use super::doc::Doc;
use super::metrics::Criteria;
use super::replay::{self, CaseResult};
use super::result::case_result;
use crate::runner::Runner;
use crate::store::turns::{go_quiet, kind};
use crate::store::{CancelRequest, DueEvalCase, EvalCaseKey, SessionKey, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Cases one replica runs at once.
pub const AT_ONCE: usize = 4;

/// Claims of one case before it ends with an error (its replicas keep dying on it).
pub const MAX_ATTEMPTS: i32 = 3;

/// How often an idle worker asks for its turn to look.
pub const PERIOD: Duration = Duration::from_secs(2);

/// One replica's worker.
pub struct Worker {
    pub store: Arc<dyn Store>,
    pub runner: Arc<Runner>,
    /// How long a claim holds without renewal: the replica's run lease.
    pub lease: Duration,
    /// Woken by this replica's routes when they create a run.
    pub wake: Arc<Notify>,
}

impl Worker {
    /// Starts the loop; it ends with `stop`, and the cases in flight with it (their claims
    /// run out, and another replica runs them again).
    pub fn spawn(self, stop: CancellationToken) {
        tokio::spawn(async move {
            let this = Arc::new(self);
            let slots = Arc::new(Semaphore::new(AT_ONCE));
            let mut cases = JoinSet::new();
            // A pass that filled every slot, or a wake, looks again without a turn.
            let mut more = true;
            loop {
                while cases.try_join_next().is_some() {}
                let free = slots.available_permits();
                let go = free > 0
                    && (more
                        || this
                            .store
                            .take_turn(kind::EVALS, PERIOD)
                            .await
                            .unwrap_or(true));
                more = false;
                if go {
                    // Before the look, so a run created during it keeps the next look granted.
                    let since = this.store.turn_clock().await.ok().flatten();
                    match this
                        .store
                        .due_eval_cases(crate::event::now_ts(), free)
                        .await
                    {
                        Ok(due) => {
                            more = due.len() == free;
                            // Nothing due: no replica looks before the next case can be
                            // due, unless a run is created meanwhile.
                            if let (true, Some(since)) = (due.is_empty(), since) {
                                let next = this.store.next_eval_case_at().await;
                                go_quiet(&*this.store, kind::EVALS, since, next).await;
                            }
                            for d in due {
                                let Ok(slot) = slots.clone().try_acquire_owned() else {
                                    break;
                                };
                                let this = this.clone();
                                let span = tracing::info_span!("eval_case", app = %d.app, eval_run = %d.run_id, eval_case = %d.eval_id);
                                cases.spawn(async move {
                                    this.attempt(d).instrument(span).await;
                                    drop(slot);
                                    // A slot is free: whatever waits may go now.
                                    this.wake.notify_one();
                                });
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "reading the eval cases due failed; the next pass tries again")
                        }
                    }
                }
                if !more {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(PERIOD) => {}
                        _ = this.wake.notified() => more = true,
                    }
                }
                if stop.is_cancelled() {
                    break;
                }
            }
            cases.abort_all();
        });
    }

    /// Claims `due` and runs it; every error is logged (the claim then runs out and the case
    /// is taken again).
    async fn attempt(&self, due: DueEvalCase) {
        let key = EvalCaseKey {
            app: due.app.clone(),
            run_id: due.run_id.clone(),
            eval_id: due.eval_id.clone(),
        };
        let claimed = match self.store.claim_eval_case(&due, self.until()).await {
            Ok(Some(c)) => c,
            // Another replica took it, or it was cancelled since it was read.
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "could not claim an eval case");
                return;
            }
        };
        let attempt = claimed.attempt;
        // The attempt before this one lost its lease: its run, if it got that far, is stopped
        // (the runner may have taken it over on another replica).
        if let Some((user, session)) = &due.session {
            self.stop_session(&SessionKey::new(&due.app, user, session))
                .await;
        }
        let case = Doc::parse(&claimed.body);
        let criteria = Doc::parse(&claimed.criteria)
            .map_err(|e| e.to_string())
            .and_then(|c| Criteria::parse(&c));
        let (case, criteria) = match (case, criteria) {
            _ if attempt > MAX_ATTEMPTS => {
                let why = format!(
                    "the case was started {MAX_ATTEMPTS} times and never finished (its replicas stopped)"
                );
                return self
                    .give_up(&key, attempt, &claimed.set_id, &due, why)
                    .await;
            }
            (Ok(case), Ok(criteria)) => (case, criteria),
            (Err(e), _) => {
                let why = format!("the stored case is not JSON: {e}");
                return self
                    .give_up(&key, attempt, &claimed.set_id, &due, why)
                    .await;
            }
            (_, Err(e)) => {
                let why = format!("the run's criteria cannot be used: {e}");
                return self
                    .give_up(&key, attempt, &claimed.set_id, &due, why)
                    .await;
            }
        };
        let user = replay::user_of(&case);
        let session = replay::new_session_id();
        // The session is on the row before its first run: a replica that takes the case over
        // after this one dies finds the run to stop.
        match self
            .store
            .renew_eval_case(&key, attempt, self.until(), Some((&user, &session)))
            .await
        {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(error = %e, "could not record an eval case's session");
                return;
            }
        }
        let session_key = SessionKey::new(&due.app, &user, &session);
        let run = replay::run_case(
            &self.runner,
            &self.store,
            &due.app,
            &case,
            &criteria,
            &session,
        );
        tokio::pin!(run);
        let mut renew = tokio::time::interval(self.lease / 3);
        renew.tick().await;
        let result = loop {
            tokio::select! {
                result = &mut run => break result,
                _ = renew.tick() => match self.store.renew_eval_case(&key, attempt, self.until(), None).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::info!("the eval case was cancelled or taken over; its run stops");
                        self.stop_session(&session_key).await;
                        return;
                    }
                    // The next renewal tries again; if none succeeds within the lease, another
                    // replica takes the case and stops this run.
                    Err(e) => tracing::warn!(error = %e, "could not renew an eval case's claim"),
                },
            }
        };
        self.finish(&key, attempt, &claimed.set_id, &result).await;
    }

    async fn give_up(
        &self,
        key: &EvalCaseKey,
        attempt: i32,
        set_id: &str,
        due: &DueEvalCase,
        why: String,
    ) {
        tracing::warn!(attempts = attempt - 1, error = %why, "an eval case ends without a score");
        let (user_id, session_id) = due.session.clone().unwrap_or_default();
        let result = CaseResult {
            eval_id: key.eval_id.clone(),
            user_id,
            session_id,
            metrics: Err(why),
            expected: vec![],
            actual: vec![],
        };
        self.finish(key, attempt, set_id, &result).await;
    }

    async fn finish(&self, key: &EvalCaseKey, attempt: i32, set_id: &str, result: &CaseResult) {
        let doc = case_result(set_id, result).to_compact();
        match self
            .store
            .finish_eval_case(key, attempt, &doc, crate::event::now_ts())
            .await
        {
            Ok(true) => {}
            Ok(false) => tracing::info!(
                "an eval case finished after it was cancelled or taken over; its result is dropped"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "could not write an eval case's result; it runs again when its claim runs out")
            }
        }
    }

    /// Cancels the session's run, if one is running (on any replica).
    async fn stop_session(&self, key: &SessionKey) {
        let why = CancelRequest {
            by: Some("eval".into()),
            reason: Some("the eval case's attempt ended".into()),
        };
        if let Err(e) = self.runner.cancel_session(key, &why).await {
            tracing::warn!(error = %e, session = %key.session_id, "could not cancel an eval session's run");
        }
    }

    fn until(&self) -> f64 {
        crate::event::now_ts() + self.lease.as_secs_f64()
    }
}
