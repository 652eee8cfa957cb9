-- Turns of the cluster-wide scans (src/store/turns.rs): the background loops that read every
-- user's rows (due schedules, orphaned ticks, due webhook deliveries, runs nobody runs,
-- housekeeping) take a turn here before a poll that follows one which found nothing, so an idle
-- deployment scans about once per poll period, not once per replica. One row per kind of scan.
--
-- A plain table: on Citus it stays on the coordinator (neither distributed nor a reference
-- table), so taking a turn is one local write there. Additive; an older replica ignores it
-- and keeps polling on its own.
CREATE TABLE poll_turns (
    kind      text PRIMARY KEY,
    polled_at double precision NOT NULL
);

-- Every kind `src/store/turns.rs` names (a kind without its row is always granted).
INSERT INTO poll_turns (kind, polled_at)
VALUES ('schedules', 0), ('webhooks', 0), ('sweep', 0), ('housekeeping', 0);
