-- Who made a schedule, and why the server paused it: a schedule made with an API key stops
-- firing once that key is revoked or expires (docs/background.md), and says so.
ALTER TABLE schedules ADD COLUMN created_by text, ADD COLUMN paused_reason text;
-- `agentd keys revoke` pauses the key's schedules at once.
CREATE INDEX schedules_by_key ON schedules (created_by) WHERE created_by IS NOT NULL;
