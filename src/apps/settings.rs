//! An app's server-side settings: `agentd.yaml` next to `root_agent.yaml`. They are agentd's
//! (webhooks, the A2A card), so `root_agent.yaml` stays a file ADK itself can load.
//!
//! ```yaml
//! webhooks:
//!   - url: https://hooks.example.com/agentd
//!     secret: ${ORDERS_WEBHOOK_SECRET}
//!     events: [run.completed, run.failed]
//! compaction:
//!   interval: 10        # summarise every 10 new turns
//!   overlap: 1
//!   model: openai/gpt-4o-mini
//! resume: always       # a run outlives its replica (docs/replicas.md); `never`: sealed
//! memory:              # search by meaning as well as words (docs/memory.md)
//!   embedding_model: openai/text-embedding-3-small
//!   dimensions: 512
//!   mode: extract      # keep facts a model extracts, not the events themselves
//!   extraction_model: openai/gpt-4o-mini
//!   ttl_days: 365      # forget what was not stated or updated for a year
//!   idle_seconds: 600  # add a session once it has paused for 10 minutes
//! context_cache:       # ADK's ContextCacheConfig names (docs/usage.md#prompt-caching)
//!   ttl_seconds: 3600
//!   min_tokens: 1024
//! a2a:
//!   name: Order desk
//!   description: Answers questions about orders.
//!   skills:
//!     - id: track
//!       description: Where an order is.
//!       examples: ["Where is order 1234?"]
//! ```

use super::yaml::expand_env;
use crate::webhook::AppWebhook;
use serde::Deserialize;
use std::path::Path;

pub const SETTINGS_FILE: &str = "agentd.yaml";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppSettings {
    /// Sent at the end of every run of the app.
    #[serde(default)]
    pub webhooks: Vec<AppWebhook>,
    /// What the app's A2A agent card says instead of what agentd derives from the tree.
    #[serde(default)]
    pub a2a: Option<A2aCard>,
    /// Summarise older turns of long sessions (`docs/editing.md`).
    #[serde(default)]
    pub compaction: Option<CompactionSettings>,
    /// Whether a run whose replica dies (or drains) goes on on another replica
    /// (`docs/replicas.md`, "Durable runs").
    #[serde(default)]
    pub resume: Resume,
    /// Ask providers to cache the prompt's stable prefix (`docs/usage.md`).
    #[serde(default)]
    pub context_cache: Option<crate::model::ContextCache>,
    /// How the app's memory is searched (`docs/memory.md`).
    #[serde(default)]
    pub memory: Option<MemorySettings>,
    /// How the app's eval sets are judged (`docs/evals.md`).
    #[serde(default)]
    pub evals: JudgeSettings,
}

/// `evals:` of an app's `agentd.yaml`: the judge model of its LLM-as-judge eval metrics
/// ([`crate::eval::metrics::judge`]).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeSettings {
    /// The judge of criteria that name none (instead of ADK's `gemini-2.5-flash`).
    #[serde(default)]
    pub judge_model: Option<String>,
    /// Where and how to reach the judge: `model_options`' fields (`base_url`, `api_key_env`,
    /// …).
    #[serde(default)]
    pub judge_options: crate::model::ModelOptions,
}

/// The `memory:` block, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySettings {
    /// What adding a session stores: its events as they are (`raw`, the default), or the
    /// facts about the user an extraction model finds in them (`extract`).
    #[serde(default)]
    pub mode: MemoryMode,
    /// The embedding model (`openai/text-embedding-3-small`, `gemini/text-embedding-004`, or a
    /// bare name for an OpenAI-compatible server; `${VAR}` expanded).
    #[serde(default)]
    pub embedding_model: Option<String>,
    /// Where and how to reach it: `model_options`' fields (`base_url`, `api_key_env`, …).
    #[serde(default)]
    pub embedding_options: crate::model::ModelOptions,
    /// The size of its vectors (sent to the provider, and checked on every answer).
    #[serde(default)]
    pub dimensions: Option<u32>,
    /// The model that extracts facts (`mode: extract`; `${VAR}` expanded).
    #[serde(default)]
    pub extraction_model: Option<String>,
    #[serde(default)]
    pub extraction_options: crate::model::ModelOptions,
    /// The extraction model's instruction, instead of agentd's.
    #[serde(default)]
    pub extraction_prompt: Option<String>,
    /// Memories not stated or updated for this many days are forgotten (with their
    /// revisions); none by default.
    #[serde(default)]
    pub ttl_days: Option<f64>,
    /// A session is added to memory once no run of it has ended for this many seconds,
    /// instead of when each run ends (docs/memory.md#when-sessions-are-added).
    #[serde(default)]
    pub idle_seconds: Option<u64>,
}

/// `memory: mode:`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryMode {
    #[default]
    Raw,
    Extract,
}

/// The longest `memory: idle_seconds:`, a week.
pub const MAX_IDLE_SECONDS: u64 = 7 * 86_400;

pub use crate::memory::app::AppMemory;

impl MemorySettings {
    pub fn build(&self) -> Result<AppMemory, String> {
        let embedder = match (&self.embedding_model, self.dimensions) {
            (Some(model), Some(dims)) => {
                let name =
                    expand_env(model).map_err(|e| format!("memory: embedding_model: {e}"))?;
                Some(
                    crate::model::embed::resolve(&name, &self.embedding_options, dims)
                        .map_err(|e| format!("memory: {e}"))?,
                )
            }
            (None, None) => None,
            (Some(_), None) => return Err("memory: embedding_model needs dimensions".into()),
            (None, Some(_)) => return Err("memory: dimensions needs embedding_model".into()),
        };
        let extraction = match (self.mode, &self.extraction_model) {
            (MemoryMode::Extract, Some(model)) => {
                let name =
                    expand_env(model).map_err(|e| format!("memory: extraction_model: {e}"))?;
                let model = crate::model::resolve(&name, &self.extraction_options)
                    .map_err(|e| format!("memory: extraction_model: {e}"))?;
                let secs = self.extraction_options.timeout_secs.unwrap_or(60)
                    + self.extraction_options.idle_timeout_secs.unwrap_or(120);
                Some(std::sync::Arc::new(crate::memory::extract::Extraction {
                    model,
                    prompt: self
                        .extraction_prompt
                        .clone()
                        .unwrap_or_else(|| crate::memory::extract::DEFAULT_PROMPT.to_string()),
                    timeout: std::time::Duration::from_secs(secs),
                }))
            }
            (MemoryMode::Extract, None) => {
                return Err("memory: mode: extract needs extraction_model".into())
            }
            (MemoryMode::Raw, Some(_)) => {
                return Err("memory: extraction_model needs mode: extract".into())
            }
            (MemoryMode::Raw, None) => None,
        };
        let ttl = match self.ttl_days {
            None => None,
            Some(d) if d.is_finite() && d > 0.0 && d <= 36_500.0 => {
                Some(std::time::Duration::from_secs_f64(d * 86_400.0))
            }
            Some(d) => {
                return Err(format!(
                    "memory: ttl_days must be over 0 and at most 36500, not {d}"
                ))
            }
        };
        let idle = match self.idle_seconds {
            None => None,
            Some(s) if (1..=MAX_IDLE_SECONDS).contains(&s) => {
                Some(std::time::Duration::from_secs(s))
            }
            Some(s) => {
                return Err(format!(
                    "memory: idle_seconds must be 1 to {MAX_IDLE_SECONDS} (a week), not {s}"
                ))
            }
        };
        Ok(AppMemory {
            embedder,
            extraction,
            ttl,
            idle,
        })
    }
}

/// `resume:` of `agentd.yaml`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resume {
    /// Another replica continues the run from its committed events.
    #[default]
    Always,
    /// The run is sealed and ends `abandoned` (or `interrupted` on a drain), as before
    /// durable runs: for agents whose turn must not be continued by another process.
    Never,
}

/// The `compaction:` block, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CompactionSettings {
    #[serde(default, alias = "compaction_interval")]
    pub interval: Option<usize>,
    #[serde(default, alias = "overlap_size")]
    pub overlap: usize,
    #[serde(default, alias = "token_threshold")]
    pub token_threshold: Option<u64>,
    /// The model that writes the summaries (`openai/gpt-4o-mini`, `${VAR}` expanded).
    pub model: String,
    #[serde(default, alias = "model_options")]
    pub model_options: crate::model::ModelOptions,
    /// The summariser's instruction, instead of agentd's.
    #[serde(default)]
    pub prompt: Option<String>,
}

/// An app's compaction: when, which model, what instruction.
#[derive(Clone)]
pub struct Compaction {
    pub policy: crate::transcript::compaction::CompactionPolicy,
    pub model: std::sync::Arc<dyn crate::model::Model>,
    pub prompt: String,
}

impl CompactionSettings {
    pub fn build(&self) -> Result<Compaction, String> {
        let policy = crate::transcript::compaction::CompactionPolicy {
            interval: self.interval,
            overlap: self.overlap,
            token_threshold: self.token_threshold,
        };
        policy.validate()?;
        let name = expand_env(&self.model).map_err(|e| format!("compaction: model: {e}"))?;
        let model = crate::model::resolve(&name, &self.model_options)
            .map_err(|e| format!("compaction: model: {e}"))?;
        Ok(Compaction {
            policy,
            model,
            prompt: self
                .prompt
                .clone()
                .unwrap_or_else(|| crate::transcript::compaction::DEFAULT_PROMPT.to_string()),
        })
    }
}

/// The `a2a:` block: overrides of the agent card (`docs/a2a.md`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct A2aCard {
    pub name: Option<String>,
    pub description: Option<String>,
    pub version: Option<String>,
    #[serde(alias = "documentation_url")]
    pub documentation_url: Option<String>,
    #[serde(default)]
    pub skills: Vec<A2aSkill>,
}

/// One skill of a card.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct A2aSkill {
    pub id: String,
    pub name: Option<String>,
    pub description: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub examples: Vec<String>,
}

/// Reads `dir/agentd.yaml` (none: the defaults), with `${VAR}` expanded in secrets.
pub fn load_settings(dir: &Path) -> Result<AppSettings, String> {
    let file = dir.join(SETTINGS_FILE);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(AppSettings::default()),
        Err(e) => return Err(format!("{}: cannot read: {e}", file.display())),
    };
    let mut settings: AppSettings =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    for hook in &mut settings.webhooks {
        if let Some(secret) = &hook.secret {
            hook.secret = Some(expand_env(secret).map_err(|e| format!("{}: {e}", file.display()))?);
        }
    }
    Ok(settings)
}
