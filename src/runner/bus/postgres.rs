//! The PostgreSQL half of the bus: one `LISTEN` connection per replica, one notifier that
//! sends queued notifications in batches, and the watch refresher.

use super::*;

impl Bus {
    /// A bus that also reaches the other replicas through PostgreSQL. Starts the listener
    /// (which `channels` share), the notifier and the watch refresher; they stop with `stop`.
    pub async fn postgres(
        replica: &str,
        pool: sqlx::PgPool,
        stop: CancellationToken,
        channels: Vec<ChannelListener>,
    ) -> Result<(Arc<Bus>, mpsc::UnboundedReceiver<String>), sqlx::Error> {
        let (cancels, cancel_rx) = mpsc::unbounded_channel();
        let (ntx, nrx) = mpsc::channel(NOTIFY_QUEUE);
        let bus = Arc::new(Bus {
            replica: replica.to_string(),
            inner: Mutex::new(Inner::default()),
            notify: Some(ntx),
            cancels,
            channels,
        });
        let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
        let names: Vec<&str> = std::iter::once(CHANNEL)
            .chain(bus.channels.iter().map(|c| c.channel))
            .collect();
        listener.listen_all(names).await?;
        tokio::spawn(listen(Arc::downgrade(&bus), listener, stop.clone()));
        tokio::spawn(notifier(replica.to_string(), pool, nrx, stop.clone()));
        tokio::spawn(refresh_watches(Arc::downgrade(&bus), stop));
        Ok((bus, cancel_rx))
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
            Ok(Some(n)) if n.channel() == CHANNEL => bus.receive(n.payload()),
            Ok(Some(n)) => {
                if let Some(c) = bus.channels.iter().find(|c| c.channel == n.channel()) {
                    (c.on_notify)(n.payload());
                }
            }
            // The connection was lost and sqlx has already reconnected and re-LISTENed.
            // Whatever was sent meanwhile is gone: followers re-read, other listeners hear of the gap.
            Ok(None) => {
                tracing::warn!("notification connection lost; reconnected");
                bus.resync_all();
            }
            // The reconnect failed. Re-subscribe first, and only then tell followers and the
            // other listeners to re-read: anything read before the subscription is back could miss
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
