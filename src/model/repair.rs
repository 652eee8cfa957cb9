//! Best-effort repair of tool-call argument text. Models (small local ones especially) emit
//! arguments cut short, wrapped in code fences, with trailing commas or single quotes. We
//! try strict JSON first, then a few conservative repairs; what still fails is reported to
//! the model as a tool error instead of running the tool with guessed arguments.

use crate::event::JsonMap;
use serde_json::Value;

/// Parses `text` as a JSON object of arguments.
pub fn parse_arguments(text: &str) -> Result<JsonMap, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(JsonMap::new());
    }
    let first_error = match serde_json::from_str::<Value>(trimmed) {
        Ok(v) => return as_object(v),
        Err(e) => e.to_string(),
    };
    let repaired = repair(trimmed);
    match serde_json::from_str::<Value>(&repaired) {
        Ok(v) => as_object(v),
        Err(_) => Err(format!(
            "the arguments are not valid JSON ({first_error}): {}",
            truncate(trimmed, 200)
        )),
    }
}

fn as_object(v: Value) -> Result<JsonMap, String> {
    match v {
        Value::Object(m) => Ok(m),
        // Some models double-encode: "{\"a\":1}".
        Value::String(s) => match serde_json::from_str::<Value>(&s) {
            Ok(Value::Object(m)) => Ok(m),
            _ => Err(format!(
                "the arguments must be a JSON object, got a string: {s}"
            )),
        },
        Value::Null => Ok(JsonMap::new()),
        other => Err(format!("the arguments must be a JSON object, got {other}")),
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Strips code fences, drops trailing commas, closes an open string and open brackets.
fn repair(text: &str) -> String {
    let mut s = text.trim();
    if let Some(rest) = s.strip_prefix("```") {
        s = rest.trim_start_matches("json").trim_start();
        s = s.strip_suffix("```").unwrap_or(s).trim_end();
    }
    let mut out = String::with_capacity(s.len() + 8);
    let mut stack: Vec<char> = vec![];
    let mut in_string = false;
    let mut escaped = false;
    for c in s.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' => {
                stack.push('}');
                out.push(c);
            }
            '[' => {
                stack.push(']');
                out.push(c);
            }
            '}' | ']' => {
                drop_trailing_comma(&mut out);
                if stack.last() == Some(&c) {
                    stack.pop();
                }
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    if in_string {
        if escaped {
            out.pop();
        }
        out.push('"');
    }
    drop_trailing_comma(&mut out);
    if out.trim_end().ends_with(':') {
        out.push_str("null");
    }
    while let Some(close) = stack.pop() {
        drop_trailing_comma(&mut out);
        out.push(close);
    }
    out
}

fn drop_trailing_comma(out: &mut String) {
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    if out.ends_with(',') {
        out.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repairs_common_breakage() {
        assert_eq!(parse_arguments("").unwrap(), JsonMap::new());
        assert_eq!(parse_arguments("{\"a\": 1,}").unwrap()["a"], 1);
        assert_eq!(parse_arguments("{\"a\": \"x").unwrap()["a"], "x");
        assert_eq!(parse_arguments("{\"a\": [1, 2").unwrap()["a"][1], 2);
        assert_eq!(parse_arguments("```json\n{\"a\": 1}\n```").unwrap()["a"], 1);
        assert_eq!(parse_arguments("\"{\\\"a\\\": 2}\"").unwrap()["a"], 2);
        assert!(parse_arguments("{\"a\": }").is_err());
        assert!(parse_arguments("[1,2]").is_err());
        assert!(parse_arguments("hello").is_err());
    }
}
