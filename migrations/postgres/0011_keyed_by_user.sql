-- Every user-owned table carries user_id in its primary key, so that the database can be
-- distributed by user (Citus: a primary key must contain the distribution column; see
-- docs/citus.md). The user comes second: a lookup by id alone still reads the key's index.
-- A run id or a ticket stays unique on its own (UUIDs, a sequence).
--
-- One exception on a plain PostgreSQL: `runs` keeps its key on `id` alone. With (id, user_id)
-- and no statistics, PostgreSQL reads a run by id and user through the small partial indexes
-- (running runs, unsealed runs) instead of the key (tests/plans.rs). Distributing the tables
-- replaces it with (id, user_id) (src/store/postgres/citus.rs).

ALTER TABLE run_queue DROP CONSTRAINT run_queue_pkey;
ALTER TABLE run_queue ADD PRIMARY KEY (ticket, user_id);

-- Idempotency keys were scoped by a string holding the app and the user; the user now has
-- its own column (recovered from the scope for keys stored before).
ALTER TABLE idempotency_keys ADD COLUMN user_id text NOT NULL DEFAULT '';
UPDATE idempotency_keys SET user_id = split_part(scope, E'\x1f', 2);
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD PRIMARY KEY (scope, key, user_id);

-- Webhook deliveries are written by the statement that ends a run (the `outbox` CTE of
-- src/store/postgres/outbox.rs): on Citus a trigger on a shard cannot write another
-- distributed table. The triggers stay on a plain PostgreSQL for replicas older than this
-- migration during a rolling upgrade (their statements write no deliveries); for a run ended
-- by a newer replica they find the deliveries written and do nothing. `agentd migrate` drops
-- them when it distributes the tables (src/store/postgres/citus.rs).
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_pkey;
ALTER TABLE webhook_deliveries ADD PRIMARY KEY (id, user_id);
CREATE OR REPLACE FUNCTION agentd_run_webhooks() RETURNS trigger LANGUAGE plpgsql AS $$
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
    ON CONFLICT (id, user_id) DO NOTHING;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION agentd_run_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM webhook_deliveries WHERE user_id = OLD.user_id AND run_id = OLD.id;
    RETURN NULL;
END $$;

-- The keys older replicas name in their ON CONFLICT clauses, kept unique for them during a
-- rolling upgrade (dropped when the tables are distributed: Citus takes no unique index
-- without the user).
CREATE UNIQUE INDEX idempotency_keys_compat ON idempotency_keys (scope, key);

ALTER TABLE schedules DROP CONSTRAINT schedules_pkey;
ALTER TABLE schedules ADD PRIMARY KEY (id, user_id);

ALTER TABLE schedule_ticks ADD COLUMN user_id text NOT NULL DEFAULT '';
UPDATE schedule_ticks t SET user_id = s.user_id FROM schedules s WHERE s.id = t.schedule_id;
ALTER TABLE schedule_ticks DROP CONSTRAINT schedule_ticks_pkey;
ALTER TABLE schedule_ticks ADD PRIMARY KEY (schedule_id, tick_time, user_id);
CREATE UNIQUE INDEX schedule_ticks_compat ON schedule_ticks (schedule_id, tick_time);
