//! Sessions and events on PostgreSQL: create, read, list, delete, and the append path
//! (one statement per complete event; see the module docs of [`super`]).
//!
//! The statements themselves are in [`super::session_sql`].

use super::*;

use super::session_sql::*;

impl PgStore {
    pub(super) async fn insert_initial_events(
        tx: &mut Transaction<'_, Postgres>,
        key: &SessionKey,
        events: &[Event],
    ) -> StoreResult<()> {
        for (i, e) in events.iter().enumerate() {
            sqlx::query(
                r#"INSERT INTO events (app_name, user_id, session_id, seq, id, invocation_id, author, "timestamp", event)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"#,
            )
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(i as i64 + 1)
            .bind(&e.id)
            .bind(&e.invocation_id)
            .bind(&e.author)
            .bind(e.timestamp)
            .bind(Json(e))
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    pub(super) async fn merge_shared_state(
        tx: &mut Transaction<'_, Postgres>,
        app: &str,
        user: &str,
        split: &SplitState,
        now: f64,
    ) -> StoreResult<()> {
        if !split.app.is_empty() {
            sqlx::query(
                "INSERT INTO app_states AS t (app_name, state, update_time) VALUES ($1, $2, $3)
                 ON CONFLICT (app_name) DO UPDATE SET state = t.state || EXCLUDED.state, update_time = EXCLUDED.update_time",
            )
            .bind(app)
            .bind(Json(&split.app))
            .bind(now)
            .execute(&mut **tx)
            .await?;
        }
        if !split.user.is_empty() {
            sqlx::query(
                "INSERT INTO user_states AS t (app_name, user_id, state, update_time) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (app_name, user_id) DO UPDATE SET state = t.state || EXCLUDED.state, update_time = EXCLUDED.update_time",
            )
            .bind(app)
            .bind(user)
            .bind(Json(&split.user))
            .bind(now)
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    pub(super) async fn append_once(
        &self,
        key: &SessionKey,
        event: &Event,
        split: &SplitState,
        artifacts: &[ArtifactWrite],
        fence: Fence<'_>,
        usage: Option<Metered<'_>>,
    ) -> StoreResult<(Option<i64>, std::collections::BTreeMap<String, i64>)> {
        let mut versions = std::collections::BTreeMap::new();
        if artifacts.is_empty() {
            let seq = self
                .append_statement(key, event, split, fence, usage)
                .fetch_optional(&self.pool)
                .await
                .map_err(map_unique_to_conflict)?
                .map(|r| r.get::<i64, _>(0));
            return Ok((seq, versions));
        }
        // Artifacts ride in the same transaction as the event that announces them.
        let mut tx = self.pool.begin().await?;
        let scope = ArtifactScope::from(key);
        let mut event = event.clone();
        for w in artifacts {
            let v = Self::insert_artifact(&mut tx, &scope, w, event.timestamp).await?;
            versions.insert(w.filename.clone(), v);
            event.actions.artifact_delta.insert(w.filename.clone(), v);
        }
        let seq = self
            .append_statement(key, &event, split, fence, usage)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_unique_to_conflict)?
            .map(|r| r.get::<i64, _>(0));
        if seq.is_some() {
            tx.commit().await?;
        }
        Ok((seq, versions))
    }

    /// The events of one multi-event commit as stored, if its last one is (one transaction:
    /// then all are).
    async fn find_all(
        &self,
        key: &SessionKey,
        events: &[(Event, Vec<ArtifactWrite>)],
    ) -> StoreResult<Option<Vec<StoredEvent>>> {
        let Some((last, _)) = events.last() else {
            return Ok(Some(vec![]));
        };
        if self.find_event(key, &last.id).await?.is_none() {
            return Ok(None);
        }
        let mut stored = Vec::with_capacity(events.len());
        for (event, _) in events {
            stored.push(self.find_event(key, &event.id).await?.ok_or_else(|| {
                StoreError::Corrupt("an event of a committed edit is missing".into())
            })?);
        }
        Ok(Some(stored))
    }

    /// [`SessionStore::append_all_fenced`]'s one try: `None` when the fence (or the session)
    /// refused an event, and then nothing was written.
    async fn append_all_once(
        &self,
        key: &SessionKey,
        events: &[(Event, Vec<ArtifactWrite>)],
        fence: Fence<'_>,
    ) -> StoreResult<Option<Vec<StoredEvent>>> {
        let mut tx = self.pool.begin().await?;
        let scope = ArtifactScope::from(key);
        let mut stored = Vec::with_capacity(events.len());
        for (event, artifacts) in events {
            let mut event = event.clone();
            for w in artifacts {
                let v = Self::insert_artifact(&mut tx, &scope, w, event.timestamp).await?;
                event.actions.artifact_delta.insert(w.filename.clone(), v);
            }
            let split = SplitState::split(&event.actions.state_delta);
            let seq = self
                .append_statement(key, &event, &split, fence, None)
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_unique_to_conflict)?
                .map(|r| r.get::<i64, _>(0));
            // Dropping `tx` rolls back what this call wrote.
            let Some(seq) = seq else { return Ok(None) };
            stored.push(StoredEvent { seq, event });
        }
        tx.commit().await?;
        Ok(Some(stored))
    }

    pub(super) fn append_statement<'q>(
        &self,
        key: &'q SessionKey,
        event: &'q Event,
        split: &'q SplitState,
        fence: Fence<'q>,
        usage: Option<Metered<'q>>,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        let (mut sql, run, sealing) = match fence {
            Fence::Unfenced => (APPEND.pick(self.citus), None, None),
            Fence::Run(run, epoch) => (APPEND.pick(self.citus), Some((run, epoch)), None),
            Fence::RunEnd(run, epoch) if usage.is_some_and(|m| m.keyed) => {
                (APPEND_END.pick(self.citus), Some((run, epoch)), None)
            }
            Fence::RunEnd(run, epoch) if usage.is_some() => (
                APPEND_END_KEYLESS.pick(self.citus),
                Some((run, epoch)),
                None,
            ),
            Fence::RunEnd(run, epoch) => (
                APPEND_END_UNMETERED.pick(self.citus),
                Some((run, epoch)),
                None,
            ),
            Fence::Sealing(dead) => (APPEND.pick(self.citus), None, Some(dead)),
        };
        // On Citus, one routed call instead (a step that writes `app:` state, a reference
        // table's row, keeps the statement form: see `router.sql`).
        if self.routed() && split.app.is_empty() {
            sql = match fence {
                Fence::RunEnd(..) => super::router::APPEND_END_CALL,
                _ => super::router::APPEND_CALL,
            };
        }
        let q = sqlx::query(sql)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id);
        bind_event(q, event, split)
            .bind(run.map(|(r, _)| r))
            .bind(sealing)
            .bind(run.map(|(_, epoch)| epoch))
            .bind(usage.map(|m| Json(m.usage)))
    }

    /// Why a fenced append wrote nothing: the session is gone, or someone else owns it.
    pub(super) async fn append_refused(&self, key: &SessionKey, fence: Fence<'_>) -> StoreError {
        let owner = sqlx::query(
            "SELECT active_run, run_cancel_requested, run_resumes, run_released_at IS NOT NULL
               FROM sessions WHERE app_name = $1 AND user_id = $2 AND id = $3",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_optional(&self.pool)
        .await;
        let row = match owner {
            Ok(Some(row)) => row,
            Ok(None) => return StoreError::SessionNotFound,
            Err(e) => return e.into(),
        };
        // The run's last event was refused because a cancel of it came first.
        let active: Option<String> = row.try_get(0).unwrap_or_default();
        let flagged: Option<bool> = row.try_get(1).unwrap_or_default();
        let epoch: Option<i32> = row.try_get(2).unwrap_or_default();
        let released: Option<bool> = row.try_get(3).unwrap_or_default();
        match fence {
            Fence::RunEnd(run, at)
                if active.as_deref() == Some(run)
                    && epoch == Some(at)
                    && released == Some(false)
                    && flagged == Some(true) =>
            {
                StoreError::CancelRequested
            }
            _ => StoreError::NotOwner,
        }
    }

    /// After an append failed in a way that leaves its outcome unknown (the connection dropped
    /// with the statement sent), asks the database by event id. A pooled connection may be as
    /// dead as the one that failed, so this tries a few, briefly spaced, before giving up.
    pub(crate) async fn resolve_by_id(
        &self,
        key: &SessionKey,
        event_id: &str,
    ) -> StoreResult<Option<StoredEvent>> {
        let mut last = None;
        for delay_ms in [0u64, 50, 200, 500, 1000] {
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
            match self.find_event(key, event_id).await {
                Ok(found) => return Ok(found),
                Err(e) if e.is_unavailable() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(StoreError::Conflict))
    }
}

fn head_from_row(key: &SessionKey, row: &sqlx::postgres::PgRow) -> StoreResult<SessionHead> {
    let Json(session): Json<JsonMap> = row.try_get("state")?;
    let Json(app): Json<JsonMap> = row.try_get("app_state")?;
    let Json(user): Json<JsonMap> = row.try_get("user_state")?;
    Ok(SessionHead {
        key: key.clone(),
        state: SplitState::merge(session, app, user),
        last_update_time: row.try_get("update_time")?,
        last_seq: row.try_get("last_seq")?,
    })
}

#[async_trait]
impl SessionStore for PgStore {
    async fn create_session(&self, mut new: NewSession) -> StoreResult<Session> {
        let id = new
            .session_id
            .take()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let key = SessionKey::new(&new.app_name, &new.user_id, &id);
        prepare_initial_events(&mut new.events, &self.limits)?;
        let now = now_ts();
        let update_time = initial_update_time(&new.events, now);
        let split = SplitState::split(&new.state);

        if new.events.is_empty() && split.app.is_empty() && split.user.is_empty() {
            let sql = match self.routed() {
                true => super::router::CREATE_CALL,
                false => CREATE_SQL,
            };
            let row = sqlx::query(sql)
                .bind(&key.app_name)
                .bind(&key.user_id)
                .bind(&key.session_id)
                .bind(Json(&split.session))
                .bind(now)
                .bind(update_time)
                .fetch_optional(&self.pool)
                .await?
                .ok_or(StoreError::SessionExists(id))?;
            return Ok(head_from_row(&key, &row)?.into_session(vec![]));
        }
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO sessions (app_name, user_id, id, state, initial_state, create_time,
                                   update_time, last_seq)
             VALUES ($1, $2, $3, $4, NULLIF($4::jsonb, '{}'::jsonb), $5, $6, $7)
             ON CONFLICT DO NOTHING",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .bind(Json(&split.session))
        .bind(now)
        .bind(update_time)
        .bind(new.events.len() as i64)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::SessionExists(id));
        }
        Self::merge_shared_state(&mut tx, &key.app_name, &key.user_id, &split, now).await?;
        Self::insert_initial_events(&mut tx, &key, &new.events).await?;
        let head = sqlx::query(HEAD_SQL)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .fetch_one(&mut *tx)
            .await?;
        let head = head_from_row(&key, &head)?;
        tx.commit().await?;
        Ok(head.into_session(new.events))
    }

    async fn get_session(
        &self,
        key: &SessionKey,
        recent: Option<u32>,
    ) -> StoreResult<Option<Session>> {
        let Some(head) = self.session_head(key).await? else {
            return Ok(None);
        };
        // Bounded by the head's version, so a concurrent append cannot show up half-read.
        let rows = match recent {
            // The newest `n`, within a page's memory (page::PAGE_BYTES).
            Some(n) => {
                let rows = sqlx::query(
                    "SELECT seq, \"timestamp\", event FROM events
                      WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND seq <= $4
                      ORDER BY seq DESC LIMIT $5",
                )
                .bind(&key.app_name)
                .bind(&key.user_id)
                .bind(&key.session_id)
                .bind(head.last_seq)
                .bind(n as i64)
                .fetch(&self.pool);
                let (mut events, _) = page::take(rows, n as usize, sized_event).await?;
                events.reverse();
                let events = events.into_iter().map(|s| s.event).collect();
                return Ok(Some(head.into_session(events)));
            }
            None => {
                sqlx::query(
                    "SELECT seq, \"timestamp\", event FROM events
                      WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND seq <= $4
                      ORDER BY seq",
                )
                .bind(&key.app_name)
                .bind(&key.user_id)
                .bind(&key.session_id)
                .bind(head.last_seq)
                .fetch_all(&self.pool)
                .await?
            }
        };
        let events = rows
            .iter()
            .map(|r| stored_event(r).map(|s| s.event))
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(Some(head.into_session(events)))
    }

    async fn session_head(&self, key: &SessionKey) -> StoreResult<Option<SessionHead>> {
        let row = sqlx::query(HEAD_SQL)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| head_from_row(key, &r)).transpose()
    }

    async fn list_sessions(
        &self,
        app_name: &str,
        user_id: &str,
        after: Option<&SessionCursor>,
        limit: u32,
    ) -> StoreResult<SessionPage> {
        let limit = limit.max(1) as i64;
        let rows = sqlx::query(LIST_SESSIONS_SQL)
            .bind(app_name)
            .bind(user_id)
            .bind(after.map(|c| c.update_time))
            .bind(after.map(|c| c.id.as_str()).unwrap_or(""))
            .bind(limit + 1)
            .fetch_all(&self.pool)
            .await?;
        let mut sessions = Vec::with_capacity(rows.len());
        for r in rows.iter().take(limit as usize) {
            let Json(state): Json<JsonMap> = r.try_get("state")?;
            let Json(app): Json<JsonMap> = r.try_get("app_state")?;
            let Json(user): Json<JsonMap> = r.try_get("user_state")?;
            sessions.push(Session {
                id: r.try_get("id")?,
                app_name: app_name.to_string(),
                user_id: user_id.to_string(),
                state: SplitState::merge(state, app, user),
                events: vec![],
                last_update_time: r.try_get("update_time")?,
            });
        }
        let next = (rows.len() as i64 > limit)
            .then(|| sessions.last())
            .flatten()
            .map(|s| SessionCursor {
                update_time: s.last_update_time,
                id: s.id.clone(),
            });
        Ok(SessionPage { sessions, next })
    }

    async fn delete_session(&self, key: &SessionKey) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await?;
        // A run still going spent what it spent: its usage goes to the aggregates with the
        // session (its later commits and outcome find no session and write nothing).
        let deleted: i64 = sqlx::query_scalar(&format!(
            "WITH gone AS (
                 DELETE FROM sessions WHERE app_name = $1 AND user_id = $2 AND id = $3
                 RETURNING app_name, user_id,
                           CASE WHEN run_key_run = active_run THEN run_key END AS key_id,
                           CASE WHEN active_run IS NOT NULL THEN run_usage END AS usage
             ){spent}
             SELECT count(*) FROM gone",
            spent = super::usage::spent_cte("gone", true)
        ))
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_one(&mut *tx)
        .await?;
        // Its runs (with their webhook deliveries) and queue tickets go too: a session
        // re-created under the same id must not inherit a dead run to seal or a waiter's place.
        sqlx::query(super::outbox::DELETE_SESSION_DELIVERIES)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .execute(&mut *tx)
            .await?;
        for table in ["events", "artifacts", "runs", "run_queue"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE app_name = $1 AND user_id = $2 AND session_id = $3"
            ))
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(deleted > 0)
    }

    async fn append_metered(
        &self,
        key: &SessionKey,
        mut event: Event,
        mut artifacts: Vec<ArtifactWrite>,
        fence: Fence<'_>,
        usage: Option<Metered<'_>>,
    ) -> StoreResult<StoredEvent> {
        prepare_event(&mut event, &self.limits)?;
        // One global insert order, so two appends staging the same files cannot deadlock.
        artifacts.sort_by(|a, b| a.filename.cmp(&b.filename));
        for a in &artifacts {
            validate_artifact(&a.filename, &a.part, self.limits.max_artifact_bytes)?;
        }
        let split = SplitState::split(&event.actions.state_delta);
        // A staged artifact's next version can be taken by a concurrent writer (`user:` files
        // are shared by all of a user's sessions): the append rolls back and is retried whole.
        let mut attempt = 0;
        let mut resolved_once = false;
        let mut transient = 0;
        let (seq, versions) = loop {
            match self
                .append_once(key, &event, &split, &artifacts, fence, usage)
                .await
            {
                Err(StoreError::Conflict) if attempt < CONFLICT_RETRIES => attempt += 1,
                // Refused and rolled back for a reason a retry clears (see `is_transient`):
                // after a short pause, the same append again (the event id still makes a
                // second commit impossible).
                Err(e) if e.is_transient() && transient < TRANSIENT_RETRIES => {
                    transient += 1;
                    tracing::warn!(event = %event.id, error = %e, attempt = transient, "append refused for a transient reason; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(50 << transient)).await;
                    if let Some(stored) = self.resolve_by_id(key, &event.id).await? {
                        return Ok(stored);
                    }
                }
                // Stored already (a retry of a commit whose acknowledgement was lost).
                Err(StoreError::DuplicateEvent(_)) => {
                    return match self.find_event(key, &event.id).await? {
                        Some(stored) if stored.event.invocation_id == event.invocation_id => {
                            Ok(stored)
                        }
                        _ => Err(StoreError::DuplicateEvent(event.id.clone())),
                    };
                }
                // The connection broke: the statement may or may not have committed. Ask by
                // id; if it is not there it did not commit (the unique index on the id makes a
                // late commit of the first attempt and the retry exclusive), so try once more.
                Err(e) if e.is_unavailable() && !resolved_once => {
                    resolved_once = true;
                    tracing::warn!(event = %event.id, error = %e, "append outcome unknown; resolving by event id");
                    if let Some(stored) = self.resolve_by_id(key, &event.id).await? {
                        return Ok(stored);
                    }
                }
                result => break result?,
            }
        };
        let Some(seq) = seq else {
            return Err(match fence {
                Fence::Unfenced => StoreError::SessionNotFound,
                _ => self.append_refused(key, fence).await,
            });
        };
        event.actions.artifact_delta.extend(versions);
        Ok(StoredEvent { seq, event })
    }

    async fn append_all_fenced(
        &self,
        key: &SessionKey,
        mut events: Vec<(Event, Vec<ArtifactWrite>)>,
        fence: Fence<'_>,
    ) -> StoreResult<Vec<StoredEvent>> {
        for (event, artifacts) in events.iter_mut() {
            prepare_event(event, &self.limits)?;
            artifacts.sort_by(|a, b| a.filename.cmp(&b.filename));
            for a in artifacts.iter() {
                validate_artifact(&a.filename, &a.part, self.limits.max_artifact_bytes)?;
            }
        }
        let mut attempt = 0;
        let mut resolved_once = false;
        loop {
            match self.append_all_once(key, &events, fence).await {
                // A unique violation: a concurrent artifact version, or an earlier attempt of
                // this very commit that landed late (then the events are there: done).
                Err(StoreError::Conflict) if attempt < CONFLICT_RETRIES => {
                    attempt += 1;
                    if let Some(stored) = self.find_all(key, &events).await? {
                        return Ok(stored);
                    }
                }
                // One transaction: the last event committed iff all did.
                Err(e) if e.is_unavailable() && !resolved_once => {
                    resolved_once = true;
                    let Some((last, _)) = events.last() else {
                        return Ok(vec![]);
                    };
                    if self.resolve_by_id(key, &last.id).await?.is_some() {
                        if let Some(stored) = self.find_all(key, &events).await? {
                            return Ok(stored);
                        }
                    }
                }
                Ok(Some(stored)) => return Ok(stored),
                Ok(None) => {
                    return Err(match fence {
                        Fence::Unfenced => StoreError::SessionNotFound,
                        _ => self.append_refused(key, fence).await,
                    })
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn find_event(
        &self,
        key: &SessionKey,
        event_id: &str,
    ) -> StoreResult<Option<StoredEvent>> {
        let row = sqlx::query(EVENT_BY_ID_SQL)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(event_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(stored_event).transpose()
    }

    async fn invocation_events(
        &self,
        key: &SessionKey,
        invocation_id: &str,
        after: i64,
        limit: u32,
    ) -> StoreResult<EventPage> {
        let limit = limit.max(1) as i64;
        let rows = sqlx::query(
            "SELECT seq, \"timestamp\", event FROM events
              WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND seq > $4
                AND invocation_id = $5
              ORDER BY seq LIMIT $6",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .bind(after)
        .bind(invocation_id)
        .bind(limit + 1)
        .fetch(&self.pool);
        let (events, has_more) = page::take(rows, limit as usize, sized_event).await?;
        Ok(EventPage { events, has_more })
    }

    async fn list_events(
        &self,
        key: &SessionKey,
        range: EventRange,
    ) -> StoreResult<Option<EventPage>> {
        let limit = range.limit.max(1) as i64;
        let rows = if let Some(before) = range.before {
            sqlx::query(
                "SELECT seq, \"timestamp\", event FROM events
                  WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND seq < $4 AND seq > $5
                  ORDER BY seq DESC LIMIT $6",
            )
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(before)
            .bind(range.after.unwrap_or(0))
            .bind(limit + 1)
            .fetch(&self.pool)
        } else {
            sqlx::query(EVENTS_AFTER_SQL)
                .bind(&key.app_name)
                .bind(&key.user_id)
                .bind(&key.session_id)
                .bind(range.after.unwrap_or(0))
                .bind(limit + 1)
                .fetch(&self.pool)
        };
        let (mut events, has_more) = page::take(rows, limit as usize, sized_event).await?;
        if events.is_empty() && self.session_head(key).await?.is_none() {
            return Ok(None);
        }
        if range.before.is_some() {
            events.reverse();
        }
        Ok(Some(EventPage { events, has_more }))
    }
}
