-- A kind of scan that knows when its next work is due (src/store/turns.rs): the last scan
-- that found nothing also found the earliest time anything could be due, and turns of that
-- kind are refused until then (`quiet_until`, bounded there), unless a write made work due
-- since the scan began (`woken_at`: a schedule stored, changed or resumed). So an idle
-- deployment does not scan every shard each poll for work it knows is not due.
--
-- On the coordinator's plain table (0018). Additive: a replica of an older release ignores
-- the columns and keeps taking turns by period alone.
ALTER TABLE poll_turns
    ADD COLUMN quiet_until double precision NOT NULL DEFAULT 0,
    ADD COLUMN woken_at    double precision NOT NULL DEFAULT 0;
