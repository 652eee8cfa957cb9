-- See migrations/postgres/0005_prune.sql.
CREATE INDEX runs_finished ON runs (finished_at) WHERE status <> 'running';
