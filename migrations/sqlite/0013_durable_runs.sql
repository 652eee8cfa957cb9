-- Durable runs (docs/replicas.md): what a process needs to continue a run it takes over (at
-- restart, on SQLite), and how often and where the run moved. Only runs admitted with
-- `durable` set are resumed.
ALTER TABLE runs ADD COLUMN durable INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN run_config TEXT;
ALTER TABLE runs ADD COLUMN deadline REAL;
ALTER TABLE runs ADD COLUMN resumes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN resume_log TEXT;
ALTER TABLE runs ADD COLUMN released_at REAL;
