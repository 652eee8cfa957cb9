//! HTTP tools declared in config: one REST endpoint as a tool.
//!
//! ```yaml
//! tools:
//!   - name: HttpTool
//!     args:
//!       name: get_weather
//!       description: Current weather for a city.
//!       method: GET                                   # GET|POST|PUT|PATCH|DELETE, default GET
//!       url: https://api.example.com/weather/{city}   # {arg}: the call's argument, one path segment
//!       headers:
//!         Authorization: "Bearer ${WEATHER_API_KEY}"  # ${VAR}: the environment, at call time
//!       parameters: {type: object, properties: {city: {type: string}}, required: [city]}
//!       timeout_secs: 30                              # default 30
//!       max_response_bytes: 1048576                   # default 1 MiB
//!       allow_private: ["10.0.0.0/8", "api.internal"] # default: public addresses only
//! ```
//!
//! Only public addresses are reached unless `allow_private` lists more (IPs, CIDR blocks, host
//! names, or `"*"`): loopback, private, link-local (the cloud metadata service) and unspecified
//! targets are refused after DNS resolution, at connect time (see [`super::egress`]).
//!
//! Arguments that fill no `{placeholder}` go to the query string (GET, DELETE) or to a JSON
//! body (POST, PUT, PATCH). `${VAR}` references (in `url` and `headers`) are resolved at call
//! time, so an app loads without the variable; a call then fails with a sentence naming it,
//! and never sends the literal `${VAR}`. Error messages show the URL with `${VAR}` unexpanded
//! and never show header values, so secrets do not reach the model.
//!
//! A JSON response becomes the tool's result (an object as is, anything else as
//! `{"result": …}`); other text becomes `{"status": 200, "body": "…"}` (cut at
//! `max_response_bytes`, with `"truncated": true`); a non-2xx status is a tool error
//! `HTTP 404 from GET https://…: <body excerpt>`.

mod response;
mod template;

use response::*;
use template::*;
pub(super) use template::{check_env_refs, expand_env};

use super::egress::{EgressPolicy, Resolver};
use super::{Tool, ToolContext, ToolError, ToolResult};
use crate::event::JsonMap;
use async_trait::async_trait;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::Method;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

const DEFAULT_TIMEOUT_SECS: f64 = 30.0;
const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// How much of an error response's body the model sees.
const ERROR_EXCERPT_CHARS: usize = 500;

/// The YAML `args` of an `HttpTool`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpToolConfig {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    method: Option<String>,
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    parameters: Option<Value>,
    #[serde(default)]
    timeout_secs: Option<f64>,
    #[serde(default)]
    max_response_bytes: Option<usize>,
    #[serde(default)]
    allow_private: Vec<String>,
    /// Safe to call again if a replica stopped mid-call (default: true for GET, false
    /// otherwise).
    #[serde(default)]
    idempotent: Option<bool>,
}

/// One REST endpoint as a tool (see the module docs).
#[derive(Debug)]
pub struct HttpTool {
    name: String,
    description: String,
    method: Method,
    url: Vec<Piece>,
    /// The `{placeholder}` names of `url`.
    url_args: BTreeSet<String>,
    /// Header name, its name as configured (for messages), its value template.
    headers: Vec<(HeaderName, String, Vec<Piece>)>,
    parameters: Option<Value>,
    /// `parameters.properties` keys: the arguments a call may pass.
    properties: BTreeSet<String>,
    required: Vec<String>,
    timeout: Duration,
    max_response_bytes: usize,
    egress: EgressPolicy,
    /// This tool's client: its resolver enforces `egress`.
    client: reqwest::Client,
    /// See [`Tool::is_idempotent`].
    idempotent: bool,
}

impl HttpTool {
    /// Builds the tool from its YAML `args` (as JSON). Errors name the field: `args.url: …`.
    pub fn from_config(args: Value) -> Result<Self, String> {
        let c: HttpToolConfig = super::config_args(args)?;

        if !valid_tool_name(&c.name) {
            return Err(format!(
                "args.name: {:?} is not a valid tool name (a letter or `_`, then up to 63 \
                 letters, digits, `_` or `-`)",
                c.name
            ));
        }

        let method = match c.method.as_deref().map(str::to_ascii_uppercase).as_deref() {
            None | Some("GET") => Method::GET,
            Some("POST") => Method::POST,
            Some("PUT") => Method::PUT,
            Some("PATCH") => Method::PATCH,
            Some("DELETE") => Method::DELETE,
            Some(_) => {
                return Err(format!(
                    "args.method: {:?} is not one of GET, POST, PUT, PATCH, DELETE",
                    c.method.unwrap_or_default()
                ))
            }
        };

        let (properties, required) = match &c.parameters {
            None => (BTreeSet::new(), Vec::new()),
            Some(p) => check_parameters(p)?,
        };

        let url = parse_template(&c.url, true).map_err(|e| format!("args.url: {e}"))?;
        check_url(&url)?;
        let mut url_args = BTreeSet::new();
        for piece in &url {
            if let Piece::Arg(a) = piece {
                if !properties.contains(a) {
                    return Err(format!(
                        "args.url: placeholder {{{a}}} is not declared in \
                         args.parameters.properties"
                    ));
                }
                url_args.insert(a.clone());
            }
        }

        let mut headers = Vec::new();
        for (name, value) in &c.headers {
            let field = format!("args.headers.{name}");
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("{field}: not a valid HTTP header name"))?;
            let pieces = parse_template(value, false).map_err(|e| format!("{field}: {e}"))?;
            // What the environment cannot change must already be a valid header value.
            let literal: String = pieces
                .iter()
                .map(|p| match p {
                    Piece::Lit(s) => s.as_str(),
                    _ => "x",
                })
                .collect();
            if HeaderValue::from_str(&literal).is_err() {
                return Err(format!("{field}: not a valid HTTP header value"));
            }
            headers.push((header, name.clone(), pieces));
        }

        let timeout_secs = c.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS);
        let timeout = Duration::try_from_secs_f64(timeout_secs)
            .ok()
            .filter(|d| !d.is_zero() && *d <= Duration::from_secs(24 * 3600))
            .ok_or_else(|| {
                format!("args.timeout_secs: {timeout_secs} is not between 0 and 86400 seconds")
            })?;
        let max_response_bytes = c.max_response_bytes.unwrap_or(DEFAULT_MAX_RESPONSE_BYTES);
        if max_response_bytes == 0 {
            return Err("args.max_response_bytes: must be at least 1".into());
        }

        let egress = EgressPolicy::parse(&c.allow_private).map_err(|e| format!("args.{e}"))?;
        let idempotent = c.idempotent.unwrap_or(method == Method::GET);
        Ok(HttpTool {
            client: tool_client(&egress)?,
            egress,
            name: c.name,
            description: c.description,
            method,
            url,
            url_args,
            headers,
            parameters: c.parameters,
            properties,
            required,
            timeout,
            max_response_bytes,
            idempotent,
        })
    }

    /// Runs one call: what [`Tool::call`] does, without needing a [`ToolContext`].
    pub async fn execute(&self, args: &JsonMap) -> ToolResult {
        let request = self.build(args)?;
        let shown = request.shown.clone();
        let method = self.method.clone();
        match tokio::time::timeout(self.timeout, self.send(request)).await {
            Ok(result) => result,
            Err(_) => Err(ToolError(format!(
                "{method} {shown} timed out after {} s",
                self.timeout.as_secs_f64()
            ))),
        }
    }

    /// Checks the arguments and builds the request.
    fn build(&self, args: &JsonMap) -> Result<Request, ToolError> {
        if let Some(unknown) = args.keys().find(|k| !self.properties.contains(*k)) {
            let allowed = if self.properties.is_empty() {
                "this tool takes no arguments".to_string()
            } else {
                let names: Vec<&str> = self.properties.iter().map(String::as_str).collect();
                format!("expected: {}", names.join(", "))
            };
            return Err(ToolError(format!(
                "unknown argument `{unknown}` ({allowed})"
            )));
        }
        for name in self.required.iter().chain(self.url_args.iter()) {
            if args.get(name).is_none_or(Value::is_null) {
                return Err(ToolError(format!("missing required argument `{name}`")));
            }
        }

        // The URL: placeholders filled and escaped; `shown` keeps `${VAR}` for messages.
        let mut real = String::new();
        let mut shown = String::new();
        for piece in &self.url {
            match piece {
                Piece::Lit(s) => {
                    real.push_str(s);
                    shown.push_str(s);
                }
                Piece::Env(var) => {
                    real.push_str(&self.env(var, "args.url")?);
                    let _ = write!(shown, "${{{var}}}");
                }
                Piece::Arg(name) => {
                    let value = scalar(name, &args[name.as_str()])?;
                    if value == "." || value == ".." {
                        return Err(ToolError(format!(
                            "argument `{name}` may not be `{value}` (it fills a URL path segment)"
                        )));
                    }
                    let encoded = utf8_percent_encode(&value, SEGMENT).to_string();
                    real.push_str(&encoded);
                    shown.push_str(&encoded);
                }
            }
        }
        let mut url = reqwest::Url::parse(&real)
            .map_err(|e| ToolError(format!("the tool's URL {shown} is not a valid URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            return Err(ToolError(format!(
                "the tool's URL {shown} is not an http:// or https:// URL"
            )));
        }

        let rest: JsonMap = args
            .iter()
            .filter(|(k, v)| !self.url_args.contains(*k) && !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let body = if matches!(self.method, Method::GET | Method::DELETE) {
            let mut query = form_urlencoded::Serializer::new(String::new());
            for (k, v) in &rest {
                match v {
                    Value::Array(items) => {
                        for item in items {
                            query.append_pair(k, &query_value(item));
                        }
                    }
                    other => {
                        query.append_pair(k, &query_value(other));
                    }
                }
            }
            let query = query.finish();
            if !query.is_empty() {
                let joined = match url.query() {
                    Some(q) if !q.is_empty() => format!("{q}&{query}"),
                    _ => query.clone(),
                };
                url.set_query(Some(&joined));
                let sep = if shown.contains('?') { '&' } else { '?' };
                shown.push(sep);
                shown.push_str(&query);
            }
            None
        } else {
            Some(Value::Object(rest))
        };

        let mut headers = HeaderMap::new();
        headers.insert(
            reqwest::header::ACCEPT,
            HeaderValue::from_static("application/json, */*;q=0.5"),
        );
        for (name, configured, pieces) in &self.headers {
            let mut value = String::new();
            for piece in pieces {
                match piece {
                    Piece::Lit(s) | Piece::Arg(s) => value.push_str(s),
                    Piece::Env(var) => {
                        value.push_str(&self.env(var, &format!("args.headers.{configured}"))?)
                    }
                }
            }
            let mut value = HeaderValue::from_str(&value).map_err(|_| {
                ToolError(format!(
                    "args.headers.{configured} of HTTP tool {} is not a valid header value \
                     once its environment variables are filled in",
                    self.name
                ))
            })?;
            value.set_sensitive(true);
            headers.insert(name.clone(), value);
        }

        Ok(Request {
            url,
            shown: truncate_chars(&shown, 300),
            headers,
            body,
        })
    }

    /// An environment variable a template refers to.
    fn env(&self, var: &str, field: &str) -> Result<String, ToolError> {
        std::env::var(var).map_err(|_| {
            ToolError(format!(
                "environment variable {var} is not set (HTTP tool {} needs it for {field})",
                self.name
            ))
        })
    }

    async fn send(&self, r: Request) -> ToolResult {
        let method = &self.method;
        let shown = &r.shown;
        self.egress
            .check_url(&r.url)
            .map_err(|e| ToolError(format!("{method} {shown}: {e}")))?;
        let mut headers = r.headers;
        crate::telemetry::inject_trace(&mut headers);
        let mut builder = self.client.request(method.clone(), r.url).headers(headers);
        if let Some(body) = &r.body {
            builder = builder.json(body);
        }
        let mut resp = builder.send().await.map_err(|e| {
            let what = if e.is_connect() {
                "could not connect"
            } else {
                "failed"
            };
            ToolError(format!("{method} {shown} {what}: {}", error_chain(&e)))
        })?;
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();

        let limit = if status.is_success() {
            self.max_response_bytes
        } else {
            self.max_response_bytes.min(4 * ERROR_EXCERPT_CHARS)
        };
        let mut buf: Vec<u8> = Vec::new();
        let mut truncated = false;
        loop {
            let chunk = resp.chunk().await.map_err(|e| {
                ToolError(format!(
                    "{method} {shown}: reading the response failed: {}",
                    error_chain(&e)
                ))
            })?;
            let Some(chunk) = chunk else { break };
            let room = limit - buf.len();
            if chunk.len() > room {
                buf.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            buf.extend_from_slice(&chunk);
        }

        if !status.is_success() {
            let text = utf8_prefix(&buf);
            let excerpt = truncate_chars(text.trim(), ERROR_EXCERPT_CHARS);
            let mut msg = format!("HTTP {} from {method} {shown}", status.as_u16());
            if !excerpt.is_empty() {
                let _ = write!(msg, ": {excerpt}");
            }
            return Err(ToolError(msg));
        }

        if is_json(&content_type) && !truncated {
            if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                return Ok(match v {
                    Value::Object(_) => v,
                    other => json!({ "result": other }),
                });
            }
        }
        if !is_textual(&content_type) {
            return Ok(json!({
                "status": status.as_u16(),
                "content_type": content_type,
                "size_bytes": buf.len(),
                "note": "binary content not shown",
            }));
        }
        let mut out = json!({
            "status": status.as_u16(),
            "body": utf8_prefix(&buf),
        });
        if truncated {
            out["truncated"] = Value::Bool(true);
        }
        Ok(out)
    }
}

/// A request ready to send; `shown` is its URL as messages may show it.
struct Request {
    url: reqwest::Url,
    shown: String,
    headers: HeaderMap,
    body: Option<Value>,
}

#[async_trait]
impl Tool for HttpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Option<Value> {
        self.parameters.clone()
    }

    fn is_idempotent(&self) -> bool {
        self.idempotent
    }

    async fn call(&self, args: JsonMap, _ctx: &ToolContext) -> ToolResult {
        self.execute(&args).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(args: Value) -> Result<HttpTool, String> {
        HttpTool::from_config(args)
    }

    #[test]
    fn templates() {
        assert_eq!(
            parse_template("https://x/{a}/b?k=${K}", true).unwrap(),
            vec![
                Piece::Lit("https://x/".into()),
                Piece::Arg("a".into()),
                Piece::Lit("/b?k=".into()),
                Piece::Env("K".into()),
            ]
        );
        assert_eq!(
            parse_template("Bearer {x}", false).unwrap(),
            vec![Piece::Lit("Bearer {x}".into())]
        );
        assert!(parse_template("a ${B", false)
            .unwrap_err()
            .contains("unclosed"));
        assert!(parse_template("${1X}", false).is_err());
    }

    #[test]
    fn config_errors_name_the_field() {
        let base = json!({"name": "t", "url": "https://example.com/{city}",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}});
        assert!(tool(base.clone()).is_ok());

        let mut v = base.clone();
        v["name"] = json!("bad name");
        assert!(tool(v).unwrap_err().starts_with("args.name:"));
        let mut v = base.clone();
        v["method"] = json!("TRACE");
        assert!(tool(v).unwrap_err().starts_with("args.method:"));
        let mut v = base.clone();
        v["url"] = json!("ftp://example.com/x");
        assert!(tool(v).unwrap_err().starts_with("args.url:"));
        let mut v = base.clone();
        v["url"] = json!("https://example.com/{town}");
        let e = tool(v).unwrap_err();
        assert!(e.contains("{town}") && e.starts_with("args.url:"), "{e}");
        let mut v = base.clone();
        v["url"] = json!("https://{city}.example.com/");
        assert!(tool(v).unwrap_err().contains("host"));
        let mut v = base.clone();
        v["headers"] = json!({"Bad Header": "x"});
        assert!(tool(v).unwrap_err().starts_with("args.headers.Bad Header:"));
        let mut v = base.clone();
        v["timeout_secs"] = json!(0);
        assert!(tool(v).unwrap_err().starts_with("args.timeout_secs:"));
        let mut v = base.clone();
        v["timeout_secs"] = json!("soon");
        assert!(tool(v).unwrap_err().starts_with("args.timeout_secs:"));
        let mut v = base.clone();
        v["extra"] = json!(1);
        assert!(tool(v)
            .unwrap_err()
            .starts_with("args.extra: unknown field `extra`"));
        let mut v = base;
        v["parameters"]["required"] = json!(["nope"]);
        assert!(tool(v)
            .unwrap_err()
            .starts_with("args.parameters.required:"));
        // A base URL from the environment is checked at call time.
        assert!(tool(json!({"name": "t", "url": "${BASE}/x"})).is_ok());
    }

    #[test]
    fn text_helpers() {
        assert_eq!(utf8_prefix("héllo".as_bytes()), "héllo");
        assert_eq!(utf8_prefix(&"hé".as_bytes()[..2]), "h");
        assert_eq!(truncate_chars("abcdef", 3), "abc…");
        assert!(is_json("application/problem+json; charset=utf-8"));
        assert!(!is_textual("image/png"));
    }
}
