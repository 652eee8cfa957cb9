//! Artifact routes (ADK): save, list, load (latest, by `?version=`, by path), versions,
//! metadata, delete. Names may contain `/`, so everything after `…/artifacts/` is one
//! wildcard that is matched here in ADK's route order (the `/versions…` forms first).

use crate::error_code::ErrorCode;
use crate::event::{JsonMap, Part};
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::{Json, Path, Query};
use crate::http::openapi::error_set;
use crate::http::openapi::{Errors, SessionPath};
use crate::http::AppState;
use crate::store::{ArtifactScope, ArtifactVersion, ArtifactWrite};
use axum::routing::get;
use serde::Deserialize;
use serde_json::Value;
use utoipa::{IntoParams, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `GET /apps/{app}/users/{user}/sessions/{session}/artifacts` answers beyond the door's codes.
    ListArtifactsErrors: AppNotFound, SessionNotFound, InvalidId
);

error_set!(
    /// What `POST /apps/{app}/users/{user}/sessions/{session}/artifacts` answers beyond the door's codes.
    SaveArtifactErrors: AppNotFound, SessionNotFound, InvalidId, ValidationError, InvalidArtifact, ArtifactTooLarge, WriteConflict
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/sessions/{session}/artifacts/{path}` answers beyond the door's codes.
    GetArtifactPathErrors: AppNotFound, SessionNotFound, InvalidId, ValidationError, ArtifactNotFound, ArtifactVersionNotFound, InvalidVersion
);

error_set!(
    /// What `DELETE /apps/{app}/users/{user}/sessions/{session}/artifacts/{path}` answers beyond the door's codes.
    DeleteArtifactErrors: AppNotFound, SessionNotFound, InvalidId
);

/// The wildcard routes' entries: OpenAPI has no wildcard segment, so they are documented with
/// a `{path}` parameter and routed by hand.
#[derive(OpenApi)]
#[openapi(paths(get_artifact_path, delete_artifact))]
struct WildcardDoc;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(WildcardDoc::openapi())
        .routes(routes!(list_artifacts, save_artifact))
        .route(
            "/apps/{app}/users/{user}/sessions/{session}/artifacts/{*rest}",
            get(get_artifact_path).delete(delete_artifact),
        )
}

fn scope(app: &str, user: &str, session: &str) -> ArtifactScope {
    ArtifactScope::new(app, user, session)
}

/// The names of the session's artifacts (with the user's `user:` ones).
#[utoipa::path(get, path = "/apps/{app}/users/{user}/sessions/{session}/artifacts", tag = "artifacts",
    params(SessionPath),
    responses((status = 200, description = "Artifact names.", body = Vec<String>), Errors, ListArtifactsErrors))]
async fn list_artifacts(
    state: axum::extract::State<AppState>,
    Path((app, user, session)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<Vec<String>>> {
    let keys = state
        .store
        .list_artifact_keys(&scope(&app, &user, &session))
        .await?;
    Ok(axum::Json(keys))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct SaveArtifactRequest {
    filename: String,
    /// The content: text or `inlineData`.
    artifact: Part,
    #[serde(default, alias = "custom_metadata")]
    #[schema(value_type = Option<Object>)]
    custom_metadata: Option<JsonMap>,
}

/// Saves a new version of an artifact (ADK).
#[utoipa::path(post, path = "/apps/{app}/users/{user}/sessions/{session}/artifacts", tag = "artifacts",
    params(SessionPath), request_body = SaveArtifactRequest,
    responses((status = 200, description = "The new version.", body = ArtifactVersion), Errors, SaveArtifactErrors))]
async fn save_artifact(
    state: axum::extract::State<AppState>,
    Path((app, user, session)): Path<(String, String, String)>,
    Json(req): Json<SaveArtifactRequest>,
) -> ApiResult<axum::Json<ArtifactVersion>> {
    if req.filename.ends_with("/versions") || req.filename.contains("/versions/") {
        return Err(ApiError::new(
            ErrorCode::InvalidArtifact,
            "artifact filenames may not contain a 'versions' path segment",
        ));
    }
    let version = state
        .store
        .save_artifact(
            &scope(&app, &user, &session),
            ArtifactWrite {
                filename: req.filename,
                part: req.artifact,
                custom_metadata: req.custom_metadata.unwrap_or_default(),
            },
        )
        .await?;
    Ok(axum::Json(version))
}

/// Which artifact route a wildcard path names.
#[derive(Debug, PartialEq)]
enum ArtifactPath<'a> {
    Load(&'a str),
    Versions(&'a str),
    VersionsMetadata(&'a str),
    Version(&'a str, &'a str),
    VersionMetadata(&'a str, &'a str),
}

fn parse_path(rest: &str) -> ArtifactPath<'_> {
    if let Some(name) = rest.strip_suffix("/versions/metadata") {
        return ArtifactPath::VersionsMetadata(name);
    }
    if let Some(head) = rest.strip_suffix("/metadata") {
        if let Some((name, v)) = head.rsplit_once("/versions/") {
            if !v.contains('/') {
                return ArtifactPath::VersionMetadata(name, v);
            }
        }
    }
    if let Some((name, v)) = rest.rsplit_once("/versions/") {
        if !v.contains('/') && !name.is_empty() {
            return ArtifactPath::Version(name, v);
        }
    }
    if let Some(name) = rest.strip_suffix("/versions") {
        return ArtifactPath::Versions(name);
    }
    ArtifactPath::Load(rest)
}

/// `latest` or an integer; anything else is ADK's 422 `Invalid version ID`.
fn parse_version(v: &str) -> ApiResult<Option<i64>> {
    if v == "latest" {
        return Ok(None);
    }
    v.parse::<i64>()
        .map(Some)
        .map_err(|_| ApiError::new(ErrorCode::InvalidVersion, "Invalid version ID"))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct LoadQuery {
    /// A version to load (default: the newest).
    version: Option<i64>,
}

/// Loads an artifact, or reads its versions (ADK's artifact routes).
///
/// `{path}` is `<name>` (the newest version, or `?version=N`), `<name>/versions` (the version
/// numbers), `<name>/versions/metadata`, `<name>/versions/{n}` or
/// `<name>/versions/{n}/metadata`. A name may contain `/`.
#[utoipa::path(get, path = "/apps/{app}/users/{user}/sessions/{session}/artifacts/{path}", tag = "artifacts",
    params(SessionPath, ("path" = String, Path, description = "The artifact's name, then optionally `/versions…`"), LoadQuery),
    responses((status = 200, description = "The artifact (a `Part`), its versions, or version metadata.", body = Value), Errors, GetArtifactPathErrors))]
async fn get_artifact_path(
    state: axum::extract::State<AppState>,
    Path((app, user, session, rest)): Path<(String, String, String, String)>,
    Query(q): Query<LoadQuery>,
) -> ApiResult<axum::Json<Value>> {
    let scope = scope(&app, &user, &session);
    let store = &state.store;
    match parse_path(&rest) {
        ArtifactPath::Load(name) => {
            let part = store.load_artifact(&scope, name, q.version).await?;
            to_json(&part.ok_or_else(artifact_not_found)?)
        }
        ArtifactPath::Version(name, v) => {
            let part = store.load_artifact(&scope, name, parse_version(v)?).await?;
            to_json(&part.ok_or_else(artifact_not_found)?)
        }
        ArtifactPath::Versions(name) => {
            let versions = store.list_artifact_versions(&scope, name).await?;
            to_json(&versions.iter().map(|v| v.version).collect::<Vec<_>>())
        }
        ArtifactPath::VersionsMetadata(name) => {
            to_json(&store.list_artifact_versions(&scope, name).await?)
        }
        ArtifactPath::VersionMetadata(name, v) => {
            let meta = store
                .artifact_version(&scope, name, parse_version(v)?)
                .await?;
            to_json(&meta.ok_or_else(|| {
                ApiError::new(
                    ErrorCode::ArtifactVersionNotFound,
                    "Artifact version not found",
                )
            })?)
        }
    }
    .map(axum::Json)
}

fn artifact_not_found() -> ApiError {
    ApiError::new(ErrorCode::ArtifactNotFound, "Artifact not found")
}

/// Deletes an artifact, every version (ADK).
#[utoipa::path(delete, path = "/apps/{app}/users/{user}/sessions/{session}/artifacts/{path}", tag = "artifacts",
    params(SessionPath, ("path" = String, Path, description = "The artifact's name")),
    responses((status = 200, description = "Deleted (or there was nothing to delete): `null`.", body = Value), Errors, DeleteArtifactErrors))]
async fn delete_artifact(
    state: axum::extract::State<AppState>,
    Path((app, user, session, name)): Path<(String, String, String, String)>,
) -> ApiResult<axum::Json<Value>> {
    state
        .store
        .delete_artifact(&scope(&app, &user, &session), &name)
        .await?;
    Ok(axum::Json(Value::Null))
}

fn to_json<T: serde::Serialize>(v: &T) -> ApiResult<Value> {
    serde_json::to_value(v).map_err(ApiError::internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_paths_match_adk_route_order() {
        assert_eq!(parse_path("a.txt"), ArtifactPath::Load("a.txt"));
        assert_eq!(
            parse_path("notes/hello.json"),
            ArtifactPath::Load("notes/hello.json")
        );
        assert_eq!(
            parse_path("a.txt/versions"),
            ArtifactPath::Versions("a.txt")
        );
        assert_eq!(
            parse_path("a.txt/versions/metadata"),
            ArtifactPath::VersionsMetadata("a.txt")
        );
        assert_eq!(
            parse_path("n/a.txt/versions/3"),
            ArtifactPath::Version("n/a.txt", "3")
        );
        assert_eq!(
            parse_path("a.txt/versions/latest/metadata"),
            ArtifactPath::VersionMetadata("a.txt", "latest")
        );
    }
}
