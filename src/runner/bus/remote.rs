//! Notifications between replicas: the JSON form of a bus message, what a replica sends for a
//! watched session, and what it does with what it hears.

use super::*;

/// The JSON form of a notification.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Wire<'a> {
    /// Sending replica (a replica ignores its own notifications).
    #[serde(rename = "f")]
    pub(super) from: &'a str,
    #[serde(rename = "t")]
    pub(super) kind: &'a str,
    #[serde(rename = "k", default, skip_serializing_if = "Option::is_none")]
    pub(super) key: Option<(String, String, String)>,
    #[serde(rename = "ks", default, skip_serializing_if = "Vec::is_empty")]
    pub(super) keys: Vec<(String, String, String)>,
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub(super) run: Option<&'a str>,
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    pub(super) invocation: Option<&'a str>,
    #[serde(rename = "q", default, skip_serializing_if = "Option::is_none")]
    pub(super) seq: Option<i64>,
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub(super) status: Option<&'a str>,
    #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
    pub(super) in_stream: Option<bool>,
    #[serde(rename = "e", default, skip_serializing_if = "Option::is_none", borrow)]
    pub(super) event: Option<&'a RawValue>,
    #[serde(rename = "m", default, skip_serializing_if = "Option::is_none")]
    pub(super) message: Option<(String, String)>,
}

impl<'a> Wire<'a> {
    pub(super) fn new(from: &'a str, kind: &'a str) -> Self {
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

pub(super) fn key_tuple(k: &SessionKey) -> (String, String, String) {
    (k.app_name.clone(), k.user_id.clone(), k.session_id.clone())
}

pub(super) fn tuple_key((a, u, s): (String, String, String)) -> SessionKey {
    SessionKey::new(a, u, s)
}

impl Bus {
    pub(super) fn send_remote(&self, key: &SessionKey, msg: &BusMsg) {
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

    pub(super) fn send_wire(&self, w: &Wire<'_>) {
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
    pub(super) fn receive(&self, payload: &str) {
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

    pub(super) fn receive_one(&self, payload: &str) {
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
                self.deliver_here(&key, msg);
            }
        }
    }
}
