//! The ticker: on every replica, a loop that claims due ticks in the database (each once, see
//! [`crate::store::schedules`]) and starts their runs as background runs. It also takes over
//! the ticks of a replica that died between claiming one and starting its run. A poll that
//! follows one which found nothing takes a turn first ([`crate::store::turns`]): one replica
//! of the deployment scans per period, and none until the next tick can be due (the turns'
//! quiet, which storing or changing a schedule ends).

use super::pattern::plan_with_min;
use super::{PAUSED_KEY_EXPIRED, PAUSED_KEY_REVOKED};
use crate::event::Content;
use crate::runner::{OnBusy, OnDisconnect, RunError, RunRequest, Runner};
use crate::store::schedules::Planner;
use crate::store::{turns, ScheduleRecord, SessionKey, TickRecord};
use crate::usage::ChargedKey;
use crate::webhook::WebhookTarget;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Due schedules claimed per poll.
const BATCH: u32 = 16;

pub struct Ticker {
    runner: Arc<Runner>,
    poll: Duration,
    /// A tick still `claimed` this long after it was fired lost its firing task (a run start
    /// is bounded by the enqueue timeout): it is fired again, with the same run id.
    stale_after: Duration,
    /// `--schedule-min-interval-secs`: a schedule stored under a lower minimum still fires
    /// no faster than this.
    min_interval_secs: u64,
}

impl Ticker {
    pub fn new(runner: Arc<Runner>, poll: Duration, min_interval_secs: u64) -> Ticker {
        let stale_after = runner.enqueue_timeout() + Duration::from_secs(120);
        Ticker {
            runner,
            poll,
            stale_after,
            min_interval_secs,
        }
    }

    /// Runs the loop until `stop` (or the replica starts draining: it claims nothing more,
    /// and what it claimed but could not start is taken over by a live replica).
    pub fn spawn(self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move { self.run(stop).await })
    }

    async fn run(self, stop: CancellationToken) {
        let min = self.min_interval_secs;
        let planner: &Planner = &move |s: &ScheduleRecord, now: f64| plan_with_min(s, now, min);
        // Whether the last scan found work: then the next one needs no turn (store::turns).
        let mut busy = true;
        loop {
            if self.runner.is_draining() {
                return;
            }
            let owner = self.runner.replica_id().to_string();
            let store = self.runner.store().clone();
            let scan = busy
                || store
                    .take_turn(turns::kind::SCHEDULES, self.poll)
                    .await
                    .unwrap_or(true);
            busy = false;
            if scan {
                // Before the look, so a schedule stored during it keeps the next look granted.
                let since = store.turn_clock().await.ok().flatten();
                match store
                    .take_over_ticks(&owner, self.stale_after.as_secs_f64())
                    .await
                {
                    Ok(ticks) => {
                        busy |= !ticks.is_empty();
                        self.fire_all(ticks, true);
                    }
                    Err(e) => tracing::warn!(error = %e, "could not look for orphaned ticks"),
                }
                loop {
                    match store.claim_ticks(&owner, planner, BATCH).await {
                        Ok(ticks) => {
                            let n = ticks.len();
                            busy |= n > 0;
                            self.fire_all(ticks, false);
                            if n < BATCH as usize {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "could not claim schedule ticks");
                            break;
                        }
                    }
                }
                // Nothing found: no replica looks before the next tick can be due, unless a
                // schedule is stored or changed meanwhile.
                if let (false, Some(since)) = (busy, since) {
                    let next = store.next_tick_work().await;
                    turns::go_quiet(&*store, turns::kind::SCHEDULES, since, next).await;
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.poll) => {}
            }
        }
    }

    fn fire_all(&self, ticks: Vec<(ScheduleRecord, TickRecord)>, taken_over: bool) {
        for (schedule, tick) in ticks {
            let runner = self.runner.clone();
            let span = tracing::info_span!("tick", app = %schedule.app_name,
                user = %schedule.user_id, session = %tick.session_id, run = %tick.run_id,
                schedule = %schedule.id, tick = tick.tick_time);
            // Each on its own task: an `enqueue` schedule may wait for its session.
            tokio::spawn(fire(runner, schedule, tick, taken_over).instrument(span));
        }
    }
}

/// Starts a tick's run (with the run id the tick recorded) and records what came of it.
async fn fire(runner: Arc<Runner>, s: ScheduleRecord, tick: TickRecord, taken_over: bool) {
    let owner = runner.replica_id().to_string();
    // A tick taken over may have started its run before its claimer died.
    if taken_over {
        if let Ok(Some(_)) = runner.get_user_run(&tick.user_id, &tick.run_id).await {
            metrics::counter!("agentd_schedule_ticks_total", "outcome" => "started").increment(1);
            settle(&runner, &tick, &owner, "started", None).await;
            return;
        }
    }
    let (gone, api_key) = match owner_gone(&runner, &s).await {
        Ok(Ok(key)) => (None, key),
        Ok(Err(reason)) => {
            pause(&runner, &s, reason).await;
            let why = format!(
                "the API key that made the schedule is {}: the schedule is paused",
                reason.trim_start_matches("key_")
            );
            (Some(why), None)
        }
        // The key store is down: the tick is skipped rather than fired unchecked.
        Err(e) => (
            Some(format!("could not check the schedule's API key: {e}")),
            None,
        ),
    };
    if let Some(why) = gone {
        metrics::counter!("agentd_schedule_ticks_total", "outcome" => "skipped").increment(1);
        tracing::warn!(reason = %why, "schedule tick skipped");
        settle(&runner, &tick, &owner, "skipped", Some(&why)).await;
        return;
    }
    let message: Option<Content> = serde_json::from_value(s.message.clone()).ok();
    let webhook: Option<WebhookTarget> = s
        .webhook
        .clone()
        .and_then(|w| serde_json::from_value(w).ok());
    let on_busy = match s.on_busy.as_str() {
        "enqueue" => OnBusy::Enqueue,
        "interrupt" => OnBusy::Interrupt,
        _ => OnBusy::Reject,
    };
    let req = RunRequest {
        key: SessionKey::new(&s.app_name, &s.user_id, &tick.session_id),
        new_message: message,
        state_delta: None,
        run_config: Default::default(),
        on_busy,
        on_disconnect: OnDisconnect::Continue,
        create_session: true,
        max_duration: None,
        webhook,
        run_id: Some(tick.run_id.clone()),
        edit: None,
        // The key that made (or last changed) the schedule pays for its runs.
        api_key,
    };
    let (status, error) = match runner.start_run(req).await {
        Ok(handle) => {
            metrics::counter!("agentd_schedule_ticks_total", "outcome" => "started").increment(1);
            tracing::info!("schedule tick started its run");
            // Nobody reads the run: it goes on alone, like a background run.
            drop(handle);
            ("started", None)
        }
        // The replica is stopping: leave the tick claimed; a live replica takes it over.
        Err(RunError::ShuttingDown) => return,
        // The user's quota of concurrent runs (`--max-runs-per-user`) holds for scheduled
        // runs too: a tick that finds it full is skipped, like one that finds its session busy,
        // and so is one whose budget (the user's, the app's, the schedule's key's) is spent.
        Err(
            e @ (RunError::Busy(_)
            | RunError::QueueTimeout(_)
            | RunError::TooManyRuns(_)
            | RunError::BudgetExhausted(_)),
        ) => {
            metrics::counter!("agentd_schedule_ticks_total", "outcome" => "skipped").increment(1);
            ("skipped", Some(e.to_string()))
        }
        // Its first claimer (slow, not dead) started the run after all: the tick did fire.
        Err(_)
            if matches!(
                runner.get_user_run(&tick.user_id, &tick.run_id).await,
                Ok(Some(_))
            ) =>
        {
            ("started", None)
        }
        Err(e) => {
            metrics::counter!("agentd_schedule_ticks_total", "outcome" => "failed").increment(1);
            tracing::warn!(error = %e, "schedule tick could not start its run");
            ("failed", Some(e.to_string()))
        }
    };
    settle(&runner, &tick, &owner, status, error.as_deref()).await;
}

/// The key the schedule's runs are charged to, or why its owner may no longer start runs
/// (`Err`: the API key that made it was revoked or has expired). A schedule made without a
/// key (no authentication, or a JWT, which the server cannot check again without the token)
/// has nothing to check and charges no key (`Ok(None)`).
async fn owner_gone(
    runner: &Runner,
    s: &ScheduleRecord,
) -> Result<Result<Option<ChargedKey>, &'static str>, crate::store::StoreError> {
    let Some(key_id) = s.created_by.as_deref() else {
        return Ok(Ok(None));
    };
    Ok(match runner.store().find_api_key(key_id).await? {
        None => Err(PAUSED_KEY_REVOKED),
        Some(k) if k.revoked_at.is_some() => Err(PAUSED_KEY_REVOKED),
        Some(k) if k.expires_at.is_some_and(|t| t <= crate::event::now_ts()) => {
            Err(PAUSED_KEY_EXPIRED)
        }
        Some(k) => Ok(Some(ChargedKey {
            user: (!k.admin).then_some(k.user_id),
            id: k.id,
        })),
    })
}

async fn pause(runner: &Runner, s: &ScheduleRecord, reason: &str) {
    tracing::warn!(
        reason,
        "schedule paused: its API key can no longer start runs"
    );
    if let Err(e) = runner
        .store()
        .pause_schedule(&s.user_id, &s.id, reason)
        .await
    {
        tracing::warn!(error = %e, "could not pause the schedule");
    }
}

async fn settle(
    runner: &Runner,
    tick: &TickRecord,
    owner: &str,
    status: &str,
    error: Option<&str>,
) {
    if let Err(e) = runner.store().settle_tick(tick, owner, status, error).await {
        tracing::warn!(error = %e, "could not record a tick's outcome");
    }
}
