//! The memory embedder: a background task on every replica that gives pending memories their
//! vectors, off the request path.
//!
//! Each pass, for each app with an embedding model: make the model's space the app's
//! ([`VectorStore::adopt_space`]), claim a batch of pending memories for a lease, embed
//! them in one provider call (retried with backoff by the provider client), store the
//! vectors in one statement. Claims are leases in the database, so replicas share the work
//! and a `kill -9` loses nothing: the dead replica's claims expire and another replica embeds
//! those memories. A provider that keeps failing is left alone for a growing while (up to
//! [`MAX_BACKOFF`]) and its claims expire meanwhile; memories stay searchable by words.

use super::{count_tokens, space_of};
use crate::apps::AppRegistry;
use crate::model::embed::{Embedder, Purpose, MAX_BATCH};
use crate::store::memory::vectors::{VectorStore, VectorSupport};
use crate::store::Store;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long a claim lasts: longer than one provider call with its retries takes.
pub const LEASE: Duration = Duration::from_secs(120);

/// The most batches one app gets per pass, so one busy app does not starve the others.
const BATCHES_PER_PASS: usize = 4;

/// The longest an app whose provider fails is left alone.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// The embedder of one replica.
pub struct MemoryEmbedder {
    store: Arc<dyn Store>,
    apps: Arc<AppRegistry>,
    /// How long an idle pass waits before the next.
    poll: Duration,
    /// Spaces already adopted by this replica: `(app, space)`.
    adopted: HashSet<(String, String)>,
    /// Apps whose provider failed: not before this instant, and the next wait.
    backoff: HashMap<String, (Instant, Duration)>,
}

impl MemoryEmbedder {
    pub fn new(store: Arc<dyn Store>, apps: Arc<AppRegistry>, poll: Duration) -> Self {
        MemoryEmbedder {
            store,
            apps,
            poll,
            adopted: HashSet::new(),
            backoff: HashMap::new(),
        }
    }

    /// Whether any app has an embedding model (else there is nothing to run).
    pub fn has_work(apps: &AppRegistry) -> bool {
        apps.entries().any(|a| a.embedder.is_some())
    }

    /// Runs passes until `stop`; says once why not when the database keeps no vectors.
    pub fn spawn(mut self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            if let VectorSupport::Missing(why) = self.store.vector_support() {
                let apps: Vec<&str> = self
                    .apps
                    .entries()
                    .filter(|a| a.embedder.is_some())
                    .map(|a| a.name.as_str())
                    .collect();
                tracing::warn!(?apps, reason = %why, "apps have an embedding model, but memory search is full-text only");
                return;
            }
            loop {
                let embedded = self.pass().await;
                let wait = if embedded > 0 {
                    Duration::ZERO
                } else {
                    self.poll
                };
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        })
    }

    /// One pass over the apps; returns how many memories got vectors.
    pub async fn pass(&mut self) -> usize {
        let apps: Vec<(String, Arc<dyn Embedder>)> = self
            .apps
            .entries()
            .filter_map(|a| a.embedder.clone().map(|e| (a.name.clone(), e)))
            .collect();
        let mut total = 0;
        for (app, embedder) in apps {
            if let Some((until, _)) = self.backoff.get(&app) {
                if Instant::now() < *until {
                    continue;
                }
            }
            match self.embed_app(&app, embedder.as_ref()).await {
                Ok(n) => {
                    self.backoff.remove(&app);
                    total += n;
                }
                Err(e) => {
                    let wait = self
                        .backoff
                        .get(&app)
                        .map_or(self.poll.max(Duration::from_secs(1)), |(_, w)| *w * 2)
                        .min(MAX_BACKOFF);
                    tracing::warn!(app, error = %e, retry_in_s = wait.as_secs_f64(), "memory embedding failed");
                    self.backoff.insert(app, (Instant::now() + wait, wait));
                }
            }
        }
        total
    }

    async fn embed_app(&mut self, app: &str, embedder: &dyn Embedder) -> Result<usize, String> {
        let space = space_of(embedder);
        let store: &dyn VectorStore = self.store.as_ref();
        let adopted = (app.to_string(), space.name.clone());
        if !self.adopted.contains(&adopted) {
            if store
                .adopt_space(app, &space)
                .await
                .map_err(|e| e.to_string())?
            {
                tracing::info!(app, space = %space.name, "memory vectors: new space; every memory of the app is embedded again");
            }
            self.adopted.insert(adopted);
        }
        let mut stored = 0;
        for _ in 0..BATCHES_PER_PASS {
            let pending = store
                .claim_pending(app, MAX_BATCH, LEASE)
                .await
                .map_err(|e| e.to_string())?;
            if pending.is_empty() {
                break;
            }
            let texts: Vec<String> = pending.iter().map(|p| p.text.clone()).collect();
            let out = embedder
                .embed(&texts, Purpose::Document)
                .await
                .map_err(|e| {
                    metrics::counter!("agentd_memory_embedding_failures_total", "app" => app.to_string(), "purpose" => "document", "code" => e.code)
                        .increment(1);
                    e.to_string()
                })?;
            count_tokens(app, "document", out.tokens);
            let vectors: Vec<(String, String, Vec<f32>)> = pending
                .into_iter()
                .zip(out.vectors)
                .map(|(p, v)| (p.user_id, p.event_id, v))
                .collect();
            stored += store
                .store_vectors(app, &space, &vectors)
                .await
                .map_err(|e| e.to_string())?;
            if vectors.len() < MAX_BATCH {
                break;
            }
        }
        Ok(stored)
    }
}
