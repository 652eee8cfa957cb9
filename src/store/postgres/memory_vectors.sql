-- The nearest memories of one (app, user) to a query vector (src/store/postgres/memory_vectors.rs).
--
-- Up to 2,000 vectors, an exact scan: the user's rows through the primary key, each measured,
-- the nearest kept. Exact is fast at that size, and an index over every user's vectors would
-- have to skip past other users' neighbours to find this one's.
--
-- Beyond that, the HNSW index of the vector size (memory_entries_hnsw_<dims>, created when an
-- app adopts the size), searched with pgvector's iterative scan in strict order, so a filter
-- on the user does not cut the result short. The sort is disabled for that query alone, so the
-- planner takes the index whatever it guesses without statistics (autovacuum may be off, and
-- the user's share of the table is unknown to it). Should the index still come back short
-- (pgvector stops after hnsw.max_scan_tuples), the exact scan answers.
--
-- Distributed on Citus by p_user, colocated with memory_entries: one call, forwarded whole to
-- the user's worker. Its name carries a version: replicas of two releases may run side by side.
CREATE OR REPLACE FUNCTION agentd_memory_nearest_v1(
    p_app text, p_user text, p_space text, p_dims integer, p_query text, p_limit integer)
RETURNS TABLE (session_id text, event_id text, author text, "timestamp" double precision,
               text text, content jsonb, distance double precision)
LANGUAGE plpgsql
SET enable_sort = on
SET hnsw.ef_search = 100
SET hnsw.iterative_scan = strict_order
AS $fn$
DECLARE
    v_n bigint;
    v_rows bigint;
BEGIN
    SELECT count(*) INTO v_n FROM (
        SELECT 1 FROM memory_entries m
         WHERE m.app_name = p_app AND m.user_id = p_user AND m.space = p_space
           AND m.embedding IS NOT NULL
         LIMIT 2001) c;
    IF v_n > 2000 THEN
        PERFORM set_config('enable_sort', 'off', true);
        RETURN QUERY EXECUTE format(
            'SELECT m.session_id, m.event_id, m.author, m."timestamp", m.text, m.content,
                    (m.embedding::vector(%1$s) <=> $4::vector(%1$s))::float8
               FROM memory_entries m
              WHERE m.app_name = $1 AND m.user_id = $2 AND m.space = $3
                AND vector_dims(m.embedding) = %1$s
              ORDER BY m.embedding::vector(%1$s) <=> $4::vector(%1$s)
              LIMIT $5',
            p_dims)
        USING p_app, p_user, p_space, p_query, p_limit;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        PERFORM set_config('enable_sort', 'on', true);
        IF v_rows >= p_limit THEN
            RETURN;
        END IF;
        -- Short: the exact answer follows (the caller keeps each memory's first row and
        -- orders by distance, so the union is the exact answer).
    END IF;
    RETURN QUERY
        SELECT m.session_id, m.event_id, m.author, m."timestamp", m.text, m.content,
               (m.embedding <=> p_query::vector)::float8 AS d
          FROM memory_entries m
         WHERE m.app_name = p_app AND m.user_id = p_user AND m.space = p_space
           AND m.embedding IS NOT NULL
         ORDER BY d, m."timestamp" DESC, m.event_id
         LIMIT p_limit;
END
$fn$;
