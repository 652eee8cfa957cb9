//! Sessions and events on SQLite: create, read, list, delete, and the append path (one
//! `BEGIN IMMEDIATE` transaction per complete event).

use super::*;
use futures::TryStreamExt;

/// One event by id (an append's idempotency check, resolving a lost acknowledgement).
const EVENT_BY_ID: &str = "SELECT seq, timestamp, event FROM events
                            WHERE app_name = ? AND user_id = ? AND session_id = ? AND id = ?";

impl SqliteStore {
    /// The body of an append inside the writer's transaction `tx` (see
    /// [`SessionStore::append_fenced`]); the caller commits, and has validated the artifacts.
    pub(crate) async fn append_in(
        tx: &mut Transaction<'static, Sqlite>,
        key: &SessionKey,
        mut event: Event,
        artifacts: &[ArtifactWrite],
        fence: Fence<'_>,
        limits: &StoreLimits,
    ) -> StoreResult<StoredEvent> {
        prepare_event(&mut event, limits)?;
        let split = SplitState::split(&event.actions.state_delta);
        let row = sqlx::query(
            "SELECT state, last_seq, active_run FROM sessions WHERE app_name = ? AND user_id = ? AND id = ?",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(row) = row else {
            return Err(StoreError::SessionNotFound);
        };
        let owner: Option<String> = row.get("active_run");
        let owned = match fence {
            Fence::Unfenced => true,
            Fence::Run(run, epoch) | Fence::RunEnd(run, epoch) => {
                owner.as_deref() == Some(run)
                    && sqlx::query_scalar::<_, bool>(
                        "SELECT EXISTS (SELECT 1 FROM runs WHERE id = ? AND resumes = ?
                                           AND released_at IS NULL)",
                    )
                    .bind(run)
                    .bind(epoch)
                    .fetch_one(&mut **tx)
                    .await?
            }
            Fence::Sealing(dead) => {
                owner.is_none()
                    && sqlx::query_scalar::<_, bool>(
                        "SELECT EXISTS (SELECT 1 FROM runs WHERE id = ? AND NOT sealed)",
                    )
                    .bind(dead)
                    .fetch_one(&mut **tx)
                    .await?
            }
        };
        if !owned {
            return Err(StoreError::NotOwner);
        }
        // Idempotent on the id, as on PostgreSQL.
        let existing = sqlx::query(EVENT_BY_ID)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(&event.id)
            .fetch_optional(&mut **tx)
            .await?;
        if let Some(r) = existing {
            let stored = stored_event(&r)?;
            if stored.event.invocation_id == event.invocation_id {
                return Ok(stored);
            }
            return Err(StoreError::DuplicateEvent(event.id));
        }
        let seq = row.get::<i64, _>("last_seq") + 1;
        let mut state = parse_map(Some(row.get("state")))?;
        apply_delta(&mut state, &split.session);

        let scope = ArtifactScope::from(key);
        for w in artifacts {
            let v = Self::insert_artifact(tx, &scope, w, event.timestamp).await?;
            event.actions.artifact_delta.insert(w.filename.clone(), v);
        }
        Self::merge_shared(tx, &key.app_name, &key.user_id, &split, event.timestamp).await?;
        sqlx::query(
            "UPDATE sessions SET state = ?, update_time = ?, last_seq = ? WHERE app_name = ? AND user_id = ? AND id = ?",
        )
        .bind(serde_json::to_string(&state)?)
        .bind(event.timestamp)
        .bind(seq)
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .execute(&mut **tx)
        .await?;
        Self::insert_event(tx, key, seq, &event).await?;
        // The run's last write: `completed` with this seq, the session freed (the fence above
        // checked that the run owns it; a run no longer running owns nothing, and the
        // caller's transaction rolls back).
        if let Fence::RunEnd(run, epoch) = fence {
            if !Self::finish_in(tx, run, epoch, RunStatus::Completed, Some(seq), None).await? {
                return Err(StoreError::NotOwner);
            }
        }
        Ok(StoredEvent { seq, event })
    }

    pub(super) async fn merge_shared(
        conn: &mut SqliteConnection,
        app: &str,
        user: &str,
        split: &SplitState,
        now: f64,
    ) -> StoreResult<()> {
        if !split.app.is_empty() {
            let cur: Option<String> =
                sqlx::query_scalar("SELECT state FROM app_states WHERE app_name = ?")
                    .bind(app)
                    .fetch_optional(&mut *conn)
                    .await?;
            let mut state = parse_map(cur.as_deref())?;
            apply_delta(&mut state, &split.app);
            sqlx::query(
                "INSERT INTO app_states (app_name, state, update_time) VALUES (?, ?, ?)
                 ON CONFLICT (app_name) DO UPDATE SET state = excluded.state, update_time = excluded.update_time",
            )
            .bind(app)
            .bind(serde_json::to_string(&state)?)
            .bind(now)
            .execute(&mut *conn)
            .await?;
        }
        if !split.user.is_empty() {
            let cur: Option<String> = sqlx::query_scalar(
                "SELECT state FROM user_states WHERE app_name = ? AND user_id = ?",
            )
            .bind(app)
            .bind(user)
            .fetch_optional(&mut *conn)
            .await?;
            let mut state = parse_map(cur.as_deref())?;
            apply_delta(&mut state, &split.user);
            sqlx::query(
                "INSERT INTO user_states (app_name, user_id, state, update_time) VALUES (?, ?, ?, ?)
                 ON CONFLICT (app_name, user_id) DO UPDATE SET state = excluded.state, update_time = excluded.update_time",
            )
            .bind(app)
            .bind(user)
            .bind(serde_json::to_string(&state)?)
            .bind(now)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }

    pub(super) async fn insert_event(
        conn: &mut SqliteConnection,
        key: &SessionKey,
        seq: i64,
        e: &Event,
    ) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO events (app_name, user_id, session_id, seq, id, invocation_id, author, timestamp, event)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .bind(seq)
        .bind(&e.id)
        .bind(&e.invocation_id)
        .bind(&e.author)
        .bind(e.timestamp)
        .bind(serde_json::to_string(e)?)
        .execute(conn)
        .await?;
        Ok(())
    }

    pub(crate) async fn head_with(
        conn: &mut SqliteConnection,
        key: &SessionKey,
    ) -> StoreResult<Option<SessionHead>> {
        let row = sqlx::query(
            "SELECT s.state, s.update_time, s.last_seq,
                    COALESCE(a.state, '{}') AS app_state, COALESCE(u.state, '{}') AS user_state
               FROM sessions s
               LEFT JOIN app_states a ON a.app_name = s.app_name
               LEFT JOIN user_states u ON u.app_name = s.app_name AND u.user_id = s.user_id
              WHERE s.app_name = ? AND s.user_id = ? AND s.id = ?",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_optional(conn)
        .await?;
        let Some(r) = row else { return Ok(None) };
        Ok(Some(SessionHead {
            key: key.clone(),
            state: SplitState::merge(
                parse_map(Some(r.get("state")))?,
                parse_map(Some(r.get("app_state")))?,
                parse_map(Some(r.get("user_state")))?,
            ),
            last_update_time: r.get("update_time"),
            last_seq: r.get("last_seq"),
        }))
    }
}

#[async_trait]
impl SessionStore for SqliteStore {
    async fn create_session(&self, mut new: NewSession) -> StoreResult<Session> {
        let id = new
            .session_id
            .take()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let key = SessionKey::new(&new.app_name, &new.user_id, &id);
        prepare_initial_events(&mut new.events, &self.limits)?;
        let now = now_ts();
        let split = SplitState::split(&new.state);

        let mut tx = self.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO sessions (app_name, user_id, id, state, initial_state, create_time,
                                   update_time, last_seq)
             VALUES (?1, ?2, ?3, ?4, NULLIF(?4, '{}'), ?5, ?6, ?7) ON CONFLICT DO NOTHING",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .bind(serde_json::to_string(&split.session)?)
        .bind(now)
        .bind(initial_update_time(&new.events, now))
        .bind(new.events.len() as i64)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::SessionExists(id));
        }
        Self::merge_shared(&mut tx, &key.app_name, &key.user_id, &split, now).await?;
        for (i, e) in new.events.iter().enumerate() {
            Self::insert_event(&mut tx, &key, i as i64 + 1, e).await?;
        }
        let head = Self::head_with(&mut tx, &key)
            .await?
            .ok_or(StoreError::SessionNotFound)?;
        tx.commit().await?;
        Ok(head.into_session(new.events))
    }

    async fn get_session(
        &self,
        key: &SessionKey,
        recent: Option<u32>,
    ) -> StoreResult<Option<Session>> {
        // One read transaction: the head and the events come from the same snapshot.
        let mut tx = self.reader.begin().await?;
        let Some(head) = Self::head_with(&mut tx, key).await? else {
            return Ok(None);
        };
        // The newest `n` within a page's memory (page::PAGE_BYTES); without `n`, all of them.
        let rows = sqlx::query(
            "SELECT seq, timestamp, event FROM events WHERE app_name = ? AND user_id = ? AND session_id = ?
              ORDER BY seq DESC LIMIT ?",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .bind(recent.map_or(-1, |n| n as i64))
        .fetch(&mut *tx);
        let mut events = match recent {
            Some(n) => page::take(rows, n as usize, sized_event).await?.0,
            None => {
                rows.map_err(StoreError::from)
                    .and_then(|r| std::future::ready(stored_event(&r)))
                    .try_collect()
                    .await?
            }
        };
        tx.commit().await?;
        events.reverse();
        let events = events.into_iter().map(|s| s.event).collect();
        Ok(Some(head.into_session(events)))
    }

    async fn session_head(&self, key: &SessionKey) -> StoreResult<Option<SessionHead>> {
        let mut conn = self.reader.acquire().await?;
        Self::head_with(&mut conn, key).await
    }

    async fn list_sessions(
        &self,
        app_name: &str,
        user_id: &str,
        after: Option<&SessionCursor>,
        limit: u32,
    ) -> StoreResult<SessionPage> {
        let limit = limit.max(1) as i64;
        let rows = sqlx::query(
            r#"SELECT s.id, s.state, s.update_time,
                      COALESCE(a.state, '{}') AS app_state, COALESCE(u.state, '{}') AS user_state
                 FROM sessions s
                 LEFT JOIN app_states a ON a.app_name = s.app_name
                 LEFT JOIN user_states u ON u.app_name = s.app_name AND u.user_id = s.user_id
                WHERE s.app_name = ?1 AND s.user_id = ?2
                  AND (?3 IS NULL OR s.update_time > ?3 OR (s.update_time = ?3 AND s.id > ?4))
                  AND s.id NOT LIKE 'adk-eval-session-%'
                  AND s.id NOT LIKE '\_\_\_eval\_\_\_session\_\_\_%' ESCAPE '\'
                ORDER BY s.update_time, s.id
                LIMIT ?5"#,
        )
        .bind(app_name)
        .bind(user_id)
        .bind(after.map(|c| c.update_time))
        .bind(after.map(|c| c.id.as_str()).unwrap_or(""))
        .bind(limit + 1)
        .fetch_all(&self.reader)
        .await?;
        let mut sessions = Vec::with_capacity(rows.len());
        for r in rows.iter().take(limit as usize) {
            sessions.push(Session {
                id: r.get("id"),
                app_name: app_name.to_string(),
                user_id: user_id.to_string(),
                state: SplitState::merge(
                    parse_map(Some(r.get("state")))?,
                    parse_map(Some(r.get("app_state")))?,
                    parse_map(Some(r.get("user_state")))?,
                ),
                events: vec![],
                last_update_time: r.get("update_time"),
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
        let mut tx = self.begin().await?;
        let deleted =
            sqlx::query("DELETE FROM sessions WHERE app_name = ? AND user_id = ? AND id = ?")
                .bind(&key.app_name)
                .bind(&key.user_id)
                .bind(&key.session_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        // Its runs and queue tickets go too: a session re-created under the same id must not
        // inherit a dead run to seal or a waiter's place.
        for table in ["events", "artifacts", "runs", "run_queue"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE app_name = ? AND user_id = ? AND session_id = ?"
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
        event: Event,
        artifacts: Vec<ArtifactWrite>,
        fence: Fence<'_>,
        usage: Option<Metered<'_>>,
    ) -> StoreResult<StoredEvent> {
        for a in &artifacts {
            validate_artifact(&a.filename, &a.part, self.limits.max_artifact_bytes)?;
        }
        // Dropping `tx` on any early return rolls everything back.
        let mut tx = self.begin().await?;
        // Before the append: a run's last commit ends the run, and the trigger that adds its
        // usage to the aggregates reads the row (migration 0014). A fence that refuses rolls
        // this back with the rest.
        // (The run's row has its key: the trigger reads it too.)
        if let (Fence::Run(run, _) | Fence::RunEnd(run, _), Some(m)) = (fence, usage) {
            sqlx::query("UPDATE runs SET usage = ? WHERE id = ? AND status = 'running'")
                .bind(serde_json::to_string(m.usage)?)
                .bind(run)
                .execute(&mut *tx)
                .await?;
        }
        let stored = Self::append_in(&mut tx, key, event, &artifacts, fence, &self.limits).await?;
        tx.commit().await?;
        Ok(stored)
    }

    async fn append_all_fenced(
        &self,
        key: &SessionKey,
        events: Vec<(Event, Vec<ArtifactWrite>)>,
        fence: Fence<'_>,
    ) -> StoreResult<Vec<StoredEvent>> {
        for (_, artifacts) in &events {
            for a in artifacts {
                validate_artifact(&a.filename, &a.part, self.limits.max_artifact_bytes)?;
            }
        }
        let mut tx = self.begin().await?;
        let mut stored = Vec::with_capacity(events.len());
        for (event, artifacts) in events {
            stored
                .push(Self::append_in(&mut tx, key, event, &artifacts, fence, &self.limits).await?);
        }
        tx.commit().await?;
        Ok(stored)
    }

    async fn find_event(
        &self,
        key: &SessionKey,
        event_id: &str,
    ) -> StoreResult<Option<StoredEvent>> {
        let row = sqlx::query(EVENT_BY_ID)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(event_id)
            .fetch_optional(&self.reader)
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
            "SELECT seq, timestamp, event FROM events
              WHERE app_name = ? AND user_id = ? AND session_id = ? AND seq > ?
                AND invocation_id = ?
              ORDER BY seq LIMIT ?",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .bind(after)
        .bind(invocation_id)
        .bind(limit + 1)
        .fetch(&self.reader);
        let (events, has_more) = page::take(rows, limit as usize, sized_event).await?;
        Ok(EventPage { events, has_more })
    }

    async fn list_events(
        &self,
        key: &SessionKey,
        range: EventRange,
    ) -> StoreResult<Option<EventPage>> {
        let limit = range.limit.max(1) as i64;
        let mut tx = self.reader.begin().await?;
        let rows = if let Some(before) = range.before {
            sqlx::query(
                "SELECT seq, timestamp, event FROM events
                  WHERE app_name = ? AND user_id = ? AND session_id = ? AND seq < ? AND seq > ?
                  ORDER BY seq DESC LIMIT ?",
            )
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(before)
            .bind(range.after.unwrap_or(0))
            .bind(limit + 1)
            .fetch(&mut *tx)
        } else {
            sqlx::query(
                "SELECT seq, timestamp, event FROM events
                  WHERE app_name = ? AND user_id = ? AND session_id = ? AND seq > ?
                  ORDER BY seq LIMIT ?",
            )
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(range.after.unwrap_or(0))
            .bind(limit + 1)
            .fetch(&mut *tx)
        };
        let (mut events, has_more) = page::take(rows, limit as usize, sized_event).await?;
        if events.is_empty() && Self::head_with(&mut tx, key).await?.is_none() {
            return Ok(None);
        }
        tx.commit().await?;
        if range.before.is_some() {
            events.reverse();
        }
        Ok(Some(EventPage { events, has_more }))
    }
}
