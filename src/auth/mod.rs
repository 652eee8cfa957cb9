//! Who is calling: API keys (stored hashed), JWTs (OIDC access tokens), or nobody (`--auth
//! none`, loopback only unless `--allow-unauthenticated`).
//!
//! Authentication yields a [`Caller`]; binding a request to what the caller may touch (its
//! user id, its apps) happens in `http::auth`.

pub mod jwt;
pub mod keys;
pub mod revocation;

pub use revocation::{KeyChanges, KEYS_CHANNEL};

use crate::error_code::ErrorCode;
use crate::store::KeyStore;
use std::sync::Arc;

/// The authenticated caller of one request.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The user the caller acts as; `None` when authentication is off.
    pub user_id: Option<String>,
    /// Apps the caller may use; `None`: every app.
    pub apps: Option<Arc<[String]>>,
    /// May act for any user (a backend serving many end users) and write `app:` state.
    pub admin: bool,
    pub via: Via,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Via {
    /// `--auth none`.
    Nobody,
    ApiKey(String),
    Jwt,
}

impl Caller {
    /// The caller when authentication is off: may act as any user.
    pub fn nobody() -> Self {
        Caller {
            user_id: None,
            apps: None,
            admin: false,
            via: Via::Nobody,
        }
    }

    /// The API key the caller presented, if any: runs it starts are charged to it.
    pub fn api_key(&self) -> Option<crate::usage::ChargedKey> {
        match &self.via {
            Via::ApiKey(id) => Some(crate::usage::ChargedKey {
                id: id.clone(),
                user: self.user_id.clone().filter(|_| !self.admin),
            }),
            _ => None,
        }
    }

    pub fn may_use_app(&self, app: &str) -> bool {
        self.apps
            .as_ref()
            .is_none_or(|apps| apps.iter().any(|a| a == app))
    }

    /// Whether the caller may read and write `user`'s data.
    pub fn may_act_as(&self, user: &str) -> bool {
        self.admin || self.user_id.as_deref().is_none_or(|u| u == user)
    }

    /// Whether the caller may see how the server is set up: agents' instructions and why an
    /// app failed to load (file paths, YAML). Admins, and everyone when authentication is off
    /// (a developer's own machine); other callers see them redacted.
    pub fn may_see_internals(&self) -> bool {
        self.admin || self.via == Via::Nobody
    }

    /// Whether the caller may touch (`app`, `user`).
    pub fn may_access(&self, app: &str, user: &str) -> bool {
        self.may_use_app(app) && self.may_act_as(user)
    }

    /// The key rate limits count under.
    pub fn limit_key(&self) -> Option<String> {
        match &self.via {
            Via::Nobody => None,
            Via::ApiKey(id) => Some(format!("key:{id}")),
            Via::Jwt => self.user_id.as_ref().map(|u| format!("user:{u}")),
        }
    }
}

/// Why a request is not authenticated (401, or 503 when the key store or JWKS is down).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AuthError {
    #[error("missing credentials: send `Authorization: Bearer <API key or token>`")]
    Missing,
    #[error("invalid API key")]
    InvalidKey,
    #[error("this API key has been revoked")]
    KeyRevoked,
    #[error("this API key has expired")]
    KeyExpired,
    #[error("the token has expired")]
    TokenExpired,
    #[error("invalid token: {0}")]
    InvalidToken(&'static str),
    #[error("credentials cannot be checked right now")]
    Unavailable,
}

impl AuthError {
    pub fn code(&self) -> ErrorCode {
        match self {
            AuthError::Missing => ErrorCode::Unauthenticated,
            AuthError::InvalidKey => ErrorCode::InvalidApiKey,
            AuthError::KeyRevoked => ErrorCode::ApiKeyRevoked,
            AuthError::KeyExpired => ErrorCode::ApiKeyExpired,
            AuthError::TokenExpired => ErrorCode::TokenExpired,
            AuthError::InvalidToken(_) => ErrorCode::InvalidToken,
            AuthError::Unavailable => ErrorCode::AuthUnavailable,
        }
    }
}

/// Turns presented credentials into a [`Caller`].
pub struct Authenticator {
    /// The API keys, the one part of the database authentication reads.
    store: Arc<dyn KeyStore>,
    api_keys: bool,
    jwt: Option<jwt::JwtVerifier>,
    cache: Option<KeyCache>,
}

/// Keys looked up recently (PostgreSQL only). A revocation notifies every replica
/// ([`KEYS_CHANNEL`]), which counts a change in `generation` and so empties the cache at once;
/// so does a lost notification connection. An entry is also never older than
/// [`KEY_CACHE_TTL`].
struct KeyCache {
    generation: KeyChanges,
    entries: std::sync::Mutex<std::collections::HashMap<String, CachedKey>>,
}

struct CachedKey {
    record: crate::store::ApiKeyRecord,
    generation: u64,
    at: std::time::Instant,
}

const KEY_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(60);
const KEY_CACHE_MAX: usize = 10_000;

impl Authenticator {
    /// `key_changes`: the key changes heard from every process (PostgreSQL: see
    /// [`revocation`]); without it (SQLite) every request reads its key.
    pub fn new(
        store: Arc<dyn KeyStore>,
        api_keys: bool,
        jwt: Option<jwt::JwtVerifier>,
        key_changes: Option<KeyChanges>,
    ) -> Self {
        Authenticator {
            store,
            api_keys,
            jwt,
            cache: key_changes.map(|generation| KeyCache {
                generation,
                entries: Default::default(),
            }),
        }
    }

    /// The stored key `id`, from the cache when it is still current.
    async fn find_key(&self, id: &str) -> Result<Option<crate::store::ApiKeyRecord>, AuthError> {
        let generation = self.cache.as_ref().map(|c| c.generation.generation());
        if let (Some(cache), Some(generation)) = (&self.cache, generation) {
            let entries = cache.entries.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(hit) = entries.get(id) {
                if hit.generation == generation && hit.at.elapsed() < KEY_CACHE_TTL {
                    return Ok(Some(hit.record.clone()));
                }
            }
        }
        let record = self.store.find_api_key(id).await.map_err(|e| {
            tracing::warn!(error = %e, "API key lookup failed");
            AuthError::Unavailable
        })?;
        if let (Some(cache), Some(generation), Some(record)) = (&self.cache, generation, &record) {
            let mut entries = cache.entries.lock().unwrap_or_else(|p| p.into_inner());
            if entries.len() >= KEY_CACHE_MAX {
                entries.retain(|_, e| e.generation == generation && e.at.elapsed() < KEY_CACHE_TTL);
                if entries.len() >= KEY_CACHE_MAX {
                    entries.clear();
                }
            }
            entries.insert(
                id.to_string(),
                CachedKey {
                    record: record.clone(),
                    generation,
                    at: std::time::Instant::now(),
                },
            );
        }
        Ok(record)
    }

    /// No authentication (`--auth none`).
    pub fn is_off(&self) -> bool {
        !self.api_keys && self.jwt.is_none()
    }

    pub async fn authenticate(&self, token: Option<&str>) -> Result<Caller, AuthError> {
        if self.is_off() {
            return Ok(Caller::nobody());
        }
        let token = token.map(str::trim).filter(|t| !t.is_empty());
        let Some(token) = token else {
            return Err(AuthError::Missing);
        };
        if keys::looks_like_key(token) || self.jwt.is_none() {
            if !self.api_keys {
                return Err(AuthError::InvalidToken("API keys are not accepted here"));
            }
            return self.api_key(token).await;
        }
        match &self.jwt {
            Some(jwt) => {
                let user = jwt.verify(token).await?;
                Ok(Caller {
                    user_id: Some(user),
                    apps: None,
                    admin: false,
                    via: Via::Jwt,
                })
            }
            None => Err(AuthError::InvalidKey),
        }
    }

    async fn api_key(&self, token: &str) -> Result<Caller, AuthError> {
        let (id, secret) = keys::parse(token).ok_or(AuthError::InvalidKey)?;
        let record = self.find_key(id).await?.ok_or(AuthError::InvalidKey)?;
        if !keys::same_hash(&keys::hash(secret), &record.secret_hash) {
            return Err(AuthError::InvalidKey);
        }
        if record.revoked_at.is_some() {
            return Err(AuthError::KeyRevoked);
        }
        if record
            .expires_at
            .is_some_and(|at| at <= crate::event::now_ts())
        {
            return Err(AuthError::KeyExpired);
        }
        Ok(Caller {
            user_id: Some(record.user_id),
            apps: record.apps.map(Arc::from),
            admin: record.admin,
            via: Via::ApiKey(record.id),
        })
    }
}
