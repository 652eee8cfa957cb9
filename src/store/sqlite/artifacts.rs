//! Artifacts on SQLite: versioned rows, session- or user-scoped.

use super::*;

impl SqliteStore {
    pub(super) async fn insert_artifact(
        conn: &mut SqliteConnection,
        scope: &ArtifactScope,
        write: &ArtifactWrite,
        now: f64,
    ) -> StoreResult<i64> {
        let (part_json, data) = split_part(&write.part)?;
        let version: i64 = sqlx::query_scalar(
            "INSERT INTO artifacts (app_name, user_id, session_id, filename, version, mime_type, part, data, custom_metadata, create_time)
             SELECT ?1, ?2, ?3, ?4,
                    COALESCE((SELECT MAX(version) + 1 FROM artifacts
                               WHERE app_name = ?1 AND user_id = ?2 AND session_id = ?3 AND filename = ?4), 0),
                    ?5, ?6, ?7, ?8, ?9
             RETURNING version",
        )
        .bind(&scope.app_name)
        .bind(&scope.user_id)
        .bind(scope.storage_session(&write.filename))
        .bind(&write.filename)
        .bind(artifact_mime_type(&write.part))
        .bind(part_json)
        .bind(data)
        .bind(serde_json::to_string(&write.custom_metadata)?)
        .bind(now)
        .fetch_one(conn)
        .await?;
        Ok(version)
    }
}

fn version_from_row(
    scope: &ArtifactScope,
    filename: &str,
    r: &sqlx::sqlite::SqliteRow,
) -> StoreResult<ArtifactVersion> {
    let version: i64 = r.get("version");
    Ok(ArtifactVersion {
        version,
        canonical_uri: scope.canonical_uri(filename, version),
        custom_metadata: parse_map(Some(r.get("custom_metadata")))?,
        create_time: r.get("create_time"),
        mime_type: r.get("mime_type"),
    })
}

#[async_trait]
impl ArtifactStore for SqliteStore {
    async fn save_artifact(
        &self,
        scope: &ArtifactScope,
        write: ArtifactWrite,
    ) -> StoreResult<ArtifactVersion> {
        validate_artifact(&write.filename, &write.part, self.limits.max_artifact_bytes)?;
        let now = now_ts();
        let mut tx = self.begin().await?;
        // The session must exist (one writer: nothing deletes it meanwhile).
        let session =
            sqlx::query("SELECT 1 FROM sessions WHERE app_name = ? AND user_id = ? AND id = ?")
                .bind(&scope.app_name)
                .bind(&scope.user_id)
                .bind(&scope.session_id)
                .fetch_optional(&mut *tx)
                .await?;
        if session.is_none() {
            return Err(StoreError::SessionNotFound);
        }
        let version = Self::insert_artifact(&mut tx, scope, &write, now).await?;
        tx.commit().await?;
        Ok(ArtifactVersion {
            version,
            canonical_uri: scope.canonical_uri(&write.filename, version),
            custom_metadata: write.custom_metadata,
            create_time: now,
            mime_type: artifact_mime_type(&write.part),
        })
    }

    async fn load_artifact(
        &self,
        scope: &ArtifactScope,
        filename: &str,
        version: Option<i64>,
    ) -> StoreResult<Option<Part>> {
        let row = sqlx::query(
            "SELECT part, data FROM artifacts
              WHERE app_name = ? AND user_id = ? AND session_id = ? AND filename = ?
                AND (?5 IS NULL OR version = ?5)
              ORDER BY version DESC LIMIT 1",
        )
        .bind(&scope.app_name)
        .bind(&scope.user_id)
        .bind(scope.storage_session(filename))
        .bind(filename)
        .bind(version)
        .fetch_optional(&self.reader)
        .await?;
        row.map(|r| join_part(r.get::<&str, _>("part"), r.get("data")))
            .transpose()
    }

    async fn list_artifact_keys(&self, scope: &ArtifactScope) -> StoreResult<Vec<String>> {
        let rows = sqlx::query(
            "SELECT DISTINCT filename FROM artifacts
              WHERE app_name = ? AND user_id = ? AND (session_id = ? OR session_id = '')
              ORDER BY filename",
        )
        .bind(&scope.app_name)
        .bind(&scope.user_id)
        .bind(&scope.session_id)
        .fetch_all(&self.reader)
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
              WHERE app_name = ? AND user_id = ? AND session_id = ? AND filename = ?
              ORDER BY version",
        )
        .bind(&scope.app_name)
        .bind(&scope.user_id)
        .bind(scope.storage_session(filename))
        .bind(filename)
        .fetch_all(&self.reader)
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
              WHERE app_name = ? AND user_id = ? AND session_id = ? AND filename = ?
                AND (?5 IS NULL OR version = ?5)
              ORDER BY version DESC LIMIT 1",
        )
        .bind(&scope.app_name)
        .bind(&scope.user_id)
        .bind(scope.storage_session(filename))
        .bind(filename)
        .bind(version)
        .fetch_optional(&self.reader)
        .await?;
        row.map(|r| version_from_row(scope, filename, &r))
            .transpose()
    }

    async fn delete_artifact(&self, scope: &ArtifactScope, filename: &str) -> StoreResult<()> {
        let mut tx = self.begin().await?;
        sqlx::query("DELETE FROM artifacts WHERE app_name = ? AND user_id = ? AND session_id = ? AND filename = ?")
            .bind(&scope.app_name)
            .bind(&scope.user_id)
            .bind(scope.storage_session(filename))
            .bind(filename)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}
