//! JWT (OIDC access token) verification with `jsonwebtoken`: a static key (`--jwt-secret`,
//! `--jwt-public-key`) or a JWKS endpoint (`--jwt-jwks-url`).
//!
//! The JWKS is fetched on first use and again when a token names a `kid` the cache does not
//! know (key rotation), at most once per `--jwt-jwks-refresh-secs`, so a stream of tokens with
//! made-up `kid`s cannot turn into a stream of requests to the identity provider. A cache older
//! than an hour is refreshed on the next token.

use super::AuthError;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

const RSA_ALGS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];
const EC_ALGS: &[Algorithm] = &[Algorithm::ES256, Algorithm::ES384];
const HMAC_ALGS: &[Algorithm] = &[Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];
/// The most a JWKS document may weigh.
const MAX_JWKS_BYTES: usize = 1024 * 1024;
/// A cache this old is refetched on the next token.
const JWKS_MAX_AGE: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone)]
pub struct JwtConfig {
    pub jwks_url: Option<String>,
    /// PEM (RSA, EC or Ed25519 public key).
    pub public_key_pem: Option<Vec<u8>>,
    /// HMAC secret (HS256/384/512).
    pub secret: Option<String>,
    pub issuer: Option<String>,
    pub audience: Vec<String>,
    /// The claim that holds the user id.
    pub user_claim: String,
    /// Least time between two JWKS fetches.
    pub jwks_refresh_min: Duration,
    /// Longest the last good key set is used while refetching fails; then tokens are refused.
    pub jwks_max_stale: Duration,
    /// Clock skew allowed on `exp`/`nbf`, in seconds.
    pub leeway_secs: u64,
}

#[derive(Clone)]
struct VerifyKey {
    key: DecodingKey,
    algs: Vec<Algorithm>,
}

pub struct JwtVerifier {
    config: JwtConfig,
    static_key: Option<VerifyKey>,
    jwks: Option<Arc<Jwks>>,
}

struct Jwks {
    url: String,
    client: reqwest::Client,
    cache: RwLock<JwksCache>,
    /// One fetch at a time; the others wait for its result.
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct JwksCache {
    keys: HashMap<String, VerifyKey>,
    /// Keys without a `kid` (used when the token names none).
    unnamed: Vec<VerifyKey>,
    /// The last successful fetch: what the keys' age is counted from.
    fetched_at: Option<Instant>,
    /// The last fetch tried, successful or not: what bounds the rate of fetches.
    attempted_at: Option<Instant>,
}

impl JwtVerifier {
    pub fn new(mut config: JwtConfig) -> anyhow::Result<Self> {
        // A stale limit below the refetch gap would refuse good tokens between fetches.
        config.jwks_max_stale = config.jwks_max_stale.max(config.jwks_refresh_min);
        let static_key = match (&config.secret, &config.public_key_pem) {
            (Some(_), Some(_)) => {
                anyhow::bail!("give --jwt-secret or --jwt-public-key, not both")
            }
            (Some(secret), None) => {
                if secret.len() < 32 {
                    anyhow::bail!("--jwt-secret must be at least 32 bytes");
                }
                Some(VerifyKey {
                    key: DecodingKey::from_secret(secret.as_bytes()),
                    algs: HMAC_ALGS.to_vec(),
                })
            }
            (None, Some(pem)) => Some(key_from_pem(pem)?),
            (None, None) => None,
        };
        let jwks = match &config.jwks_url {
            Some(url) => Some(Arc::new(Jwks {
                url: url.clone(),
                client: reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()?,
                cache: RwLock::new(JwksCache::default()),
                fetching: tokio::sync::Mutex::new(()),
            })),
            None => None,
        };
        if static_key.is_none() && jwks.is_none() {
            anyhow::bail!("--auth jwt needs --jwt-jwks-url, --jwt-public-key or --jwt-secret");
        }
        Ok(JwtVerifier {
            config,
            static_key,
            jwks,
        })
    }

    /// Verifies `token` and returns the user id its claim names.
    pub async fn verify(&self, token: &str) -> Result<String, AuthError> {
        // `alg: none` (and any algorithm jsonwebtoken does not implement) fails here.
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::InvalidToken("malformed token"))?;
        let key = self.key_for(header.kid.as_deref()).await?;
        if !key.algs.contains(&header.alg) {
            return Err(AuthError::InvalidToken(
                "algorithm not allowed for this key",
            ));
        }
        let mut validation = Validation::new(header.alg);
        validation.algorithms = vec![header.alg];
        validation.leeway = self.config.leeway_secs;
        validation.validate_nbf = true;
        if let Some(iss) = &self.config.issuer {
            validation.set_issuer(&[iss]);
            validation.required_spec_claims.insert("iss".into());
        }
        if self.config.audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&self.config.audience);
            validation.required_spec_claims.insert("aud".into());
        }
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            &key.key,
            &validation,
        )
        .map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::ExpiredSignature => AuthError::TokenExpired,
                K::ImmatureSignature => AuthError::InvalidToken("token not yet valid"),
                K::InvalidIssuer => AuthError::InvalidToken("wrong issuer"),
                K::InvalidAudience => AuthError::InvalidToken("wrong audience"),
                K::InvalidSignature => AuthError::InvalidToken("bad signature"),
                K::MissingRequiredClaim(_) => {
                    AuthError::InvalidToken("a required claim is missing")
                }
                K::InvalidAlgorithm => AuthError::InvalidToken("algorithm not allowed"),
                _ => AuthError::InvalidToken("malformed token"),
            }
        })?;
        match data.claims.get(&self.config.user_claim) {
            Some(serde_json::Value::String(user)) if !user.is_empty() => Ok(user.clone()),
            _ => Err(AuthError::InvalidToken("the token has no user claim")),
        }
    }

    async fn key_for(&self, kid: Option<&str>) -> Result<VerifyKey, AuthError> {
        let Some(jwks) = &self.jwks else {
            return self
                .static_key
                .clone()
                .ok_or(AuthError::InvalidToken("no key"));
        };
        let max_stale = self.config.jwks_max_stale;
        if let Some(key) = jwks.lookup(kid, JWKS_MAX_AGE.min(max_stale)) {
            return Ok(key);
        }
        // A key it knows from a set older than an hour but within the stale limit: answer at
        // once and refetch in the background (at most once per gap), so a provider that is
        // slow or down does not hold every login up behind the fetch.
        if let Some(key) = jwks.lookup(kid, max_stale) {
            let (jwks, min_gap) = (jwks.clone(), self.config.jwks_refresh_min);
            if jwks.fetch_due(min_gap) {
                tokio::spawn(async move {
                    let _ = jwks.refresh(min_gap, max_stale).await;
                });
            }
            return Ok(key);
        }
        jwks.refresh(self.config.jwks_refresh_min, max_stale)
            .await?;
        // Fresh keys after a good fetch; after a failed one, the last good keys while they
        // are younger than the stale limit (`refresh` failed closed past it).
        jwks.lookup(kid, max_stale)
            .or_else(|| self.static_key.clone())
            .ok_or(AuthError::InvalidToken("unknown signing key"))
    }
}

/// Whether the cached keys may still be used: some were fetched, less than `max_stale` ago.
fn usable(cache: &JwksCache, max_stale: Duration) -> Result<(), AuthError> {
    let fresh = cache.fetched_at.is_some_and(|at| at.elapsed() <= max_stale);
    if fresh && !(cache.keys.is_empty() && cache.unnamed.is_empty()) {
        Ok(())
    } else {
        Err(AuthError::Unavailable)
    }
}

impl Jwks {
    /// Whether no fetch was tried within `min_gap` (and none is running now).
    fn fetch_due(&self, min_gap: Duration) -> bool {
        if self.fetching.try_lock().is_err() {
            return false;
        }
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        cache.attempted_at.is_none_or(|at| at.elapsed() >= min_gap)
    }

    /// The key for `kid` from a key set fetched successfully less than `max_age` ago.
    fn lookup(&self, kid: Option<&str>, max_age: Duration) -> Option<VerifyKey> {
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        if cache.fetched_at.is_none_or(|at| at.elapsed() > max_age) {
            return None;
        }
        match kid {
            Some(kid) => cache.keys.get(kid).cloned(),
            None if cache.unnamed.len() == 1 && cache.keys.is_empty() => {
                cache.unnamed.first().cloned()
            }
            None => None,
        }
    }

    /// Fetches the key set unless another fetch was tried within `min_gap`. A failed fetch
    /// keeps the last good keys, but only while they are younger than `max_stale`: past that
    /// it fails closed, so a provider that cannot be reached (or is blocked) does not keep the
    /// keys it removed valid.
    async fn refresh(&self, min_gap: Duration, max_stale: Duration) -> Result<(), AuthError> {
        let _one = self.fetching.lock().await;
        {
            let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
            if cache.attempted_at.is_some_and(|at| at.elapsed() < min_gap) {
                return usable(&cache, max_stale);
            }
        }
        let fetched = self.fetch().await;
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        match fetched {
            Ok(next) => {
                *cache = next;
                Ok(())
            }
            Err(e) => {
                tracing::warn!(url = %self.url, error = %e, "JWKS fetch failed");
                // Counted as a try, so failures are rate-bounded too; the keys keep their age.
                cache.attempted_at = Some(Instant::now());
                usable(&cache, max_stale)
            }
        }
    }

    async fn fetch(&self) -> anyhow::Result<JwksCache> {
        let mut resp = self
            .client
            .get(&self.url)
            .send()
            .await?
            .error_for_status()?;
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                anyhow::bail!("JWKS larger than {MAX_JWKS_BYTES} bytes");
            }
            body.extend_from_slice(&chunk);
        }
        let set: JwkSet = serde_json::from_slice(&body)?;
        let now = Instant::now();
        let mut next = JwksCache {
            fetched_at: Some(now),
            attempted_at: Some(now),
            ..JwksCache::default()
        };
        for jwk in &set.keys {
            if jwk.common.public_key_use == Some(jsonwebtoken::jwk::PublicKeyUse::Encryption) {
                continue;
            }
            let algs: Vec<Algorithm> = match (&jwk.common.key_algorithm, &jwk.algorithm) {
                (Some(alg), _) => match alg.to_string().parse::<Algorithm>() {
                    Ok(a) => vec![a],
                    Err(_) => continue,
                },
                (None, AlgorithmParameters::RSA(_)) => RSA_ALGS.to_vec(),
                (None, AlgorithmParameters::EllipticCurve(_)) => EC_ALGS.to_vec(),
                (None, AlgorithmParameters::OctetKeyPair(_)) => vec![Algorithm::EdDSA],
                // Symmetric keys are never taken from a published key set.
                (None, AlgorithmParameters::OctetKey(_)) => continue,
            };
            if algs.iter().any(|a| HMAC_ALGS.contains(a)) {
                continue;
            }
            let Ok(key) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            let vk = VerifyKey { key, algs };
            match &jwk.common.key_id {
                Some(kid) => {
                    next.keys.insert(kid.clone(), vk);
                }
                None => next.unnamed.push(vk),
            }
        }
        Ok(next)
    }
}

fn key_from_pem(pem: &[u8]) -> anyhow::Result<VerifyKey> {
    if let Ok(key) = DecodingKey::from_rsa_pem(pem) {
        return Ok(VerifyKey {
            key,
            algs: RSA_ALGS.to_vec(),
        });
    }
    if let Ok(key) = DecodingKey::from_ec_pem(pem) {
        return Ok(VerifyKey {
            key,
            algs: EC_ALGS.to_vec(),
        });
    }
    if let Ok(key) = DecodingKey::from_ed_pem(pem) {
        return Ok(VerifyKey {
            key,
            algs: vec![Algorithm::EdDSA],
        });
    }
    anyhow::bail!("--jwt-public-key is not an RSA, EC or Ed25519 public key in PEM form")
}
