-- Plans that hold without statistics. On a table that was never analyzed (a fresh deployment,
-- a bulk load, autovacuum off or behind), PostgreSQL estimated one row for both a primary-key
-- lookup of a session (app_name, user_id, id) and for the same lookup through
-- sessions_by_update_time (app_name, user_id, update_time, id), called it a tie and took the
-- second: a scan of every session of that user, with id checked on each (3 ms at 4,376
-- sessions). The listing index is now keyed by one expression that no primary-key lookup
-- mentions, so it is never a candidate for one; the listing query names the same expression.
-- The separator (U+001F) cannot occur in app or user ids (control characters are refused),
-- and the query also compares the app name's length, so the match stays exact regardless.
DROP INDEX IF EXISTS sessions_by_update_time;
CREATE INDEX sessions_by_owner_update_time
    ON sessions ((app_name || E'\x1f' || user_id), update_time, id);
