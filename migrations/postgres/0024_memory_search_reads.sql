-- Memory search by words for a user with many memories, reading what it needs (0019's
-- function, two reads changed; docs/performance.md#memory-search).
--
-- - The count that picks the branch stops at 2,001 entries of the primary key only when it is
--   a plain index scan: without statistics the planner made it a bitmap scan, which collects
--   every entry of the user before the first row is counted (100,000 of them, 7 ms of a 15 ms
--   search). Bitmap scans are off for the count alone; both searches need them (GIN has no
--   other kind).
-- - 0019 kept the primary key (app_name, user_id, event_id) out of the GIN branch's plan with
--   `app_name || ''`, but `user_id = p_user` alone still matches the key's second column:
--   the planner could AND the GIN index with a scan of the whole key (every memory of every
--   user and app). Compared under the "C" collation the clause matches no index (each has
--   the column's default collation), so the matches come from the GIN index alone and the
--   user's are kept by a filter. Equality is the same bytes under any deterministic
--   collation, so the answer does not change, and the clause still compares the distribution
--   column with the user, which keeps the query on the user's shard on Citus (the function
--   stays distributed by p_user: CREATE OR REPLACE keeps its signature, and Citus sends the
--   new body to the workers).
CREATE OR REPLACE FUNCTION agentd_memory_by_words_v1(
    p_app text, p_user text, p_query text, p_limit integer)
RETURNS TABLE (session_id text, event_id text, author text, "timestamp" double precision,
               text text, content jsonb)
LANGUAGE plpgsql
SET enable_seqscan = on
SET enable_bitmapscan = off
AS $fn$
DECLARE
    v_n bigint;
BEGIN
    SELECT count(*) INTO v_n FROM (
        SELECT 1 FROM memory_entries m
         WHERE m.app_name = p_app AND m.user_id = p_user
         LIMIT 2001) c;
    PERFORM set_config('enable_bitmapscan', 'on', true);
    IF v_n > 2000 THEN
        PERFORM set_config('enable_seqscan', 'off', true);
        RETURN QUERY
            SELECT m.session_id, m.event_id, m.author, m."timestamp", m.text, m.content
              FROM memory_entries m, memory_tsquery(p_query) AS t(q)
             WHERE m.app_name || '' = p_app AND m.user_id = p_user COLLATE "C" AND m.tsv @@ t.q
             ORDER BY ts_rank(m.tsv, t.q) DESC, m."timestamp" DESC, m.event_id
             LIMIT p_limit;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT m.session_id, m.event_id, m.author, m."timestamp", m.text, m.content
          FROM memory_entries m, memory_tsquery(p_query) AS t(q)
         WHERE m.app_name = p_app AND m.user_id = p_user AND m.tsv @@ t.q
         ORDER BY ts_rank(m.tsv, t.q) DESC, m."timestamp" DESC, m.event_id
         LIMIT p_limit;
END
$fn$;
