//! The apps agentd serves: one folder per app under `--apps-dir` (ADK's convention), each
//! with a `root_agent.yaml`, plus apps registered from Rust with [`AppRegistry::insert`].
//!
//! A folder whose config cannot be loaded is kept with its error (logged at start, shown by
//! `list-apps?detailed=true` and `app-info`, and returned by `/run`) without taking the
//! other apps down. The registry owns what the apps hold open (MCP toolsets) and closes it
//! ([`AppRegistry::close`]).

pub mod settings;
pub mod yaml;

use crate::agent::AgentTree;
use crate::tools::Toolset;
use crate::webhook::{AppWebhook, WebhookPolicy, WebhookTarget};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use yaml::load_tree;

pub const ROOT_AGENT_FILE: &str = "root_agent.yaml";

/// One app and what loading it gave.
#[derive(Clone)]
pub struct AppEntry {
    pub name: String,
    pub tree: Result<Arc<AgentTree>, String>,
    /// Toolsets holding connections or child processes (MCP), closed by
    /// [`AppRegistry::close`].
    toolsets: Vec<Arc<dyn Toolset>>,
    /// `webhooks:` of the app's `agentd.yaml`, as written; checked into [`Self::webhooks`]
    /// by [`AppRegistry::apply_webhook_policy`].
    app_webhooks: Vec<AppWebhook>,
    /// Sent at the end of every run of the app.
    pub webhooks: Vec<WebhookTarget>,
    /// The `a2a:` block of the app's `agentd.yaml`.
    pub a2a: Option<settings::A2aCard>,
    /// The `compaction:` block of the app's `agentd.yaml`, built.
    pub compaction: Option<settings::Compaction>,
    /// `resume:` of the app's `agentd.yaml`.
    pub resume: settings::Resume,
    /// `context_cache:` of the app's `agentd.yaml`.
    pub context_cache: Option<crate::model::ContextCache>,
    /// The `memory:` block of the app's `agentd.yaml`, built: its embedding model (search by
    /// meaning), its extraction, its memories' lifetime.
    pub memory: settings::AppMemory,
    /// The `evals:` block of the app's `agentd.yaml`: its eval judge.
    pub evals: settings::JudgeSettings,
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
            let settings = settings::load_settings(&path);
            let compaction = match settings
                .as_ref()
                .map(|s| s.compaction.as_ref().map(|c| c.build()))
            {
                Ok(Some(Err(e))) => Some(Err(e)),
                Ok(Some(Ok(c))) => Some(Ok(c)),
                _ => None,
            };
            let (tree, toolsets) = match settings
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|_| load_tree(&file).map_err(|e| e.to_string()))
            {
                Ok(loaded) => {
                    tracing::info!(app = %name, root = loaded.tree.root().name(), "app loaded");
                    (Ok(Arc::new(loaded.tree)), loaded.toolsets)
                }
                Err(e) => {
                    tracing::error!(app = %name, error = %e, "app failed to load");
                    (Err(e), vec![])
                }
            };
            let memory = match settings
                .as_ref()
                .map(|s| s.memory.as_ref().map(|m| m.build()))
            {
                Ok(Some(r)) => Some(r),
                _ => None,
            };
            let (tree, compaction) = match compaction {
                Some(Err(e)) => {
                    tracing::error!(app = %name, error = %e, "app failed to load");
                    (Err(format!("{}: {e}", settings::SETTINGS_FILE)), None)
                }
                Some(Ok(c)) => (tree, Some(c)),
                None => (tree, None),
            };
            let (tree, memory) = match memory {
                Some(Err(e)) => {
                    tracing::error!(app = %name, error = %e, "app failed to load");
                    (
                        Err(format!("{}: {e}", settings::SETTINGS_FILE)),
                        Default::default(),
                    )
                }
                Some(Ok(m)) => (tree, m),
                None => (tree, Default::default()),
            };
            let resume = settings.as_ref().map(|s| s.resume).unwrap_or_default();
            let context_cache = settings.as_ref().ok().and_then(|s| s.context_cache);
            let evals = settings
                .as_ref()
                .map(|s| s.evals.clone())
                .unwrap_or_default();
            let (app_webhooks, a2a) = settings.map(|s| (s.webhooks, s.a2a)).unwrap_or_default();
            registry.apps.insert(
                name.clone(),
                AppEntry {
                    name,
                    tree,
                    toolsets,
                    app_webhooks,
                    webhooks: vec![],
                    a2a,
                    compaction,
                    resume,
                    context_cache,
                    memory,
                    evals,
                },
            );
        }
        registry
    }

    /// Checks the apps' webhooks against the server's policy (URL, secret, events); an app
    /// with a bad one fails to load, with the reason, like a bad agent config.
    pub fn apply_webhook_policy(&mut self, policy: &WebhookPolicy) {
        for app in self.apps.values_mut() {
            let checked: Result<Vec<WebhookTarget>, String> = app
                .app_webhooks
                .iter()
                .map(|h| {
                    policy.app_target(h).map_err(|e| {
                        format!(
                            "{}: webhook {}: {}",
                            settings::SETTINGS_FILE,
                            h.url,
                            e.message
                        )
                    })
                })
                .collect();
            match checked {
                Ok(targets) => app.webhooks = targets,
                Err(e) => {
                    tracing::error!(app = %app.name, error = %e, "app failed to load");
                    app.tree = Err(e);
                }
            }
        }
    }

    /// Registers (or replaces) an app built in Rust.
    pub fn insert(&mut self, name: impl Into<String>, tree: AgentTree) {
        self.insert_with_toolsets(name, tree, vec![]);
    }

    /// Registers (or replaces) an app built in Rust whose agents hold `toolsets` that need
    /// closing at shutdown (MCP servers started as child processes).
    pub fn insert_with_toolsets(
        &mut self,
        name: impl Into<String>,
        tree: AgentTree,
        toolsets: Vec<Arc<dyn Toolset>>,
    ) {
        let name = name.into();
        self.apps.insert(
            name.clone(),
            AppEntry {
                name,
                tree: Ok(Arc::new(tree)),
                toolsets,
                app_webhooks: vec![],
                webhooks: vec![],
                a2a: None,
                compaction: None,
                resume: settings::Resume::default(),
                context_cache: None,
                memory: Default::default(),
                evals: Default::default(),
            },
        );
    }

    /// Whether runs of app `name` (built in Rust) go on on another replica when theirs dies.
    pub fn set_resume(&mut self, name: &str, resume: settings::Resume) {
        if let Some(app) = self.apps.get_mut(name) {
            app.resume = resume;
        }
    }

    /// Asks providers to cache the prompts of app `name` (built in Rust).
    pub fn set_context_cache(&mut self, name: &str, cache: crate::model::ContextCache) {
        if let Some(app) = self.apps.get_mut(name) {
            app.context_cache = Some(cache);
        }
    }

    /// Compacts the long sessions of app `name` (built in Rust) as `compaction` says.
    pub fn set_compaction(&mut self, name: &str, compaction: settings::Compaction) {
        if let Some(app) = self.apps.get_mut(name) {
            app.compaction = Some(compaction);
        }
    }

    /// Gives app `name` (built in Rust) a memory as `memory:` of an `agentd.yaml` would: an
    /// embedding model, an extraction, a lifetime.
    pub fn set_memory(&mut self, name: &str, memory: settings::AppMemory) {
        if let Some(app) = self.apps.get_mut(name) {
            app.memory = memory;
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

    /// Closes every app's toolsets (MCP connections and child processes end with agentd).
    pub async fn close(&self) {
        for app in self.apps.values() {
            for set in &app.toolsets {
                set.close().await;
            }
        }
    }
}
