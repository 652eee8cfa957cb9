-- Webhooks: see migrations/postgres/0009_webhooks.sql for the reasoning; the same schema,
-- and the same trigger writing the deliveries in the run's end's transaction.
ALTER TABLE runs ADD COLUMN webhooks TEXT;

CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL,
    app_name        TEXT NOT NULL,
    user_id         TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    url             TEXT NOT NULL,
    target          TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending',
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    claimed_by      TEXT,
    last_status     INTEGER,
    last_error      TEXT,
    created_at      REAL NOT NULL,
    delivered_at    REAL
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_by_run ON webhook_deliveries (run_id);

CREATE TRIGGER runs_webhooks AFTER UPDATE OF status ON runs
    WHEN OLD.status = 'running' AND NEW.status <> 'running' AND NEW.webhooks IS NOT NULL
BEGIN
    INSERT OR IGNORE INTO webhook_deliveries (id, run_id, app_name, user_id, event_type, url,
                                              target, next_attempt_at, created_at)
    SELECT NEW.id || '-w' || (t.key + 1), NEW.id, NEW.app_name, NEW.user_id, k.kind,
           json_extract(t.value, '$.url'), t.value, k.at, k.at
      FROM json_each(NEW.webhooks) AS t,
           (SELECT CASE NEW.status WHEN 'completed' THEN 'run.completed'
                                   WHEN 'cancelled' THEN 'run.cancelled'
                                   ELSE 'run.failed' END AS kind,
                   (julianday('now') - 2440587.5) * 86400.0 AS at) AS k
     WHERE EXISTS (SELECT 1 FROM json_each(t.value, '$.events') AS e
                    WHERE e.value = k.kind
                       OR (k.kind = 'run.completed' AND e.value = 'run.input_required'));
END;

CREATE TRIGGER runs_deleted AFTER DELETE ON runs
BEGIN
    DELETE FROM webhook_deliveries WHERE run_id = OLD.id;
END;
