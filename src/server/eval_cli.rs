//! `agentd eval`: an eval set file run against an app inside this process, for CI. The cases
//! run as ordinary runs of a runner of its own, over its own database (embedded SQLite unless
//! `--database-url`); the result is a table on stdout, a result JSON, and the exit code.
//!
//! Only the runner is started: no HTTP listener, no scheduler, no webhook sender, no memory
//! loops and no memory ingestion, and the apps' webhooks are not attached to the runs. With
//! `--database-url` naming a database that replicas serve, the command is then not one of
//! them: it claims no schedule tick or delivery of theirs, and its runs notify nobody.

use crate::apps::AppRegistry;
use crate::config::{EvalArgs, ServeArgs};
use crate::eval::doc::Doc;
use crate::eval::metrics::{Criteria, Status};
use crate::eval::replay::{new_session_id, run_case, CaseResult};
use crate::eval::result::result_document;
use crate::invocation::PluginSet;
use crate::runner::{Runner, RunnerConfig};
use futures::StreamExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Every case passed.
pub const EXIT_PASSED: i32 = 0;
/// A case did not pass: below a threshold, not scored, or its runs failed.
pub const EXIT_FAILED: i32 = 1;
/// Nothing was scored: the set, the config, the app or the output could not be used.
pub const EXIT_UNUSABLE: i32 = 2;

/// The config `adk eval` reads beside the set when none is given.
const CONFIG_BESIDE_SET: &str = "test_config.json";

/// Runs `agentd eval`; the process's exit code.
pub async fn run(args: EvalArgs) -> i32 {
    match evaluate(&args).await {
        Ok(results) if results.iter().all(|r| r.status() == Status::Passed) => EXIT_PASSED,
        Ok(_) => EXIT_FAILED,
        Err(e) => {
            eprintln!("agentd eval: {e:#}");
            EXIT_UNUSABLE
        }
    }
}

/// A temporary directory removed when dropped (the default database lives in it).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn evaluate(args: &EvalArgs) -> anyhow::Result<Vec<CaseResult>> {
    // Everything that can be wrong with the command is found before a database is opened.
    let (set_id, cases) = read_set(&args.eval_set)?;
    let criteria = criteria(args)?;
    let apps = AppRegistry::load(&args.apps_dir);
    match apps.get(&args.app) {
        Some(entry) => {
            if let Err(e) = &entry.tree {
                anyhow::bail!("app {:?} does not load: {e}", args.app);
            }
        }
        None => anyhow::bail!(
            "no app {:?} in {} (it has: {})",
            args.app,
            args.apps_dir.display(),
            apps.names().collect::<Vec<_>>().join(", ")
        ),
    }
    super::warn_missing_keys(&apps);
    let output = args.output.clone().unwrap_or_else(|| {
        // ADK's `_sanitize_eval_set_result_name`: the id names a file in this directory.
        PathBuf::from(format!("{}.evalset_result.json", set_id.replace('/', "_")))
    });
    // Opened now, without truncating: a path that cannot take the result fails before any
    // case has run, and a result file already there is left as it is until the new one is
    // written.
    let existed = output.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&output)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", output.display()))?;
    if !existed {
        let _ = std::fs::remove_file(&output);
    }

    let mut _temp = None;
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => {
            let dir = std::env::temp_dir().join(format!("agentd-eval-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&dir)
                .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
            let url = format!("sqlite://{}", dir.join("eval.db").display());
            _temp = Some(TempDir(dir));
            url
        }
    };
    let store = super::open_store(&ServeArgs::for_database(url)).await?;
    let runner = Runner::start(
        store.clone(),
        Arc::new(apps),
        PluginSet::default(),
        RunnerConfig::default(),
        vec![],
    )
    .await
    .map_err(|e| anyhow::anyhow!("cannot start the runner: {e}"))?;
    let (runner_ref, store_ref, criteria_ref) = (&runner, &store, &criteria);
    let results: Vec<CaseResult> = futures::stream::iter(cases.iter())
        .map(|case| async move {
            let session = new_session_id();
            run_case(
                runner_ref,
                store_ref,
                &args.app,
                case,
                criteria_ref,
                &session,
            )
            .await
        })
        .buffered(usize::from(args.concurrency))
        .collect()
        .await;
    // Nothing above fails once the runner runs; its runs have all ended by now.
    runner
        .shutdown(Duration::from_secs(5), Duration::from_secs(5))
        .await;
    print!("{}", table(&criteria, &results));
    let doc = result_document(&args.app, &set_id, &results);
    std::fs::write(&output, doc.to_pretty())
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", output.display()))?;
    eprintln!("results: {}", output.display());
    Ok(results)
}

/// `--config`, else `test_config.json` beside the set (as `adk eval` looks for it), else ADK's
/// default criteria.
fn criteria(args: &EvalArgs) -> anyhow::Result<Criteria> {
    let beside = args
        .eval_set
        .parent()
        .map(|dir| dir.join(CONFIG_BESIDE_SET))
        .filter(|p| p.is_file());
    let Some(path) = args.config.clone().or(beside) else {
        return Ok(Criteria::default());
    };
    let doc = read_json(&path)?;
    Criteria::parse(&doc).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn read_json(path: &Path) -> anyhow::Result<Doc> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    Doc::parse(&text).map_err(|e| anyhow::anyhow!("{} is not JSON: {e}", path.display()))
}

/// The set's id and its cases (file form), checked as an import is.
fn read_set(path: &Path) -> anyhow::Result<(String, Vec<Doc>)> {
    let doc = read_json(path)?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("eval_set");
    let stem = name
        .strip_suffix(".evalset.json")
        .or_else(|| name.strip_suffix(".test.json"))
        .or_else(|| name.strip_suffix(".json"))
        .unwrap_or(name);
    let id = doc
        .get("eval_set_id")
        .or_else(|| doc.get("evalSetId"))
        .and_then(Doc::as_str)
        .unwrap_or(stem)
        .to_string();
    let stored =
        crate::eval::store_set(&id, &doc, crate::event::now_ts()).map_err(|e| match e {
            crate::eval::Invalid::Problems(p) => anyhow::anyhow!(
                "{} is not a valid eval set:\n{}",
                path.display(),
                p.iter()
                    .map(|p| format!(
                        "  at {}: {}",
                        serde_json::Value::Array(p.loc.clone()),
                        p.msg
                    ))
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
            crate::eval::Invalid::TooLarge(case, n) => {
                anyhow::anyhow!("case {case:?} is {n} bytes, over the limit")
            }
            crate::eval::Invalid::TooMany(n) => anyhow::anyhow!("{n} cases, over the limit"),
            crate::eval::Invalid::SetTooLarge(n) => anyhow::anyhow!("the cases are over {n} bytes"),
        })?;
    let cases = stored
        .cases
        .iter()
        .map(|(_, text)| Doc::parse(text))
        .collect::<Result<Vec<_>, _>>()?;
    if cases.is_empty() {
        anyhow::bail!("{} has no eval cases", path.display());
    }
    // A scenario case needs a simulated user, which agentd does not have; a case of no turns
    // would score nothing and pass.
    for case in &cases {
        let id = case.get("eval_id").and_then(Doc::as_str).unwrap_or("?");
        if case
            .get("conversation_scenario")
            .is_some_and(|s| !matches!(s, Doc::Null))
        {
            anyhow::bail!(
                "case {id:?} is a conversation scenario (a simulated user): agentd replays \
                 conversations only"
            );
        }
        if case
            .get("conversation")
            .and_then(Doc::as_array)
            .is_none_or(|c| c.is_empty())
        {
            anyhow::bail!("case {id:?} has no invocations to replay");
        }
    }
    Ok((id, cases))
}

/// Cases × metrics, a row per case: each metric's score (or why it has none) and the case's
/// verdict.
fn table(criteria: &Criteria, results: &[CaseResult]) -> String {
    let mut head = vec!["eval_id".to_string()];
    head.extend(
        criteria
            .0
            .iter()
            .map(|c| format!("{} (≥ {})", c.name, c.threshold)),
    );
    head.push("result".into());
    let mut rows = vec![head];
    for r in results {
        let mut row = vec![r.eval_id.clone()];
        match &r.metrics {
            Ok(m) => row.extend(m.iter().map(|(_, s)| match s.score {
                Some(score) => format!("{score:.3} {}", s.status.label()),
                None => s.status.label().to_string(),
            })),
            Err(_) => row.extend(criteria.0.iter().map(|_| "-".to_string())),
        }
        row.push(r.status().label().to_string());
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    for r in results {
        if let Err(e) = &r.metrics {
            out.push_str(&format!("{}: {e}\n", r.eval_id));
        }
    }
    let passed = results
        .iter()
        .filter(|r| r.status() == Status::Passed)
        .count();
    out.push_str(&format!("{passed} of {} cases passed\n", results.len()));
    out
}
