//! Agents declared in YAML, ADK's Agent Config format (`root_agent.yaml`):
//!
//! ```yaml
//! agent_class: SequentialAgent      # LlmAgent (default) | EchoAgent | SequentialAgent | ParallelAgent | LoopAgent | RemoteA2aAgent
//! name: pipeline
//! description: Runs two echo agents in order.
//! sub_agents:
//!   - config_path: ./first.yaml     # relative to this file
//!   - config_path: ./second.yaml
//! ```
//!
//! Unknown fields are errors, and every error names the file and the field.

use crate::agent::echo::{EchoAgent, EchoSettings};
use crate::agent::workflow::{LoopAgent, ParallelAgent, SequentialAgent, WorkflowParts};
use crate::agent::{Agent, AgentTree};
use crate::tools::Toolset;
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

/// An app loaded from YAML: its agent tree, and the toolsets its agents hold (MCP servers:
/// connections or child processes), which the registry closes at shutdown.
pub struct Loaded {
    pub tree: AgentTree,
    pub toolsets: Vec<Arc<dyn Toolset>>,
}

/// Loads `file` and everything it references, and validates the tree.
pub fn load_tree(file: &Path) -> Result<Loaded, ConfigError> {
    let mut toolsets = vec![];
    let root = load_agent(file, 0, &mut toolsets)?;
    let tree = AgentTree::new(root).map_err(|e| err(file, e.to_string()))?;
    Ok(Loaded { tree, toolsets })
}

fn load_agent(
    file: &Path,
    depth: usize,
    toolsets: &mut Vec<Arc<dyn Toolset>>,
) -> Result<Arc<dyn Agent>, ConfigError> {
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
        .map(|r| load_agent(&dir.join(&r.config_path), depth + 1, toolsets))
        .collect::<Result<Vec<_>, _>>()?;
    let common = Common {
        name,
        description,
        sub_agents,
    };
    build(&class, common, map, file, toolsets)
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
    toolsets: &mut Vec<Arc<dyn Toolset>>,
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
        "LlmAgent" => llm_agent(c, rest, file, toolsets)?,
        "RemoteA2aAgent" => {
            let s: crate::agent::remote_a2a::RemoteA2aSettings = settings(rest, file, class)?;
            if !c.sub_agents.is_empty() {
                return Err(err(file, "RemoteA2aAgent: it has no `sub_agents` (the remote agent is the agent)"));
            }
            Arc::new(
                crate::agent::remote_a2a::RemoteA2aAgent::new(c.name, c.description, s)
                    .map_err(|e| err(file, format!("RemoteA2aAgent: {e}")))?,
            )
        }
        other => {
            return Err(err(
                file,
                format!(
                    "field `agent_class`: unsupported class {other:?} (supported: LlmAgent, EchoAgent, \
                     SequentialAgent, ParallelAgent, LoopAgent, RemoteA2aAgent)"
                ),
            ))
        }
    })
}

/// One entry of an LLM agent's `tools` (ADK: `{name, args}`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolRef {
    name: String,
    #[serde(default)]
    args: Option<serde_json::Value>,
    /// agentd: calls need the client's approval first (ADK tool confirmation).
    #[serde(default)]
    require_confirmation: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LlmSettings {
    model: Option<String>,
    #[serde(default)]
    model_options: crate::model::ModelOptions,
    #[serde(default)]
    instruction: String,
    #[serde(default)]
    global_instruction: String,
    #[serde(default)]
    tools: Vec<ToolRef>,
    #[serde(default)]
    output_key: Option<String>,
    #[serde(default)]
    generate_content_config: crate::model::GenerateConfig,
    #[serde(default)]
    include_contents: crate::agent::llm::IncludeContents,
    #[serde(default)]
    disallow_transfer_to_parent: bool,
    #[serde(default)]
    disallow_transfer_to_peers: bool,
    #[serde(default)]
    max_steps: Option<u32>,
}

fn llm_agent(
    c: Common,
    rest: Mapping,
    file: &Path,
    toolsets: &mut Vec<Arc<dyn Toolset>>,
) -> Result<Arc<dyn Agent>, ConfigError> {
    for key in [
        "before_agent_callbacks",
        "after_agent_callbacks",
        "before_model_callbacks",
        "after_model_callbacks",
        "before_tool_callbacks",
        "after_tool_callbacks",
    ] {
        if rest.contains_key(key) {
            return Err(err(
                file,
                format!(
                    "field `{key}`: callbacks are Rust code in agentd; register them with \
                     the Rust API (LlmAgent::llm_callbacks / AgentCallbacks)"
                ),
            ));
        }
    }
    let s: LlmSettings = settings(rest, file, "LlmAgent")?;
    let model_name = s
        .model
        .ok_or_else(|| err(file, "LlmAgent: field `model` is required"))?;
    let model_name =
        expand_env(&model_name).map_err(|e| err(file, format!("field `model`: {e}")))?;
    let model = crate::model::resolve(&model_name, &s.model_options)
        .map_err(|e| err(file, format!("field `model`: {e}")))?;
    let mut agent = crate::agent::llm::LlmAgent::new(c.name, model);
    agent.description = c.description;
    agent.sub_agents = c.sub_agents;
    agent.instruction = s.instruction;
    agent.global_instruction = s.global_instruction;
    agent.output_key = s.output_key;
    agent.generate_config = s.generate_content_config;
    agent.include_contents = s.include_contents;
    agent.disallow_transfer_to_parent = s.disallow_transfer_to_parent;
    agent.disallow_transfer_to_peers = s.disallow_transfer_to_peers;
    if let Some(n) = s.max_steps {
        if n == 0 {
            return Err(err(file, "field `max_steps`: must be at least 1"));
        }
        agent.max_steps = n;
    }
    for (i, t) in s.tools.into_iter().enumerate() {
        let at = |m: String| err(file, format!("field `tools[{i}]` ({}): {m}", t.name));
        let name = t.name.strip_prefix("google.adk.tools.").unwrap_or(&t.name);
        let no_args = |tool: Arc<dyn crate::tools::Tool>| match &t.args {
            Some(serde_json::Value::Object(m)) if !m.is_empty() => {
                Err(at("this tool takes no `args`".into()))
            }
            _ => Ok(tool),
        };
        let tool: Arc<dyn crate::tools::Tool> = match name {
            "transfer_to_agent" => no_args(Arc::new(crate::tools::builtin::TransferToAgent))?,
            "exit_loop" => no_args(Arc::new(crate::tools::builtin::ExitLoop))?,
            "load_artifacts" => no_args(Arc::new(crate::tools::builtin::LoadArtifacts))?,
            "load_memory" => no_args(Arc::new(crate::tools::builtin::LoadMemory))?,
            "preload_memory" | "PreloadMemoryTool" => {
                no_args(Arc::new(crate::tools::builtin::PreloadMemory))?
            }
            "HttpTool" => Arc::new(
                crate::tools::http::HttpTool::from_config(t.args.clone().unwrap_or_default())
                    .map_err(at)?,
            ),
            "McpToolset" => {
                if t.require_confirmation {
                    return Err(at(
                        "require_confirmation is not supported on toolsets".into()
                    ));
                }
                let set =
                    crate::tools::mcp::McpToolset::from_config(t.args.clone().unwrap_or_default())
                        .map_err(at)?;
                let set: Arc<dyn Toolset> = Arc::new(set);
                toolsets.push(set.clone());
                agent.toolsets.push(set);
                continue;
            }
            other => {
                return Err(at(format!(
                    "unknown tool {other:?} (built in: transfer_to_agent, exit_loop, \
                     load_artifacts, load_memory, preload_memory, HttpTool, McpToolset; Python \
                     tools need the Rust API)"
                )))
            }
        };
        if agent.tools.iter().any(|x| x.name() == tool.name()) {
            return Err(at(format!("tool name {:?} is declared twice", tool.name())));
        }
        agent.tools.push(if t.require_confirmation {
            Arc::new(crate::tools::RequireConfirmation(tool))
        } else {
            tool
        });
    }
    Ok(Arc::new(agent))
}

/// Expands `${VAR}` and `${VAR:-default}` from the environment, so one config serves several
/// deployments (`model: ${AGENTD_MODEL:-openai/gpt-4o-mini}`).
pub fn expand_env(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed `${{` in {text:?}"))?;
        let inner = &after[..end];
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        match (std::env::var(name).ok().filter(|v| !v.is_empty()), default) {
            (Some(v), _) => out.push_str(&v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                return Err(format!(
                    "environment variable {name} is not set (write ${{{name}:-default}} for a fallback)"
                ))
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::expand_env;

    #[test]
    fn env_expansion() {
        assert_eq!(expand_env("plain").unwrap(), "plain");
        assert_eq!(
            expand_env("${AGENTD_SURELY_UNSET_VAR:-openai/x}").unwrap(),
            "openai/x"
        );
        assert!(expand_env("${AGENTD_SURELY_UNSET_VAR}").is_err());
        assert!(expand_env("${OOPS").is_err());
    }
}
