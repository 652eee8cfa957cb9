-- API keys (`--auth api-key`). Only a SHA-256 of each key's secret is stored: the key itself is
-- shown once, by `agentd keys create`. A key acts as `user_id` only, unless `admin`; `apps` (a
-- JSON array) restricts the apps it may use (NULL: all). Revocation sets `revoked_at`; every
-- request looks its key up, so it takes effect at once on every replica.
CREATE TABLE api_keys (
    id          text PRIMARY KEY,
    secret_hash text NOT NULL,
    user_id     text NOT NULL,
    apps        text,
    admin       boolean NOT NULL DEFAULT false,
    name        text,
    created_at  double precision NOT NULL,
    expires_at  double precision,
    revoked_at  double precision
);
