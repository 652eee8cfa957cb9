//! Every stable error code agentd answers with, in one closed table: the HTTP status, the
//! `code` string clients match on, whether a `Retry-After` comes with it, and what it means.
//!
//! The table is the contract. `docs/api.md` lists every code (a test checks it), the OpenAPI
//! document lists each route's codes, and each wire renders the same [`ErrorCode`] its own
//! way (`http::error`: ADK/FastAPI `{detail, code}`, OpenAI `{error}`, JSON-RPC,
//! `google.rpc.Status`). It sits at the crate root, below every layer, so that the door's
//! errors, webhook and schedule checks can name their codes without reaching up into `http`.

/// Whether an answer with a code carries `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// No: repeating the same request gets the same answer.
    No,
    /// Always, with these seconds: the request did nothing and may be repeated.
    After(u64),
    /// Always, with seconds the answer computes (a rate limit's wait).
    Computed,
}

macro_rules! error_codes {
    ($($variant:ident = $status:literal, $code:literal, $retry:expr, $meaning:literal;)*) => {
        /// A stable error code (see the module docs).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $(#[doc = $meaning] $variant,)*
        }

        impl ErrorCode {
            /// Every code, in the table's order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The `code` string of the JSON body.
            pub const fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $code,)* }
            }

            /// The HTTP status of an answer with this code.
            pub const fn status(self) -> u16 {
                match self { $(ErrorCode::$variant => $status,)* }
            }

            /// Whether the answer carries `Retry-After`.
            pub const fn retry(self) -> Retry {
                match self { $(ErrorCode::$variant => $retry,)* }
            }

            /// What the code means, in one line.
            pub const fn meaning(self) -> &'static str {
                match self { $(ErrorCode::$variant => $meaning,)* }
            }
        }
    };
}

error_codes! {
    // Transport and request shape
    RouteNotFound = 404, "route_not_found", Retry::No, "No route has this path.";
    MethodNotAllowed = 405, "method_not_allowed", Retry::No, "The path exists, but not for this method.";
    PayloadTooLarge = 413, "payload_too_large", Retry::No, "The body is over `--max-body-bytes` (Connection: close).";
    BodyUnreadable = 400, "body_unreadable", Retry::No, "The body was cut off, too slow or broken.";
    BodyTooComplex = 413, "body_too_complex", Retry::No, "The body holds more JSON values than `--max-json-values`.";
    UnsupportedContentType = 415, "unsupported_content_type", Retry::No, "A body not labelled JSON.";
    JsonInvalid = 422, "json_invalid", Retry::No, "Malformed JSON (problem list).";
    InvalidUtf8 = 422, "invalid_utf8", Retry::No, "The body is not UTF-8 (problem list).";
    NulCharacter = 422, "nul_character", Retry::No, "A JSON string contains NUL (`\\u0000`) (problem list).";
    ValidationError = 422, "validation_error", Retry::No, "The body, query or header fails validation (problem list).";
    InvalidPath = 400, "invalid_path", Retry::No, "A path segment that cannot be read.";
    InvalidId = 400, "invalid_id", Retry::No, "An id is not 1 to 128 printable characters without `/`.";
    // The door: who calls, from where, how often, with what rights
    Unauthenticated = 401, "unauthenticated", Retry::No, "No credentials.";
    InvalidApiKey = 401, "invalid_api_key", Retry::No, "Unknown API key.";
    ApiKeyRevoked = 401, "api_key_revoked", Retry::No, "The API key was revoked.";
    ApiKeyExpired = 401, "api_key_expired", Retry::No, "The API key expired.";
    TokenExpired = 401, "token_expired", Retry::No, "The JWT expired.";
    InvalidToken = 401, "invalid_token", Retry::No, "The JWT failed verification.";
    AuthUnavailable = 503, "auth_unavailable", Retry::After(1), "Credentials cannot be checked right now.";
    HostForbidden = 403, "host_forbidden", Retry::No, "A non-localhost Host without auth (DNS rebinding).";
    CrossOriginForbidden = 403, "cross_origin_forbidden", Retry::No, "A state-changing request from a disallowed origin.";
    OriginForbidden = 403, "origin_forbidden", Retry::No, "An MCP request from a disallowed page origin.";
    NotAcceptable = 406, "not_acceptable", Retry::No, "The `Accept` header refuses what MCP answers (it must take `application/json` and `text/event-stream`).";
    InvalidMcpRequest = 400, "invalid_mcp_request", Retry::No, "An MCP request its transport refuses (e.g. an unsupported `MCP-Protocol-Version`).";
    TooManyAuthFailures = 429, "too_many_auth_failures", Retry::Computed, "This address is blocked after failed authentications.";
    RateLimited = 429, "rate_limited", Retry::Computed, "Over the request rate.";
    AdminRequired = 403, "admin_required", Retry::No, "Needs an admin key.";
    AppStateForbidden = 403, "app_state_forbidden", Retry::No, "Writing `app:` state needs an admin key.";
    UserForbidden = 403, "user_forbidden", Retry::No, "The key may not act for the named user.";
    UserRequired = 400, "user_required", Retry::No, "The request does not say which user it is for.";
    NotFound = 404, "not_found", Retry::No, "A user path the caller may not act as.";
    // Apps
    AppNotFound = 404, "app_not_found", Retry::No, "No such app, or one the caller may not use.";
    AppLoadFailed = 500, "app_load_failed", Retry::No, "The app's configuration failed to load.";
    NotLlmAgent = 400, "not_llm_agent", Retry::No, "The app's root is not an LlmAgent.";
    NoDefaultApp = 404, "no_default_app", Retry::No, "Several apps are served and no default A2A app is set.";
    // Sessions
    SessionNotFound = 404, "session_not_found", Retry::No, "No such session.";
    SessionExists = 409, "session_exists", Retry::No, "The session id is taken.";
    SessionBusy = 409, "session_busy", Retry::No, "Another run owns the session.";
    SessionBusyTimeout = 409, "session_busy_timeout", Retry::No, "The wait for the session's run timed out.";
    SessionChanged = 409, "session_changed", Retry::No, "The session was replaced during the read.";
    WriteConflict = 409, "write_conflict", Retry::No, "A concurrent write conflicted; retry.";
    InvalidInitialEvent = 400, "invalid_initial_event", Retry::No, "A seed event that a new session cannot hold.";
    OptionsUnsupported = 400, "options_unsupported", Retry::No, "Session options are not supported.";
    // Runs
    AppNameRequired = 400, "app_name_required", Retry::No, "`appName` is missing and there is no default app.";
    NewMessageRequired = 400, "new_message_required", Retry::No, "No `newMessage` and no resume.";
    InvocationNotFound = 404, "invocation_not_found", Retry::No, "The invocation is not in the session.";
    TurnNotFound = 404, "turn_not_found", Retry::No, "No user turn to regenerate.";
    EditAmbiguous = 400, "edit_ambiguous", Retry::No, "Edit options that conflict.";
    ShuttingDown = 503, "shutting_down", Retry::After(1), "The replica is draining.";
    TooManyRuns = 429, "too_many_runs", Retry::After(1), "The user's run quota is used up.";
    BudgetExhausted = 429, "budget_exhausted", Retry::Computed, "A token or cost budget of the run (the user's in the app, the app's, the API key's) is spent until its window resets (`Retry-After`).";
    BudgetNotFound = 404, "budget_not_found", Retry::No, "No budget is set there.";
    KeyNotFound = 404, "key_not_found", Retry::No, "No such API key.";
    RunNotFound = 404, "run_not_found", Retry::No, "No such run.";
    RunNotActive = 409, "run_not_active", Retry::No, "The run already ended.";
    NoActiveRun = 409, "no_active_run", Retry::No, "The session has no running run.";
    AfterBeyondEnd = 400, "after_beyond_end", Retry::No, "The resume point is past the last event.";
    RunFailed = 500, "run_failed", Retry::No, "The run failed (JSON `/run`; also the in-stream code).";
    RunCancelled = 499, "run_cancelled", Retry::No, "The run was cancelled (JSON `/run`).";
    // Edits (rewind, fork)
    ForkPointAmbiguous = 400, "fork_point_ambiguous", Retry::No, "Both fork points are given.";
    SeqOutOfRange = 422, "seq_out_of_range", Retry::No, "The seq is not in the session.";
    // Idempotency keys
    InvalidIdempotencyKey = 422, "invalid_idempotency_key", Retry::No, "A malformed `Idempotency-Key`.";
    IdempotencyKeyReused = 422, "idempotency_key_reused", Retry::No, "The key was used with another request.";
    IdempotencyKeyInProgress = 409, "idempotency_key_in_progress", Retry::After(1), "The key's first request is still in flight.";
    // Artifacts
    ArtifactNotFound = 404, "artifact_not_found", Retry::No, "No such artifact.";
    ArtifactVersionNotFound = 404, "artifact_version_not_found", Retry::No, "No such artifact version.";
    ArtifactTooLarge = 413, "artifact_too_large", Retry::No, "The artifact is over `--max-artifact-bytes`.";
    InvalidArtifact = 400, "invalid_artifact", Retry::No, "A bad artifact name or part.";
    InvalidVersion = 422, "invalid_version", Retry::No, "The version is not `latest` or an integer.";
    // Memory
    MemoryNotFound = 404, "memory_not_found", Retry::No, "No such memory.";
    MemoryExtractionFailed = 502, "memory_extraction_failed", Retry::After(5), "The app's extraction model failed, or did not answer as asked; the events it did not cover wait for the next add.";
    // Evals
    EvalSetNotFound = 404, "eval_set_not_found", Retry::No, "No such eval set in the app.";
    EvalCaseNotFound = 404, "eval_case_not_found", Retry::No, "No such eval case in the set.";
    EvalSetExists = 409, "eval_set_exists", Retry::No, "The app has an eval set of that id.";
    EvalCaseExists = 409, "eval_case_exists", Retry::No, "The set has an eval case of that id.";
    EvalLimitReached = 409, "eval_limit_reached", Retry::No, "The app has 1,000 eval sets, or the set 1,000 cases or 64 MiB of them: delete some first.";
    EvalCaseTooLarge = 413, "eval_case_too_large", Retry::No, "An eval case over 4 MiB of JSON (a session too long to copy whole).";
    EvalRunNotFound = 404, "eval_run_not_found", Retry::No, "No such eval run (eval result) in the app.";
    EvalSetEmpty = 422, "eval_set_empty", Retry::No, "The eval set has no cases to run.";
    InvalidEvalCriteria = 422, "invalid_eval_criteria", Retry::No, "The run's criteria or eval metrics cannot be used: an unknown metric, no threshold, or a mode agentd does not run.";
    TraceNotFound = 404, "trace_not_found", Retry::No, "No kept span made this event (spans are kept per replica, the latest `--trace-spans` of them).";
    TooManyEvalRuns = 429, "too_many_eval_runs", Retry::After(5), "The app has 8 eval runs in flight: wait for one to end, or cancel one.";
    // Schedules
    ScheduleNotFound = 404, "schedule_not_found", Retry::No, "No such schedule.";
    InvalidCron = 422, "invalid_cron", Retry::No, "A bad cron pattern.";
    InvalidTimezone = 422, "invalid_timezone", Retry::No, "An unknown time zone.";
    CronTooFrequent = 422, "cron_too_frequent", Retry::No, "The pattern fires more often than the server allows.";
    TooManySchedules = 429, "too_many_schedules", Retry::No, "The user's schedule quota is used up.";
    InvalidMessage = 422, "invalid_message", Retry::No, "A message that cannot be used.";
    InvalidCursor = 400, "invalid_cursor", Retry::No, "Not a cursor from this list.";
    // Webhooks
    WebhookUrlInvalid = 422, "webhook_url_invalid", Retry::No, "A bad webhook URL, token or credentials.";
    WebhookUrlRefused = 422, "webhook_url_refused", Retry::No, "The webhook host is a private address that is not allowed.";
    WebhookEventUnknown = 422, "webhook_event_unknown", Retry::No, "A webhook names no event, or an unknown one.";
    WebhookSecretRequired = 422, "webhook_secret_required", Retry::No, "The webhook needs a secret.";
    WebhookSecretInvalid = 422, "webhook_secret_invalid", Retry::No, "The webhook secret is malformed.";
    // Frontend protocols (AI SDK, AG-UI, OpenAI)
    TooManyParts = 422, "too_many_parts", Retry::No, "A message or event has more parts than `--max-message-parts`.";
    TooManyTools = 400, "too_many_tools", Retry::No, "Too many client tools.";
    InvalidTool = 400, "invalid_tool", Retry::No, "A client tool name that is bad, reserved or declared twice.";
    InvalidFile = 400, "invalid_file", Retry::No, "A file part that is not base64.";
    NoNewInput = 400, "no_new_input", Retry::No, "Nothing new to run.";
    TooManyMessages = 400, "too_many_messages", Retry::No, "Too many seed messages.";
    InvalidInput = 400, "invalid_input", Retry::No, "Responses `input` has the wrong shape.";
    ResponseNotFound = 404, "response_not_found", Retry::No, "No such response.";
    // The database and the server
    DatabaseBusy = 503, "database_busy", Retry::After(1), "The database pool is exhausted; retry.";
    DatabaseUnavailable = 503, "database_unavailable", Retry::After(1), "The database cannot be reached; retry.";
    Internal = 500, "internal", Retry::No, "Server fault (logged, nothing leaks).";
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn codes_are_distinct_snake_case_and_have_an_error_status() {
        let mut seen = HashSet::new();
        for code in ErrorCode::ALL {
            let s = code.as_str();
            assert!(seen.insert(s), "{s} twice");
            assert!(
                s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{s} is not snake_case"
            );
            assert!(
                (400..600).contains(&code.status()),
                "{s}: {}",
                code.status()
            );
            assert!(!code.meaning().is_empty(), "{s} has no meaning");
        }
        assert_eq!(ErrorCode::ALL.len(), 105);
    }

    /// docs/api.md's table of errors says what this table says, row for row.
    #[test]
    fn every_code_is_documented_in_the_api_page() {
        let page = include_str!("../docs/api.md");
        let mut missing = vec![];
        for code in ErrorCode::ALL {
            let retry = match code.retry() {
                Retry::No => String::new(),
                Retry::After(secs) => secs.to_string(),
                Retry::Computed => "computed".to_string(),
            };
            let row = format!(
                "| `{}` | {} | {} | {} |",
                code.as_str(),
                code.status(),
                retry,
                code.meaning()
            )
            .replace("|  |", "| |");
            if !page.lines().any(|l| l == row) {
                missing.push(row);
            }
        }
        assert!(
            missing.is_empty(),
            "docs/api.md (## Errors) lacks or differs from these rows:\n{}",
            missing.join("\n")
        );
    }
}
