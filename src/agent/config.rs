//! Agents declared in YAML, ADK's Agent Config format (`root_agent.yaml`):
//!
//! ```yaml
//! agent_class: SequentialAgent      # EchoAgent | SequentialAgent | ParallelAgent | LoopAgent
//! name: pipeline
//! description: Runs two echo agents in order.
//! sub_agents:
//!   - config_path: ./first.yaml     # relative to this file
//!   - config_path: ./second.yaml
//! ```
//!
//! Unknown fields are errors, and every error names the file and the field.

use super::echo::{EchoAgent, EchoSettings};
use super::workflow::{LoopAgent, ParallelAgent, SequentialAgent, WorkflowParts};
use super::{Agent, AgentTree};
use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A config file that could not be turned into an agent tree.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    pub file: PathBuf,
    pub message: String,
}

fn err(file: &Path, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: file.to_path_buf(),
        message: message.into(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubAgentRef {
    config_path: PathBuf,
}

/// Fields every agent class shares.
struct Common {
    name: String,
    description: String,
    sub_agents: Vec<Arc<dyn Agent>>,
}

/// Loads `file` and everything it references, and validates the tree.
pub fn load_tree(file: &Path) -> Result<AgentTree, ConfigError> {
    let root = load_agent(file, 0)?;
    AgentTree::new(root).map_err(|e| err(file, e.to_string()))
}

fn load_agent(file: &Path, depth: usize) -> Result<Arc<dyn Agent>, ConfigError> {
    if depth > 16 {
        return Err(err(
            file,
            "sub_agents nest deeper than 16 levels (a config_path cycle?)",
        ));
    }
    let text = std::fs::read_to_string(file).map_err(|e| err(file, format!("cannot read: {e}")))?;
    let value: Value = serde_yaml_ng::from_str(&text).map_err(|e| err(file, e.to_string()))?;
    let Value::Mapping(mut map) = value else {
        return Err(err(file, "expected a mapping of agent fields"));
    };
    let class = take_string(&mut map, "agent_class", file)?.unwrap_or_else(|| "LlmAgent".into());
    let name = take_string(&mut map, "name", file)?
        .ok_or_else(|| err(file, "field `name` is required"))?;
    let description = take_string(&mut map, "description", file)?.unwrap_or_default();
    let refs: Vec<SubAgentRef> = match map.remove("sub_agents") {
        Some(v) => serde_yaml_ng::from_value(v)
            .map_err(|e| err(file, format!("field `sub_agents`: {e}")))?,
        None => vec![],
    };
    let dir = file.parent().unwrap_or(Path::new("."));
    let sub_agents = refs
        .iter()
        .map(|r| load_agent(&dir.join(&r.config_path), depth + 1))
        .collect::<Result<Vec<_>, _>>()?;
    let common = Common {
        name,
        description,
        sub_agents,
    };
    build(&class, common, map, file)
}

fn take_string(map: &mut Mapping, key: &str, file: &Path) -> Result<Option<String>, ConfigError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(err(
            file,
            format!("field `{key}` must be a string, got {other:?}"),
        )),
    }
}

fn settings<T: serde::de::DeserializeOwned>(
    rest: Mapping,
    file: &Path,
    class: &str,
) -> Result<T, ConfigError> {
    serde_yaml_ng::from_value(Value::Mapping(rest)).map_err(|e| err(file, format!("{class}: {e}")))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoSettings {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoopSettings {
    #[serde(default)]
    max_iterations: Option<u32>,
}

fn build(
    class: &str,
    c: Common,
    rest: Mapping,
    file: &Path,
) -> Result<Arc<dyn Agent>, ConfigError> {
    let parts = |c: Common| WorkflowParts {
        name: c.name,
        description: c.description,
        sub_agents: c.sub_agents,
        callbacks: None,
    };
    Ok(match class {
        "EchoAgent" => {
            let settings: EchoSettings = settings(rest, file, class)?;
            Arc::new(EchoAgent {
                name: c.name,
                description: c.description,
                settings,
                sub_agents: c.sub_agents,
                callbacks: None,
            })
        }
        "SequentialAgent" => {
            settings::<NoSettings>(rest, file, class)?;
            Arc::new(SequentialAgent { parts: parts(c) })
        }
        "ParallelAgent" => {
            settings::<NoSettings>(rest, file, class)?;
            Arc::new(ParallelAgent { parts: parts(c) })
        }
        "LoopAgent" => {
            let s: LoopSettings = settings(rest, file, class)?;
            if c.sub_agents.is_empty() {
                return Err(err(file, "LoopAgent: `sub_agents` must not be empty"));
            }
            Arc::new(LoopAgent {
                parts: parts(c),
                max_iterations: s.max_iterations,
            })
        }
        other => {
            return Err(err(
                file,
                format!(
                    "field `agent_class`: unsupported class {other:?} (supported: EchoAgent, SequentialAgent, \
                     ParallelAgent, LoopAgent)"
                ),
            ))
        }
    })
}
