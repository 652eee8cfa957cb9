-- Idempotent retries (`Idempotency-Key` on POST /run, POST /run_sse and session create). A key
-- is scoped to its caller (app and user today; the authenticated caller once auth exists),
-- remembers a hash of the request it was first used with, and what that request produced: the
-- run it started, or the response it answered. Keys expire (`--idempotency-ttl-secs`).
CREATE TABLE idempotency_keys (
    scope        text NOT NULL,
    key          text NOT NULL,
    request_hash text NOT NULL,
    run_id       text,
    status       integer,
    response     text,
    created_at   double precision NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);
