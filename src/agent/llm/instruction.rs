//! Instruction templating, ADK's rules: `{key}` is replaced by the session state value
//! (strings as they are, other JSON as JSON), `{key?}` by an empty string when the key is
//! missing, `{artifact.name}` by the text of that artifact. Keys may carry the `app:`,
//! `user:` or `temp:` prefix. Braces around anything that is not a valid name are left
//! alone, so JSON examples in an instruction survive.

use crate::agent::{AgentError, AgentResult, InvocationContext};
use serde_json::Value;

/// Fills `template` from the invocation's state and artifacts.
pub async fn render(template: &str, ctx: &InvocationContext) -> AgentResult<String> {
    let state = ctx.state();
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let inner = &after[..end];
        // `{{x}}` and names with spaces or quotes are not placeholders.
        let (name, optional) = match inner.trim().strip_suffix('?') {
            Some(n) => (n.trim(), true),
            None => (inner.trim(), false),
        };
        if inner.contains('{') || !valid_name(name) {
            out.push('{');
            rest = after;
            continue;
        }
        if let Some(file) = name.strip_prefix("artifact.") {
            match ctx.load_artifact(file, None).await? {
                Some(part) => out.push_str(&artifact_text(&part)),
                None if optional => {}
                None => {
                    return Err(AgentError::failed(
                        "KeyError",
                        format!("Artifact {file} not found."),
                    ))
                }
            }
        } else {
            match state.get(name) {
                Some(Value::String(s)) => out.push_str(s),
                Some(Value::Null) | None if optional => {}
                Some(other) => out.push_str(&other.to_string()),
                None => {
                    return Err(AgentError::failed(
                        "KeyError",
                        format!("Context variable not found: `{name}`."),
                    ))
                }
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn artifact_text(part: &crate::event::Part) -> String {
    if let Some(t) = &part.text {
        return t.clone();
    }
    part.inline_data
        .as_ref()
        .map(|b| String::from_utf8_lossy(&b.data.0).into_owned())
        .unwrap_or_default()
}

/// An identifier, optionally with a state prefix, or `artifact.<file name>`.
fn valid_name(name: &str) -> bool {
    if let Some(file) = name.strip_prefix("artifact.") {
        return !file.is_empty() && !file.contains(char::is_whitespace);
    }
    let bare = ["app:", "user:", "temp:"]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    let mut chars = bare.chars();
    matches!(chars.next(), Some(c) if c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::valid_name;

    #[test]
    fn names() {
        assert!(valid_name("user_name"));
        assert!(valid_name("user:name"));
        assert!(valid_name("artifact.notes.txt"));
        assert!(!valid_name("\"a\": 1"));
        assert!(!valid_name("1x"));
        assert!(!valid_name(""));
    }
}
