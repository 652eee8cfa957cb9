-- See migrations/postgres/0004_idempotency.sql.
CREATE TABLE idempotency_keys (
    scope        TEXT NOT NULL,
    key          TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    run_id       TEXT,
    status       INTEGER,
    response     TEXT,
    created_at   REAL NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);
