-- Retention (`agentd prune`, `--session-ttl`): old finished runs are found by when they ended.
CREATE INDEX runs_finished ON runs (finished_at) WHERE status <> 'running';
