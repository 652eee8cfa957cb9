-- The plain state a session was created with (NULL: none, or created before this migration),
-- so that a rewind or a fork restores it (docs/editing.md).
ALTER TABLE sessions ADD COLUMN initial_state TEXT;
