//! Evals (docs/evals.md): ADK's eval sets and cases, kept per app in the database
//! ([`crate::store::EvalStore`]) where ADK keeps them as one developer's files.
//!
//! - [`doc`]: JSON that keeps its keys' order, so an exported file is the imported one;
//! - [`shape`]: ADK's eval models in their file form (stored, exported) and wire form (what
//!   ADK's dev server answers), and what makes a case invalid;
//! - [`from_session`]: a session's events as a case's conversation, as ADK's `add_session`
//!   makes it;
//! - [`legacy`]: ADK's first file format (`*.test.json`);
//! - [`metrics`]: ADK's deterministic metrics and the criteria of an eval config;
//! - [`replay`]: a case run as ordinary runs in a new session of its own, and scored;
//! - [`result`]: ADK's result models of how cases went;
//! - [`redact`]: credential secrets taken out of a case or a result the routes answer;
//! - [`worker`]: runs of stored sets, their cases run by every replica's worker, each case
//!   claimed by one replica at a time and run again elsewhere if that replica dies.
//!
//! `agentd eval` (a set file run in process for CI) puts a runner, a store and the apps
//! together as a server does, so it lives above them all, in [`crate::server::eval_cli`].

pub mod doc;
pub mod from_session;
pub mod legacy;
pub mod metrics;
pub mod redact;
pub mod replay;
pub mod result;
pub mod shape;
pub mod worker;

use crate::store::StoredEvalSet;
use doc::Doc;
use serde_json::json;
use shape::Problem;

/// Eval sets one app may have.
pub const MAX_EVAL_SETS_PER_APP: usize = 1000;
/// Eval cases one set may have.
pub const MAX_EVAL_CASES_PER_SET: usize = 1000;
/// The largest case, as file-form JSON. A case copies a whole session: this bounds what one
/// `add_session` stores and what one read of a set returns per case.
pub const MAX_EVAL_CASE_BYTES: usize = 4 << 20;
/// The largest set: its cases together, as file-form JSON. Reading a set (an export, the web
/// UI's view of it) holds all of it in memory at once.
pub const MAX_EVAL_SET_BYTES: usize = 64 << 20;

/// Runs of one app's sets not yet finished: each holds up to [`worker::AT_ONCE`] cases of
/// every replica, so a bound keeps one app from filling every replica's workers for long.
pub const MAX_RUNNING_EVAL_RUNS_PER_APP: usize = 8;
/// Finished runs one app keeps (with their results); the oldest go as new ones start.
pub const MAX_STORED_EVAL_RUNS_PER_APP: usize = 100;

/// Why a set or case cannot be stored.
#[derive(Debug)]
pub enum Invalid {
    /// What FastAPI would list as a 422.
    Problems(Vec<Problem>),
    /// A case over [`MAX_EVAL_CASE_BYTES`] (its id, its size).
    TooLarge(String, usize),
    /// More than [`MAX_EVAL_CASES_PER_SET`] cases.
    TooMany(usize),
    /// Cases over [`MAX_EVAL_SET_BYTES`] together (at least this many bytes).
    SetTooLarge(usize),
}

/// A case as it is stored: checked, in the file form, with its id and its JSON text.
pub fn store_case(case: &Doc, at: &[serde_json::Value]) -> Result<(String, String), Invalid> {
    let file = shape::case_file(case);
    let problems = shape::case_problems(&file, at);
    if !problems.is_empty() {
        return Err(Invalid::Problems(problems));
    }
    let id = file
        .get("eval_id")
        .and_then(Doc::as_str)
        .unwrap_or_default()
        .to_string();
    let text = file.to_pretty();
    if text.len() > MAX_EVAL_CASE_BYTES {
        return Err(Invalid::TooLarge(id, text.len()));
    }
    Ok((id, text))
}

/// An eval set file (new format or old) as it is stored, under `id`: its head and cases.
/// An `eval_set_id` in the file must be `id`; one left out is `id`.
pub fn store_set(id: &str, body: &Doc, now: f64) -> Result<StoredEvalSet, Invalid> {
    let file = match legacy::is_legacy(body) {
        true => legacy::convert(id, body, now).map_err(Invalid::Problems)?,
        false => shape::set_file(body),
    };
    let Doc::Object(_) = file else {
        return Err(Invalid::Problems(vec![Problem {
            loc: vec![],
            msg: "an eval set is an object (or, in ADK's old format, a list)".into(),
        }]));
    };
    match file.get("eval_set_id") {
        None => {}
        Some(Doc::String(given)) if given == id => {}
        Some(_) => {
            return Err(Invalid::Problems(vec![Problem {
                loc: vec![json!("evalSetId")],
                msg: format!("the file's eval_set_id must be the path's, {id:?}"),
            }]))
        }
    }
    let cases: &[Doc] = match file.get("eval_cases") {
        Some(Doc::Array(cases)) => cases,
        None => &[],
        Some(_) => {
            return Err(Invalid::Problems(vec![Problem {
                loc: vec![json!("evalCases")],
                msg: "Input should be a valid list".into(),
            }]))
        }
    };
    if cases.len() > MAX_EVAL_CASES_PER_SET {
        return Err(Invalid::TooMany(cases.len()));
    }
    let mut total = 0;
    let mut stored = vec![];
    let mut problems = vec![];
    for (i, case) in cases.iter().enumerate() {
        match store_case(case, &[json!("evalCases"), json!(i)]) {
            Ok((id, text)) => {
                total += text.len();
                if total > MAX_EVAL_SET_BYTES {
                    return Err(Invalid::SetTooLarge(total));
                }
                if stored
                    .iter()
                    .any(|(seen, _): &(String, String)| *seen == id)
                {
                    problems.push(Problem {
                        loc: vec![json!("evalCases"), json!(i), json!("evalId")],
                        msg: format!("Eval id `{id}` is in the set twice."),
                    });
                }
                stored.push((id, text));
            }
            Err(Invalid::Problems(p)) => problems.extend(p),
            Err(other) => return Err(other),
        }
    }
    if !problems.is_empty() {
        return Err(Invalid::Problems(problems));
    }
    let mut head = file.clone();
    head.remove("eval_cases");
    if head.get("eval_set_id").is_none() {
        // At the end here; every read puts the fields in the model's order again.
        head.set("eval_set_id", Doc::str(id));
    }
    Ok(StoredEvalSet {
        head: head.to_pretty(),
        cases: stored,
    })
}

/// A new, empty set as ADK's `create_eval_set` makes it: named by its id, stamped now.
pub fn new_set(id: &str, now: f64) -> StoredEvalSet {
    let head = Doc::object()
        .with("eval_set_id", Doc::str(id))
        .with("name", Doc::str(id))
        .with("creation_timestamp", Doc::float(now));
    StoredEvalSet {
        head: head.to_pretty(),
        cases: vec![],
    }
}

/// A stored set as one document in the file form: the `*.evalset.json` ADK would write.
pub fn set_document(stored: &StoredEvalSet) -> Result<Doc, serde_json::Error> {
    let mut set = Doc::parse(&stored.head)?;
    let cases = stored
        .cases
        .iter()
        .map(|(_, text)| Doc::parse(text))
        .collect::<Result<Vec<_>, _>>()?;
    set.set("eval_cases", Doc::Array(cases));
    // The head's fields and the cases, in the model's order.
    Ok(shape::set_file(&set))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_file_comes_back_as_it_went_in() {
        let text = r#"{
  "eval_set_id": "s1",
  "name": "s1",
  "eval_cases": [
    {
      "eval_id": "c1",
      "conversation": [
        {
          "invocation_id": "e-1",
          "user_content": {
            "parts": [
              {
                "text": "hi"
              }
            ],
            "role": "user"
          },
          "intermediate_data": {}
        }
      ],
      "creation_timestamp": 1764669123.25
    }
  ],
  "creation_timestamp": 1764669000.5
}"#;
        let stored = store_set("s1", &Doc::parse(text).unwrap(), 0.0).unwrap();
        assert_eq!(set_document(&stored).unwrap().to_pretty(), text);
    }

    #[test]
    fn a_mismatched_id_and_a_duplicate_case_are_refused() {
        let other = Doc::parse(r#"{"eval_set_id":"other","eval_cases":[]}"#).unwrap();
        assert!(matches!(
            store_set("s1", &other, 0.0),
            Err(Invalid::Problems(_))
        ));
        let twice = Doc::parse(
            r#"{"eval_cases":[{"eval_id":"a","conversation":[]},{"eval_id":"a","conversation":[]}]}"#,
        )
        .unwrap();
        assert!(matches!(store_set("s1", &twice, 0.0), Err(Invalid::Problems(p)) if p.len() == 1));
    }
}
