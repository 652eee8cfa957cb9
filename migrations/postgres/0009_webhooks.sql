-- Webhooks: an outbox written by the run's end itself.
--
-- `runs.webhooks` holds the run's webhook targets (the request's own and its app's), each
-- `{url, secret, events, allowPrivate, includeText}`, fixed at admission. When a run leaves
-- `running` — however: its own finish, a final event committed with the outcome, a takeover,
-- the sweeper — the trigger below inserts one delivery row per target that wants the event,
-- in the same transaction as the status change. So a delivery exists exactly when the run's
-- end is committed: never lost by a crash between the two, never written twice (the id is
-- the run's id and the target's position). Any replica sends it (see src/webhook/sender.rs).
ALTER TABLE runs ADD COLUMN webhooks jsonb;

CREATE TABLE webhook_deliveries (
    -- The `webhook-id` header: the same on every attempt.
    id              text PRIMARY KEY,
    run_id          text NOT NULL,
    app_name        text NOT NULL,
    user_id         text NOT NULL,
    -- run.completed | run.failed | run.cancelled (the sender tells run.input_required apart
    -- from run.completed by the run's last event).
    event_type      text NOT NULL,
    url             text NOT NULL,
    target          jsonb NOT NULL,
    -- pending | delivered | failed | skipped
    status          text NOT NULL DEFAULT 'pending',
    attempts        integer NOT NULL DEFAULT 0,
    -- Due time. A sender's claim moves it one lease ahead: a sender that dies mid-attempt
    -- leaves the row due again when the lease runs out, for any replica to take.
    next_attempt_at double precision NOT NULL,
    claimed_by      text,
    last_status     integer,
    last_error      text,
    created_at      double precision NOT NULL,
    delivered_at    double precision
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_by_run ON webhook_deliveries (run_id);

CREATE FUNCTION agentd_run_webhooks() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    kind text := CASE NEW.status WHEN 'completed' THEN 'run.completed'
                                 WHEN 'cancelled' THEN 'run.cancelled'
                                 ELSE 'run.failed' END;
    at double precision := extract(epoch from clock_timestamp());
BEGIN
    INSERT INTO webhook_deliveries (id, run_id, app_name, user_id, event_type, url, target,
                                    next_attempt_at, created_at)
    SELECT NEW.id || '-w' || t.ord, NEW.id, NEW.app_name, NEW.user_id, kind,
           t.target->>'url', t.target, at, at
      FROM jsonb_array_elements(NEW.webhooks) WITH ORDINALITY AS t(target, ord)
     WHERE t.target->'events' ? kind
        OR (kind = 'run.completed' AND t.target->'events' ? 'run.input_required')
    ON CONFLICT (id) DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_webhooks AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running' AND NEW.webhooks IS NOT NULL)
    EXECUTE FUNCTION agentd_run_webhooks();

-- A deleted run (pruned, or its session deleted) takes its deliveries with it.
CREATE FUNCTION agentd_run_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM webhook_deliveries WHERE run_id = OLD.id;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_deleted AFTER DELETE ON runs
    FOR EACH ROW EXECUTE FUNCTION agentd_run_deleted();
