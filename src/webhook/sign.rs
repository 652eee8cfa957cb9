//! Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256>` over
//! `{webhook-id}.{webhook-timestamp}.{body}`, keyed by the secret's bytes (`whsec_<base64>`).
//! Receivers verify with the `standardwebhooks` or `svix` libraries.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const PREFIX: &str = "whsec_";
/// A secret's decoded length: at least 24 bytes (192 bits, Standard Webhooks' floor), at
/// most 64 (HMAC-SHA256's block).
pub const MIN_SECRET_BYTES: usize = 24;
pub const MAX_SECRET_BYTES: usize = 64;

/// The key bytes of a `whsec_…` secret, or why it is not one.
pub fn decode_secret(secret: &str) -> Result<Vec<u8>, String> {
    let b64 = secret
        .strip_prefix(PREFIX)
        .ok_or_else(|| "a webhook secret starts with `whsec_`".to_string())?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| "the part after `whsec_` must be standard base64".to_string())?;
    if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&bytes.len()) {
        return Err(format!(
            "a webhook secret holds {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes (this one \
             holds {})",
            bytes.len()
        ));
    }
    Ok(bytes)
}

/// The `webhook-signature` header's value for one attempt.
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes a key of any length: this never fails.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks reference vector (the spec's and the svix libraries' tests).
    #[test]
    fn reference_vector() {
        let key = decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            signature(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn bad_secrets() {
        assert!(decode_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(decode_secret("whsec_not base64!").is_err());
        assert!(decode_secret("whsec_c2hvcnQ=").is_err());
    }
}
