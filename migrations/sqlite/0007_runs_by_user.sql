-- A user's runs, newest first (`GET /apps/{app}/users/{user}/runs`, keyset pagination on
-- (created_at, id)).
CREATE INDEX runs_by_user ON runs (app_name, user_id, created_at, id);
