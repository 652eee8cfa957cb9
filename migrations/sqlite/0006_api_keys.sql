-- See migrations/postgres/0006_api_keys.sql.
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    apps        TEXT,
    admin       BOOLEAN NOT NULL DEFAULT 0,
    name        TEXT,
    created_at  REAL NOT NULL,
    expires_at  REAL,
    revoked_at  REAL
);
