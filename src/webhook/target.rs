//! Where a run's end is sent: a run request's `webhook`, an app's `webhooks:`, and the checks
//! both pass before anything is stored (URL, SSRF, events, secret).

use super::sign::decode_secret;
use crate::error_code::ErrorCode;
use crate::tools::egress::EgressPolicy;
use serde::{Deserialize, Serialize};

/// The events a target may ask for. `run.input_required`: the run completed waiting for the
/// user (a confirmation or a long-running tool call is open).
pub const EVENTS: [&str; 4] = [
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.input_required",
];

/// The longest URL a webhook may have.
const MAX_URL: usize = 2048;

/// A webhook as a run request names it (`"webhook": {…}`).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookSpec {
    /// An `http(s)` URL on a public address (private ones only where the server allows them).
    pub url: String,
    /// `whsec_<base64>` (24 to 64 bytes); default: the server's `--webhook-secret`.
    #[serde(default)]
    pub secret: Option<String>,
    /// Default: all four events.
    #[serde(default)]
    pub events: Option<Vec<String>>,
    /// Send the final response's text in the body (default true).
    #[serde(default, alias = "include_text")]
    pub include_text: Option<bool>,
}

/// A webhook of an app (`webhooks:` in the app's `agentd.yaml`): every run of the app sends
/// it. It may reach private addresses the server does not allow in general.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppWebhook {
    pub url: String,
    /// `${VAR}` is expanded from the environment (by the app loader).
    #[serde(default)]
    pub secret: Option<String>,
    #[serde(default)]
    pub events: Option<Vec<String>>,
    #[serde(default)]
    pub include_text: Option<bool>,
    /// As for HTTP tools: addresses, CIDR blocks, host names or `"*"`.
    #[serde(default)]
    pub allow_private: Vec<String>,
}

/// A checked target, as stored on the run (`runs.webhooks`) and its deliveries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookTarget {
    pub url: String,
    /// The signing secret (empty for an A2A push config, which A2A authenticates its own
    /// way).
    #[serde(default)]
    pub secret: String,
    pub events: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_private: Vec<String>,
    #[serde(default = "yes")]
    pub include_text: bool,
    /// An A2A push notification config: sent as A2A says, not as a Standard Webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a: Option<A2aPush>,
    /// One of the app's own webhooks (its `agentd.yaml`), not the caller's: its URL and what
    /// happened to it are shown to admins only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub app: bool,
}

/// An A2A push notification config (`TaskPushNotificationConfig`): the receiver gets the
/// task's final status as a `StreamResponse`, with `X-A2A-Notification-Token: <token>` and
/// `Authorization: <scheme> <credentials>` when the config has them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct A2aPush {
    /// The config's id (unique within its task).
    pub id: String,
    pub task_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scheme: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub credentials: String,
}

/// The most an A2A token or credential may hold.
const MAX_SECRET: usize = 4096;

fn yes() -> bool {
    true
}

/// The server's webhook settings (flags).
#[derive(Debug, Clone, Default)]
pub struct WebhookPolicy {
    /// `--webhook-allow-private`: what every webhook may reach besides public addresses.
    pub allow_private: Vec<String>,
    /// `--webhook-secret`: the secret of webhooks that name none.
    pub default_secret: Option<String>,
}

/// Why a webhook was refused: a stable code and a sentence.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetError {
    pub code: ErrorCode,
    pub message: String,
}

fn refuse(code: ErrorCode, message: impl Into<String>) -> TargetError {
    TargetError {
        code,
        message: message.into(),
    }
}

impl WebhookPolicy {
    /// The egress rules for a target: the server's plus the target's own.
    pub fn egress(&self, extra: &[String]) -> Result<EgressPolicy, String> {
        let all: Vec<String> = self.allow_private.iter().chain(extra).cloned().collect();
        EgressPolicy::parse(&all)
    }

    /// Checks a run request's webhook (no DNS: see [`check_resolves`]).
    pub fn target(&self, spec: &WebhookSpec) -> Result<WebhookTarget, TargetError> {
        self.build(
            &spec.url,
            spec.secret.as_deref(),
            spec.events.as_deref(),
            spec.include_text,
            vec![],
        )
    }

    /// Checks an app's webhook (at start).
    pub fn app_target(&self, hook: &AppWebhook) -> Result<WebhookTarget, TargetError> {
        let target = self.build(
            &hook.url,
            hook.secret.as_deref(),
            hook.events.as_deref(),
            hook.include_text,
            hook.allow_private.clone(),
        )?;
        Ok(WebhookTarget {
            app: true,
            ..target
        })
    }

    /// Checks an A2A push notification config: the URL as any webhook's; every end of the
    /// task is sent.
    pub fn a2a_target(&self, url: &str, push: A2aPush) -> Result<WebhookTarget, TargetError> {
        let too_long = [&push.id, &push.token, &push.scheme, &push.credentials]
            .iter()
            .any(|s| s.len() > MAX_SECRET);
        if too_long || push.id.chars().any(char::is_control) {
            return Err(refuse(
                ErrorCode::WebhookUrlInvalid,
                format!("a push config's id, token and credentials have at most {MAX_SECRET} characters"),
            ));
        }
        let bad_header = [&push.token, &push.scheme, &push.credentials]
            .iter()
            .any(|s| reqwest::header::HeaderValue::from_str(s).is_err());
        if bad_header {
            return Err(refuse(
                ErrorCode::WebhookUrlInvalid,
                "a push config's token and credentials must be valid header text",
            ));
        }
        let url = self.check_url(url, &[])?;
        Ok(WebhookTarget {
            url,
            secret: String::new(),
            events: EVENTS.iter().map(|e| e.to_string()).collect(),
            allow_private: vec![],
            include_text: false,
            a2a: Some(push),
            app: false,
        })
    }

    /// A webhook URL, checked (http(s), a host, no address the policy forbids).
    fn check_url(&self, url: &str, allow_private: &[String]) -> Result<String, TargetError> {
        if url.len() > MAX_URL {
            return Err(refuse(
                ErrorCode::WebhookUrlInvalid,
                format!("a webhook URL has at most {MAX_URL} characters"),
            ));
        }
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| refuse(ErrorCode::WebhookUrlInvalid, format!("not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(refuse(
                ErrorCode::WebhookUrlInvalid,
                "a webhook URL is http:// or https:// with a host",
            ));
        }
        let egress = self
            .egress(allow_private)
            .map_err(|e| refuse(ErrorCode::WebhookUrlInvalid, e))?;
        egress.check_url(&parsed).map_err(refused)?;
        Ok(parsed.to_string())
    }

    fn build(
        &self,
        url: &str,
        secret: Option<&str>,
        events: Option<&[String]>,
        include_text: Option<bool>,
        allow_private: Vec<String>,
    ) -> Result<WebhookTarget, TargetError> {
        let url = self.check_url(url, &allow_private)?;
        let events = match events {
            None => EVENTS.iter().map(|e| e.to_string()).collect(),
            Some([]) => {
                return Err(refuse(
                    ErrorCode::WebhookEventUnknown,
                    "events must name at least one event",
                ))
            }
            Some(list) => {
                if let Some(bad) = list.iter().find(|e| !EVENTS.contains(&e.as_str())) {
                    return Err(refuse(
                        ErrorCode::WebhookEventUnknown,
                        format!(
                            "unknown event {bad:?}; the events are {}",
                            EVENTS.join(", ")
                        ),
                    ));
                }
                let mut list = list.to_vec();
                list.dedup();
                list
            }
        };
        let secret = secret.or(self.default_secret.as_deref()).ok_or_else(|| {
            refuse(
                ErrorCode::WebhookSecretRequired,
                "a webhook needs a `secret` (whsec_…): this server has no --webhook-secret",
            )
        })?;
        decode_secret(secret).map_err(|e| refuse(ErrorCode::WebhookSecretInvalid, e))?;
        Ok(WebhookTarget {
            url,
            secret: secret.to_string(),
            events,
            allow_private,
            include_text: include_text.unwrap_or(true),
            a2a: None,
            app: false,
        })
    }
}

fn refused(r: crate::tools::egress::Refused) -> TargetError {
    refuse(ErrorCode::WebhookUrlRefused, refusal(&r))
}

/// Why a webhook may not reach an address, and what allows it. The address the name resolved
/// to, and its class, go to the log only: a caller must not map internal names through it.
pub(super) fn refusal(r: &crate::tools::egress::Refused) -> String {
    tracing::info!(host = %r.host, addr = %r.addr, class = r.class, "webhook host refused");
    format!(
        "the webhook's host {} is not a public address; allow it with --webhook-allow-private \
         (or an app webhook's allow_private)",
        r.host
    )
}

/// Resolves the target's host now and refuses one that only reaches addresses the policy
/// forbids (the sender checks again at connect time, so a name that changes later cannot
/// slip through).
pub async fn check_resolves(
    policy: &WebhookPolicy,
    target: &WebhookTarget,
) -> Result<(), TargetError> {
    let Ok(url) = reqwest::Url::parse(&target.url) else {
        return Err(refuse(ErrorCode::WebhookUrlInvalid, "not a URL"));
    };
    let host = url.host_str().unwrap_or("").trim_matches(['[', ']']);
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(()); // checked without DNS
    }
    let egress = policy
        .egress(&target.allow_private)
        .map_err(|e| refuse(ErrorCode::WebhookUrlInvalid, e))?;
    match egress.resolve(host).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            match e
                .into_inner()
                .and_then(|inner| inner.downcast::<crate::tools::egress::Refused>().ok())
            {
                Some(r) => Err(refused(*r)),
                None => Err(refuse(
                    ErrorCode::WebhookUrlRefused,
                    format!("the webhook's host {host} is not a public address"),
                )),
            }
        }
        // Answered as a private address is (the resolver's words go to the log): "does not
        // resolve" and "is private" must not tell internal names apart.
        Err(e) => {
            tracing::info!(host, error = %e, "webhook host does not resolve");
            Err(refuse(
                ErrorCode::WebhookUrlRefused,
                format!(
                    "the webhook's host {host} is not a public address; allow it with \
                     --webhook-allow-private (or an app webhook's allow_private)"
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn spec(url: &str) -> WebhookSpec {
        WebhookSpec {
            url: url.into(),
            secret: Some(SECRET.into()),
            events: None,
            include_text: None,
        }
    }

    #[test]
    fn checks() {
        let p = WebhookPolicy::default();
        let t = p.target(&spec("https://example.com/hook")).unwrap();
        assert_eq!(t.events.len(), 4);
        assert!(t.include_text);
        let code = |s: WebhookSpec| p.target(&s).unwrap_err().code;
        assert_eq!(
            code(spec("ftp://example.com/")),
            ErrorCode::WebhookUrlInvalid
        );
        assert_eq!(code(spec("not a url")), ErrorCode::WebhookUrlInvalid);
        assert_eq!(
            code(spec("http://127.0.0.1:9/x")),
            ErrorCode::WebhookUrlRefused
        );
        assert_eq!(code(spec("http://[::1]/x")), ErrorCode::WebhookUrlRefused);
        assert_eq!(
            code(spec("http://169.254.169.254/")),
            ErrorCode::WebhookUrlRefused
        );
        let mut s = spec("https://example.com/");
        s.secret = Some("hunter2".into());
        assert_eq!(code(s), ErrorCode::WebhookSecretInvalid);
        let mut s = spec("https://example.com/");
        s.secret = None;
        assert_eq!(code(s), ErrorCode::WebhookSecretRequired);
        let mut s = spec("https://example.com/");
        s.events = Some(vec!["run.exploded".into()]);
        assert_eq!(code(s), ErrorCode::WebhookEventUnknown);
        let allowed = WebhookPolicy {
            allow_private: vec!["127.0.0.1".into()],
            default_secret: Some(SECRET.into()),
        };
        let mut s = spec("http://127.0.0.1:9/x");
        s.secret = None;
        assert_eq!(allowed.target(&s).unwrap().secret, SECRET);
    }
}
