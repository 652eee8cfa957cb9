//! An HTTP tool's declaration checked when the app loads: its name, its parameters' schema,
//! and the URL, header and body templates with `{arg}` and `${ENV}` references.

use super::*;

/// Everything but the RFC 3986 unreserved characters is escaped in a placeholder's value,
/// so it stays one path segment (or one query value): no `/`, `?`, `#`, `&`, `=`.
pub(super) const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A piece of a `url` or header template.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Piece {
    Lit(String),
    /// `${VAR}`: from the environment, at call time.
    Env(String),
    /// `{arg}`: the call's argument, percent-encoded.
    Arg(String),
}

/// `^[a-zA-Z_][a-zA-Z0-9_-]{0,63}$`
pub(super) fn valid_tool_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')
}

/// `parameters` must be an object schema; returns its property names and `required` list.
pub(super) fn check_parameters(p: &Value) -> Result<(BTreeSet<String>, Vec<String>), String> {
    let obj = p
        .as_object()
        .ok_or("args.parameters: must be a JSON schema object (`type: object`)")?;
    match obj.get("type") {
        None => {}
        Some(Value::String(t)) if t == "object" => {}
        Some(_) => return Err("args.parameters.type: must be `object`".into()),
    }
    let properties: BTreeSet<String> = match obj.get("properties") {
        None => BTreeSet::new(),
        Some(Value::Object(m)) => m.keys().cloned().collect(),
        Some(_) => return Err("args.parameters.properties: must be a mapping".into()),
    };
    let required = match obj.get("required") {
        None => Vec::new(),
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for item in items {
                let name = item
                    .as_str()
                    .ok_or("args.parameters.required: must be a list of property names")?;
                if !properties.contains(name) {
                    return Err(format!(
                        "args.parameters.required: `{name}` is not in args.parameters.properties"
                    ));
                }
                out.push(name.to_string());
            }
            out
        }
        Some(_) => return Err("args.parameters.required: must be a list".into()),
    };
    Ok((properties, required))
}

/// Splits a template into literal text, `${VAR}` and (when `args`) `{arg}` pieces.
pub(super) fn parse_template(s: &str, args: bool) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut lit = String::new();
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        let (is_env, open) = if rest.starts_with("${") {
            (true, 2)
        } else if c == '{' && args {
            (false, 1)
        } else {
            lit.push(c);
            rest = &rest[c.len_utf8()..];
            continue;
        };
        let close = rest
            .find('}')
            .ok_or_else(|| format!("unclosed `{}` in {s:?}", &rest[..open]))?;
        let name = &rest[open..close];
        if is_env {
            if !valid_env_name(name) {
                return Err(format!(
                    "`${{{name}}}` is not a valid environment variable name"
                ));
            }
        } else if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        {
            return Err(format!("`{{{name}}}` is not a valid placeholder"));
        }
        if !lit.is_empty() {
            pieces.push(Piece::Lit(std::mem::take(&mut lit)));
        }
        pieces.push(if is_env {
            Piece::Env(name.to_string())
        } else {
            Piece::Arg(name.to_string())
        });
        rest = &rest[close + 1..];
    }
    if !lit.is_empty() {
        pieces.push(Piece::Lit(lit));
    }
    Ok(pieces)
}

/// Checks the `${VAR}` references in a config value (for other tool kinds' config).
pub(in crate::tools) fn check_env_refs(s: &str) -> Result<(), String> {
    parse_template(s, false).map(|_| ())
}

/// Fills in the `${VAR}` references of a config value from the environment; the error
/// names the variable and `field`, never the value.
pub(in crate::tools) fn expand_env(s: &str, field: &str) -> Result<String, String> {
    let mut out = String::new();
    for piece in parse_template(s, false).map_err(|e| format!("{field}: {e}"))? {
        match piece {
            Piece::Lit(t) | Piece::Arg(t) => out.push_str(&t),
            Piece::Env(var) => match std::env::var(&var) {
                Ok(v) => out.push_str(&v),
                Err(_) => {
                    return Err(format!(
                        "environment variable {var} is not set (needed by {field})"
                    ))
                }
            },
        }
    }
    Ok(out)
}

pub(super) fn valid_env_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// The URL must be http(s) and its placeholders must sit after the host. A URL that starts
/// with `${VAR}` (a base URL from the environment) is checked at call time instead.
pub(super) fn check_url(url: &[Piece]) -> Result<(), String> {
    let first = match url.first() {
        Some(Piece::Lit(s)) => s.as_str(),
        Some(Piece::Env(_)) => return Ok(()),
        _ => "",
    };
    let scheme_end = match first.find("://") {
        Some(i) if matches!(&first[..i].to_ascii_lowercase()[..], "http" | "https") => i + 3,
        _ => return Err("args.url: must be an http:// or https:// URL".into()),
    };
    // The authority is the first piece up to `/`, `?` or `#`; it may not have placeholders.
    if !first[scheme_end..].contains(['/', '?', '#']) {
        if let Some(p) = url.get(1) {
            let what = match p {
                Piece::Arg(a) => format!("placeholder {{{a}}}"),
                Piece::Env(v) => format!("${{{v}}}"),
                Piece::Lit(_) => unreachable!("consecutive literals are merged"),
            };
            return Err(format!(
                "args.url: {what} is in the host; placeholders may only fill the path or query"
            ));
        }
    }
    // Check the shape with every placeholder filled in.
    let sample: String = url
        .iter()
        .map(|p| match p {
            Piece::Lit(s) => s.as_str(),
            Piece::Env(_) | Piece::Arg(_) => "x",
        })
        .collect();
    let parsed = reqwest::Url::parse(&sample).map_err(|e| format!("args.url: {e}"))?;
    if !parsed.has_host() {
        return Err("args.url: has no host".into());
    }
    Ok(())
}

/// A placeholder's value: strings as they are, numbers and booleans written out.
pub(super) fn scalar(name: &str, v: &Value) -> Result<String, ToolError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(ToolError(format!(
            "argument `{name}` must be a string, number or boolean (it fills the URL)"
        ))),
    }
}

/// A query-string value: scalars written out, anything else as JSON.
pub(super) fn query_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}
