-- Durable runs (docs/replicas.md): a run outlives the replica that runs it. What a replica
-- needs to continue a run it takes over lives beside the run on its session row, with how
-- often and where the run moved; `runs` keeps the count and the log once the run has ended.
--
-- Additive and safe for a rolling update: a run is resumable only while `run_durable` equals
-- `active_run`, which only a replica of this version writes (at admission); an older
-- replica's runs are never resumed, and columns an older admission leaves stale do not count.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

ALTER TABLE sessions
    -- The running run's id when it may be resumed (NULL: a hold, `resume: never`, older).
    ADD COLUMN run_durable     text,
    -- What the run continues with (its run config; NULL: all defaults).
    ADD COLUMN run_config      jsonb,
    -- When it must have ended: its first start plus its limit (PostgreSQL's clock).
    ADD COLUMN run_deadline    double precision,
    -- Takeovers so far: also the epoch every write on the run's behalf is fenced by.
    ADD COLUMN run_resumes     integer NOT NULL DEFAULT 0,
    -- Each takeover: from, to, at, reason.
    ADD COLUMN run_resume_log  jsonb,
    -- A draining owner gave the run up at a commit boundary, for a live replica to take.
    ADD COLUMN run_released_at double precision;

ALTER TABLE runs
    ADD COLUMN resumes    integer NOT NULL DEFAULT 0,
    ADD COLUMN resume_log jsonb;
