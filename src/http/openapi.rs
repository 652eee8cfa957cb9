//! The OpenAPI 3.1 document (`GET /openapi.json`) and its interactive page (`GET /docs`).
//!
//! The document is generated from the code. Every documented handler carries a
//! `#[utoipa::path]` annotation and is put on the router by `utoipa_axum::routes!` from that
//! same annotation, so a documented route cannot be missing from the router and a route put
//! there that way cannot be missing from the document. The routes axum registers directly are
//! the artifact wildcard (OpenAPI has no wildcard segments; `artifacts.rs` adds its entry) and
//! this module's two pages (documented here). `tests/openapi.rs` checks that every route answers as
//! documented, with schemathesis against both backends.
//!
//! The page's assets (Swagger UI) are compiled into the binary from `assets/swagger-ui/`: a
//! deployment behind a firewall, or a browser without Internet access, still gets the page.

use super::AppState;
use crate::error_code::{ErrorCode, Retry};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::header::Header;
use utoipa::openapi::response::Response as DocResponse;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{IntoResponses, Modify, OpenApi, ToSchema};

/// The document's fixed parts; the paths come from the routers (see `http::router`).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "agentd",
        description = "An HTTP/SSE agent-serving daemon, wire-compatible with Google ADK's \
            `adk api_server`, plus agentd's additions (event seqs, resume, run control, \
            pagination, authentication) and the AI SDK, AG-UI and OpenAI protocols.\n\n\
            Errors are JSON `{\"detail\": …, \"code\": …}`; `code` is stable and \
            machine-readable, `detail` is a message or, for 422, a list of problems.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    paths(openapi_doc, docs_page),
    components(schemas(ErrorBody, ValidationProblem, OpenAiErrorBody, A2aErrorBody)),
    modifiers(&Security),
    tags(
        (name = "service", description = "Health, readiness, version, metrics, this document."),
        (name = "apps", description = "The apps (agents) this server serves."),
        (name = "sessions", description = "ADK's session routes plus paging and event seqs."),
        (name = "artifacts", description = "Versioned files a session's agents saved."),
        (name = "memory", description = "Long-term memory across a user's sessions."),
        (name = "runs", description = "Running an agent, following, re-attaching and cancelling runs."),
        (name = "usage", description = "What users spent (tokens, cost) and may spend (budgets)."),
        (name = "ai-sdk", description = "The Vercel AI SDK's UI message stream protocol."),
        (name = "ag-ui", description = "The AG-UI protocol (CopilotKit and other AG-UI clients)."),
        (name = "openai", description = "OpenAI's Chat Completions and Responses APIs; `model` is the app."),
        (name = "a2a", description = "The A2A protocol (JSON-RPC and HTTP+JSON bindings) for other agents."),
        (name = "schedules", description = "Runs started on a schedule (cron), without a client."),
        (name = "evals", description = "Eval sets, their cases, and runs of them with their results."),
        (name = "web-ui", description = "ADK's dev-server trace routes, which ADK's web UI reads."),
    )
)]
pub struct ApiDoc;

/// API keys (`x-api-key` or `Authorization: Bearer`) and JWTs, when the server runs with
/// `--auth`; with `--auth none` nothing is asked.
struct Security;

impl Modify for Security {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "apiKey",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "x-api-key",
                "An agentd API key (`agentd keys create`).",
            ))),
        );
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An agentd API key, or a JWT when `--auth jwt` is on."))
                    .build(),
            ),
        );
    }
}

/// A2A's error body: a `google.rpc.Status` (`{"error": {"code", "status", "message",
/// "details"}}`) from the routes, or agentd's `{"detail", "code"}` from the door.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct A2aErrorBody(serde_json::Map<String, Value>);

/// Every error: a stable `code` and a human-readable `detail`.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct ErrorBody {
    /// A message, or (422 `validation_error`) the list of problems found.
    detail: ErrorDetail,
    /// Stable and machine-readable (the table in docs/api.md), e.g. `session_not_found`,
    /// `session_busy`.
    code: String,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum ErrorDetail {
    Message(String),
    Problems(Vec<ValidationProblem>),
}

/// One problem with the request, FastAPI style.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct ValidationProblem {
    #[serde(rename = "type")]
    kind: String,
    /// Where: `["body", "sessionId"]`, `["query", "limit"]`, …
    loc: Vec<Value>,
    msg: String,
}

/// The OpenAI routes' errors: agentd's body plus OpenAI's `error` object, which the OpenAI
/// SDKs read (an authentication failure, answered before the route, has only agentd's part).
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct OpenAiErrorBody {
    detail: ErrorDetail,
    code: String,
    #[schema(nullable = false)]
    error: Option<OpenAiError>,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct OpenAiError {
    message: String,
    /// `invalid_request_error` or `server_error`.
    #[serde(rename = "type")]
    kind: String,
    code: Option<String>,
    param: Option<String>,
}

/// The errors every route may answer, each with an [`ErrorBody`].
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum Errors {
    /// The request was refused and changed nothing (bad input, unknown resource, conflict,
    /// authentication, rate limit, size limit); `code` says which. 429 carries `Retry-After`.
    #[response(status = "4XX")]
    Client(ErrorBody),
    /// The server could not do it: 503 (`database_unavailable`, `shutting_down`, with
    /// `Retry-After`: safe to repeat) or 500 (`internal`, nothing leaked).
    #[response(status = "5XX")]
    Server(ErrorBody),
}

/// The OpenAI routes' errors.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum OpenAiErrors {
    /// The request was refused and changed nothing; `code` and `error.code` say why.
    #[response(status = "4XX")]
    Client(OpenAiErrorBody),
    /// The server could not do it (503 with `Retry-After` is safe to repeat).
    #[response(status = "5XX")]
    Server(OpenAiErrorBody),
}

/// The codes every route may answer because of the door in front of it (authentication,
/// origin and host checks, rate limits, the body limit, reading the body and the path) or the
/// server behind it (the database, a fault): added to every operation by [`add_door_errors`].
pub const DOOR_ERRORS: &[ErrorCode] = &[
    ErrorCode::Unauthenticated,
    ErrorCode::InvalidApiKey,
    ErrorCode::ApiKeyRevoked,
    ErrorCode::ApiKeyExpired,
    ErrorCode::TokenExpired,
    ErrorCode::InvalidToken,
    ErrorCode::AuthUnavailable,
    ErrorCode::HostForbidden,
    ErrorCode::CrossOriginForbidden,
    ErrorCode::TooManyAuthFailures,
    ErrorCode::RateLimited,
    ErrorCode::PayloadTooLarge,
    ErrorCode::BodyUnreadable,
    ErrorCode::UnsupportedContentType,
    ErrorCode::BodyTooComplex,
    ErrorCode::JsonInvalid,
    ErrorCode::InvalidUtf8,
    ErrorCode::NulCharacter,
    ErrorCode::InvalidPath,
    ErrorCode::MethodNotAllowed,
    ErrorCode::Internal,
    ErrorCode::DatabaseBusy,
    ErrorCode::DatabaseUnavailable,
];

/// The vendor extension on an error response that lists its codes, for clients and for the
/// tests that hold the document against what routes answer.
pub const CODES_EXTENSION: &str = "x-error-codes";

/// Declares the error codes one or more operations answer (beyond [`DOOR_ERRORS`]), as a type
/// their `#[utoipa::path(responses(…))]` names: one response per status, each code listed
/// with its meaning and an example body. `error_set!(Name as "OpenAiErrorBody": …)` documents
/// another body schema.
macro_rules! error_set {
    ($(#[$doc:meta])* $name:ident $(as $body:literal)?: $($code:ident),+ $(,)?) => {
        $(#[$doc])*
        pub(crate) struct $name;

        impl utoipa::IntoResponses for $name {
            fn responses() -> std::collections::BTreeMap<
                String,
                utoipa::openapi::RefOr<utoipa::openapi::response::Response>,
            > {
                $crate::http::openapi::error_responses(
                    &[$($crate::error_code::ErrorCode::$code),+],
                    $crate::http::openapi::error_set!(@body $($body)?),
                )
            }
        }
    };
    (@body) => { "ErrorBody" };
    (@body $body:literal) => { $body };
}
pub(crate) use error_set;

/// The responses of an operation that answers `codes` with `body`: one per status.
pub fn error_responses(codes: &[ErrorCode], body: &str) -> BTreeMap<String, RefOr<DocResponse>> {
    let mut out = BTreeMap::new();
    for code in codes {
        add_code(&mut out, *code, body);
    }
    out
}

fn add_code(responses: &mut BTreeMap<String, RefOr<DocResponse>>, code: ErrorCode, body: &str) {
    let status = code.status().to_string();
    let entry = responses
        .entry(status)
        .or_insert_with(|| RefOr::T(DocResponse::new("")));
    let RefOr::T(resp) = entry else {
        return;
    };
    let listed = resp
        .extensions
        .get_or_insert_with(Default::default)
        .entry(CODES_EXTENSION.to_string())
        .or_insert_with(|| Value::Array(vec![]));
    let Value::Array(list) = listed else {
        return;
    };
    if list.iter().any(|c| c == code.as_str()) {
        return;
    }
    list.push(Value::String(code.as_str().into()));
    if !resp.description.is_empty() {
        resp.description.push_str("\n\n");
    }
    resp.description
        .push_str(&format!("`{}`: {}", code.as_str(), code.meaning()));
    let content = resp
        .content
        .entry("application/json".to_string())
        .or_insert_with(|| {
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(body)))
                .build()
        });
    content.examples.insert(
        code.as_str().to_string(),
        RefOr::T(
            ExampleBuilder::new()
                .summary(code.as_str())
                .value(Some(
                    json!({"detail": code.meaning(), "code": code.as_str()}),
                ))
                .build(),
        ),
    );
    if code.retry() != Retry::No {
        resp.headers.insert(
            "Retry-After".to_string(),
            Header::new(
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::Integer),
            ),
        );
    }
}

/// Adds [`DOOR_ERRORS`] to every operation of `doc` (the door answers them before any route;
/// the OpenAI routes' bodies carry their `error` object too).
pub fn add_door_errors(doc: &mut utoipa::openapi::OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
            &mut item.head,
            &mut item.options,
        ];
        for op in ops.into_iter().flatten() {
            let openai = op.tags.iter().flatten().any(|t| t == "openai");
            let body = if openai {
                "OpenAiErrorBody"
            } else {
                "ErrorBody"
            };
            for code in DOOR_ERRORS {
                add_code(&mut op.responses.responses, *code, body);
            }
        }
    }
}

/// The response of the router's fallback, in the document's components: the codes a path no
/// operation has answers (`route_not_found`), which no operation can list.
pub const FALLBACK_RESPONSE: &str = "NoSuchRoute";

/// Adds [`FALLBACK_RESPONSE`] to `doc`'s components, so every stable code is in the document.
pub fn add_fallback_errors(doc: &mut utoipa::openapi::OpenApi) {
    let mut responses = error_responses(&[ErrorCode::RouteNotFound], "ErrorBody");
    let Some((_, response)) = responses.pop_first() else {
        return;
    };
    doc.components
        .get_or_insert_with(Default::default)
        .responses
        .insert(FALLBACK_RESPONSE.to_string(), response);
}

/// What a health or readiness probe answers.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// `ok` (`/health`) or `ready` (`/ready`).
    status: String,
    /// `/ready` only: how memory is searched, `hybrid` (by words and meaning) or `full-text`
    /// (PostgreSQL without pgvector).
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_search: Option<String>,
    /// `/ready` only, with `full-text`: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_search_note: Option<String>,
}

/// One event of a Server-Sent Events stream (OpenAPI 3.2's `itemSchema` for
/// `text/event-stream`, which schemathesis applies to each event); the operation's
/// description says what `data` holds. Keep-alives are comments (`:`), not events.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct EventStream {
    /// The payload: JSON for every agentd stream (`[DONE]` ends AI SDK and Chat Completions
    /// streams).
    data: String,
    /// The event's name (`message` when absent): e.g. `done`, `error`, `run_started`, or a
    /// Responses event type.
    #[schema(nullable = false)]
    event: Option<String>,
    /// A committed event's seq (agentd's streams), to resume with `Last-Event-ID`.
    #[schema(nullable = false)]
    id: Option<String>,
}

/// The routes of this module: the document, the page and its assets.
pub fn router(doc: &utoipa::openapi::OpenApi) -> Router<AppState> {
    let json = Bytes::from(doc.to_json().unwrap_or_else(|_| "{}".to_string()));
    Router::new()
        .route(
            "/openapi.json",
            get(move || {
                let json = json.clone();
                async move { ([(CONTENT_TYPE, "application/json")], json) }
            }),
        )
        .route(
            "/docs",
            get(|| async { asset(DOCS_HTML, "text/html; charset=utf-8") }),
        )
        .route("/docs/", get(|| async { Redirect::permanent("/docs") }))
        .route(
            "/docs/swagger-ui-bundle.js",
            get(|| async { asset(BUNDLE, "text/javascript") }),
        )
        .route(
            "/docs/swagger-ui.css",
            get(|| async { asset(CSS, "text/css") }),
        )
        .route(
            "/docs/favicon-32x32.png",
            get(|| async { asset(FAVICON, "image/png") }),
        )
}

const DOCS_HTML: &[u8] = br##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>agentd API</title>
<link rel="stylesheet" href="/docs/swagger-ui.css">
<link rel="icon" type="image/png" href="/docs/favicon-32x32.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  validatorUrl: null,
  tryItOutEnabled: false
});
</script>
</body>
</html>
"##;
const BUNDLE: &[u8] = include_bytes!("../../assets/swagger-ui/swagger-ui-bundle.js");
const CSS: &[u8] = include_bytes!("../../assets/swagger-ui/swagger-ui.css");
const FAVICON: &[u8] = include_bytes!("../../assets/swagger-ui/favicon-32x32.png");

fn asset(body: &'static [u8], content_type: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            (CACHE_CONTROL, "public, max-age=3600"),
        ],
        body,
    )
        .into_response()
}

// Hand-written entries for the routes axum registers directly.

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "service",
    responses((status = 200, description = "The OpenAPI 3.1 document.", body = Object))
)]
#[allow(dead_code)]
async fn openapi_doc() {}

/// This document as an interactive page (Swagger UI, served by agentd itself).
#[utoipa::path(
    get,
    path = "/docs",
    tag = "service",
    responses((status = 200, description = "An HTML page.", content_type = "text/html", body = String))
)]
#[allow(dead_code)]
async fn docs_page() {}

/// The path of a user's resources.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct UserPath {
    /// The app's name.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    app: String,
    /// The user's id (1 to 128 bytes of printable characters, no `/`).
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    user: String,
}

/// The path of a session.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct SessionPath {
    /// The app's name.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    app: String,
    /// The user's id.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    user: String,
    /// The session's id.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    session: String,
}

/// The path of an app's routes.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct AppPath {
    /// The app's name.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    app: String,
}

/// Who a frontend request acts for, when authentication is off (or an admin key acts for one).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub struct UserHeader {
    /// The user's id; else the protocol's user field is used.
    #[param(
        rename = "x-agentd-user-id",
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    user: Option<String>,
}

/// The path of one schedule.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct SchedulePath {
    /// The app's name.
    app: String,
    /// The user's id.
    user: String,
    /// The schedule's id (`sch-…`).
    schedule: String,
}
