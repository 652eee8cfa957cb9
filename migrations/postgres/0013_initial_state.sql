-- The plain state a session was created with (NULL: none, or created before this migration),
-- so that a rewind or a fork restores it instead of rebuilding the state from the events'
-- deltas alone (docs/editing.md). NULL when the creation state is empty: an append copies the
-- row, and an empty state then costs it nothing. Adding a nullable column rewrites nothing.
ALTER TABLE sessions ADD COLUMN initial_state jsonb;
