//! The memory embedder: a background task on every replica that gives pending memories their
//! vectors, off the request path.
//!
//! Each pass, for each app with an embedding model: claim a batch of pending memories for a
//! lease, embed them in one provider call (retried with backoff by the provider client),
//! store the vectors in one statement. Claims are leases in the database, so replicas share
//! the work and a `kill -9` loses nothing: the dead replica's claims expire and another
//! replica embeds those memories. A provider that keeps failing is left alone for a growing
//! while (up to [`MAX_BACKOFF`]); memories stay searchable by words meanwhile. A text the
//! provider refuses is put off for [`REFUSED_DELAY`], so it does not hold back the others.
//!
//! Each call's tokens are charged to the users whose memories it embedded, in proportion to
//! their texts ([`super::charge::shares`]); a user whose budget is spent has their memories
//! put off until it resets.
//!
//! The app's space (its model and vector size) is adopted at start and every
//! [`ADOPT_EVERY`]: vectors of another space (stored by a replica still on an old model
//! during a rolling update) become pending again.

use super::charge::{shares, user_call};
use super::{count_tokens, space_of};
use crate::model::embed::{Embedder, Purpose, MAX_BATCH};
use crate::model::ModelError;
use crate::store::memory::vectors::{PendingMemory, VectorStore, VectorSupport};
use crate::store::usage::spent_budgets;
use crate::store::{Store, StoreError};
use crate::usage::Prices;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The most batches one app gets per pass, so one busy app does not starve the others.
const BATCHES_PER_PASS: usize = 4;

/// The longest an app whose provider fails is left alone.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How long a text the provider refuses waits before it is tried again.
pub const REFUSED_DELAY: Duration = Duration::from_secs(3600);

/// A text every embedding model takes: when the provider refuses every text of a batch, it
/// tells a refusal of those texts from a refusal of the request itself.
const PROBE: &str = "memory";

/// How often the app's space is adopted again.
pub const ADOPT_EVERY: Duration = Duration::from_secs(600);

/// Why a pass over an app stopped: the app then backs off.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("database: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// An app whose memories are embedded, and its model.
pub struct EmbeddedApp {
    pub app: String,
    pub embedder: Arc<dyn Embedder>,
}

/// The embedder of one replica.
pub struct MemoryEmbedder {
    store: Arc<dyn Store>,
    apps: Vec<EmbeddedApp>,
    /// What the calls cost (`--prices`), charged to the users.
    prices: Arc<Prices>,
    /// How long an idle pass waits before the next.
    poll: Duration,
    /// When each app's space was last adopted.
    adopted: HashMap<String, Instant>,
    /// Apps whose provider failed: not before this instant, and the next wait.
    backoff: HashMap<String, (Instant, Duration)>,
}

impl MemoryEmbedder {
    pub fn new(
        store: Arc<dyn Store>,
        apps: Vec<EmbeddedApp>,
        prices: Arc<Prices>,
        poll: Duration,
    ) -> Self {
        MemoryEmbedder {
            store,
            apps,
            prices,
            poll,
            adopted: HashMap::new(),
            backoff: HashMap::new(),
        }
    }

    /// Runs passes until `stop`; says once why not when the database keeps no vectors.
    pub fn spawn(mut self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            if let VectorSupport::Missing(why) = self.store.vector_support() {
                let apps: Vec<&str> = self.apps.iter().map(|a| a.app.as_str()).collect();
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
        let mut total = 0;
        for i in 0..self.apps.len() {
            let app = self.apps[i].app.clone();
            if let Some((until, _)) = self.backoff.get(&app) {
                if Instant::now() < *until {
                    continue;
                }
            }
            let embedder = self.apps[i].embedder.clone();
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

    async fn embed_app(&mut self, app: &str, embedder: &dyn Embedder) -> Result<usize, Failure> {
        let space = space_of(embedder);
        let store: &dyn VectorStore = self.store.as_ref();
        let due = self
            .adopted
            .get(app)
            .is_none_or(|at| at.elapsed() >= ADOPT_EVERY);
        if due {
            if store.adopt_space(app, &space).await? {
                tracing::info!(app, space = %space.name, "memory vectors: memories of another space are embedded again");
            }
            self.adopted.insert(app.to_string(), Instant::now());
        } else if store.current_space(app).await?.as_deref() != Some(space.name.as_str()) {
            // Another replica's model is the app's now (a rolling update): nothing to store
            // until this one adopts again.
            return Ok(0);
        }
        // A claim outlasts the longest call, so no other replica embeds the same memories.
        let lease = embedder.longest_call() + Duration::from_secs(30);
        let mut stored = 0;
        for _ in 0..BATCHES_PER_PASS {
            let pending = store.claim_pending(app, MAX_BATCH, lease).await?;
            if pending.is_empty() {
                break;
            }
            let full = pending.len() == MAX_BATCH;
            let pending = match self.within_budgets(app, pending.clone()).await {
                Ok(p) => p,
                Err(e) => return Err(self.release(app, &pending, e).await),
            };
            if pending.is_empty() {
                if full {
                    continue;
                }
                break;
            }
            let vectors = match self.embed(app, embedder, &pending).await {
                Ok(v) => v,
                Err(e) if refuses_text(&e) => {
                    match self.one_by_one(app, embedder, pending.clone(), lease).await {
                        Ok(v) => v,
                        Err(e) => return Err(self.release(app, &pending, e).await),
                    }
                }
                Err(e) => return Err(self.release(app, &pending, e.into()).await),
            };
            // A replica on another model made the app its own meanwhile (a rolling update):
            // these vectors would be of the wrong space. This replica adopts again when its
            // next adoption is due, not sooner (two models would otherwise take turns every
            // pass).
            if store.current_space(app).await?.as_deref() != Some(space.name.as_str()) {
                break;
            }
            stored += store.store_vectors(app, &space, &vectors).await?;
            if !full {
                break;
            }
        }
        Ok(stored)
    }

    /// The memories of `pending` whose users may spend; those of a user whose budget (or the
    /// app's) is spent are put off until it resets, searchable by words meanwhile.
    async fn within_budgets(
        &self,
        app: &str,
        pending: Vec<PendingMemory>,
    ) -> Result<Vec<PendingMemory>, Failure> {
        let users: BTreeSet<&str> = pending.iter().map(|p| p.user_id.as_str()).collect();
        let resets: BTreeMap<String, i64> = spent_budgets(self.store.as_ref(), app, users)
            .await?
            .into_iter()
            .map(|(user, spent)| (user, spent.reset))
            .collect();
        if resets.is_empty() {
            return Ok(pending);
        }
        let (over, within): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|p| resets.contains_key(&p.user_id));
        let now = crate::event::now_ts();
        for (user, reset) in &resets {
            let keys: Vec<(String, String)> = over
                .iter()
                .filter(|p| &p.user_id == user)
                .map(|p| (p.user_id.clone(), p.event_id.clone()))
                .collect();
            let delay = Duration::from_secs_f64((*reset as f64 - now).max(1.0));
            self.store.defer_pending(app, &keys, delay).await?;
            tracing::debug!(
                app,
                user,
                memories = keys.len(),
                "memories not embedded: the budget is spent"
            );
        }
        Ok(within)
    }

    /// The vectors of `pending`, each with its memory; the call's tokens charged to their
    /// users.
    async fn embed(
        &self,
        app: &str,
        embedder: &dyn Embedder,
        pending: &[PendingMemory],
    ) -> Result<Vec<(PendingMemory, Vec<f32>)>, ModelError> {
        let texts: Vec<String> = pending.iter().map(|p| p.text.clone()).collect();
        let out = embedder
            .embed(&texts, Purpose::Document)
            .await
            .inspect_err(|e| {
                metrics::counter!("agentd_memory_embedding_failures_total", "app" => app.to_string(), "purpose" => "document", "code" => e.code)
                    .increment(1);
            })?;
        count_tokens(app, "document", out.tokens);
        let texts = pending.iter().map(|p| (p.user_id.as_str(), p.text.len()));
        for (user, n) in shares(out.tokens, texts) {
            user_call(
                self.store.as_ref(),
                &self.prices,
                app,
                &user,
                embedder.model(),
                n,
            )
            .await;
        }
        Ok(pending
            .iter()
            .zip(out.vectors)
            .map(|(p, v)| (p.clone(), v))
            .collect())
    }

    /// A failed call's memories are let go at once: they wait for the app's backoff (which
    /// the failure starts), not for the claim's lease, which outlasts the longest call
    /// (minutes) and would hold them long after the provider is back. Returns `failure`.
    async fn release(&self, app: &str, pending: &[PendingMemory], failure: Failure) -> Failure {
        let keys: Vec<(String, String)> = pending
            .iter()
            .map(|p| (p.user_id.clone(), p.event_id.clone()))
            .collect();
        if let Err(e) = self.store.defer_pending(app, &keys, Duration::ZERO).await {
            tracing::warn!(app, error = %e, "could not let go of memories after a failed embedding call; they wait for their lease");
        }
        failure
    }

    /// A batch the provider refused, embedded one memory at a time: the memories it refuses
    /// alone are put off, the others get their vectors. Before each call the claims of those
    /// left are renewed, so a slow provider does not let them go to another replica. When it
    /// refuses every one and a plain text too, the fault is not the texts': an error, and the
    /// app's backoff, nothing put off.
    async fn one_by_one(
        &self,
        app: &str,
        embedder: &dyn Embedder,
        pending: Vec<PendingMemory>,
        lease: Duration,
    ) -> Result<Vec<(PendingMemory, Vec<f32>)>, Failure> {
        let mut vectors = vec![];
        let mut refused = vec![];
        let mut last = None;
        for (i, p) in pending.iter().enumerate() {
            let left: Vec<(String, String)> = pending[i..]
                .iter()
                .map(|p| (p.user_id.clone(), p.event_id.clone()))
                .collect();
            self.store.defer_pending(app, &left, lease).await?;
            match self.embed(app, embedder, std::slice::from_ref(p)).await {
                Ok(mut v) => vectors.append(&mut v),
                Err(e) if refuses_text(&e) => {
                    tracing::warn!(app, memory = %p.event_id, error = %e, "the embedding model refuses a memory's text; trying again later");
                    refused.push((p.user_id.clone(), p.event_id.clone()));
                    last = Some(e);
                }
                Err(e) => return Err(e.into()),
            }
        }
        if vectors.is_empty() {
            if let Some(e) = last {
                // Every text refused: the texts, or the request as a whole (a setting the
                // provider rejects)? A plain text tells.
                let probe = [PROBE.to_string()];
                if embedder.embed(&probe, Purpose::Document).await.is_err() {
                    return Err(e.into());
                }
            }
        }
        self.store
            .defer_pending(app, &refused, REFUSED_DELAY)
            .await?;
        Ok(vectors)
    }
}

/// Whether the provider refused the texts themselves (a 400: too long, unacceptable), not
/// the request as a whole (a bad key, an unknown model, a redirect, an outage).
fn refuses_text(e: &ModelError) -> bool {
    e.code == "MODEL_BAD_REQUEST"
}
