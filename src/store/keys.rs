//! API keys: one row per key, holding a hash of its secret, never the secret itself.
//!
//! The SQL is the same on both backends (SQLite binds `$N` by position too), so one macro
//! writes both implementations.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::StoreResult;
use async_trait::async_trait;
use sqlx::Row;

/// A stored API key (without its secret).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ApiKeyRecord {
    pub id: String,
    /// Hex SHA-256 of the secret part of the key.
    #[serde(skip)]
    pub secret_hash: String,
    pub user_id: String,
    /// The apps the key may use; `None`: every app.
    pub apps: Option<Vec<String>>,
    pub admin: bool,
    pub name: Option<String>,
    pub created_at: f64,
    pub expires_at: Option<f64>,
    pub revoked_at: Option<f64>,
}

#[async_trait]
pub trait KeyStore: Send + Sync + 'static {
    async fn insert_api_key(&self, key: &ApiKeyRecord) -> StoreResult<()>;
    async fn find_api_key(&self, id: &str) -> StoreResult<Option<ApiKeyRecord>>;
    /// Every key, newest first (revoked ones included).
    async fn list_api_keys(&self) -> StoreResult<Vec<ApiKeyRecord>>;
    /// Marks the key revoked; false when no unrevoked key has that id.
    async fn revoke_api_key(&self, id: &str, at: f64) -> StoreResult<bool>;
}

const COLUMNS: &str =
    "id, secret_hash, user_id, apps, admin, name, created_at, expires_at, revoked_at";

fn read_key<R: Row>(row: &R) -> StoreResult<ApiKeyRecord>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    f64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let apps: Option<String> = row.try_get("apps")?;
    Ok(ApiKeyRecord {
        id: row.try_get("id")?,
        secret_hash: row.try_get("secret_hash")?,
        user_id: row.try_get("user_id")?,
        // Written by `insert_api_key` only; unreadable JSON means no app at all, never all.
        apps: apps.map(|a| serde_json::from_str(&a).unwrap_or_default()),
        admin: row.try_get("admin")?,
        name: row.try_get("name")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

/// Revokes and, on PostgreSQL, tells every replica (they drop their cached keys; the channel
/// is `auth::KEYS_CHANNEL`).
const PG_REVOKE: &str = "WITH r AS (UPDATE api_keys SET revoked_at = $2
                     WHERE id = $1 AND revoked_at IS NULL RETURNING id)
     SELECT pg_notify('agentd_keys', id) FROM r";
const SQLITE_REVOKE: &str =
    "UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL RETURNING id";

macro_rules! key_store {
    ($store:ty, $writer:ident, $reader:ident, $revoke:expr) => {
        #[async_trait]
        impl KeyStore for $store {
            async fn insert_api_key(&self, key: &ApiKeyRecord) -> StoreResult<()> {
                let apps = key
                    .apps
                    .as_ref()
                    .map(|a| serde_json::to_string(a).unwrap_or_else(|_| "[]".into()));
                sqlx::query(&format!(
                    "INSERT INTO api_keys ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
                ))
                .bind(&key.id)
                .bind(&key.secret_hash)
                .bind(&key.user_id)
                .bind(apps)
                .bind(key.admin)
                .bind(&key.name)
                .bind(key.created_at)
                .bind(key.expires_at)
                .bind(key.revoked_at)
                .execute(&self.$writer)
                .await?;
                Ok(())
            }

            async fn find_api_key(&self, id: &str) -> StoreResult<Option<ApiKeyRecord>> {
                let row = sqlx::query(&format!("SELECT {COLUMNS} FROM api_keys WHERE id = $1"))
                    .bind(id)
                    .fetch_optional(&self.$reader)
                    .await?;
                row.as_ref().map(read_key).transpose()
            }

            async fn list_api_keys(&self) -> StoreResult<Vec<ApiKeyRecord>> {
                let rows = sqlx::query(&format!(
                    "SELECT {COLUMNS} FROM api_keys ORDER BY created_at DESC, id"
                ))
                .fetch_all(&self.$reader)
                .await?;
                rows.iter().map(read_key).collect()
            }

            async fn revoke_api_key(&self, id: &str, at: f64) -> StoreResult<bool> {
                Ok(!sqlx::query($revoke)
                    .bind(id)
                    .bind(at)
                    .fetch_all(&self.$writer)
                    .await?
                    .is_empty())
            }
        }
    };
}

key_store!(PgStore, pool, pool, PG_REVOKE);
key_store!(SqliteStore, writer, reader, SQLITE_REVOKE);
