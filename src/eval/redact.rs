//! Credential secrets taken out of what the eval routes answer, as ADK 2.13's dev server takes
//! them out of a case and a result it answers (`_redact_credential_secrets`): an eval file
//! imported from ADK may hold a conversation in which a tool asked for credentials, with the
//! tokens, keys and client secrets of that exchange. The stored file keeps them (an export is
//! the file that was imported); a read of one case or one result does not show them.
//!
//! (agentd's own sessions cannot hold such a conversation: its agents never ask for
//! credentials, and a session is not created with events that carry actions or ADK's
//! internal function calls.)

use super::doc::Doc;

/// The keys of a credential's secrets, in both spellings.
const SECRET_KEYS: &[&str] = &[
    "password",
    "token",
    "additionalHeaders",
    "additional_headers",
    "clientSecret",
    "client_secret",
    "authResponseUri",
    "auth_response_uri",
    "authCode",
    "auth_code",
    "accessToken",
    "access_token",
    "refreshToken",
    "refresh_token",
    "idToken",
    "id_token",
    "codeVerifier",
    "code_verifier",
    "privateKeyId",
    "private_key_id",
    "privateKey",
    "private_key",
    "apiKey",
    "api_key",
];

/// ADK's `AuthCredentialTypes`, as its values, names and lower-case names.
const AUTH_TYPES: &[&str] = &[
    "apiKey",
    "http",
    "oauth2",
    "openIdConnect",
    "serviceAccount",
    "API_KEY",
    "HTTP",
    "OAUTH2",
    "OPEN_ID_CONNECT",
    "SERVICE_ACCOUNT",
    "api_key",
    "open_id_connect",
    "service_account",
];

/// The function ADK's tools call to ask the client for credentials.
const REQUEST_CREDENTIAL: &str = "adk_request_credential";

/// Fields that hold a credential (or a map of them) whole.
const CREDENTIAL_FIELDS: &[&str] = &[
    "requestedAuthConfigs",
    "requested_auth_configs",
    "rawAuthCredential",
    "raw_auth_credential",
    "exchangedAuthCredential",
    "exchanged_auth_credential",
];

/// `doc` without the credential secrets ADK strips: in a credential (an object with an auth
/// type), in a credential request's arguments and response, and under the fields that hold
/// credentials.
pub fn credential_secrets(doc: &Doc) -> Doc {
    match doc {
        Doc::Object(pairs) => {
            let auth_type = ["authType", "auth_type"]
                .iter()
                .filter_map(|k| doc.get(k).and_then(Doc::as_str))
                .any(|t| AUTH_TYPES.contains(&t));
            if auth_type {
                return strip(doc);
            }
            let request = doc.get("name").and_then(Doc::as_str) == Some(REQUEST_CREDENTIAL);
            Doc::Object(
                pairs
                    .iter()
                    .map(|(k, v)| {
                        let v = match k.as_str() {
                            "args" if request && matches!(v, Doc::Object(_)) => {
                                let mut args = v.clone();
                                for key in ["authConfig", "auth_config"] {
                                    if let Some(c) = v.get(key) {
                                        args.set(key, strip(c));
                                    }
                                }
                                args
                            }
                            "response" if request => strip(v),
                            k if CREDENTIAL_FIELDS.contains(&k) => strip(v),
                            _ => credential_secrets(v),
                        };
                        (k.clone(), v)
                    })
                    .collect(),
            )
        }
        Doc::Array(items) => Doc::Array(items.iter().map(credential_secrets).collect()),
        other => other.clone(),
    }
}

/// `doc` without any secret key, at any depth (ADK's `_redact_auth_config_secrets`).
fn strip(doc: &Doc) -> Doc {
    match doc {
        Doc::Object(pairs) => Doc::Object(
            pairs
                .iter()
                .filter(|(k, _)| !SECRET_KEYS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Doc::Array(items) => Doc::Array(items.iter().map(strip).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Doc {
        Doc::parse(text).unwrap()
    }

    #[test]
    fn a_credential_requests_secrets_go_and_the_rest_stays() {
        let case = doc(
            r#"{"conversation": [{"intermediateData": {"invocationEvents": [{"content": {"parts": [
                {"functionCall": {"name": "adk_request_credential", "args": {
                    "functionCallId": "c1",
                    "authConfig": {"authScheme": {"type": "oauth2"},
                        "exchangedAuthCredential": {"authType": "oauth2",
                            "oauth2": {"clientId": "id", "clientSecret": "s3cret", "accessToken": "tok"}}}}}},
                {"functionResponse": {"name": "adk_request_credential", "response": {
                    "authConfig": {"rawAuthCredential": {"oauth2": {"refresh_token": "r"}}}}}},
                {"functionCall": {"name": "get_weather", "args": {"token": "a city's token"}}}
            ]}, "actions": {"requestedAuthConfigs": {"c1": {"credentialKey": "k", "apiKey": "sk-1"}}}}]}}],
            "state": {"token": "kept: state is not a credential"}}"#,
        );
        let out = credential_secrets(&case).to_compact();
        for secret in ["s3cret", "\"tok\"", "\"r\"", "sk-1"] {
            assert!(!out.contains(secret), "{secret} left in {out}");
        }
        for kept in ["clientId", "credentialKey", "a city's token", "kept: state"] {
            assert!(out.contains(kept), "{kept} gone from {out}");
        }
    }

    #[test]
    fn a_credential_anywhere_loses_its_secrets() {
        let d = doc(
            r#"[{"x": {"auth_type": "API_KEY", "api_key": "k", "nested": [{"password": "p", "user": "u"}]}}]"#,
        );
        assert_eq!(
            credential_secrets(&d).to_compact(),
            r#"[{"x":{"auth_type":"API_KEY","nested":[{"user":"u"}]}}]"#
        );
        let plain = doc(r#"{"authType": "unknown", "password": "stays"}"#);
        assert_eq!(credential_secrets(&plain), plain);
    }
}
