-- Memory search by words that stays fast for a user with many memories, planned the same with
-- or without statistics (autovacuum may be off; src/store/postgres/memory.rs calls it).
--
-- Up to 2,000 memories of a user, the user's rows through the primary key, each tested: right
-- whatever the words. Beyond, the GIN index: the memories with the words, of every user, then
-- the user's. `app_name || ''` keeps the primary key out of that plan and the sequential scan is
-- disabled for it alone (without statistics the planner takes either, and then tests every
-- memory of the user); `user_id = p_user` stays plain, so Citus runs the call on the user's
-- worker (the function is distributed by p_user, src/store/postgres/citus.rs).
--
-- The GIN index without its pending list: with fastupdate, new entries wait in a list every
-- search reads in full until a vacuum (or 4 MB of them) merges it, and autovacuum may be off.
-- What waits already is merged now (on Citus, where this runs after the tables were
-- distributed, the shards' lists wait for their next vacuum).
ALTER INDEX memory_entries_tsv SET (fastupdate = off);
SELECT gin_clean_pending_list('memory_entries_tsv'::regclass);

CREATE FUNCTION agentd_memory_by_words_v1(
    p_app text, p_user text, p_query text, p_limit integer)
RETURNS TABLE (session_id text, event_id text, author text, "timestamp" double precision,
               text text, content jsonb)
LANGUAGE plpgsql
SET enable_seqscan = on
AS $fn$
DECLARE
    v_n bigint;
BEGIN
    SELECT count(*) INTO v_n FROM (
        SELECT 1 FROM memory_entries m
         WHERE m.app_name = p_app AND m.user_id = p_user
         LIMIT 2001) c;
    IF v_n > 2000 THEN
        PERFORM set_config('enable_seqscan', 'off', true);
        RETURN QUERY
            SELECT m.session_id, m.event_id, m.author, m."timestamp", m.text, m.content
              FROM memory_entries m, memory_tsquery(p_query) AS t(q)
             WHERE m.app_name || '' = p_app AND m.user_id = p_user AND m.tsv @@ t.q
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
