//! ADK's first eval file format (`*.test.json`: a list of `{name, data: [{query,
//! expected_tool_use, expected_intermediate_agent_responses, reference}], initial_session}`),
//! converted as ADK's `convert_eval_set_to_pydantic_schema` converts it. Invocation ids are
//! new uuids and timestamps are now, as there.

use super::doc::Doc;
use super::shape::Problem;
use serde_json::json;

/// Whether `doc` is in the old format: a list, where the new format is an object.
pub fn is_legacy(doc: &Doc) -> bool {
    matches!(doc, Doc::Array(_))
}

/// The eval set, in the file form, that ADK makes of an old file.
pub fn convert(set_id: &str, doc: &Doc, now: f64) -> Result<Doc, Vec<Problem>> {
    let Doc::Array(cases) = doc else {
        return Err(vec![problem(
            vec![],
            "an old-format eval file is a list of cases",
        )]);
    };
    let mut out = vec![];
    let mut problems = vec![];
    for (i, case) in cases.iter().enumerate() {
        let Some(name) = case.get("name").and_then(Doc::as_str) else {
            problems.push(problem(vec![json!(i), json!("name")], "Field required"));
            continue;
        };
        let Some(data) = case.get("data").and_then(Doc::as_array) else {
            problems.push(problem(vec![json!(i), json!("data")], "Field required"));
            continue;
        };
        let mut conversation = vec![];
        for (j, turn) in data.iter().enumerate() {
            match invocation(turn, now) {
                Some(inv) => conversation.push(inv),
                None => problems.push(problem(
                    vec![json!(i), json!("data"), json!(j), json!("query")],
                    "Field required",
                )),
            }
        }
        let mut new = Doc::object()
            .with("eval_id", Doc::str(name))
            .with("conversation", Doc::Array(conversation));
        if let Some(Doc::Object(session)) = case.get("initial_session") {
            if !session.is_empty() {
                let initial = Doc::Object(session.clone());
                let field = |k: &str| initial.get(k).cloned().unwrap_or(Doc::str(""));
                let mut input = Doc::object()
                    .with("app_name", field("app_name"))
                    .with("user_id", field("user_id"));
                if let Some(state) = initial.get("state").filter(|s| !s.is_falsy()) {
                    input.set("state", state.clone());
                }
                new.set("session_input", input);
            }
        }
        new.set("creation_timestamp", Doc::float(now));
        out.push(new);
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Doc::object()
        .with("eval_set_id", Doc::str(set_id))
        .with("name", Doc::str(set_id))
        .with("eval_cases", Doc::Array(out))
        .with("creation_timestamp", Doc::float(now)))
}

fn invocation(turn: &Doc, now: f64) -> Option<Doc> {
    let query = turn.get("query")?.as_str()?;
    let reference = turn.get("reference").and_then(Doc::as_str).unwrap_or("");
    let text = |t: &str| Doc::object().with("text", Doc::str(t));
    let mut tool_uses = vec![];
    for used in turn
        .get("expected_tool_use")
        .and_then(Doc::as_array)
        .into_iter()
        .flatten()
    {
        tool_uses.push(
            Doc::object()
                .with(
                    "args",
                    used.get("tool_input").cloned().unwrap_or(Doc::object()),
                )
                .with(
                    "name",
                    used.get("tool_name").cloned().unwrap_or(Doc::str("")),
                ),
        );
    }
    let mut responses = vec![];
    for r in turn
        .get("expected_intermediate_agent_responses")
        .and_then(Doc::as_array)
        .into_iter()
        .flatten()
    {
        let author = r.get("author").cloned().unwrap_or(Doc::str(""));
        let said = r.get("text").and_then(Doc::as_str).unwrap_or("");
        responses.push(Doc::Array(vec![author, Doc::Array(vec![text(said)])]));
    }
    let mut intermediate = Doc::object();
    if !tool_uses.is_empty() {
        intermediate.set("tool_uses", Doc::Array(tool_uses));
    }
    if !responses.is_empty() {
        intermediate.set("intermediate_responses", Doc::Array(responses));
    }
    Some(
        Doc::object()
            .with("invocation_id", Doc::str(uuid::Uuid::new_v4().to_string()))
            .with(
                "user_content",
                Doc::object()
                    .with("parts", Doc::Array(vec![text(query)]))
                    .with("role", Doc::str("user")),
            )
            .with(
                "final_response",
                Doc::object()
                    .with("parts", Doc::Array(vec![text(reference)]))
                    .with("role", Doc::str("model")),
            )
            .with("intermediate_data", intermediate)
            .with("creation_timestamp", Doc::float(now)),
    )
}

fn problem(loc: Vec<serde_json::Value>, msg: &str) -> Problem {
    Problem {
        loc,
        msg: msg.to_string(),
    }
}
