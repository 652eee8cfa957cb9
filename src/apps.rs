//! The apps agentd serves: one folder per app under `--apps-dir` (ADK's convention), each
//! with a `root_agent.yaml`, plus apps registered from Rust with [`AppRegistry::insert`].
//!
//! A folder whose config cannot be loaded is kept with its error (logged at start, shown by
//! `list-apps?detailed=true` and `app-info`, and returned by `/run`) without taking the
//! other apps down.

use crate::agent::config::load_tree;
use crate::agent::AgentTree;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const ROOT_AGENT_FILE: &str = "root_agent.yaml";

/// One app and what loading it gave.
#[derive(Clone)]
pub struct AppEntry {
    pub name: String,
    pub tree: Result<Arc<AgentTree>, String>,
}

/// The apps, by name.
#[derive(Clone, Default)]
pub struct AppRegistry {
    pub dir: PathBuf,
    apps: BTreeMap<String, AppEntry>,
}

impl AppRegistry {
    /// Scans `dir`. A missing directory is an empty registry (agentd still serves sessions).
    pub fn load(dir: &Path) -> Self {
        let mut registry = AppRegistry {
            dir: dir.to_path_buf(),
            apps: BTreeMap::new(),
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            tracing::warn!(dir = %dir.display(), "apps directory not readable; serving no apps");
            return registry;
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
            let file = path.join(ROOT_AGENT_FILE);
            if name.starts_with('.') || name.starts_with("__") || !file.is_file() {
                continue;
            }
            let tree = load_tree(&file).map(Arc::new).map_err(|e| e.to_string());
            match &tree {
                Ok(t) => tracing::info!(app = %name, root = t.root().name(), "app loaded"),
                Err(e) => tracing::error!(app = %name, error = %e, "app failed to load"),
            }
            registry.apps.insert(name.clone(), AppEntry { name, tree });
        }
        registry
    }

    /// Registers (or replaces) an app built in Rust.
    pub fn insert(&mut self, name: impl Into<String>, tree: AgentTree) {
        let name = name.into();
        self.apps.insert(
            name.clone(),
            AppEntry {
                name,
                tree: Ok(Arc::new(tree)),
            },
        );
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
