-- agentd's hot steps as distributed functions, for Citus only (src/store/postgres/router.rs).
--
-- Each function is one step of a run that a plain PostgreSQL runs as one statement of
-- data-modifying CTEs (src/store/postgres/runs.rs, sessions.rs). Citus cannot route such a
-- statement whole: it plans each CTE as a subplan of its own, a round trip from the
-- coordinator to the worker with its result shipped back as an intermediate result. Here the
-- same writes are single-table statements, each fast-path routable by `user_id`, inside a
-- function distributed by its user argument and colocated with `sessions`: the coordinator
-- forwards the call to the worker holding the user's shards in one round trip, and the worker
-- runs every statement locally, in one local transaction (no two-phase commit). Inside a
-- transaction block (an append with artifacts, a multi-event edit) Citus does not forward a
-- call: the function then runs on the coordinator, each statement routed on its own, in the
-- block's transaction; correct, and as many round trips as statements.
--
-- Names carry a version: a function's body never changes under its name, so replicas of two
-- releases can run side by side during a rolling update. No function writes a reference table
-- on the hot path: the callers send a step that changes `app:` state through the statement
-- form instead (the one place such a write is needed).
--
-- `statement_timestamp()` is the worker's clock here (the coordinator's in the statement
-- form): the operator keeps the nodes' clocks in step with NTP (docs/citus.md).

-- Creating a session with no initial events and no `app:`/`user:` state (CREATE_SQL).
CREATE OR REPLACE FUNCTION agentd_create_session_v1(
    p_app text, p_user text, p_id text, p_state jsonb,
    p_create double precision, p_update double precision)
RETURNS TABLE (state jsonb, update_time double precision, last_seq bigint,
               app_state jsonb, user_state jsonb)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    s record;
BEGIN
    INSERT INTO sessions (app_name, user_id, id, state, initial_state, create_time,
                          update_time, last_seq)
    VALUES (p_app, p_user, p_id, p_state, NULLIF(p_state, '{}'::jsonb), p_create, p_update, 0)
    ON CONFLICT DO NOTHING
    RETURNING sessions.state, sessions.update_time, sessions.last_seq INTO s;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    state := s.state;
    update_time := s.update_time;
    last_seq := s.last_seq;
    SELECT a.state INTO app_state FROM app_states a WHERE a.app_name = p_app;
    SELECT u.state INTO user_state FROM user_states u
     WHERE u.app_name = p_app AND u.user_id = p_user;
    app_state := COALESCE(app_state, '{}'::jsonb);
    user_state := COALESCE(user_state, '{}'::jsonb);
    RETURN NEXT;
END
$fn$;

-- Admission (pg_insert_run_sql, whose doc comment explains each part; the parameters in its
-- order).
CREATE OR REPLACE FUNCTION agentd_admit_v1(
    p_run text, p_app text, p_user text, p_session text, p_invocation text, p_owner text,
    p_user_event boolean, p_ticket bigint, p_queue_ttl double precision,
    p_with_event boolean, p_state jsonb, p_app_delta jsonb, p_user_delta jsonb,
    p_ts double precision, p_event_id text, p_event_invocation text, p_author text,
    p_event jsonb, p_webhooks jsonb, p_durable text, p_config jsonb,
    p_max_secs double precision, p_key text)
RETURNS TABLE (session boolean, base_seq bigint, unsealed boolean, taken boolean, seq bigint,
               ts double precision, state jsonb, snapshot_seq bigint, app_state jsonb,
               user_state jsonb)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_now double precision := extract(epoch from statement_timestamp())::double precision;
    v_first bigint;
    v_with_event boolean;
    v_free boolean;
    q record;
    s record;
BEGIN
    IF NOT p_with_event THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- Single-table reads only: Citus plans those on its fast path and caches the plan, where
    -- a query with a subquery is planned again at every call (about a millisecond).
    --
    -- The free session's row is locked first, as the statement form's UPDATE locks it: every
    -- read below then sees what was committed before (a dead run's record written by the
    -- statement that freed the session, a ticket), where the statement form read them in the
    -- snapshot its UPDATE was checked against. A session a run holds is skipped without
    -- waiting, as there.
    SELECT x.last_seq INTO snapshot_seq FROM sessions x
     WHERE x.app_name = p_app AND x.user_id = p_user AND x.id = p_session
       AND x.active_run IS NULL
       FOR NO KEY UPDATE;
    v_free := FOUND;
    IF v_free THEN
        session := true;
    ELSE
        SELECT x.last_seq INTO snapshot_seq FROM sessions x
         WHERE x.app_name = p_app AND x.user_id = p_user AND x.id = p_session;
        session := FOUND;
    END IF;
    -- The queue's first live ticket (its waiter's replica heartbeating); usually none.
    FOR q IN SELECT t.ticket, t.owner FROM run_queue t
              WHERE t.app_name = p_app AND t.user_id = p_user AND t.session_id = p_session
                AND t.created_at > v_now - p_queue_ttl
              ORDER BY t.ticket
    LOOP
        PERFORM 1 FROM replicas r
         WHERE r.id = q.owner AND r.heartbeat_at > v_now - r.lease_secs;
        IF FOUND THEN
            v_first := q.ticket;
            EXIT;
        END IF;
    END LOOP;
    PERFORM 1 FROM runs r WHERE r.app_name = p_app AND r.user_id = p_user
                            AND r.session_id = p_session AND NOT r.sealed LIMIT 1;
    unsealed := FOUND;
    PERFORM 1 FROM runs r WHERE r.user_id = p_user AND r.id = p_run;
    taken := FOUND;
    v_with_event := p_with_event AND NOT unsealed;
    IF v_free AND NOT taken AND (v_first IS NULL OR v_first = p_ticket) THEN
        UPDATE sessions
           SET active_run = p_run, run_invocation = p_invocation, run_owner = p_owner,
               run_created_at = v_now, run_base_seq = sessions.last_seq,
               run_user_event = p_user_event, run_webhooks = p_webhooks,
               run_cancel_requested = false, run_cancelled_by = NULL, run_cancel_reason = NULL,
               run_durable = p_durable, run_config = p_config,
               run_deadline = v_now + p_max_secs, run_resumes = 0, run_resume_log = NULL,
               run_released_at = NULL, run_usage = NULL, run_key = p_key, run_key_run = p_run,
               state = CASE WHEN v_with_event THEN sessions.state || p_state
                            ELSE sessions.state END,
               update_time = CASE WHEN v_with_event THEN GREATEST(p_ts, sessions.update_time)
                                  ELSE sessions.update_time END,
               last_seq = sessions.last_seq + CASE WHEN v_with_event THEN 1 ELSE 0 END
         WHERE app_name = p_app AND user_id = p_user AND id = p_session
           AND active_run IS NULL
        RETURNING sessions.last_seq, sessions.state, sessions.update_time AS ts,
                  sessions.run_base_seq AS base_seq
        INTO s;
        IF FOUND THEN
            base_seq := s.base_seq;
            state := s.state;
            IF v_with_event THEN
                IF p_app_delta <> '{}'::jsonb THEN
                    INSERT INTO app_states AS t (app_name, state, update_time)
                    VALUES (p_app, p_app_delta, p_ts)
                    ON CONFLICT (app_name) DO UPDATE
                       SET state = t.state || EXCLUDED.state, update_time = EXCLUDED.update_time;
                END IF;
                IF p_user_delta <> '{}'::jsonb THEN
                    INSERT INTO user_states AS t (app_name, user_id, state, update_time)
                    VALUES (p_app, p_user, p_user_delta, p_ts)
                    ON CONFLICT (app_name, user_id) DO UPDATE
                       SET state = t.state || EXCLUDED.state,
                           update_time = EXCLUDED.update_time;
                END IF;
                INSERT INTO events (app_name, user_id, session_id, seq, id, invocation_id,
                                    author, "timestamp", event)
                VALUES (p_app, p_user, p_session, s.last_seq, p_event_id, p_event_invocation,
                        p_author, s.ts, jsonb_set(p_event, '{timestamp}', to_jsonb(s.ts)));
                seq := s.last_seq;
                ts := s.ts;
            END IF;
        END IF;
    END IF;
    SELECT a.state INTO app_state FROM app_states a WHERE a.app_name = p_app;
    SELECT u.state INTO user_state FROM user_states u
     WHERE u.app_name = p_app AND u.user_id = p_user;
    app_state := COALESCE(app_state, '{}'::jsonb);
    user_state := COALESCE(user_state, '{}'::jsonb);
    RETURN NEXT;
END
$fn$;

-- What the end of a run writes besides its `runs` row: the webhook deliveries its outcome
-- owes (outbox.rs) and its usage added to the daily aggregates, and to its key's when an API
-- key started it (usage.rs). Called by the two functions below, on the same node.
CREATE OR REPLACE FUNCTION agentd_after_end_v1(
    p_run text, p_app text, p_user text, p_status text, p_webhooks jsonb, p_usage jsonb,
    p_key text)
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now double precision := extract(epoch from statement_timestamp())::double precision;
    v_day integer := floor(extract(epoch from statement_timestamp()) / 86400.0)::integer;
    v_kind text := CASE p_status WHEN 'completed' THEN 'run.completed'
                                 WHEN 'cancelled' THEN 'run.cancelled'
                                 ELSE 'run.failed' END;
    v_hook record;
    v_sum record;
BEGIN
    IF p_webhooks IS NOT NULL THEN
        FOR v_hook IN SELECT w.target, w.ord
                        FROM jsonb_array_elements(p_webhooks) WITH ORDINALITY AS w(target, ord)
        LOOP
            IF v_hook.target->'events' ? v_kind
               OR (v_kind = 'run.completed'
                   AND v_hook.target->'events' ? 'run.input_required') THEN
                INSERT INTO webhook_deliveries (id, run_id, app_name, user_id, event_type, url,
                                                target, next_attempt_at, created_at)
                VALUES (p_run || '-w' || v_hook.ord, p_run, p_app, p_user, v_kind,
                        v_hook.target->>'url', v_hook.target, v_now, v_now)
                ON CONFLICT (user_id, id) DO NOTHING;
            END IF;
        END LOOP;
    END IF;
    IF p_usage IS NULL OR p_usage = '{}'::jsonb THEN
        RETURN;
    END IF;
    FOR v_sum IN SELECT u.key, u.value FROM jsonb_each(p_usage || '{"": {}}'::jsonb) AS u LOOP
        INSERT INTO usage_daily AS t (app_name, user_id, day, model, input_tokens,
                                      output_tokens, cached_tokens, reasoning_tokens,
                                      model_calls, runs, cost, unpriced_calls)
        VALUES (p_app, p_user, v_day, v_sum.key,
                COALESCE((v_sum.value->>'inputTokens')::bigint, 0),
                COALESCE((v_sum.value->>'outputTokens')::bigint, 0),
                COALESCE((v_sum.value->>'cachedTokens')::bigint, 0),
                COALESCE((v_sum.value->>'reasoningTokens')::bigint, 0),
                COALESCE((v_sum.value->>'modelCalls')::bigint, 0), 1,
                COALESCE((v_sum.value->>'pricedCost')::double precision, 0),
                COALESCE((v_sum.value->>'unpricedCalls')::bigint, 0))
        ON CONFLICT (app_name, user_id, day, model) DO UPDATE
           SET input_tokens = t.input_tokens + EXCLUDED.input_tokens,
               output_tokens = t.output_tokens + EXCLUDED.output_tokens,
               cached_tokens = t.cached_tokens + EXCLUDED.cached_tokens,
               reasoning_tokens = t.reasoning_tokens + EXCLUDED.reasoning_tokens,
               model_calls = t.model_calls + EXCLUDED.model_calls,
               runs = t.runs + EXCLUDED.runs,
               cost = t.cost + EXCLUDED.cost,
               unpriced_calls = t.unpriced_calls + EXCLUDED.unpriced_calls;
    END LOOP;
    IF p_key IS NOT NULL THEN
        SELECT COALESCE(sum((u.value->>'inputTokens')::bigint), 0) AS input_tokens,
               COALESCE(sum((u.value->>'outputTokens')::bigint), 0) AS output_tokens,
               COALESCE(sum((u.value->>'cachedTokens')::bigint), 0) AS cached_tokens,
               COALESCE(sum((u.value->>'reasoningTokens')::bigint), 0) AS reasoning_tokens,
               COALESCE(sum((u.value->>'modelCalls')::bigint), 0) AS model_calls,
               COALESCE(sum((u.value->>'pricedCost')::double precision), 0) AS cost,
               COALESCE(sum((u.value->>'unpricedCalls')::bigint), 0) AS unpriced_calls
          INTO v_sum FROM jsonb_each(p_usage) AS u;
        INSERT INTO usage_keys AS t (user_id, key_id, day, app_name, input_tokens,
                                     output_tokens, cached_tokens, reasoning_tokens,
                                     model_calls, runs, cost, unpriced_calls)
        VALUES (p_user, p_key, v_day, p_app, v_sum.input_tokens, v_sum.output_tokens,
                v_sum.cached_tokens, v_sum.reasoning_tokens, v_sum.model_calls, 1, v_sum.cost,
                v_sum.unpriced_calls)
        ON CONFLICT (user_id, key_id, day, app_name) DO UPDATE
           SET input_tokens = t.input_tokens + EXCLUDED.input_tokens,
               output_tokens = t.output_tokens + EXCLUDED.output_tokens,
               cached_tokens = t.cached_tokens + EXCLUDED.cached_tokens,
               reasoning_tokens = t.reasoning_tokens + EXCLUDED.reasoning_tokens,
               model_calls = t.model_calls + EXCLUDED.model_calls,
               runs = t.runs + EXCLUDED.runs,
               cost = t.cost + EXCLUDED.cost,
               unpriced_calls = t.unpriced_calls + EXCLUDED.unpriced_calls;
    END IF;
END
$fn$;

-- A run's ended record: its one `runs` row from the session row an UPDATE just freed
-- (run_record.rs insert_ended; the `p_s_*` parameters are that row's `run_*` columns), then
-- what the end owes (agentd_after_end_v1). A row already there is kept, as in the statement
-- form, and then nothing else is written.
CREATE OR REPLACE FUNCTION agentd_record_end_v1(
    p_run text, p_status text, p_last_seq bigint, p_error text, p_user text, p_app text,
    p_session text, p_s_invocation text, p_s_owner text, p_s_cancel_requested boolean,
    p_s_cancelled_by text, p_s_cancel_reason text, p_s_created_at double precision,
    p_s_base_seq bigint, p_s_user_event boolean, p_s_webhooks jsonb, p_s_resumes integer,
    p_s_resume_log jsonb, p_s_usage jsonb, p_s_key text, p_s_key_run text)
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now double precision := extract(epoch from statement_timestamp())::double precision;
    v_key text := CASE WHEN p_s_key_run = p_run THEN p_s_key END;
BEGIN
    INSERT INTO runs (id, app_name, user_id, session_id, invocation_id, status, owner,
                      lease_expires_at, cancel_requested, cancelled_by, cancel_reason,
                      created_at, started_at, finished_at, base_seq, user_event, last_seq,
                      error, sealed, webhooks, resumes, resume_log, usage, key_id)
    VALUES (p_run, p_app, p_user, p_session, p_s_invocation, p_status, p_s_owner, 0,
            p_s_cancel_requested, p_s_cancelled_by, p_s_cancel_reason, p_s_created_at,
            p_s_created_at, v_now, p_s_base_seq, p_s_user_event, p_last_seq, p_error, true,
            p_s_webhooks, p_s_resumes, p_s_resume_log, p_s_usage, v_key)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        PERFORM agentd_after_end_v1(p_run, p_app, p_user, p_status, p_s_webhooks, p_s_usage,
                                    v_key);
    END IF;
END
$fn$;

-- The append of one complete event (APPEND; with p_end, APPEND_END: fenced by the run not
-- having been asked to cancel, freeing the session and recording the run `completed`). The
-- parameters in the statement's order. Returns the event's seq, or no row when the fence (or
-- the session) refused it.
CREATE OR REPLACE FUNCTION agentd_append_v1(
    p_app text, p_user text, p_session text, p_state jsonb, p_app_delta jsonb,
    p_user_delta jsonb, p_ts double precision, p_event_id text, p_invocation text,
    p_author text, p_event jsonb, p_run text, p_sealing text, p_epoch integer, p_usage jsonb,
    p_end boolean)
RETURNS TABLE (seq bigint)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    s record;
BEGIN
    IF p_end THEN
        UPDATE sessions
           SET state = sessions.state || p_state, update_time = p_ts,
               run_usage = COALESCE(p_usage, sessions.run_usage),
               last_seq = sessions.last_seq + 1, active_run = NULL
         WHERE app_name = p_app AND user_id = p_user AND id = p_session
           AND active_run = p_run AND run_resumes = p_epoch AND run_released_at IS NULL
           AND NOT run_cancel_requested
        RETURNING sessions.last_seq, sessions.app_name, sessions.id, sessions.run_invocation, sessions.run_owner,
                  sessions.run_cancel_requested, sessions.run_cancelled_by,
                  sessions.run_cancel_reason, sessions.run_created_at, sessions.run_base_seq,
                  sessions.run_user_event, sessions.run_webhooks, sessions.run_resumes,
                  sessions.run_resume_log, sessions.run_usage, sessions.run_key,
                  sessions.run_key_run
        INTO s;
    ELSIF p_sealing IS NULL THEN
        UPDATE sessions
           SET state = sessions.state || p_state, update_time = p_ts,
               run_usage = CASE WHEN p_run IS NULL THEN sessions.run_usage
                                ELSE COALESCE(p_usage, sessions.run_usage) END,
               last_seq = sessions.last_seq + 1
         WHERE app_name = p_app AND user_id = p_user AND id = p_session
           AND (p_run IS NULL
                OR (active_run = p_run AND run_resumes = p_epoch AND run_released_at IS NULL))
        RETURNING sessions.last_seq INTO s;
    ELSE
        -- Sealing a dead run's transcript (rare): the statement form's subquery as it is.
        UPDATE sessions
           SET state = sessions.state || p_state, update_time = p_ts,
               last_seq = sessions.last_seq + 1
         WHERE app_name = p_app AND user_id = p_user AND id = p_session
           AND (p_run IS NULL
                OR (active_run = p_run AND run_resumes = p_epoch AND run_released_at IS NULL))
           AND active_run IS NULL
           AND EXISTS (SELECT 1 FROM runs r WHERE r.user_id = p_user
                          AND r.id = p_sealing AND NOT r.sealed)
        RETURNING sessions.last_seq INTO s;
    END IF;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_end THEN
        PERFORM agentd_record_end_v1(p_run, 'completed', s.last_seq, NULL, p_user,
                                     s.app_name, s.id, s.run_invocation, s.run_owner,
                                     s.run_cancel_requested, s.run_cancelled_by,
                                     s.run_cancel_reason, s.run_created_at, s.run_base_seq,
                                     s.run_user_event, s.run_webhooks, s.run_resumes,
                                     s.run_resume_log, s.run_usage, s.run_key, s.run_key_run);
    END IF;
    IF p_app_delta <> '{}'::jsonb THEN
        INSERT INTO app_states AS t (app_name, state, update_time)
        VALUES (p_app, p_app_delta, p_ts)
        ON CONFLICT (app_name) DO UPDATE
           SET state = t.state || EXCLUDED.state, update_time = EXCLUDED.update_time;
    END IF;
    IF p_user_delta <> '{}'::jsonb THEN
        INSERT INTO user_states AS t (app_name, user_id, state, update_time)
        VALUES (p_app, p_user, p_user_delta, p_ts)
        ON CONFLICT (app_name, user_id) DO UPDATE
           SET state = t.state || EXCLUDED.state, update_time = EXCLUDED.update_time;
    END IF;
    INSERT INTO events (app_name, user_id, session_id, seq, id, invocation_id, author,
                        "timestamp", event)
    VALUES (p_app, p_user, p_session, s.last_seq, p_event_id, p_invocation, p_author, p_ts,
            p_event);
    seq := s.last_seq;
    RETURN NEXT;
END
$fn$;

-- A run's outcome when it did not ride on its last event (FINISH_RUN: the parameters in its
-- order): frees the session, records the run; asynchronous commit as there. Returns 1 when it
-- ended the run, 0 when the run no longer held the session.
CREATE OR REPLACE FUNCTION agentd_finish_run_v1(
    p_run text, p_status text, p_last_seq bigint, p_error text, p_user text, p_epoch integer,
    p_usage jsonb)
RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    s record;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE sessions SET active_run = NULL, run_usage = COALESCE(p_usage, sessions.run_usage)
     WHERE user_id = p_user AND active_run = p_run AND run_resumes = p_epoch
       AND run_released_at IS NULL
       AND (p_status <> 'completed' OR NOT run_cancel_requested)
    RETURNING sessions.app_name, sessions.id, sessions.run_invocation, sessions.run_owner,
              sessions.run_cancel_requested, sessions.run_cancelled_by,
              sessions.run_cancel_reason, sessions.run_created_at, sessions.run_base_seq,
              sessions.run_user_event, sessions.run_webhooks, sessions.run_resumes,
              sessions.run_resume_log, sessions.run_usage, sessions.run_key,
              sessions.run_key_run
    INTO s;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    PERFORM agentd_record_end_v1(p_run, p_status, p_last_seq, p_error, p_user,
                                 s.app_name, s.id, s.run_invocation, s.run_owner,
                                 s.run_cancel_requested, s.run_cancelled_by,
                                 s.run_cancel_reason, s.run_created_at, s.run_base_seq,
                                 s.run_user_event, s.run_webhooks, s.run_resumes,
                                 s.run_resume_log, s.run_usage, s.run_key, s.run_key_run);
    RETURN 1;
END
$fn$;
