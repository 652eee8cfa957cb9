-- A user's runs, newest first (`GET /apps/{app}/users/{user}/runs`, keyset pagination on
-- (created_at, id)). Keyed, like sessions_by_owner_update_time (0007), by an expression only
-- the listing names: an index led by (app_name, user_id) columns would tie, without
-- statistics, with runs_by_session for a session's runs and could be taken for them (a scan of
-- every run of the user). The separator (U+001F) cannot occur in ids; the query also compares
-- the app name's length, so the match stays exact.
CREATE INDEX runs_by_owner_created
    ON runs ((app_name || E'\x1f' || user_id), created_at, id);
