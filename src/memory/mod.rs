//! Memory search by meaning and by words, and the upkeep that gives memories their vectors.
//!
//! [`search`] is what `GET …/memory` and the `load_memory` tool call: the full-text ranking
//! of the user's memories ([`crate::store::MemoryStore::search_memory`]) and, when the app has
//! an embedding model (`memory:` in its `agentd.yaml`) and the database stores vectors, the
//! nearest memories to the query's embedding; the two rankings fused
//! ([`crate::store::memory::fusion`]). Every ranking is of one `(app, user)`'s memories only.
//!
//! The query's embedding is the one provider call on the request path, bounded by
//! [`QUERY_EMBED_TIMEOUT`]: a provider that fails or is slow leaves the search full-text,
//! never fails it; nor is it made while the user's budget is spent ([`crate::store::usage::spent_budget`]).
//! Stored memories are embedded off the request path by [`embedder`]. What an
//! app's `memory:` block builds into is [`app::AppMemory`].

pub mod app;
pub mod charge;
pub mod embedder;
pub mod extract;
pub mod idle;
pub mod retention;

use crate::model::embed::{Embedder, Purpose};
use crate::store::memory::fusion::{fuse, MemoryHit};
use crate::store::memory::vectors::{VectorSpace, VectorSupport};
use crate::store::{SessionKey, Store, StoreResult};
use std::time::Duration;

/// The longest a search waits for its query's embedding before it ranks by words alone.
pub const QUERY_EMBED_TIMEOUT: Duration = Duration::from_secs(5);

/// Candidates each ranking contributes to the fusion, for a search of `limit` results.
fn candidates(limit: usize) -> usize {
    (limit * 3).clamp(20, 300)
}

/// The space of `embedder`'s vectors.
pub fn space_of(embedder: &dyn Embedder) -> VectorSpace {
    VectorSpace {
        name: embedder.space(),
        dims: embedder.dimensions(),
    }
}

/// The best `limit` memories of `(app, user)` for `query`: by words, and by meaning when
/// `embedder` is the app's embedding model and the store keeps vectors. A blank query finds
/// nothing. The query's embedding is charged to `charge` while the vectors are ranked.
pub async fn search(
    store: &dyn Store,
    embedder: Option<&dyn Embedder>,
    charge: charge::Charge<'_>,
    app: &str,
    user: &str,
    query: &str,
    limit: usize,
) -> StoreResult<Vec<MemoryHit>> {
    if query.trim().is_empty() || limit == 0 {
        return Ok(vec![]);
    }
    let n = candidates(limit);
    let vectors = embedder.filter(|_| store.vector_support() == VectorSupport::Available);
    let by_words = store.search_memory(app, user, query, n);
    let by_meaning = async {
        let Some(embedder) = vectors else {
            return vec![];
        };
        if matches!(charge, charge::Charge::User(_)) && !may_embed(store, app, user).await {
            return vec![];
        }
        let Some((vector, tokens)) = embed_query(embedder, app, query).await else {
            return vec![];
        };
        let space = space_of(embedder);
        let (near, ()) = tokio::join!(
            store.nearest_memories(app, user, &space, &vector, n),
            charge.query(store, app, user, embedder.model(), tokens)
        );
        match near {
            Ok(near) => near,
            Err(e) => {
                tracing::warn!(app, error = %e, "memory search by meaning failed; searching by words");
                vec![]
            }
        }
    };
    let (text, near) = tokio::join!(by_words, by_meaning);
    Ok(fuse(text?, near, n, limit))
}

/// Whether a search outside a run may embed `user`'s query: not while the user's or the
/// app's budget is spent (the search then ranks by words, as when the provider is down).
async fn may_embed(store: &dyn Store, app: &str, user: &str) -> bool {
    let code = match crate::store::usage::spent_budget(store, app, user).await {
        Ok(None) => return true,
        Ok(Some(spent)) => {
            tracing::debug!(app, user, %spent, "memory query not embedded; searching by words");
            crate::model::BUDGET_EXHAUSTED
        }
        Err(e) => {
            tracing::warn!(app, error = %e, "could not read the budgets; searching memory by words");
            "BUDGET_UNREAD"
        }
    };
    metrics::counter!("agentd_memory_embedding_failures_total", "app" => app.to_string(), "purpose" => "query", "code" => code)
        .increment(1);
    false
}

/// The query's vector and the tokens its call used, or `None` (logged) when the provider
/// fails, is too slow, or returns a vector of no direction.
async fn embed_query(embedder: &dyn Embedder, app: &str, query: &str) -> Option<(Vec<f32>, u64)> {
    let texts = [query.to_string()];
    let out = tokio::time::timeout(QUERY_EMBED_TIMEOUT, embedder.embed(&texts, Purpose::Query));
    let outcome = match out.await {
        Ok(Ok(mut e)) => {
            count_tokens(app, "query", e.tokens);
            let v = e.vectors.pop().filter(|v| v.iter().any(|x| *x != 0.0));
            if let Some(v) = v {
                return Some((v, e.tokens));
            }
            "empty"
        }
        Ok(Err(e)) => {
            tracing::warn!(app, error = %e, "could not embed the memory query; searching by words");
            e.code
        }
        Err(_) => {
            tracing::warn!(
                app,
                "the memory query's embedding timed out; searching by words"
            );
            "MODEL_TIMEOUT"
        }
    };
    metrics::counter!("agentd_memory_embedding_failures_total", "app" => app.to_string(), "purpose" => "query", "code" => outcome)
        .increment(1);
    None
}

/// Counts the tokens an embedding call used.
pub(crate) fn count_tokens(app: &str, purpose: &'static str, tokens: u64) {
    metrics::counter!("agentd_memory_embedding_tokens_total", "app" => app.to_string(), "purpose" => purpose)
        .increment(tokens);
}

/// Adds the session's new events to the user's memory the app's way: as they are (`mode:
/// raw`), or the facts `extraction`'s model finds in them (`mode: extract`, [`extract`]; its
/// calls charged to the user at `prices`).
/// `StoreError::SessionNotFound` (as [`extract::ExtractError::Store`]) when the session does
/// not exist.
pub async fn add_session(
    store: &dyn Store,
    embedder: Option<&dyn Embedder>,
    extraction: Option<&extract::Extraction>,
    prices: &crate::usage::Prices,
    key: &SessionKey,
) -> Result<(), extract::ExtractError> {
    match extraction {
        None => {
            let added = store.add_session_to_memory(key).await?;
            tracing::debug!(added, session = %key.session_id, "session added to memory");
        }
        Some(x) => {
            let done = extract::add_session(store, embedder, x, prices, key).await?;
            tracing::debug!(
                calls = done.calls,
                added = done.applied.added,
                updated = done.applied.updated,
                deleted = done.applied.deleted,
                session = %key.session_id,
                "memories extracted from a session"
            );
        }
    }
    Ok(())
}
