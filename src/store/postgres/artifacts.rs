//! Artifacts on PostgreSQL: versioned rows, session- or user-scoped.

use super::*;

impl PgStore {
    /// Inserts the next version of an artifact inside `tx`, returning the version.
    pub(super) async fn insert_artifact(
        conn: &mut sqlx::PgConnection,
        scope: &ArtifactScope,
        write: &ArtifactWrite,
        now: f64,
    ) -> StoreResult<i64> {
        let (part_json, data) = split_part(&write.part)?;
        let row = sqlx::query(
            r#"INSERT INTO artifacts (app_name, user_id, session_id, filename, version, mime_type, part, data, custom_metadata, create_time)
               SELECT $1, $2, $3, $4,
                      COALESCE((SELECT MAX(version) + 1 FROM artifacts
                                 WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND filename = $4), 0),
                      $5, $6::jsonb, $7, $8, $9
               RETURNING version"#,
        )
        .bind(&scope.app_name)
        .bind(&scope.user_id)
        .bind(scope.storage_session(&write.filename))
        .bind(&write.filename)
        .bind(artifact_mime_type(&write.part))
        .bind(part_json)
        .bind(data)
        .bind(Json(&write.custom_metadata))
        .bind(now)
        .fetch_one(conn)
        .await
        .map_err(map_unique_to_conflict)?;
        Ok(row.get::<i32, _>(0) as i64)
    }
}

fn version_from_row(
    scope: &ArtifactScope,
    filename: &str,
    row: &sqlx::postgres::PgRow,
) -> StoreResult<ArtifactVersion> {
    let version = row.try_get::<i32, _>("version")? as i64;
    let Json(custom_metadata): Json<JsonMap> = row.try_get("custom_metadata")?;
    Ok(ArtifactVersion {
        version,
        canonical_uri: scope.canonical_uri(filename, version),
        custom_metadata,
        create_time: row.try_get("create_time")?,
        mime_type: row.try_get("mime_type")?,
    })
}

#[async_trait]
impl ArtifactStore for PgStore {
    async fn save_artifact(
        &self,
        scope: &ArtifactScope,
        write: ArtifactWrite,
    ) -> StoreResult<ArtifactVersion> {
        validate_artifact(&write.filename, &write.part, self.limits.max_artifact_bytes)?;
        let now = now_ts();
        // Two concurrent saves of one name can pick the same version; the loser retries.
        let mut attempt = 0;
        loop {
            // The session must exist, and stays while the version is written (a delete of the
            // session takes its row first, then its artifacts: it waits for this save, or this
            // save finds the session gone).
            let mut tx = self.pool.begin().await?;
            let session = sqlx::query(
                "SELECT 1 FROM sessions WHERE app_name = $1 AND user_id = $2 AND id = $3
                    FOR KEY SHARE",
            )
            .bind(&scope.app_name)
            .bind(&scope.user_id)
            .bind(&scope.session_id)
            .fetch_optional(&mut *tx)
            .await?;
            if session.is_none() {
                return Err(StoreError::SessionNotFound);
            }
            match Self::insert_artifact(&mut tx, scope, &write, now).await {
                Ok(version) => {
                    tx.commit().await?;
                    return Ok(ArtifactVersion {
                        version,
                        canonical_uri: scope.canonical_uri(&write.filename, version),
                        custom_metadata: write.custom_metadata,
                        create_time: now,
                        mime_type: artifact_mime_type(&write.part),
                    });
                }
                Err(StoreError::Conflict) if attempt < CONFLICT_RETRIES => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    async fn load_artifact(
        &self,
        scope: &ArtifactScope,
        filename: &str,
        version: Option<i64>,
    ) -> StoreResult<Option<Part>> {
        let row = sqlx::query(
            "SELECT part::text AS part, data FROM artifacts
              WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND filename = $4
                AND ($5::integer IS NULL OR version = $5)
              ORDER BY version DESC LIMIT 1",
        )
        .bind(&scope.app_name)
        .bind(&scope.user_id)
        .bind(scope.storage_session(filename))
        .bind(filename)
        .bind(version.map(|v| v.clamp(-1, i32::MAX as i64) as i32))
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| join_part(r.get::<&str, _>("part"), r.get("data")))
            .transpose()
    }

    async fn list_artifact_keys(&self, scope: &ArtifactScope) -> StoreResult<Vec<String>> {
        let rows = sqlx::query(
            "SELECT DISTINCT filename FROM artifacts
              WHERE app_name = $1 AND user_id = $2 AND (session_id = $3 OR session_id = '')
              ORDER BY filename",
        )
        .bind(&scope.app_name)
        .bind(&scope.user_id)
        .bind(&scope.session_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| r.get::<String, _>(0)).collect())
    }

    async fn list_artifact_versions(
        &self,
        scope: &ArtifactScope,
        filename: &str,
    ) -> StoreResult<Vec<ArtifactVersion>> {
        let rows = sqlx::query(
            "SELECT version, mime_type, custom_metadata, create_time FROM artifacts
              WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND filename = $4
              ORDER BY version",
        )
        .bind(&scope.app_name)
        .bind(&scope.user_id)
        .bind(scope.storage_session(filename))
        .bind(filename)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| version_from_row(scope, filename, r))
            .collect()
    }

    async fn artifact_version(
        &self,
        scope: &ArtifactScope,
        filename: &str,
        version: Option<i64>,
    ) -> StoreResult<Option<ArtifactVersion>> {
        let row = sqlx::query(
            "SELECT version, mime_type, custom_metadata, create_time FROM artifacts
              WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND filename = $4
                AND ($5::integer IS NULL OR version = $5)
              ORDER BY version DESC LIMIT 1",
        )
        .bind(&scope.app_name)
        .bind(&scope.user_id)
        .bind(scope.storage_session(filename))
        .bind(filename)
        .bind(version.map(|v| v.clamp(-1, i32::MAX as i64) as i32))
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| version_from_row(scope, filename, &r))
            .transpose()
    }

    async fn delete_artifact(&self, scope: &ArtifactScope, filename: &str) -> StoreResult<()> {
        sqlx::query(
            "DELETE FROM artifacts WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND filename = $4",
        )
        .bind(&scope.app_name)
        .bind(&scope.user_id)
        .bind(scope.storage_session(filename))
        .bind(filename)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
