-- The user in the keys of idempotency keys and schedule ticks, as on PostgreSQL (where it
-- lets the database be distributed by user). SQLite keeps its primary keys; the unique
-- indexes are what the shared statements' ON CONFLICT clauses name.
ALTER TABLE idempotency_keys ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
UPDATE idempotency_keys SET user_id = substr(scope, instr(scope, char(31)) + 1);
CREATE UNIQUE INDEX idempotency_keys_by_user ON idempotency_keys (user_id, scope, key);

ALTER TABLE schedule_ticks ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
UPDATE schedule_ticks SET user_id = COALESCE(
    (SELECT s.user_id FROM schedules s WHERE s.id = schedule_ticks.schedule_id), '');
CREATE UNIQUE INDEX schedule_ticks_by_user ON schedule_ticks (user_id, schedule_id, tick_time);
