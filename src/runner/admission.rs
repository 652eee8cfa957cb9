//! Admission: the claim of a session in the database, and a place in its queue.
//!
//! The claim itself is one statement (see [`crate::store::RunStore::insert_run`]); [`claim`]
//! retries it over a holder whose replica stopped heartbeating (a takeover). A [`Ticket`] is a
//! place in the database queue of a session, so waiters on every replica are admitted in
//! arrival order. Runs (`life::admit`) and holds (`edits::hold`) both claim through here.

use crate::store::runs::Opened;
use crate::store::{
    Expired, Insert, NewRun, RunRecord, RunStore, SessionKey, StoreError, StoreResult,
};
use std::sync::Arc;

/// The result of trying to admit a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The run owns the session; its events come after `base_seq`. `unsealed`: a dead run of
    /// the session still needs its transcript sealed (the new run does it first).
    Acquired {
        base_seq: i64,
        unsealed: bool,
        /// The user event, if admission committed it (see [`NewRun::opening`]).
        opened: Option<Box<Opened>>,
    },
    /// Another live run holds the session (`None`: earlier queued requests come first).
    Busy(Option<Box<RunRecord>>),
    /// A durable run whose replica died holds the session: it is to be resumed (or ended)
    /// before the session can be claimed.
    Orphaned(Box<RunRecord>),
    /// The session does not exist (nothing was written).
    NoSession,
}

/// Admits `run`: takes the session unless a live run holds it. A holder whose replica
/// stopped heartbeating is marked `abandoned` and the claim is retried, unless it is durable
/// (then the caller has it resumed). One round trip when the session is free.
pub async fn claim(store: &dyn RunStore, run: &NewRun, ticket: Option<i64>) -> StoreResult<Claim> {
    claim_telling(store, run, ticket, &tokio::sync::Notify::new()).await
}

/// [`claim`], telling `ended` when a holder is ended here: its end wrote its webhook
/// deliveries, for this replica's sender (the runner's `run_ended`).
pub(super) async fn claim_telling(
    store: &dyn RunStore,
    run: &NewRun,
    ticket: Option<i64>,
    ended: &tokio::sync::Notify,
) -> StoreResult<Claim> {
    for _ in 0..5 {
        match store.insert_run(run, ticket).await? {
            Insert::Inserted {
                base_seq,
                unsealed,
                opened,
            } => {
                return Ok(Claim::Acquired {
                    base_seq,
                    unsealed,
                    opened,
                })
            }
            Insert::NoSession => return Ok(Claim::NoSession),
            Insert::Occupied => {}
        }
        let Some(active) = store.active_run(&run.key).await? else {
            return Ok(Claim::Busy(None)); // queued requests come first, or it just ended
        };
        match store.expire_run(&active).await? {
            Expired::Ended => ended.notify_one(),
            Expired::Alive => return Ok(Claim::Busy(Some(Box::new(active)))),
            Expired::Durable => return Ok(Claim::Orphaned(Box::new(active))),
        }
        tracing::warn!(run = %active.run_id, owner = %active.owner, "took over a session whose replica stopped heartbeating");
    }
    Err(StoreError::Conflict)
}

/// A place in a session's queue; leaving it (timed out, the client gone) is the drop. An
/// admitted waiter leaves at once ([`Ticket::leave`]): a request right behind it must not
/// find the ticket still ahead of it.
pub(super) struct Ticket {
    pub(super) id: i64,
    user: String,
    store: Arc<dyn RunStore>,
    left: bool,
}

impl Ticket {
    /// Takes a place at the end of `key`'s queue.
    pub(super) async fn take(
        store: &Arc<dyn RunStore>,
        key: &SessionKey,
        owner: &str,
    ) -> StoreResult<Ticket> {
        let id = store.enqueue(key, owner).await?;
        Ok(Ticket {
            id,
            user: key.user_id.clone(),
            store: store.clone(),
            left: false,
        })
    }

    pub(super) async fn leave(mut self) {
        self.left = true;
        if let Err(e) = self.store.dequeue(&self.user, self.id).await {
            tracing::warn!(ticket = self.id, error = %e, "could not leave the run queue; the ticket expires with this replica's heartbeat or its time to live");
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        let store = self.store.clone();
        let id = self.id;
        let user = std::mem::take(&mut self.user);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = store.dequeue(&user, id).await {
                    tracing::warn!(ticket = id, error = %e, "could not leave the run queue; the ticket expires with this replica's heartbeat or its time to live");
                }
            });
        }
    }
}
