//! The door: authentication, the cross-site check, per-caller rate limits, and binding every
//! route that names an app or a user to what the caller may touch.
//!
//! Runs after routing (it is a route layer), so it sees the route's `{app}`, `{user}` and
//! `{session}` parameters. Another user's data answers exactly as missing data does (404), so
//! a caller learns nothing about what it may not see. Routes that name the user in the body
//! (`/run`, `/run_sse`) and routes that name a run (`/runs/{id}…`) check with
//! [`Caller::may_access`] once they know the owner.

use super::error::ApiError;
use super::AppState;
use crate::auth::{AuthError, Authenticator, Caller};
use crate::error_code::ErrorCode;
use axum::extract::{ConnectInfo, FromRequestParts, RawPathParams, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

/// Routes any prober may call: liveness, readiness, the version.
/// Open to anyone: probes, and the API's description (it says what the routes are, not what
/// they hold).
const OPEN_PATHS: &[&str] = &[
    "/health",
    "/ready",
    "/version",
    "/openapi.json",
    "/docs",
    "/docs/",
    "/docs/swagger-ui-bundle.js",
    "/docs/swagger-ui.css",
    "/docs/favicon-32x32.png",
];

/// Whether `path` is an A2A agent card: open to anyone with `--a2a-public-cards`, as public
/// discovery documents are (a card says what an app is and how to call it, never what any
/// user holds); otherwise behind the door like every route, so a key limited to some apps
/// cannot read the others' cards.
fn is_agent_card(path: &str) -> bool {
    path == "/.well-known/agent-card.json"
        || (path.starts_with("/a2a/") && path.ends_with("/.well-known/agent-card.json"))
}

type Limiter = governor::DefaultKeyedRateLimiter<String>;

/// What the door needs; one per server.
pub struct Gate {
    pub auth: Authenticator,
    limiter: Option<Limiter>,
    checks: AtomicU64,
    protect_metrics: bool,
    /// `--a2a-public-cards`: agent cards answer without credentials.
    public_cards: bool,
    allow_origins: Vec<String>,
    pub allow_client_app_state: bool,
    /// No authentication on a loopback bind: only loopback host names are answered.
    loopback_only: bool,
    max_body_bytes: usize,
    /// Failed authentications per client address (`--auth-failures-per-ip`): a stream of bad
    /// credentials does not turn into a stream of key lookups.
    failures: Option<Limiter>,
    /// Addresses over their failure budget, until when (bounded: expired ones are dropped).
    blocked: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, std::time::Instant>>,
}

/// Addresses remembered as blocked at most.
const MAX_BLOCKED: usize = 100_000;

impl Gate {
    pub fn new(auth: Authenticator, args: &crate::config::ServeArgs) -> Self {
        let sec = &args.security;
        let allow_origins = &args.allow_origins;
        let limiter = NonZeroU32::new(sec.rate_limit_rps).map(|rps| {
            let burst = sec
                .rate_limit_burst
                .and_then(NonZeroU32::new)
                .unwrap_or(rps);
            governor::RateLimiter::keyed(governor::Quota::per_second(rps).allow_burst(burst))
        });
        // A burst of five seconds' worth: honest mistakes pass, a guessing loop does not.
        let failures = NonZeroU32::new(sec.auth_failures_per_ip).map(|n| {
            let burst = NonZeroU32::new(n.get().saturating_mul(5)).unwrap_or(n);
            governor::RateLimiter::keyed(governor::Quota::per_second(n).allow_burst(burst))
        });
        Gate {
            loopback_only: auth.is_off() && args.bind.ip().is_loopback(),
            max_body_bytes: args.max_body_bytes,
            failures,
            blocked: Default::default(),
            auth,
            limiter,
            checks: AtomicU64::new(0),
            protect_metrics: sec.protect_metrics,
            public_cards: args.interop.a2a_public_cards,
            allow_origins: allow_origins.iter().map(|o| o.trim().to_string()).collect(),
            allow_client_app_state: sec.allow_client_app_state,
        }
    }

    /// Seconds until `key` may send again, if it is over its rate.
    fn over_rate(&self, key: String) -> Option<u64> {
        let limiter = self.limiter.as_ref()?;
        // Forget callers whose budget is full again, so the table stays as small as the set
        // of recently active callers.
        if self.checks.fetch_add(1, Ordering::Relaxed) % 4096 == 4095 {
            limiter.retain_recent();
        }
        match limiter.check_key(&key) {
            Ok(()) => None,
            Err(not_until) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                Some(wait.as_secs_f64().ceil().max(1.0) as u64)
            }
        }
    }

    /// Whether `ip` spent its budget of failed authentications (and until when it waits).
    fn blocked_for(&self, ip: std::net::IpAddr) -> Option<u64> {
        let blocked = self.blocked.lock().unwrap_or_else(|p| p.into_inner());
        let until = *blocked.get(&ip)?;
        let left = until.checked_duration_since(std::time::Instant::now())?;
        Some(left.as_secs_f64().ceil().max(1.0) as u64)
    }

    /// Counts a failed authentication from `ip`.
    fn failed(&self, ip: std::net::IpAddr) {
        let Some(failures) = &self.failures else {
            return;
        };
        if let Err(not_until) = failures.check_key(&ip.to_string()) {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            let now = std::time::Instant::now();
            let mut blocked = self.blocked.lock().unwrap_or_else(|p| p.into_inner());
            if blocked.len() >= MAX_BLOCKED {
                blocked.retain(|_, until| *until > now);
            }
            if blocked.len() < MAX_BLOCKED {
                blocked.insert(ip, now + wait.max(std::time::Duration::from_secs(1)));
            }
        }
        if self.checks.fetch_add(1, Ordering::Relaxed) % 4096 == 4095 {
            failures.retain_recent();
        }
    }

    /// Without authentication on a loopback bind, only loopback host names are answered: a
    /// web page whose own name was re-pointed at 127.0.0.1 (DNS rebinding) is same-origin to
    /// the browser, so the Origin check cannot see it, but its `Host` gives it away.
    fn foreign_host(&self, headers: &HeaderMap) -> bool {
        if !self.loopback_only {
            return false;
        }
        let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
            return false;
        };
        let name = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => host.rsplit_once(':').map_or(host, |(h, _)| h),
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let loopback = name == "localhost"
            || name.ends_with(".localhost")
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        !loopback
    }

    /// A state-changing request a browser sent from another site without credentials of its
    /// own (it could only ride on the user's network position): refused, as ADK's server does.
    ///
    /// Only a credential this server checks exempts a request: a `Bearer` token or an
    /// `x-api-key`, and only with authentication on. A browser attaches cached `Basic` or
    /// `Digest` credentials (say, for a proxy in front of agentd) to a cross-site request by
    /// itself, and with `--auth none` nothing checks a bearer token either, so neither tells
    /// a page's forged request from the user's own.
    fn cross_site(&self, method: &Method, headers: &HeaderMap) -> bool {
        if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return false;
        }
        if !self.auth.is_off() && credentials(headers).is_some_and(|t| !t.trim().is_empty()) {
            return false;
        }
        let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) else {
            // No Origin: not a browser's cross-site request, unless Fetch metadata says so.
            return headers
                .get("sec-fetch-site")
                .is_some_and(|v| v.as_bytes() == b"cross-site");
        };
        if self.allow_origins.iter().any(|o| o == "*" || o == origin) {
            return false;
        }
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        let origin_host = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        !matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
    }
}

/// The bearer token or API key a request presents. Any other `Authorization` scheme
/// (`Basic`, `Digest`: what a browser may send on its own) presents none, even next to an
/// `x-api-key`.
fn credentials(headers: &HeaderMap) -> Option<&str> {
    if let Some(auth) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let (scheme, token) = auth.trim().split_once(' ').unwrap_or((auth, ""));
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then_some(token.trim());
    }
    headers.get("x-api-key").and_then(|v| v.to_str().ok())
}

fn unauthenticated(e: AuthError) -> Response {
    let err = ApiError::new(e.code(), e.to_string());
    let challenge = err.status == StatusCode::UNAUTHORIZED;
    let mut resp = err.into_response();
    if challenge {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    resp
}

/// 404 for an app that does not exist, or that the caller may not use (worded the same):
/// ADK's sentence, then the apps the caller may use, and, without authentication, the apps
/// directory they come from.
pub fn app_hidden(apps: &crate::apps::AppRegistry, caller: &Caller, app: &str) -> ApiError {
    let served: Vec<&str> = apps.names().filter(|a| caller.may_use_app(a)).collect();
    let mut hint = match served.is_empty() {
        true => " No app is served to this caller".to_string(),
        false => format!(" Served apps: {}", served.join(", ")),
    };
    // Where the apps come from, only without authentication (a developer's own server):
    // a place on disk is nothing to show a caller of a deployed one, admins included.
    if caller.via == crate::auth::Via::Nobody {
        hint.push_str(&format!(" (from {})", apps.dir.display()));
    }
    let mut e = ApiError::app_not_found(app);
    if let serde_json::Value::String(detail) = &mut e.detail {
        detail.push_str(&hint);
        detail.push('.');
    }
    e
}

/// The door in front of every route: open paths pass; then the host and origin checks, the
/// per-address block after failed authentications, authentication, the rate limit, the admin
/// check of `/metrics`, the path's `{app}`/`{user}`/`{session}` bound to the caller, and the
/// body limit. The caller goes to the handler as a request extension.
pub async fn guard(
    State(state): State<AppState>,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
    mut req: Request<axum::body::Body>,
    next: Next,
) -> Response {
    let gate = &state.gate;
    if gate.is_open(req.uri().path()) {
        return next.run(req).await;
    }
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip());
    let caller = match gate.check_origin(&req) {
        Ok(()) => match gate.admit(req.headers(), peer).await {
            Ok(caller) => caller,
            Err(refused) => return refused,
        },
        Err(e) => return e.into_response(),
    };
    let checked = gate
        .check_rate(&caller, peer)
        .and_then(|()| check_metrics(req.uri().path(), &caller))
        .and_then(|()| bind_params(&state.apps, &caller, params));
    if let Err(e) = checked {
        return e.into_response();
    }
    if let Some(declared) = super::body_limit::oversize(&req, gate.max_body_bytes) {
        return super::body_limit::drain_and_refuse(req, declared, gate.max_body_bytes).await;
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

impl Gate {
    /// Paths open to anyone: the probes and the document, `/metrics` unless protected, agent
    /// cards when they are public.
    fn is_open(&self, path: &str) -> bool {
        OPEN_PATHS.contains(&path)
            || (path == "/metrics" && !self.protect_metrics)
            || (self.public_cards && is_agent_card(path))
    }

    /// The DNS-rebinding and cross-site checks.
    fn check_origin(&self, req: &Request<axum::body::Body>) -> Result<(), ApiError> {
        if self.foreign_host(req.headers()) {
            return Err(ApiError::new(
                ErrorCode::HostForbidden,
                "Without authentication agentd answers only to localhost names (protection \
                 against DNS rebinding); use --auth, or bind a non-loopback address with \
                 --allow-unauthenticated.",
            ));
        }
        if self.cross_site(req.method(), req.headers()) {
            return Err(ApiError::new(
                ErrorCode::CrossOriginForbidden,
                "A state-changing request from another origin needs an allowed origin \
                 (--allow-origin), or, with --auth on, a bearer token or API key.",
            ));
        }
        Ok(())
    }

    /// Authenticates the request's credentials, unless its address is blocked for failing too
    /// often; a failure counts against the address.
    async fn admit(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Result<Caller, Response> {
        if let Some(wait) = peer.and_then(|ip| self.blocked_for(ip)) {
            let msg =
                format!("Too many failed authentications from this address; retry in {wait} s.");
            let err = ApiError::new(ErrorCode::TooManyAuthFailures, msg).retry_after(wait);
            return Err(err.into_response());
        }
        self.auth
            .authenticate(credentials(headers))
            .await
            .map_err(|e| {
                if let (Some(ip), false) = (peer, e == AuthError::Unavailable) {
                    self.failed(ip);
                }
                unauthenticated(e)
            })
    }

    /// The request rate per caller (or, for a caller without a key, per address).
    fn check_rate(&self, caller: &Caller, peer: Option<IpAddr>) -> Result<(), ApiError> {
        let limit_key = caller
            .limit_key()
            .or_else(|| peer.map(|ip| format!("ip:{ip}")));
        match limit_key.and_then(|k| self.over_rate(k)) {
            Some(wait) => {
                metrics::counter!("agentd_rate_limited_total").increment(1);
                let msg = format!("Too many requests; retry in {wait} s.");
                Err(ApiError::new(ErrorCode::RateLimited, msg).retry_after(wait))
            }
            None => Ok(()),
        }
    }
}

/// A protected `/metrics` needs an admin key.
fn check_metrics(path: &str, caller: &Caller) -> Result<(), ApiError> {
    if path == "/metrics" && !caller.admin {
        return Err(admin_required(caller, "/metrics"));
    }
    Ok(())
}

/// 403 for what only an admin key may do, saying how to get one: without authentication
/// there are no keys, so nobody is an admin.
pub fn admin_required(caller: &Caller, what: &str) -> ApiError {
    let how = match caller.via {
        crate::auth::Via::Nobody => {
            " This server runs without authentication (--auth none), where nobody is an admin: \
             start it with --auth api-key and make an admin key with \
             `agentd keys create --user <id> --admin`."
        }
        _ => " Make one with `agentd keys create --user <id> --admin`.",
    };
    ApiError::new(
        ErrorCode::AdminRequired,
        format!("{what} needs an admin key.{how}"),
    )
}

/// Passes an admin; anyone else gets [`admin_required`] for `what`.
pub fn require_admin(caller: &Caller, what: &str) -> Result<(), ApiError> {
    match caller.may_see_internals() {
        true => Ok(()),
        false => Err(admin_required(caller, what)),
    }
}

/// The app's entry, when it is served; else the 404 of [`app_hidden`] (the door already hid
/// the apps the caller may not use).
pub fn served_app<'a>(
    state: &'a AppState,
    caller: &Caller,
    app: &str,
) -> Result<&'a crate::apps::AppEntry, ApiError> {
    state
        .apps
        .get(app)
        .ok_or_else(|| app_hidden(&state.apps, caller, app))
}

/// The path's `{app}`, `{user}` and `{session}`, bound to the caller: an app it may not use
/// does not exist, nor does another user (or, on a session's route, that user's session). A
/// parameter the door cannot read never passes unchecked.
fn bind_params(
    apps: &crate::apps::AppRegistry,
    caller: &Caller,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
) -> Result<(), ApiError> {
    let params = match params {
        Ok(params) => params,
        // No parameters on this route (or the fallback).
        Err(axum::extract::rejection::RawPathParamsRejection::MissingPathParams(_)) => {
            return Ok(())
        }
        Err(e) => return Err(ApiError::new(ErrorCode::InvalidPath, e.body_text())),
    };
    let has_session = params.iter().any(|(name, _)| name == "session");
    for (name, value) in params.iter() {
        if name == "app" && !caller.may_use_app(value) {
            return Err(app_hidden(apps, caller, value));
        }
    }
    for (name, value) in params.iter() {
        if name == "user" && !caller.may_act_as(value) {
            return Err(match has_session {
                true => ApiError::session_not_found(),
                false => ApiError::new(ErrorCode::NotFound, "Not Found"),
            });
        }
    }
    Ok(())
}

/// The caller the door let in (handlers behind [`guard`] always have one).
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::new(ErrorCode::Unauthenticated, "missing credentials"))
    }
}

/// Whether `caller` may write state under the `app:` prefix (shared by every user of the app
/// and rendered into their instructions).
/// Without authentication every caller is already trusted with every user's data, so there
/// is no boundary to protect and ADK clients keep working.
pub fn may_write_app_state(gate: &Gate, caller: &Caller) -> bool {
    caller.admin || gate.allow_client_app_state || caller.via == crate::auth::Via::Nobody
}

/// 403 for a client write of `app:` state.
pub fn app_state_forbidden() -> ApiError {
    ApiError::new(
        ErrorCode::AppStateForbidden,
        "`app:` state is shared by every user of the app; writing it needs an admin key \
         (or --allow-client-app-state).",
    )
}

/// Checks a delta (PATCH body, create-session state, a run's `stateDelta`) for `app:` keys.
pub fn check_app_state<'a>(
    gate: &Gate,
    caller: &Caller,
    mut keys: impl Iterator<Item = &'a String>,
) -> Result<(), ApiError> {
    if !may_write_app_state(gate, caller) && keys.any(|k| k.starts_with("app:")) {
        return Err(app_state_forbidden());
    }
    Ok(())
}
