//! `tool_trajectory_avg_score`: per invocation, 1.0 when the tool calls made match the
//! expected ones under the criterion's match type, else 0.0; the case's score is their mean
//! (ADK 2.13's `TrajectoryEvaluator`).

use crate::eval::doc::Doc;
use serde_json::Number;

/// How actual tool calls are matched against the expected ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchType {
    /// The same calls in the same order, nothing more.
    Exact,
    /// The expected calls in their order, others allowed in between.
    InOrder,
    /// The expected calls in any order, others allowed.
    AnyOrder,
}

impl MatchType {
    /// As ADK 2.13 reads it: a name, trimmed, in any case, `-` or a space for `_`
    /// (`"in-order"`), or the enum's integer value (0, 1, 2).
    pub fn parse(v: &Doc) -> Option<MatchType> {
        match v {
            Doc::String(s) => match s.trim().to_uppercase().replace(['-', ' '], "_").as_str() {
                "EXACT" => Some(MatchType::Exact),
                "IN_ORDER" => Some(MatchType::InOrder),
                "ANY_ORDER" => Some(MatchType::AnyOrder),
                _ => None,
            },
            Doc::Number(n) => match n.as_i64() {
                Some(0) => Some(MatchType::Exact),
                Some(1) => Some(MatchType::InOrder),
                Some(2) => Some(MatchType::AnyOrder),
                _ => None,
            },
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MatchType::Exact => "EXACT",
            MatchType::InOrder => "IN_ORDER",
            MatchType::AnyOrder => "ANY_ORDER",
        }
    }
}

/// A function call as the metric compares it: its name and arguments.
struct Call<'a> {
    name: Option<&'a Doc>,
    args: Option<&'a Doc>,
}

/// The tool calls of an invocation (file form): `intermediate_data.tool_uses`, or the function
/// calls in `intermediate_data.invocation_events`' contents (ADK's `get_all_tool_calls`).
fn calls(invocation: &Doc) -> Vec<Call<'_>> {
    let Some(data) = invocation.get("intermediate_data") else {
        return vec![];
    };
    if let Some(events) = data.get("invocation_events").and_then(Doc::as_array) {
        return events
            .iter()
            .filter_map(|e| e.get("content")?.get("parts")?.as_array())
            .flatten()
            .filter_map(|p| p.get("function_call").filter(|c| !matches!(c, Doc::Null)))
            .map(call)
            .collect();
    }
    data.get("tool_uses")
        .and_then(Doc::as_array)
        .map(|uses| uses.iter().map(call).collect())
        .unwrap_or_default()
}

fn call(c: &Doc) -> Call<'_> {
    Call {
        name: c.get("name").filter(|n| !matches!(n, Doc::Null)),
        args: c.get("args").filter(|a| !matches!(a, Doc::Null)),
    }
}

/// Whether one invocation's calls match the expected invocation's.
pub fn matches(actual: &Doc, expected: &Doc, match_type: MatchType, ignore_args: bool) -> bool {
    let (actual, expected) = (calls(actual), calls(expected));
    let same =
        |a: &Call, e: &Call| opt_eq(a.name, e.name) && (ignore_args || opt_eq(a.args, e.args));
    match match_type {
        MatchType::Exact => {
            actual.len() == expected.len() && actual.iter().zip(&expected).all(|(a, e)| same(a, e))
        }
        MatchType::InOrder => {
            let mut want = expected.iter().peekable();
            for a in &actual {
                if want.peek().is_some_and(|e| same(a, e)) {
                    want.next();
                }
            }
            want.peek().is_none()
        }
        MatchType::AnyOrder => {
            let mut left: Vec<&Call> = actual.iter().collect();
            expected
                .iter()
                .all(|e| match left.iter().position(|a| same(a, e)) {
                    Some(i) => {
                        left.remove(i);
                        true
                    }
                    None => false,
                })
        }
    }
}

fn opt_eq(a: Option<&Doc>, b: Option<&Doc>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => py_eq(a, b),
        _ => false,
    }
}

/// Python's `==` on JSON values: objects equal whatever their key order, `1 == 1.0`, and
/// `True == 1`.
pub fn py_eq(a: &Doc, b: &Doc) -> bool {
    match (a, b) {
        (Doc::Null, Doc::Null) => true,
        (Doc::String(a), Doc::String(b)) => a == b,
        (Doc::Array(a), Doc::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| py_eq(a, b))
        }
        (Doc::Object(a), Doc::Object(b)) => {
            // A key given twice was kept once when read (see `Doc`).
            a.len() == b.len()
                && a.iter().all(|(k, v)| {
                    b.iter()
                        .find(|(bk, _)| bk == k)
                        .is_some_and(|(_, bv)| py_eq(v, bv))
                })
        }
        (Doc::Number(_) | Doc::Bool(_), Doc::Number(_) | Doc::Bool(_)) => num_eq(a, b),
        _ => false,
    }
}

fn num_eq(a: &Doc, b: &Doc) -> bool {
    let int = |d: &Doc| match d {
        Doc::Bool(x) => Some(i128::from(*x)),
        Doc::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from)),
        _ => None,
    };
    if let (Some(x), Some(y)) = (int(a), int(b)) {
        return x == y;
    }
    let float = |d: &Doc| match d {
        Doc::Bool(x) => Some(f64::from(u8::from(*x))),
        Doc::Number(n) => Number::as_f64(n),
        _ => None,
    };
    matches!((float(a), float(b)), (Some(x), Some(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(calls: &[(&str, &str)]) -> Doc {
        let uses: Vec<String> = calls
            .iter()
            .map(|(n, a)| format!(r#"{{"name": "{n}", "args": {a}}}"#))
            .collect();
        Doc::parse(&format!(
            r#"{{"intermediate_data": {{"tool_uses": [{}]}}}}"#,
            uses.join(",")
        ))
        .unwrap()
    }

    #[test]
    fn the_three_match_types() {
        let want = inv(&[("a", "{}"), ("b", r#"{"x": 1}"#)]);
        let extra = inv(&[("a", "{}"), ("c", "{}"), ("b", r#"{"x": 1.0}"#)]);
        let swapped = inv(&[("b", r#"{"x": 1}"#), ("a", "{}")]);
        assert!(!matches(&extra, &want, MatchType::Exact, false));
        assert!(matches(&extra, &want, MatchType::InOrder, false));
        assert!(!matches(&swapped, &want, MatchType::InOrder, false));
        assert!(matches(&swapped, &want, MatchType::AnyOrder, false));
        assert!(matches(&want, &want, MatchType::Exact, false));
        let other_args = inv(&[("a", "{}"), ("b", r#"{"x": 2}"#)]);
        assert!(!matches(&other_args, &want, MatchType::Exact, false));
        assert!(matches(&other_args, &want, MatchType::Exact, true));
        // No expected calls: any order and in order pass, exact needs none made.
        let none = inv(&[]);
        assert!(matches(&want, &none, MatchType::InOrder, false));
        assert!(!matches(&want, &none, MatchType::Exact, false));
    }

    #[test]
    fn arguments_compare_as_python_compares_them() {
        let a = Doc::parse(r#"{"k": [1, true], "j": "s"}"#).unwrap();
        let b = Doc::parse(r#"{"j": "s", "k": [1.0, 1]}"#).unwrap();
        assert!(py_eq(&a, &b));
        assert!(!py_eq(
            &Doc::parse("1").unwrap(),
            &Doc::parse(r#""1""#).unwrap()
        ));
    }
}
