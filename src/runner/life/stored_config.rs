//! What admission stores of a run's configuration (`run_config` on the session row), and the
//! configuration a replica that takes the run over continues with: the request's options
//! that change what the agent does, nothing that belongs to the client who sent it.

use crate::event::JsonMap;
use crate::invocation::RunConfig;
use crate::model::ToolDeclaration;
use serde::{Deserialize, Serialize};

/// A run's configuration as admission stores it, for a replica that takes the run over.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct StoredConfig {
    streaming: bool,
    save_input_blobs_as_artifacts: bool,
    custom_metadata: Option<JsonMap>,
    resume: bool,
    client_tools: Vec<StoredTool>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct StoredTool {
    name: String,
    description: String,
    parameters: Option<serde_json::Value>,
}

/// `config` as admission stores it (`None`: all defaults, nothing to store).
pub(in crate::runner) fn stored_config(config: &RunConfig) -> Option<serde_json::Value> {
    let stored = StoredConfig {
        streaming: config.streaming,
        save_input_blobs_as_artifacts: config.save_input_blobs_as_artifacts,
        custom_metadata: config.custom_metadata.clone(),
        resume: config.resume,
        client_tools: config
            .client_tools
            .iter()
            .map(|t| StoredTool {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.clone(),
            })
            .collect(),
    };
    (stored != StoredConfig::default())
        .then(|| serde_json::to_value(stored).ok())
        .flatten()
}

/// The configuration a taken-over run continues with.
pub(super) fn run_config(stored: Option<serde_json::Value>) -> RunConfig {
    let stored: StoredConfig = stored
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    RunConfig {
        streaming: stored.streaming,
        save_input_blobs_as_artifacts: stored.save_input_blobs_as_artifacts,
        custom_metadata: stored.custom_metadata,
        user_event_metadata: None,
        resume: true,
        client_tools: stored
            .client_tools
            .into_iter()
            .map(|t| ToolDeclaration {
                name: t.name,
                description: t.description,
                parameters: t.parameters,
            })
            .collect(),
        takeover: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_goes_through_the_database_and_back() {
        assert_eq!(
            stored_config(&RunConfig::default()),
            None,
            "defaults: nothing stored"
        );
        let config = RunConfig {
            streaming: true,
            custom_metadata: Some(serde_json::from_str(r#"{"k": 1}"#).unwrap()),
            client_tools: vec![ToolDeclaration {
                name: "pick".into(),
                description: "d".into(),
                parameters: None,
            }],
            ..Default::default()
        };
        let back = run_config(stored_config(&config));
        assert!(back.streaming && back.resume && back.takeover);
        assert_eq!(back.custom_metadata, config.custom_metadata);
        assert_eq!(back.client_tools, config.client_tools);
    }
}
