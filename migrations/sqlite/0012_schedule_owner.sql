-- Who made a schedule, and why the server paused it (see the PostgreSQL migration).
ALTER TABLE schedules ADD COLUMN created_by TEXT;
ALTER TABLE schedules ADD COLUMN paused_reason TEXT;
CREATE INDEX schedules_by_key ON schedules (created_by) WHERE created_by IS NOT NULL;
