//! The apps agentd serves: one folder per app under `--apps-dir`, ADK's convention.
//!
//! An app folder holds a `root_agent.yaml` in ADK's Agent Config format. A folder whose file
//! cannot be read or parsed is reported (logged, and listed by `/apps/{app}/app-info` as an
//! error naming the file) without taking the other apps down.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const ROOT_AGENT_FILE: &str = "root_agent.yaml";

/// The part of an ADK Agent Config the registry reads up front.
#[derive(Debug, Clone, Deserialize)]
pub struct AgentConfigHead {
    pub name: String,
    #[serde(default = "default_agent_class")]
    pub agent_class: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub instruction: Option<String>,
}

fn default_agent_class() -> String {
    "LlmAgent".to_string()
}

/// One app folder and what loading it gave.
#[derive(Debug, Clone)]
pub struct AppEntry {
    pub name: String,
    pub dir: PathBuf,
    pub root: Result<AgentConfigHead, String>,
}

/// The apps found under the apps directory, by name.
#[derive(Debug, Clone, Default)]
pub struct AppRegistry {
    pub dir: PathBuf,
    apps: BTreeMap<String, AppEntry>,
}

impl AppRegistry {
    /// Scans `dir`. A missing directory is an empty registry (agentd still serves sessions).
    pub fn load(dir: &Path) -> Self {
        let mut apps = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir(dir) else {
            tracing::warn!(dir = %dir.display(), "apps directory not readable; serving no apps");
            return AppRegistry {
                dir: dir.to_path_buf(),
                apps,
            };
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            if !path.is_dir() || name.starts_with('.') || name.starts_with("__") {
                continue;
            }
            let file = path.join(ROOT_AGENT_FILE);
            if !file.exists() {
                continue;
            }
            let root = std::fs::read_to_string(&file)
                .map_err(|e| format!("{}: {e}", file.display()))
                .and_then(|s| {
                    serde_yaml_ng::from_str::<AgentConfigHead>(&s)
                        .map_err(|e| format!("{}: {e}", file.display()))
                });
            if let Err(e) = &root {
                tracing::error!(app = %name, error = %e, "app failed to load");
            }
            apps.insert(
                name.clone(),
                AppEntry {
                    name,
                    dir: path,
                    root,
                },
            );
        }
        AppRegistry {
            dir: dir.to_path_buf(),
            apps,
        }
    }

    /// Sorted app names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.apps.keys().map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Option<&AppEntry> {
        self.apps.get(name)
    }

    pub fn entries(&self) -> impl Iterator<Item = &AppEntry> {
        self.apps.values()
    }
}
