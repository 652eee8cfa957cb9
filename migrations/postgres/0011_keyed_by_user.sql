-- Every user-owned table carries user_id in its primary key, so that the database can be
-- distributed by user (Citus: a primary key must contain the distribution column; see
-- docs/citus.md). The user comes second: a lookup by id alone (the bare `GET /runs/{id}`)
-- still reads the key's index, and a lookup by id and user reads it without statistics
-- (tests/plans.rs), where a key led by the user would compete with the per-user indexes.
-- A run id or a ticket stays unique on its own (UUIDs, a sequence).

ALTER TABLE runs DROP CONSTRAINT runs_pkey;
ALTER TABLE runs ADD PRIMARY KEY (id, user_id);

ALTER TABLE run_queue DROP CONSTRAINT run_queue_pkey;
ALTER TABLE run_queue ADD PRIMARY KEY (ticket, user_id);

-- Idempotency keys were scoped by a string holding the app and the user; the user now has
-- its own column (recovered from the scope for keys stored before).
ALTER TABLE idempotency_keys ADD COLUMN user_id text NOT NULL DEFAULT '';
UPDATE idempotency_keys SET user_id = split_part(scope, E'\x1f', 2);
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD PRIMARY KEY (scope, key, user_id);

-- Webhook deliveries are written by the statement that ends a run (no trigger: on Citus a
-- trigger on a shard cannot write another distributed table). The outbox is one CTE shared
-- by those statements (src/store/postgres/outbox.rs).
DROP TRIGGER runs_webhooks ON runs;
DROP TRIGGER runs_deleted ON runs;
DROP FUNCTION agentd_run_webhooks();
DROP FUNCTION agentd_run_deleted();
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_pkey;
ALTER TABLE webhook_deliveries ADD PRIMARY KEY (id, user_id);

ALTER TABLE schedules DROP CONSTRAINT schedules_pkey;
ALTER TABLE schedules ADD PRIMARY KEY (id, user_id);

ALTER TABLE schedule_ticks ADD COLUMN user_id text NOT NULL DEFAULT '';
UPDATE schedule_ticks t SET user_id = s.user_id FROM schedules s WHERE s.id = t.schedule_id;
ALTER TABLE schedule_ticks DROP CONSTRAINT schedule_ticks_pkey;
ALTER TABLE schedule_ticks ADD PRIMARY KEY (schedule_id, tick_time, user_id);
