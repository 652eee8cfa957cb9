//! Artifacts: versioned files per session (or per user, `user:` names), the types and the
//! [`ArtifactStore`] trait.

use super::{SessionKey, StoreError, StoreResult};
use crate::event::{JsonMap, Part};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// An artifact to store together with the event that announces it in `artifactDelta`.
#[derive(Debug, Clone)]
pub struct ArtifactWrite {
    pub filename: String,
    pub part: Part,
    pub custom_metadata: JsonMap,
}

/// Metadata of one stored artifact version (ADK `ArtifactVersion`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactVersion {
    pub version: i64,
    pub canonical_uri: String,
    #[schema(value_type = Object)]
    pub custom_metadata: JsonMap,
    pub create_time: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
}

/// Addresses the artifacts visible to one session: its own, plus the user's `user:` ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactScope {
    pub app_name: String,
    pub user_id: String,
    pub session_id: String,
}

impl From<&SessionKey> for ArtifactScope {
    fn from(k: &SessionKey) -> Self {
        ArtifactScope {
            app_name: k.app_name.clone(),
            user_id: k.user_id.clone(),
            session_id: k.session_id.clone(),
        }
    }
}

impl ArtifactScope {
    pub fn new(app: &str, user: &str, session: &str) -> Self {
        ArtifactScope {
            app_name: app.into(),
            user_id: user.into(),
            session_id: session.into(),
        }
    }

    /// The `session_id` column value for `filename`: `''` for user-scoped names.
    pub fn storage_session<'a>(&'a self, filename: &str) -> &'a str {
        if is_user_scoped(filename) {
            ""
        } else {
            &self.session_id
        }
    }

    pub fn canonical_uri(&self, filename: &str, version: i64) -> String {
        if is_user_scoped(filename) {
            format!(
                "agentd://apps/{}/users/{}/artifacts/{}/versions/{}",
                self.app_name, self.user_id, filename, version
            )
        } else {
            format!(
                "agentd://apps/{}/users/{}/sessions/{}/artifacts/{}/versions/{}",
                self.app_name, self.user_id, self.session_id, filename, version
            )
        }
    }
}

/// `user:` filenames belong to the user and are listed in every one of their sessions.
pub fn is_user_scoped(filename: &str) -> bool {
    filename.starts_with("user:")
}

/// Checks a filename and part before anything is written.
pub fn validate_artifact(filename: &str, part: &Part, max_bytes: usize) -> StoreResult<()> {
    if filename.is_empty() || filename.len() > 1024 {
        return Err(StoreError::InvalidArtifact(
            "filename must be 1 to 1024 bytes".into(),
        ));
    }
    if filename.contains('\0') {
        return Err(StoreError::InvalidArtifact(
            "filename must not contain NUL".into(),
        ));
    }
    if part.inline_data.is_none() && part.text.is_none() && part.extra.get("fileData").is_none() {
        return Err(StoreError::InvalidArtifact(
            "artifact must have inlineData, text or fileData".into(),
        ));
    }
    let size = artifact_size(part);
    if size > max_bytes {
        return Err(StoreError::ArtifactTooLarge {
            size,
            limit: max_bytes,
        });
    }
    Ok(())
}

fn artifact_size(part: &Part) -> usize {
    part.inline_data.as_ref().map_or(0, |b| b.data.0.len())
        + part.text.as_ref().map_or(0, |t| t.len())
}

/// The MIME type ADK reports for a part: the blob's, or `text/plain` for text.
pub fn artifact_mime_type(part: &Part) -> Option<String> {
    match (&part.inline_data, &part.text) {
        (Some(b), _) => b.mime_type.clone(),
        (None, Some(_)) => Some("text/plain".to_string()),
        _ => part
            .extra
            .get("fileData")
            .and_then(|f| f.get("mimeType"))
            .and_then(|m| m.as_str())
            .map(str::to_string),
    }
}

/// Splits a part into its JSON without inline bytes, and the bytes.
pub(crate) fn split_part(part: &Part) -> StoreResult<(String, Option<Vec<u8>>)> {
    let mut p = part.clone();
    let data = p
        .inline_data
        .as_mut()
        .map(|b| std::mem::take(&mut b.data.0));
    Ok((serde_json::to_string(&p)?, data))
}

/// Rebuilds a part stored by [`split_part`].
pub(crate) fn join_part(json: &str, data: Option<Vec<u8>>) -> StoreResult<Part> {
    let mut p: Part = serde_json::from_str(json)?;
    if let (Some(b), Some(d)) = (p.inline_data.as_mut(), data) {
        b.data.0 = d;
    }
    Ok(p)
}

/// Versioned artifacts, stored in the database.
#[async_trait]
pub trait ArtifactStore: Send + Sync + 'static {
    /// Saves a new version (0, 1, 2, ...) and returns its metadata. `SessionNotFound` (nothing
    /// stored) when the session does not exist: a `user:` artifact too is saved through one
    /// of the user's sessions. (ADK saves to a session that does not exist.)
    async fn save_artifact(
        &self,
        scope: &ArtifactScope,
        write: ArtifactWrite,
    ) -> StoreResult<ArtifactVersion>;

    /// The part at `version`, or the newest one.
    async fn load_artifact(
        &self,
        scope: &ArtifactScope,
        filename: &str,
        version: Option<i64>,
    ) -> StoreResult<Option<Part>>;

    /// Sorted filenames visible to the session (its own plus the user's `user:` ones).
    async fn list_artifact_keys(&self, scope: &ArtifactScope) -> StoreResult<Vec<String>>;

    /// Every version's metadata, oldest first (`[]` when there is none).
    async fn list_artifact_versions(
        &self,
        scope: &ArtifactScope,
        filename: &str,
    ) -> StoreResult<Vec<ArtifactVersion>>;

    /// One version's metadata (`None` version: the newest).
    async fn artifact_version(
        &self,
        scope: &ArtifactScope,
        filename: &str,
        version: Option<i64>,
    ) -> StoreResult<Option<ArtifactVersion>>;

    /// Deletes every version. Deleting nothing is not an error.
    async fn delete_artifact(&self, scope: &ArtifactScope, filename: &str) -> StoreResult<()>;
}
