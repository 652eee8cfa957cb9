//! The follower engine behind every re-attached and followed stream, on any replica:
//! a run followed from a resume point ([`RunFollower`]: `GET /runs/{id}/stream`, an
//! idempotent retry's replay, a protocol adapter's items) and a session followed across runs
//! ([`SessionFollower`]).
//!
//! Committed events always come from the database, in seq order, each once: the bus only says
//! *when* to read (see [`crate::runner::bus`]), and a slow poll covers a lost notification.

use super::resume::sse_body;
use super::run_headers;
use super::{Framing, KEEP_ALIVE_EVERY};
use crate::error_code::ErrorCode;
use crate::event::Event;
use crate::http::error::{ApiError, ApiResult};
use crate::http::sse;
use crate::http::AppState;
use crate::runner::bus::{BusMsg, Subscription};
use crate::store::{EventRange, RunRecord, RunStatus, SessionKey, StoredEvent};
use crate::transcript::RunItem;
use axum::http::HeaderValue;
use axum::response::Response;
use bytes::Bytes;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

/// A follower re-reads the database this often even without a notification.
const FOLLOW_POLL: Duration = Duration::from_secs(3);
/// Events read per database page while replaying.
const REPLAY_PAGE: u32 = 200;
/// Frames buffered towards one follower.
const FOLLOWER_FRAMES: usize = 64;

/// Where a follower writes: SSE frames for a client, or the run's items for a protocol
/// adapter (which frames them itself).
enum Out {
    Frames(mpsc::Sender<Bytes>),
    Items(mpsc::Sender<RunItem>),
}

impl Out {
    /// Sends a frame (dropped for an item reader); false once the reader has gone.
    async fn send(&self, frame: Bytes) -> bool {
        match self {
            Out::Frames(tx) => tx.send(frame).await.is_ok(),
            Out::Items(tx) => !tx.is_closed(),
        }
    }

    async fn closed(&self) {
        match self {
            Out::Frames(tx) => tx.closed().await,
            Out::Items(tx) => tx.closed().await,
        }
    }
}

/// Streams run `run_id` of `user` from its start as `framing` (an idempotent retry of the request that
/// started it gets the same stream, replayed and then live, from any replica).
pub async fn replay_run(
    state: &AppState,
    user: &str,
    run_id: &str,
    framing: Framing,
) -> ApiResult<Response> {
    let Some(run) = state.runner.get_user_run(user, run_id).await? else {
        return Err(ApiError::new(ErrorCode::RunNotFound, "Run not found"));
    };
    let sub = state.runner.bus().subscribe(&run.key());
    let Some(run) = state.runner.get_user_run(user, run_id).await? else {
        return Err(ApiError::new(ErrorCode::RunNotFound, "Run not found"));
    };
    let (tx, rx) = mpsc::channel(FOLLOWER_FRAMES);
    let mut extra = run_headers(&run.run_id, &run.invocation_id, None);
    extra.insert("idempotent-replayed", HeaderValue::from_static("true"));
    let mut follower = RunFollower::new(state.clone(), run, None, Out::Frames(tx));
    follower.framing = framing;
    tokio::spawn(follower.run(sub));
    Ok(sse_body(rx, extra))
}

/// Follows run `run_id` of `user` as items, for a protocol adapter: its committed events after
/// `after` (from its start when `None`) from the database, then live (partial events
/// included), ending with [`RunItem::Done`]. Works for a run on any replica, running or not.
pub async fn follow_run_items(
    state: &AppState,
    user: &str,
    run_id: &str,
    after: Option<i64>,
) -> ApiResult<mpsc::Receiver<RunItem>> {
    let Some(run) = state.runner.get_user_run(user, run_id).await? else {
        return Err(ApiError::new(ErrorCode::RunNotFound, "Run not found"));
    };
    // Subscribe before the second read: whatever happens from here on is heard.
    let sub = state.runner.bus().subscribe(&run.key());
    let Some(run) = state.runner.get_user_run(user, run_id).await? else {
        return Err(ApiError::new(ErrorCode::RunNotFound, "Run not found"));
    };
    let (tx, rx) = mpsc::channel(FOLLOWER_FRAMES);
    let follower = RunFollower::new(state.clone(), run, after, Out::Items(tx));
    tokio::spawn(follower.run(sub));
    Ok(rx)
}

pub struct RunFollower {
    state: AppState,
    framing: Framing,
    run: RunRecord,
    key: SessionKey,
    /// The last committed seq this client has (or that is not part of the run's stream).
    last: i64,
    /// The run's user event is not streamed by `POST /run`; skip it when replaying from the
    /// run's start.
    skip_user_event: bool,
    out: Out,
}

impl RunFollower {
    /// Follows `run` from `after` (its start when `None`) as `POST /run`'s SSE frames, on a
    /// task of its own.
    pub fn spawn_frames(
        state: AppState,
        run: RunRecord,
        after: Option<i64>,
        sub: Subscription,
    ) -> mpsc::Receiver<Bytes> {
        let (tx, rx) = mpsc::channel(FOLLOWER_FRAMES);
        tokio::spawn(RunFollower::new(state, run, after, Out::Frames(tx)).run(sub));
        rx
    }

    fn new(state: AppState, run: RunRecord, after: Option<i64>, out: Out) -> Self {
        let base = run.base_seq.unwrap_or(0);
        let last = after.unwrap_or(base).max(0);
        RunFollower {
            framing: Framing::Agentd,
            key: run.key(),
            skip_user_event: run.user_event && last <= base,
            last,
            state,
            run,
            out,
        }
    }

    fn frames(&self, item: &RunItem) -> Vec<Bytes> {
        match self.framing {
            Framing::Agentd => vec![sse::agentd_frame(
                item,
                &self.run.run_id,
                &self.run.invocation_id,
            )],
            Framing::Adk { split_artifacts } => sse::adk_frames(item, split_artifacts),
        }
    }

    /// Sends an item's frames (or the item); false once the client has gone.
    async fn send_item(&self, item: &RunItem) -> bool {
        if let Out::Items(tx) = &self.out {
            return tx.send(item.clone()).await.is_ok();
        }
        for frame in self.frames(item) {
            if !self.out.send(frame).await {
                return false;
            }
        }
        true
    }

    /// Sends the run's committed events after `last`, from the database. False: client gone.
    async fn replay(&mut self) -> Result<bool, crate::store::StoreError> {
        loop {
            let page = self
                .state
                .store
                .invocation_events(&self.key, &self.run.invocation_id, self.last, REPLAY_PAGE)
                .await?;
            for StoredEvent { seq, event } in &page.events {
                self.last = *seq;
                if std::mem::take(&mut self.skip_user_event) && event.author == "user" {
                    continue;
                }
                let item = RunItem::Event {
                    event: Box::new(event.clone()),
                    seq: Some(*seq),
                };
                if !self.send_item(&item).await {
                    return Ok(false);
                }
            }
            if !page.has_more {
                self.skip_user_event = false;
                return Ok(true);
            }
        }
    }

    async fn done(&mut self, status: RunStatus, last_seq: Option<i64>) {
        let item = RunItem::Done {
            status,
            last_seq: last_seq.or(Some(self.last)),
        };
        let _ = self.send_item(&item).await;
    }

    /// Replays, and ends the stream if the database says the run is over. Some(true): ended.
    async fn check_row(&mut self) -> Option<bool> {
        if !self.replay().await.ok()? {
            return Some(true);
        }
        let row = self
            .state
            .store
            .get_user_run(&self.run.user_id, &self.run.run_id)
            .await
            .ok()??;
        // An abandoned run is over once its transcript is sealed (a sweeper does it within
        // moments), so the replay includes the seal.
        if row.status == RunStatus::Running || (row.status == RunStatus::Abandoned && !row.sealed) {
            return Some(false);
        }
        self.replay().await.ok()?;
        self.done(row.status, row.last_seq).await;
        Some(true)
    }

    async fn run(mut self, mut sub: crate::runner::bus::Subscription) {
        match self.check_row().await {
            Some(false) => {}
            Some(true) => return,
            None => {
                tracing::warn!(run = %self.run.run_id, "re-attach: could not read the run");
                return;
            }
        }
        let my_run: Arc<str> = self.run.run_id.as_str().into();
        let mut poll = tokio::time::interval(FOLLOW_POLL);
        poll.reset();
        let state = self.state.clone();
        let stopped = state.runner.stopped();
        tokio::pin!(stopped);
        loop {
            let quiet = tokio::time::sleep(KEEP_ALIVE_EVERY);
            tokio::select! {
                _ = &mut stopped => return,
                msg = sub.rx.recv() => match msg {
                    Ok(BusMsg::Partial { run_id, after, event }) if run_id == my_run => {
                        let after = after.unwrap_or(self.run.base_seq.unwrap_or(0));
                        if after < self.last {
                            continue; // part of an event this client already has
                        }
                        if after > self.last && !matches!(self.replay().await, Ok(true)) {
                            return;
                        }
                        if after < self.last {
                            continue; // the replay brought the event this partial belongs to
                        }
                        let item = RunItem::Event { event: Box::new(Event::clone(&event)), seq: None };
                        if !self.send_item(&item).await {
                            return;
                        }
                    }
                    Ok(BusMsg::Committed { run_id: Some(run_id), seq, event, in_run_stream }) if run_id == my_run => {
                        if seq <= self.last {
                            continue;
                        }
                        match event {
                            Some(event) if in_run_stream && seq == self.last + 1 && !self.skip_user_event => {
                                self.last = seq;
                                let item = RunItem::Event { event: Box::new(Event::clone(&event)), seq: Some(seq) };
                                if !self.send_item(&item).await {
                                    return;
                                }
                            }
                            _ => {
                                if !matches!(self.replay().await, Ok(true)) {
                                    return;
                                }
                            }
                        }
                    }
                    Ok(BusMsg::Error { run_id, kind, message }) if run_id == my_run => {
                        let item = RunItem::Error { kind, message };
                        if !self.send_item(&item).await {
                            return;
                        }
                    }
                    Ok(BusMsg::Done { run_id, .. }) if run_id == my_run => {
                        // The row is the truth (the notification may come from a sweeper).
                        match self.check_row().await {
                            Some(false) => {}
                            _ => return,
                        }
                    }
                    Ok(BusMsg::Resync) | Err(RecvError::Lagged(_)) => {
                        if self.check_row().await != Some(false) {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(RecvError::Closed) => return,
                },
                _ = poll.tick() => {
                    if self.check_row().await != Some(false) {
                        return;
                    }
                }
                _ = quiet, if self.framing == Framing::Agentd && matches!(self.out, Out::Frames(_)) => {
                    if !self.out.send(Bytes::from_static(sse::KEEP_ALIVE)).await {
                        return;
                    }
                }
                _ = self.out.closed() => return,
            }
        }
    }
}

pub struct SessionFollower {
    state: AppState,
    key: SessionKey,
    last: i64,
    /// The run in progress as far as this follower knows: its end is announced even if the
    /// notification of it was lost (the poll reads the run's row).
    current: Option<String>,
    /// The last run whose end was sent (the poll and the notification may both see it).
    ended: Option<String>,
    out: Out,
}

fn committed_frame(seq: i64, event: &Event) -> Bytes {
    sse::agentd_frame(
        &RunItem::Event {
            event: Box::new(event.clone()),
            seq: Some(seq),
        },
        "",
        "",
    )
}

fn named_frame(name: &str, body: serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {body}\n\n"))
}

impl SessionFollower {
    /// Follows session `key` from seq `last` as SSE frames, on a task of its own (`current`:
    /// its running run, if any, whose end is announced even if that notification is lost).
    pub fn spawn_frames(
        state: AppState,
        key: SessionKey,
        last: i64,
        current: Option<String>,
        sub: Subscription,
    ) -> mpsc::Receiver<Bytes> {
        let (tx, rx) = mpsc::channel(FOLLOWER_FRAMES);
        let follower = SessionFollower {
            state,
            key,
            last,
            current,
            ended: None,
            out: Out::Frames(tx),
        };
        tokio::spawn(follower.run(sub));
        rx
    }

    /// Sends committed events after `last`. Err: stop (client gone, session deleted, or the
    /// database failed).
    async fn replay(&mut self) -> Result<(), ()> {
        loop {
            let page = self
                .state
                .store
                .list_events(
                    &self.key,
                    EventRange {
                        after: Some(self.last),
                        before: None,
                        limit: REPLAY_PAGE,
                    },
                )
                .await
                .map_err(|e| tracing::warn!(error = %e, "session follower: read failed"))?
                .ok_or(())?;
            for StoredEvent { seq, event } in &page.events {
                self.last = *seq;
                if !self.out.send(committed_frame(*seq, event)).await {
                    return Err(());
                }
            }
            if !page.has_more {
                return Ok(());
            }
        }
    }

    /// The fallback for a lost end-of-run notification: the run's row says it is over.
    async fn poll_current_run(&mut self) -> Option<Bytes> {
        let run_id = self.current.clone()?;
        let row = self
            .state
            .store
            .get_user_run(&self.key.user_id, &run_id)
            .await
            .ok()??;
        if row.status == RunStatus::Running || (row.status == RunStatus::Abandoned && !row.sealed) {
            return None;
        }
        self.replay().await.ok()?;
        self.current = None;
        self.ended = Some(row.run_id.clone());
        Some(named_frame(
            "run_done",
            json!({"runId": row.run_id, "status": row.status.as_str(), "lastSeq": row.last_seq.or(Some(self.last))}),
        ))
    }

    async fn run(mut self, mut sub: crate::runner::bus::Subscription) {
        if self.replay().await.is_err() {
            return;
        }
        let mut poll = tokio::time::interval(FOLLOW_POLL);
        poll.reset();
        let state = self.state.clone();
        let stopped = state.runner.stopped();
        tokio::pin!(stopped);
        loop {
            let quiet = tokio::time::sleep(KEEP_ALIVE_EVERY);
            let frame = tokio::select! {
                _ = &mut stopped => return,
                msg = sub.rx.recv() => match msg {
                    Ok(BusMsg::Started { run_id, .. }) if self.current.as_deref() == Some(&*run_id) => None,
                    Ok(BusMsg::Started { run_id, invocation_id }) => {
                        self.current = Some(run_id.to_string());
                        Some(named_frame(
                        "run_started",
                        json!({"runId": &*run_id, "invocationId": &*invocation_id}),
                    ))
                    }
                    Ok(BusMsg::Partial { after, event, .. }) => {
                        if after.is_some_and(|a| a < self.last) {
                            None
                        } else {
                            if after.is_some_and(|a| a > self.last) && self.replay().await.is_err() {
                                return;
                            }
                            if after.is_some_and(|a| a < self.last) {
                                continue;
                            }
                            Some(sse::agentd_frame(&RunItem::Event { event: Box::new(Event::clone(&event)), seq: None }, "", ""))
                        }
                    }
                    Ok(BusMsg::Committed { seq, event, .. }) => {
                        match event {
                            _ if seq <= self.last => None,
                            Some(event) if seq == self.last + 1 => {
                                self.last = seq;
                                Some(committed_frame(seq, &event))
                            }
                            _ => {
                                if self.replay().await.is_err() {
                                    return;
                                }
                                None
                            }
                        }
                    }
                    Ok(BusMsg::Error { run_id, kind, message }) => Some(named_frame(
                        "error",
                        json!({"runId": &*run_id, "error": format!("{kind}: {message}"),
                               "code": ErrorCode::RunFailed.as_str(),
                               "errorType": kind, "errorMessage": message}),
                    )),
                    Ok(BusMsg::Done { run_id, status, last_seq }) => {
                        // Read only if the run's end brings events this client lacks.
                        if last_seq.is_none_or(|l| l > self.last) && self.replay().await.is_err() {
                            return;
                        }
                        if self.current.as_deref() == Some(&*run_id) {
                            self.current = None;
                        }
                        if self.ended.as_deref() == Some(&*run_id) {
                            continue;
                        }
                        self.ended = Some(run_id.to_string());
                        Some(named_frame(
                            "run_done",
                            json!({"runId": &*run_id, "status": status.as_str(), "lastSeq": last_seq.or(Some(self.last))}),
                        ))
                    }
                    Ok(BusMsg::Resync) | Err(RecvError::Lagged(_)) => {
                        if self.replay().await.is_err() {
                            return;
                        }
                        None
                    }
                    Err(RecvError::Closed) => return,
                },
                _ = poll.tick() => {
                    if self.replay().await.is_err() {
                        return;
                    }
                    self.poll_current_run().await
                }
                _ = quiet => Some(Bytes::from_static(sse::KEEP_ALIVE)),
                _ = self.out.closed() => return,
            };
            if let Some(frame) = frame {
                if !self.out.send(frame).await {
                    return;
                }
            }
        }
    }
}
