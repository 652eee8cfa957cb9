//! An app's memory as agentd runs it: what its `memory:` block of `agentd.yaml`
//! ([`crate::apps::settings::MemorySettings`]) builds into. It lives here, below the apps and
//! the invocation context that both hold it, so neither reaches up into the other.

/// An app's memory, built from its `memory:` block.
#[derive(Clone, Default)]
pub struct AppMemory {
    pub embedder: Option<std::sync::Arc<dyn crate::model::embed::Embedder>>,
    pub extraction: Option<std::sync::Arc<super::extract::Extraction>>,
    /// `ttl_days`, as a duration.
    pub ttl: Option<std::time::Duration>,
    /// `idle_seconds`, as a duration.
    pub idle: Option<std::time::Duration>,
}
