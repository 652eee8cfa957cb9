//! An HTTP tool's client and what comes back: content types, bounded text, error chains.

use super::*;

pub(super) fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence == "application/json" || essence.ends_with("+json") || essence == "text/json"
}

pub(super) fn is_textual(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.is_empty()
        || essence.starts_with("text/")
        || [
            "json",
            "xml",
            "javascript",
            "yaml",
            "x-www-form-urlencoded",
            "csv",
        ]
        .iter()
        .any(|k| essence.contains(k))
}

/// The bytes as text: a character cut at the end is dropped, invalid UTF-8 replaced.
pub(super) fn utf8_prefix(buf: &[u8]) -> String {
    match std::str::from_utf8(buf) {
        Ok(s) => s.to_string(),
        Err(e) if e.error_len().is_none() => {
            String::from_utf8_lossy(&buf[..e.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(buf).into_owned(),
    }
}

pub(super) fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// A reqwest error and its causes, without the URL (which may carry a secret).
pub(super) fn error_chain(e: &reqwest::Error) -> String {
    let mut out = String::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        source = s.source();
    }
    if out.is_empty() {
        // reqwest's own message names the URL; say what kind of failure it was instead.
        out.push_str(if e.is_timeout() {
            "timed out"
        } else if e.is_body() || e.is_decode() {
            "bad response body"
        } else {
            "request error"
        });
    }
    out
}

/// An HTTP tool's own client: redirects are not followed, so a configured secret header (an
/// `X-Api-Key`, say) is never replayed to another host and a redirect cannot lead around the
/// egress rule; a 3xx is reported as it is. Its resolver drops addresses `egress` refuses.
pub(super) fn tool_client(egress: &EgressPolicy) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        // A proxy from the environment would resolve the target itself, around the rule.
        .no_proxy()
        .dns_resolver(std::sync::Arc::new(Resolver(egress.clone())))
        .user_agent(concat!("agentd/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}
