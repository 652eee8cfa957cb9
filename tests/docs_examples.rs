//! The documentation's examples run as written: `scripts/docs-examples.sh` runs every `sh`
//! block of README.md and docs/*.md, top to bottom, each file against a fresh `agentd serve`
//! of this build (a scripted model where a key would be needed, a local webhook receiver),
//! and fails on an answer the example does not state. A doc that drifts from the server fails
//! here.

use std::process::Command;

#[test]
fn every_documented_example_runs_as_written() {
    for tool in ["python3", "jq", "curl"] {
        let found = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "the documentation's examples need {tool}, which is not installed \
             (scripts/docs-examples.sh runs them with curl and jq, and its fixtures with python3)"
        );
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/docs-examples.sh");
    let out = Command::new(script)
        .arg(env!("CARGO_BIN_EXE_agentd"))
        .output()
        .expect("scripts/docs-examples.sh runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "a documented example failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}
