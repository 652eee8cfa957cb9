//! API key format, generation and hashing.
//!
//! A key reads `agentd_<id>_<secret>`: `id` (16 hex digits) names the row, `secret` is 32 bytes
//! from the operating system's random source, base64url. Only SHA-256(secret) is stored. A
//! slow password hash is not needed: the secret has 256 bits of entropy, so no dictionary
//! applies, and every request can afford the lookup.

use crate::store::ApiKeyRecord;
use base64::Engine;
use sha2::{Digest, Sha256};

const PREFIX: &str = "agentd_";

/// A freshly created key: the plaintext is shown once and never stored.
pub struct NewKey {
    pub plaintext: String,
    pub record: ApiKeyRecord,
}

/// What `agentd keys create` asks for.
pub struct KeySpec {
    pub user_id: String,
    pub apps: Option<Vec<String>>,
    pub admin: bool,
    pub name: Option<String>,
    pub expires_at: Option<f64>,
}

/// Makes a new key (not yet stored).
pub fn generate(spec: KeySpec, now: f64) -> std::io::Result<NewKey> {
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id).map_err(std::io::Error::other)?;
    getrandom::fill(&mut secret).map_err(std::io::Error::other)?;
    let id = crate::hex(&id);
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    Ok(NewKey {
        plaintext: format!("{PREFIX}{id}_{secret}"),
        record: ApiKeyRecord {
            secret_hash: hash(&secret),
            id,
            user_id: spec.user_id,
            apps: spec.apps,
            admin: spec.admin,
            name: spec.name,
            created_at: now,
            expires_at: spec.expires_at,
            revoked_at: None,
        },
    })
}

/// Splits a presented key into (id, secret); `None` if it is not shaped like an agentd key.
pub fn parse(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.strip_prefix(PREFIX)?.split_once('_')?;
    let id_ok = id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit());
    (id_ok && !secret.is_empty() && secret.len() <= 64).then_some((id, secret))
}

/// Whether a bearer token is meant as an agentd key (rather than a JWT).
pub fn looks_like_key(token: &str) -> bool {
    token.starts_with(PREFIX)
}

pub fn hash(secret: &str) -> String {
    crate::hex(&Sha256::digest(secret.as_bytes()))
}

/// Compares two hashes without an early exit (the lengths are public: both are SHA-256 hex).
pub fn same_hash(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice_key() -> NewKey {
        let spec = KeySpec {
            user_id: "alice".into(),
            apps: None,
            admin: false,
            name: None,
            expires_at: None,
        };
        generate(spec, 0.0).unwrap()
    }

    #[test]
    fn a_generated_key_parses_back_and_only_its_hash_is_kept() {
        let k = alice_key();
        let (id, secret) = parse(&k.plaintext).unwrap();
        assert_eq!(id, k.record.id);
        assert!(same_hash(&hash(secret), &k.record.secret_hash));
        assert!(!k.record.secret_hash.contains(secret));
        assert!(parse("agentd_nothex__x").is_none());
        assert!(parse("Bearer x").is_none());
        assert_ne!(alice_key().plaintext, k.plaintext);
    }
}
