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
/// API key changes (a revocation): every replica drops its cached keys.
pub const KEYS_CHANNEL: &str = "agentd_keys";
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

/// The JSON form of a notification.
#[derive(Debug, Serialize, Deserialize)]
struct Wire<'a> {
    /// Sending replica (a replica ignores its own notifications).
    #[serde(rename = "f")]
    from: &'a str,
    #[serde(rename = "t")]
    kind: &'a str,
    #[serde(rename = "k", default, skip_serializing_if = "Option::is_none")]
    key: Option<(String, String, String)>,
    #[serde(rename = "ks", default, skip_serializing_if = "Vec::is_empty")]
    keys: Vec<(String, String, String)>,
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    run: Option<&'a str>,
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    invocation: Option<&'a str>,
    #[serde(rename = "q", default, skip_serializing_if = "Option::is_none")]
    seq: Option<i64>,
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    status: Option<&'a str>,
    #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
    in_stream: Option<bool>,
    #[serde(rename = "e", default, skip_serializing_if = "Option::is_none", borrow)]
    event: Option<&'a RawValue>,
    #[serde(rename = "m", default, skip_serializing_if = "Option::is_none")]
    message: Option<(String, String)>,
}

impl<'a> Wire<'a> {
    fn new(from: &'a str, kind: &'a str) -> Self {
        Wire {
            from,
            kind,
            key: None,
            keys: vec![],
            run: None,
            invocation: None,
            seq: None,
            status: None,
            in_stream: None,
            event: None,
            message: None,
        }
    }
}

fn key_tuple(k: &SessionKey) -> (String, String, String) {
    (k.app_name.clone(), k.user_id.clone(), k.session_id.clone())
}

fn tuple_key((a, u, s): (String, String, String)) -> SessionKey {
    SessionKey::new(a, u, s)
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
    /// Bumped on every API key change heard (and whenever notifications may have been
    /// missed); `None` without PostgreSQL, where no other process can tell us.
    key_generation: Option<Arc<std::sync::atomic::AtomicU64>>,
}

/// A follower's subscription; dropping it stops following.
pub struct Subscription {
    pub rx: broadcast::Receiver<BusMsg>,
    key: SessionKey,
    bus: Weak<Bus>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(bus) = self.bus.upgrade() {
            let mut inner = bus.lock();
            if inner
                .local
                .get(&self.key)
                .is_some_and(|tx| tx.receiver_count() <= 1)
            {
                inner.local.remove(&self.key);
            }
        }
    }
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
            key_generation: None,
        });
        (bus, rx)
    }

    /// A bus that also reaches the other replicas through PostgreSQL. Starts the listener,
    /// the notifier and the watch refresher; they stop with `stop`.
    pub async fn postgres(
        replica: &str,
        pool: sqlx::PgPool,
        stop: CancellationToken,
    ) -> Result<(Arc<Bus>, mpsc::UnboundedReceiver<String>), sqlx::Error> {
        let (cancels, cancel_rx) = mpsc::unbounded_channel();
        let (ntx, nrx) = mpsc::channel(NOTIFY_QUEUE);
        let bus = Arc::new(Bus {
            replica: replica.to_string(),
            inner: Mutex::new(Inner::default()),
            notify: Some(ntx),
            cancels,
            key_generation: Some(Arc::default()),
        });
        let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
        listener.listen_all([CHANNEL, KEYS_CHANNEL]).await?;
        tokio::spawn(listen(Arc::downgrade(&bus), listener, stop.clone()));
        tokio::spawn(notifier(replica.to_string(), pool, nrx, stop.clone()));
        tokio::spawn(refresh_watches(Arc::downgrade(&bus), stop));
        Ok((bus, cancel_rx))
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
        let (local, remote) = self.followed(key);
        if remote {
            self.send_remote(key, &msg);
        }
        if let Some(tx) = local {
            let _ = tx.send(msg);
        }
    }

    /// Tells every replica to cancel `run_id` (its owner acts on it).
    pub fn broadcast_cancel(&self, run_id: &str) {
        let mut w = Wire::new(&self.replica, "x");
        w.run = Some(run_id);
        self.send_wire(&w);
    }

    fn send_remote(&self, key: &SessionKey, msg: &BusMsg) {
        let json;
        let mut w;
        match msg {
            BusMsg::Started {
                run_id,
                invocation_id,
            } => {
                w = Wire::new(&self.replica, "b");
                w.run = Some(run_id);
                w.invocation = Some(invocation_id);
            }
            BusMsg::Partial {
                run_id,
                after,
                event,
            } => {
                json = match serde_json::to_string(&**event)
                    .ok()
                    .and_then(|s| RawValue::from_string(s).ok())
                {
                    Some(raw) => raw,
                    None => return,
                };
                w = Wire::new(&self.replica, "p");
                w.run = Some(run_id);
                w.seq = *after;
                w.event = Some(&json);
            }
            BusMsg::Committed {
                run_id,
                seq,
                in_run_stream,
                ..
            } => {
                w = Wire::new(&self.replica, "c");
                w.run = run_id.as_deref();
                w.seq = Some(*seq);
                w.in_stream = Some(*in_run_stream);
            }
            BusMsg::Error {
                run_id,
                kind,
                message,
            } => {
                w = Wire::new(&self.replica, "e");
                w.run = Some(run_id);
                w.message = Some((kind.clone(), message.clone()));
            }
            BusMsg::Done {
                run_id,
                status,
                last_seq,
            } => {
                w = Wire::new(&self.replica, "d");
                w.run = Some(run_id);
                w.status = Some(status.as_str());
                w.seq = *last_seq;
            }
            BusMsg::Resync => return,
        }
        w.key = Some(key_tuple(key));
        self.send_wire(&w);
    }

    fn send_wire(&self, w: &Wire<'_>) {
        let Some(notify) = &self.notify else { return };
        let Ok(payload) = serde_json::to_string(w) else {
            return;
        };
        if payload.len() > MAX_PAYLOAD {
            tracing::debug!(
                bytes = payload.len(),
                "notification too large for NOTIFY; not sent"
            );
            return;
        }
        if notify.try_send(payload).is_err() {
            tracing::warn!("notification queue full; a notification was dropped");
        }
    }

    /// Handles one notification: `<sending replica>\n<message or array of messages>` (the
    /// notifier packs what is queued together into as few notifications as fit). Every
    /// replica hears its own notifications too; those are dropped before any parsing.
    fn receive(&self, payload: &str) {
        let payload = match payload.split_once('\n') {
            Some((from, _)) if from == self.replica => return,
            Some((_, rest)) => rest,
            None => payload,
        };
        if payload.starts_with('[') {
            match serde_json::from_str::<Vec<&RawValue>>(payload) {
                Ok(items) => items.iter().for_each(|raw| self.receive_one(raw.get())),
                Err(e) => tracing::warn!(error = %e, "unreadable notification ignored"),
            }
        } else {
            self.receive_one(payload);
        }
    }

    fn receive_one(&self, payload: &str) {
        let w: Wire<'_> = match serde_json::from_str(payload) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable notification ignored");
                return;
            }
        };
        if w.from == self.replica {
            return;
        }
        match w.kind {
            "w" => {
                let until = Instant::now() + WATCH_TTL;
                let mut catch_up = vec![];
                {
                    let mut inner = self.lock();
                    let now = Instant::now();
                    for k in w.keys {
                        let key = tuple_key(k);
                        // Only a new watch needs the catch-up (a refresh would repeat it).
                        let new = inner
                            .remote
                            .insert(key.clone(), until)
                            .is_none_or(|t| t <= now);
                        if let (true, Some(run)) = (new, inner.runs.get(&key)) {
                            catch_up.push((key, run.clone()));
                        }
                    }
                }
                for (key, run) in catch_up {
                    self.send_remote(
                        &key,
                        &BusMsg::Started {
                            run_id: run.run_id.clone(),
                            invocation_id: run.invocation_id.clone(),
                        },
                    );
                    if let Some(seq) = run.last_seq {
                        self.send_remote(
                            &key,
                            &BusMsg::Committed {
                                run_id: Some(run.run_id.clone()),
                                seq,
                                event: None,
                                in_run_stream: true,
                            },
                        );
                    }
                }
            }
            "x" => {
                if let Some(run) = w.run {
                    let _ = self.cancels.send(run.to_string());
                }
            }
            kind => {
                let Some(key) = w.key.map(tuple_key) else {
                    return;
                };
                let run_id: Option<Arc<str>> = w.run.map(Into::into);
                let msg = match (kind, run_id) {
                    ("b", Some(run_id)) => BusMsg::Started {
                        run_id,
                        invocation_id: w.invocation.unwrap_or_default().into(),
                    },
                    ("p", Some(run_id)) => {
                        let Some(event) = w
                            .event
                            .and_then(|raw| serde_json::from_str::<Event>(raw.get()).ok())
                        else {
                            return;
                        };
                        BusMsg::Partial {
                            run_id,
                            after: w.seq,
                            event: Arc::new(event),
                        }
                    }
                    ("c", run_id) => BusMsg::Committed {
                        run_id,
                        seq: w.seq.unwrap_or(0),
                        event: None,
                        in_run_stream: w.in_stream.unwrap_or(true),
                    },
                    ("e", Some(run_id)) => {
                        let (kind, message) = w.message.unwrap_or_default();
                        BusMsg::Error {
                            run_id,
                            kind,
                            message,
                        }
                    }
                    ("d", Some(run_id)) => BusMsg::Done {
                        run_id,
                        status: RunStatus::parse(w.status.unwrap_or("")),
                        last_seq: w.seq,
                    },
                    _ => return,
                };
                if let Some(tx) = self.lock().local.get(&key) {
                    let _ = tx.send(msg);
                }
            }
        }
    }

    /// Every local follower re-reads from the database.
    fn resync_all(&self) {
        self.keys_changed();
        for tx in self.lock().local.values() {
            let _ = tx.send(BusMsg::Resync);
        }
    }

    /// The API key generation, when key changes are heard from every process (PostgreSQL).
    pub fn key_generation(&self) -> Option<Arc<std::sync::atomic::AtomicU64>> {
        self.key_generation.clone()
    }

    fn keys_changed(&self) {
        if let Some(g) = &self.key_generation {
            g.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn watched_keys(&self) -> Vec<SessionKey> {
        self.lock().local.keys().cloned().collect()
    }
}

/// The one listening connection of this replica.
async fn listen(bus: Weak<Bus>, mut listener: sqlx::postgres::PgListener, stop: CancellationToken) {
    let bus_ref = bus;
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => return,
            n = listener.try_recv() => n,
        };
        let Some(bus) = bus_ref.upgrade() else { return };
        match next {
            Ok(Some(n)) if n.channel() == KEYS_CHANNEL => bus.keys_changed(),
            Ok(Some(n)) => bus.receive(n.payload()),
            // The connection was lost and sqlx has already reconnected and re-LISTENed.
            // Whatever was sent meanwhile is gone: followers re-read, cached keys go.
            Ok(None) => {
                tracing::warn!("notification connection lost; reconnected");
                bus.resync_all();
            }
            // The reconnect failed. Re-subscribe first, and only then tell followers and the
            // key cache to re-read: anything read before the subscription is back could miss
            // a notification sent in between.
            Err(e) => {
                tracing::warn!(error = %e, "notification listener error; reconnecting");
                drop(bus);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                    // A statement through the listener reconnects it and re-LISTENs.
                    match sqlx::query("SELECT 1").execute(&mut listener).await {
                        Ok(_) => break,
                        Err(e) => tracing::warn!(error = %e, "notification listener: still down"),
                    }
                }
                let Some(bus) = bus_ref.upgrade() else { return };
                bus.resync_all();
            }
        }
    }
}

/// Sends queued notifications, as many as are waiting in one statement.
async fn notifier(
    replica: String,
    pool: sqlx::PgPool,
    mut rx: mpsc::Receiver<String>,
    stop: CancellationToken,
) {
    let mut batch = Vec::with_capacity(64);
    let mut stopping = false;
    loop {
        let n = if stopping {
            // At shutdown: send what is queued (the last runs' ends), then stop.
            while batch.len() < 256 {
                match rx.try_recv() {
                    Ok(p) => batch.push(p),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                return;
            }
            batch.len()
        } else {
            tokio::select! {
                _ = stop.cancelled() => {
                    stopping = true;
                    continue;
                }
                n = rx.recv_many(&mut batch, 256) => n,
            }
        };
        if n == 0 {
            return;
        }
        let packed = pack(&replica, &batch);
        let sent = sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
            .bind(CHANNEL)
            .bind(&packed)
            .execute(&pool)
            .await;
        if let Err(e) = sent {
            tracing::warn!(error = %e, n, "notifications not sent");
        }
        batch.clear();
    }
}

/// Packs queued messages (in order) into JSON arrays of at most [`MAX_PAYLOAD`] bytes: a burst
/// of partial events costs one notification, not one each.
/// Each payload starts with the sending replica's id and a newline, so a replica skips its own
/// without parsing them.
fn pack(replica: &str, batch: &[String]) -> Vec<String> {
    let mut out = vec![];
    let mut current = String::new();
    let head = replica.len() + 1;
    for item in batch {
        if !current.is_empty() && current.len() + item.len() + 2 > MAX_PAYLOAD {
            current.push(']');
            out.push(std::mem::take(&mut current));
        }
        if current.is_empty() {
            current.push_str(replica);
            current.push_str("\n[");
        } else {
            current.push(',');
        }
        current.push_str(item);
    }
    if current.len() > head {
        current.push(']');
        out.push(current);
    }
    out
}

/// Re-announces the sessions followed here, so owners keep sending for them.
async fn refresh_watches(bus: Weak<Bus>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(WATCH_REFRESH);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(bus) = bus.upgrade() else { return };
        // Forget watches nobody refreshed (their followers left).
        let now = Instant::now();
        bus.lock().remote.retain(|_, until| *until > now);
        let keys = bus.watched_keys();
        let mut batch: Vec<(String, String, String)> = vec![];
        let mut size = 0;
        for k in keys {
            let t = key_tuple(&k);
            let len = t.0.len() + t.1.len() + t.2.len() + 16;
            if size + len > MAX_PAYLOAD - 200 && !batch.is_empty() {
                let mut w = Wire::new(&bus.replica, "w");
                w.keys = std::mem::take(&mut batch);
                bus.send_wire(&w);
                size = 0;
            }
            size += len;
            batch.push(t);
        }
        if !batch.is_empty() {
            let mut w = Wire::new(&bus.replica, "w");
            w.keys = batch;
            bus.send_wire(&w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{pack, MAX_PAYLOAD};

    #[test]
    fn packing_keeps_order_and_the_payload_limit() {
        let items: Vec<String> = (0..100)
            .map(|i| format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(300)))
            .collect();
        let packed = pack("replica-a", &items);
        assert!(packed.len() > 1 && packed.len() < 10, "{}", packed.len());
        let mut seen = vec![];
        for p in &packed {
            assert!(p.len() <= MAX_PAYLOAD);
            let (from, json) = p.split_once('\n').unwrap();
            assert_eq!(from, "replica-a");
            let v: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
            seen.extend(v.into_iter().map(|x| x["n"].as_i64().unwrap()));
        }
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        assert!(pack("replica-a", &[]).is_empty());
    }
}
