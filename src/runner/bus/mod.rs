//! The notification bus: how a run's progress reaches followers on any replica, and how a
//! cancel reaches the replica that executes a run.
//!
//! - **In process**: one `broadcast` channel per followed session. A run publishes its items
//!   (partial events, committed seqs, start and end) to its session's channel only when the
//!   session has a follower here; a session nobody follows costs one map lookup per item.
//! - **Across replicas** (PostgreSQL): one `LISTEN agentd` connection per replica and one
//!   notifier connection that sends `pg_notify` in batches. A replica with followers of a
//!   session announces a *watch* on it (at once, then every [`WATCH_REFRESH`]); the replica
//!   running a run on a watched session then NOTIFYs its partial events, commit seqs and end.
//!   Committed events themselves are never in a notification: followers read them from the
//!   events table by seq, so a lost or late notification can delay a frame but never lose or
//!   duplicate one. A run on a session nobody watches sends no notification at all (a
//!   notifying commit takes PostgreSQL's global notify lock, so commits never notify; the
//!   notifier sends after the commit, off the run's path).
//! - On receiving a watch, the owner answers at once with the run's current seq (catch-up), so
//!   a commit made between a follower's database read and the owner learning of the watch is
//!   still announced.
//!
//! Payloads over PostgreSQL's 8,000-byte limit (a very large partial event) are not sent; the
//! complete event that follows carries the whole content. SQLite (one process) uses only the
//! in-process half.
//!
//! Files: this one (the messages and the in-process half), [`remote`] (the wire format of a
//! notification, sending and receiving), [`postgres`] (the listening and notifying
//! connections), [`tap`] (a run's items to its session's followers).

mod postgres;
mod remote;
mod tap;

use remote::{key_tuple, Wire};

pub(crate) use tap::BusTap;

use crate::event::Event;
use crate::store::{RunStatus, SessionKey};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

/// The one notification channel every replica listens on.
pub const CHANNEL: &str = "agentd";
/// How often a replica re-announces the sessions its clients follow.
pub const WATCH_REFRESH: Duration = Duration::from_secs(2);
/// A remote watch not refreshed for this long is dropped.
const WATCH_TTL: Duration = Duration::from_secs(7);
/// Largest payload sent (PostgreSQL refuses 8,000 bytes and more).
const MAX_PAYLOAD: usize = 7_900;
/// Items buffered per session for followers here; a follower that falls further behind gets
/// `Lagged` and re-reads committed events from the database.
const FOLLOWER_BUFFER: usize = 1024;
/// Notifications waiting to be sent; beyond this, partial events are dropped (never needed for
/// correctness: followers read committed events from the database).
const NOTIFY_QUEUE: usize = 16_384;

/// What followers of a session hear.
#[derive(Debug, Clone)]
pub enum BusMsg {
    /// A run started on the session.
    Started {
        run_id: Arc<str>,
        invocation_id: Arc<str>,
    },
    /// A partial event of `run_id`; `after` is the run's last committed seq when it was sent
    /// (a partial with `after` below what a follower has seen belongs to an event it has).
    Partial {
        run_id: Arc<str>,
        after: Option<i64>,
        event: Arc<Event>,
    },
    /// Events up to `seq` are committed. `event` is the event itself when it came from this
    /// process (else read it from the database); `in_run_stream` is false for the run's user
    /// event, which `POST /run` does not stream.
    Committed {
        run_id: Option<Arc<str>>,
        seq: i64,
        event: Option<Arc<Event>>,
        in_run_stream: bool,
    },
    /// A run failed after it started (the stream's `event: error`).
    Error {
        run_id: Arc<str>,
        kind: String,
        message: String,
    },
    /// A run ended.
    Done {
        run_id: Arc<str>,
        status: RunStatus,
        last_seq: Option<i64>,
    },
    /// Notifications may have been lost (the listening connection was re-established):
    /// re-read from the database.
    Resync,
}

/// A local run's position, for answering a new watch at once.
#[derive(Debug, Clone)]
struct LocalRun {
    run_id: Arc<str>,
    invocation_id: Arc<str>,
    last_seq: Option<i64>,
}

#[derive(Default)]
struct Inner {
    /// Sessions followed in this process.
    local: HashMap<SessionKey, broadcast::Sender<BusMsg>>,
    /// Sessions whose runs' ends (only) someone here waits for: not "followed", so their
    /// runs publish no partial events and no watch goes to other replicas for them.
    ends: HashMap<SessionKey, broadcast::Sender<BusMsg>>,
    /// Sessions followed on other replicas, until when.
    remote: HashMap<SessionKey, Instant>,
    /// Runs executing here, by session.
    runs: HashMap<SessionKey, LocalRun>,
}

/// One per process. Cheap to share (`Arc`).
pub struct Bus {
    replica: String,
    inner: Mutex<Inner>,
    /// Payloads for the notifier (PostgreSQL only).
    notify: Option<mpsc::Sender<String>>,
    /// Cancel requests heard for runs (the runner cancels the local ones).
    cancels: mpsc::UnboundedSender<String>,
    /// Other listeners sharing this replica's notification connection.
    channels: Vec<ChannelListener>,
}

/// Another listener on this replica's one notification connection (PostgreSQL): told of
/// every notification on its channel, and of a gap (the connection was lost, so some may have
/// been missed). The bus knows nothing of what it listens for (API key changes: see
/// [`crate::auth::KeyChanges`]); the server wires the two.
pub struct ChannelListener {
    pub channel: &'static str,
    pub on_notify: Box<dyn Fn(&str) + Send + Sync>,
    pub on_gap: Box<dyn Fn() + Send + Sync>,
}

/// A follower's subscription; dropping it stops following.
pub struct Subscription {
    pub rx: broadcast::Receiver<BusMsg>,
    key: SessionKey,
    bus: Weak<Bus>,
    /// Made by [`Bus::subscribe_ends`].
    ends_only: bool,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(bus) = self.bus.upgrade() {
            let mut inner = bus.lock();
            let map = if self.ends_only {
                &mut inner.ends
            } else {
                &mut inner.local
            };
            if map
                .get(&self.key)
                .is_some_and(|tx| tx.receiver_count() <= 1)
            {
                map.remove(&self.key);
            }
        }
    }
}

/// What an ends-only subscription hears: a run's end, or that one may have been missed.
fn is_end(msg: &BusMsg) -> bool {
    matches!(msg, BusMsg::Done { .. } | BusMsg::Resync)
}

impl Bus {
    /// An in-process bus (SQLite). `cancels` receives run ids to cancel locally.
    pub fn local(replica: &str) -> (Arc<Bus>, mpsc::UnboundedReceiver<String>) {
        let (cancels, rx) = mpsc::unbounded_channel();
        let bus = Arc::new(Bus {
            replica: replica.to_string(),
            inner: Mutex::new(Inner::default()),
            notify: None,
            cancels,
            channels: vec![],
        });
        (bus, rx)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Follows a session: everything published for it from now on, from any replica.
    pub fn subscribe(self: &Arc<Self>, key: &SessionKey) -> Subscription {
        let (rx, new) = {
            let mut inner = self.lock();
            match inner.local.get(key) {
                Some(tx) => (tx.subscribe(), false),
                None => {
                    let (tx, rx) = broadcast::channel(FOLLOWER_BUFFER);
                    inner.local.insert(key.clone(), tx);
                    (rx, true)
                }
            }
        };
        if new {
            let mut w = Wire::new(&self.replica, "w");
            w.keys = vec![key_tuple(key)];
            self.send_wire(&w);
        }
        Subscription {
            rx,
            key: key.clone(),
            bus: Arc::downgrade(self),
            ends_only: false,
        }
    }

    /// Hears only the ends of the session's runs (`Done`, and `Resync` when one may have been
    /// missed), for a waiter that reads the run from the database anyway. Unlike
    /// [`Bus::subscribe`] it makes no one publish partial events or announce a watch: an end on
    /// this replica is heard at once, one on another replica only by the waiter's own re-read.
    pub fn subscribe_ends(self: &Arc<Self>, key: &SessionKey) -> Subscription {
        let mut inner = self.lock();
        let rx = match inner.ends.get(key) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = broadcast::channel(16);
                inner.ends.insert(key.clone(), tx);
                rx
            }
        };
        Subscription {
            rx,
            key: key.clone(),
            bus: Arc::downgrade(self),
            ends_only: true,
        }
    }

    /// Hands `msg` to this process's followers of `key`, and to its waiters if it is an end.
    pub(super) fn deliver_here(&self, key: &SessionKey, msg: BusMsg) {
        let inner = self.lock();
        if is_end(&msg) {
            if let Some(tx) = inner.ends.get(key) {
                let _ = tx.send(msg.clone());
            }
        }
        if let Some(tx) = inner.local.get(key) {
            let _ = tx.send(msg);
        }
    }

    /// Whether anyone, here or on another replica, follows the session.
    pub fn is_followed(&self, key: &SessionKey) -> bool {
        let inner = self.lock();
        inner.local.contains_key(key)
            || inner
                .remote
                .get(key)
                .is_some_and(|until| *until > Instant::now())
    }

    fn followed(&self, key: &SessionKey) -> (Option<broadcast::Sender<BusMsg>>, bool) {
        let mut inner = self.lock();
        let local = inner.local.get(key).cloned();
        let remote = match inner.remote.get(key) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                inner.remote.remove(key);
                false
            }
            None => false,
        };
        (local, remote)
    }

    /// A run of this process started on `key`.
    pub fn run_started(&self, key: &SessionKey, run_id: &str, invocation_id: &str) {
        let run: Arc<str> = run_id.into();
        let inv: Arc<str> = invocation_id.into();
        self.lock().runs.insert(
            key.clone(),
            LocalRun {
                run_id: run.clone(),
                invocation_id: inv.clone(),
                last_seq: None,
            },
        );
        let (local, remote) = self.followed(key);
        if let Some(tx) = local {
            let _ = tx.send(BusMsg::Started {
                run_id: run,
                invocation_id: inv,
            });
        }
        if remote {
            let mut w = Wire::new(&self.replica, "b");
            w.key = Some(key_tuple(key));
            w.run = Some(run_id);
            w.invocation = Some(invocation_id);
            self.send_wire(&w);
        }
    }

    /// A message about `key` from this process: to local followers, and to other replicas if
    /// they follow the session.
    pub fn publish(&self, key: &SessionKey, msg: BusMsg) {
        if let BusMsg::Committed {
            seq,
            run_id: Some(_),
            ..
        } = &msg
        {
            if let Some(run) = self.lock().runs.get_mut(key) {
                run.last_seq = Some(*seq);
            }
        }
        if let BusMsg::Done { run_id, .. } = &msg {
            let mut inner = self.lock();
            if inner.runs.get(key).is_some_and(|r| r.run_id == *run_id) {
                inner.runs.remove(key);
            }
        }
        if self.followed(key).1 {
            self.send_remote(key, &msg);
        }
        self.deliver_here(key, msg);
    }

    /// Tells every replica to cancel `run_id` (its owner acts on it).
    pub fn broadcast_cancel(&self, run_id: &str) {
        let mut w = Wire::new(&self.replica, "x");
        w.run = Some(run_id);
        self.send_wire(&w);
    }

    /// Every local follower re-reads from the database, and every other listener hears of
    /// the gap.
    fn resync_all(&self) {
        for c in &self.channels {
            (c.on_gap)();
        }
        let inner = self.lock();
        for tx in inner.local.values().chain(inner.ends.values()) {
            let _ = tx.send(BusMsg::Resync);
        }
    }

    fn watched_keys(&self) -> Vec<SessionKey> {
        self.lock().local.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter for a run's end does not make the session followed (its runs would then put
    /// every partial event on the bus, and on PostgreSQL into NOTIFYs), and hears the end.
    #[tokio::test]
    async fn an_ends_only_waiter_hears_the_end_and_follows_nothing() {
        let (bus, _cancels) = Bus::local("r1");
        let key = SessionKey::new("app", "u1", "s1");
        let mut waiter = bus.subscribe_ends(&key);
        assert!(!bus.is_followed(&key), "a waiter is not a follower");
        let done = BusMsg::Done {
            run_id: "run-1".into(),
            status: RunStatus::Completed,
            last_seq: Some(3),
        };
        bus.publish(
            &key,
            BusMsg::Committed {
                run_id: Some("run-1".into()),
                seq: 3,
                event: None,
                in_run_stream: true,
            },
        );
        bus.publish(&key, done);
        assert!(matches!(waiter.rx.recv().await, Ok(BusMsg::Done { .. })));
        let mut follower = bus.subscribe(&key);
        assert!(bus.is_followed(&key));
        drop(waiter);
        assert!(
            bus.is_followed(&key),
            "dropping the waiter leaves the follower"
        );
        bus.resync_all();
        assert!(matches!(follower.rx.recv().await, Ok(BusMsg::Resync)));
    }
}
