//! Memory extraction (`memory: {mode: extract}`, Memory Bank's "generate"): adding a session
//! asks the app's extraction model which facts about the user the new part of the
//! conversation states, given the user's memories nearest to it, and applies what it answers:
//! a new fact, an update of a memory it was shown (the earlier text kept as a revision), or the
//! deletion of one the user contradicted.
//!
//! Each call covers the session's events after its memory mark, at most
//! [`MAX_CONVERSATION_BYTES`] of their text, and its changes are applied together with the
//! mark's move in one transaction, only while the mark is still where this call read it
//! ([`crate::store::MemoryStore::apply_memory_changes`]). So a failed or killed call stores
//! nothing of its own (calls before it in the same add keep theirs) and the next add repeats
//! it, and two adds of the same events (a `PATCH` racing `--memory-auto-ingest`) apply once. The model only sees ids of the user's own memories, and
//! an id it invents is ignored: an answer can change no other user's memory.

use crate::event::Content;
use crate::model::embed::Embedder;
use crate::model::{Delta, LlmRequest, Model, ModelError};
use crate::store::memory::changes::{Applied, MemoryChange};
use crate::store::memory::{page_entries, truncate_at_char, MemoryEntry};
use crate::store::usage::OutsideCall;
use crate::store::{EventRange, SessionKey, Store, StoreError};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// An app's extraction: its model and instruction.
#[derive(Clone)]
pub struct Extraction {
    pub model: Arc<dyn Model>,
    pub prompt: String,
    /// The longest one model call may take.
    pub timeout: Duration,
}

/// What the extraction model is told, before the conversation and the existing memories.
pub const DEFAULT_PROMPT: &str = "You maintain a memory of facts about the user, for an assistant \
that talks with them across conversations. Read the new part of a conversation and the \
memories already kept. Keep only lasting facts about the user (preferences, circumstances, \
plans, relationships), each one short and self-contained, in the third person. Do not keep \
small talk, questions, or what the assistant said unless the user confirmed it. \
For each fact the conversation states: if no memory holds it, add it; if a memory holds an \
older or less precise version of it, update that memory with the full new text; if the user \
said a memory is no longer true and it has no replacement, delete it. Change nothing else. \
Answer with JSON only, of this shape: {\"memories\": [{\"action\": \"add\", \"text\": \"…\"}, \
{\"action\": \"update\", \"id\": \"…\", \"text\": \"…\"}, {\"action\": \"delete\", \"id\": \"…\"}]} \
(an empty list when there is nothing to keep).";

/// Most conversation text (bytes) one extraction call reads; a longer addition takes several.
pub const MAX_CONVERSATION_BYTES: usize = 32 * 1024;
/// Most existing memories shown to the model in one call.
pub const MAX_EXISTING: usize = 50;
/// Most changes one call applies (the rest of a longer answer is ignored).
pub const MAX_CHANGES: usize = 50;
/// Most calls one add makes; the rest of a very long session waits for the next add.
pub const MAX_CALLS: usize = 8;
/// Longest extracted fact, in bytes.
pub const MAX_FACT_BYTES: usize = 4 * 1024;
/// Events read per page.
const PAGE: u32 = 200;
/// Who an extracted memory's author is.
pub const AUTHOR: &str = "memory";

/// Why an extraction stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the extraction model failed: {0}")]
    Model(ModelError),
    #[error("the extraction model took longer than {0} s")]
    Timeout(u64),
    #[error("the extraction model's answer is not the JSON asked for: {0}")]
    Answer(String),
    /// The user's or the app's budget is spent: no call was made, nothing stored.
    #[error("{0}")]
    BudgetExhausted(crate::usage::Exhausted),
}

/// What an add did, over all its calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extracted {
    pub applied: Applied,
    /// Model calls made.
    pub calls: usize,
}

/// Adds the session's new events to the user's memory through `extraction`'s model.
/// `Err(ExtractError::Store(StoreError::SessionNotFound))` when the session does not exist.
pub async fn add_session(
    store: &dyn Store,
    embedder: Option<&dyn Embedder>,
    extraction: &Extraction,
    prices: &crate::usage::Prices,
    key: &SessionKey,
) -> Result<Extracted, ExtractError> {
    let mut done = Extracted::default();
    // Each pass reads the mark again: a pass another add raced covered only the events that
    // add read, and later ones may have come since. Bounded: a pass that lost the race read
    // no more than it did, and at most MAX_CALLS of the passes call the model.
    for _ in 0..MAX_CALLS * 4 {
        if done.calls == MAX_CALLS {
            break;
        }
        let from = store
            .memory_mark(key)
            .await?
            .ok_or(StoreError::SessionNotFound)?;
        let Some(chunk) = next_chunk(store, key, from.ingested_seq).await? else {
            return Ok(done);
        };
        let mut to = from;
        to.ingested_seq = chunk.last_seq;
        let changes = if chunk.turns.is_empty() {
            vec![]
        } else {
            done.calls += 1;
            decide(store, embedder, extraction, prices, key, &chunk.turns).await?
        };
        match store.apply_memory_changes(key, from, to, &changes).await? {
            Some(a) => {
                done.applied.added += a.added;
                done.applied.updated += a.updated;
                done.applied.deleted += a.deleted;
                if !chunk.more {
                    return Ok(done);
                }
            }
            // Another add moved the mark first: its changes stand, ours are dropped, and the
            // next pass reads from where it left the mark.
            None => {
                tracing::debug!(session = %key.session_id, "memory extraction raced; reading the mark again")
            }
        }
    }
    Ok(done)
}

/// The events after `after`, up to [`MAX_CONVERSATION_BYTES`] of their text.
struct Chunk {
    /// `(author, text)` of the events that carry text, oldest first.
    turns: Vec<(String, String)>,
    /// The last event read: the mark moves to it.
    last_seq: i64,
    /// Whether events after `last_seq` remain.
    more: bool,
}

async fn next_chunk(
    store: &dyn Store,
    key: &SessionKey,
    after: i64,
) -> Result<Option<Chunk>, StoreError> {
    let range = EventRange {
        after: Some(after),
        before: None,
        limit: PAGE,
    };
    let page = store
        .list_events(key, range)
        .await?
        .ok_or(StoreError::SessionNotFound)?;
    if page.events.is_empty() {
        return Ok(None);
    }
    // What a rewind annulled is not what the user said.
    let (entries, _) = page_entries(store, key, &page.events).await?;
    let mut chunk = Chunk {
        turns: vec![],
        // Past the page's last event, whether it carried text or not.
        last_seq: page.events.last().map_or(after, |e| e.seq),
        more: page.has_more,
    };
    let mut bytes = 0;
    for (seq, m) in entries {
        if bytes > 0 && bytes + m.text.len() > MAX_CONVERSATION_BYTES {
            // This one waits for the next call: the mark stops before it.
            chunk.last_seq = seq - 1;
            chunk.more = true;
            break;
        }
        let mut text = m.text;
        truncate_at_char(&mut text, MAX_CONVERSATION_BYTES);
        bytes += text.len();
        chunk.turns.push((m.author, text));
    }
    Ok(Some(chunk))
}

/// One model call: the changes it asks for, checked.
async fn decide(
    store: &dyn Store,
    embedder: Option<&dyn Embedder>,
    extraction: &Extraction,
    prices: &crate::usage::Prices,
    key: &SessionKey,
    turns: &[(String, String)],
) -> Result<Vec<MemoryChange>, ExtractError> {
    let (app, user) = (key.app_name.as_str(), key.user_id.as_str());
    budget_gate(store, app, user).await?;
    // The memories the conversation is nearest to, by words and meaning: those it may update
    // or contradict.
    let query: String = turns
        .iter()
        .filter(|(author, _)| author == "user")
        .map(|(_, t)| t.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let query = if query.trim().is_empty() {
        turns
            .iter()
            .map(|(_, t)| t.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        query
    };
    let charge = crate::memory::charge::Charge::User(prices);
    let existing =
        crate::memory::search(store, embedder, charge, app, user, &query, MAX_EXISTING).await?;
    let existing: Vec<&MemoryEntry> = existing.iter().map(|h| &h.entry).collect();
    let answer = ask(store, extraction, prices, key, &existing, turns).await?;
    let known: HashSet<&str> = existing.iter().map(|e| e.event_id.as_str()).collect();
    Ok(changes_of(answer, &known, &key.session_id))
}

/// Refuses the call when the user's or the app's budget is spent, as admission refuses a
/// run: an extraction's calls are charged to the user.
async fn budget_gate(store: &dyn Store, app: &str, user: &str) -> Result<(), ExtractError> {
    match crate::store::usage::spent_budget(store, app, user).await? {
        Some(spent) => Err(ExtractError::BudgetExhausted(spent)),
        None => Ok(()),
    }
}

/// The model's answer, as asked for by [`DEFAULT_PROMPT`].
#[derive(Debug, Deserialize)]
struct Answer {
    #[serde(default)]
    memories: Vec<Operation>,
}

#[derive(Debug, Deserialize)]
struct Operation {
    action: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    text: Option<String>,
}

async fn ask(
    store: &dyn Store,
    extraction: &Extraction,
    prices: &crate::usage::Prices,
    key: &SessionKey,
    existing: &[&MemoryEntry],
    turns: &[(String, String)],
) -> Result<Answer, ExtractError> {
    let payload = json!({
        "memories": existing.iter().map(|e| json!({"id": e.event_id, "text": e.text})).collect::<Vec<_>>(),
        "conversation": turns.iter().map(|(a, t)| json!({"author": a, "text": t})).collect::<Vec<_>>(),
    });
    let request = LlmRequest {
        model: extraction.model.name().to_string(),
        system_instruction: Some(extraction.prompt.clone()),
        contents: vec![Content::text("user", payload.to_string())],
        ..Default::default()
    };
    let call = async {
        let mut stream = extraction
            .model
            .stream(&request)
            .await
            .map_err(ExtractError::Model)?;
        let mut text = String::new();
        let mut usage = None;
        while let Some(delta) = stream.next().await {
            match delta.map_err(ExtractError::Model)? {
                Delta::Text(t) => {
                    text.push_str(&t);
                    if text.len() > 4 * MAX_CONVERSATION_BYTES {
                        return Err(ExtractError::Answer("longer than asked".into()));
                    }
                }
                Delta::Usage(u) => usage = Some(u),
                _ => {}
            }
        }
        Ok((text, usage))
    };
    let (text, usage) = tokio::time::timeout(extraction.timeout, call)
        .await
        .map_err(|_| ExtractError::Timeout(extraction.timeout.as_secs()))??;
    if let Some(u) = usage {
        charge(store, extraction, prices, key, u).await;
    }
    parse_answer(&text)
}

/// Counts the call's tokens, and adds them and their cost at `prices` to the user's usage
/// (their budgets count them). A failed write is logged: the answer is used all the same.
async fn charge(
    store: &dyn Store,
    extraction: &Extraction,
    prices: &crate::usage::Prices,
    key: &SessionKey,
    u: crate::model::Usage,
) {
    count_tokens(&key.app_name, u.total_tokens);
    let model = extraction.model.name();
    // Normalised as a run's calls are (the output is every token past the prompt).
    let tokens = crate::usage::Tokens::normalise(
        u.prompt_tokens,
        u.candidates_tokens,
        u.thoughts_tokens.unwrap_or(0),
        u.cached_tokens.unwrap_or(0),
        u.total_tokens,
    );
    let call = OutsideCall {
        app: &key.app_name,
        user: &key.user_id,
        model,
        day: crate::usage::Window::now().today,
        input_tokens: tokens.input,
        output_tokens: tokens.output,
        cost: prices.cost(model, tokens),
    };
    if let Err(e) = store.charge_call(&call).await {
        tracing::warn!(error = %e, "could not add the extraction's tokens to the user's usage");
    }
}

/// The JSON object of `text`: the whole text, or what lies between its first `{` and last
/// `}` (a model may wrap it in a code fence or a sentence).
fn parse_answer(text: &str) -> Result<Answer, ExtractError> {
    let json = match (text.find('{'), text.rfind('}')) {
        (Some(a), Some(b)) if a < b => &text[a..=b],
        _ => return Err(ExtractError::Answer("no JSON object".into())),
    };
    serde_json::from_str(json).map_err(|e| ExtractError::Answer(e.to_string()))
}

/// The answer's operations as changes: adds and updates with non-blank text (cut at
/// [`MAX_FACT_BYTES`]), updates and deletes of memories the model was shown, each memory
/// changed once, at most [`MAX_CHANGES`]. What does not fit is ignored (and logged).
fn changes_of(answer: Answer, known: &HashSet<&str>, session_id: &str) -> Vec<MemoryChange> {
    let mut changes = vec![];
    let mut touched: HashSet<String> = HashSet::new();
    let mut ignored = 0;
    for op in answer.memories {
        if changes.len() == MAX_CHANGES {
            ignored += 1;
            continue;
        }
        let text = op.text.as_deref().map(str::trim).filter(|t| !t.is_empty());
        let id = op
            .id
            .filter(|id| known.contains(id.as_str()) && !touched.contains(id));
        let change = match (op.action.as_str(), id, text) {
            ("add", _, Some(text)) => MemoryChange::Add(fact(session_id, None, text)),
            ("update", Some(id), Some(text)) => {
                touched.insert(id.clone());
                MemoryChange::Update(fact(session_id, Some(id), text))
            }
            ("delete", Some(id), _) => {
                touched.insert(id.clone());
                MemoryChange::Delete(id)
            }
            _ => {
                ignored += 1;
                continue;
            }
        };
        changes.push(change);
    }
    // Updates and deletes in the order of their ids: two extractions of one user lock the same
    // memories in the same order, and do not deadlock.
    changes.sort_by(|a, b| change_id(a).cmp(&change_id(b)));
    if ignored > 0 {
        tracing::warn!(
            ignored,
            "the extraction model's answer had operations that were ignored"
        );
    }
    changes
}

/// The memory a change locks: none for an add (a new id), the id otherwise.
fn change_id(c: &MemoryChange) -> Option<&str> {
    match c {
        MemoryChange::Add(_) => None,
        MemoryChange::Update(e) => Some(&e.event_id),
        MemoryChange::Delete(id) => Some(id),
    }
}

/// An extracted fact of session `session_id`: memory `id`, or a new one.
fn fact(session_id: &str, id: Option<String>, text: &str) -> MemoryEntry {
    let mut text = text.to_string();
    truncate_at_char(&mut text, MAX_FACT_BYTES);
    MemoryEntry {
        session_id: session_id.to_string(),
        event_id: id.unwrap_or_else(|| format!("mem-{}", uuid::Uuid::new_v4())),
        author: AUTHOR.to_string(),
        timestamp: crate::event::now_ts(),
        content: Content::text("model", text.clone()),
        text,
    }
}

/// Counts the tokens an extraction call used.
fn count_tokens(app: &str, tokens: u64) {
    metrics::counter!("agentd_memory_extraction_tokens_total", "app" => app.to_string())
        .increment(tokens);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known<'a>(ids: &[&'a str]) -> HashSet<&'a str> {
        ids.iter().copied().collect()
    }

    #[test]
    fn answers_in_fences_or_sentences_are_read() {
        let a = parse_answer("Sure:\n```json\n{\"memories\": []}\n```").unwrap();
        assert!(a.memories.is_empty());
        assert!(parse_answer("nothing to keep").is_err());
        assert!(parse_answer("{\"memories\": 5}").is_err());
    }

    #[test]
    fn only_shown_memories_change_and_each_once() {
        let answer = parse_answer(
            r#"{"memories": [
                {"action": "add", "text": "  Likes blue  "},
                {"action": "add", "text": "   "},
                {"action": "update", "id": "mem-1", "text": "Lives in Porto"},
                {"action": "update", "id": "mem-1", "text": "again"},
                {"action": "delete", "id": "mem-other-user"},
                {"action": "delete", "id": "mem-2"},
                {"action": "forget", "id": "mem-2"}
            ]}"#,
        )
        .unwrap();
        let changes = changes_of(answer, &known(&["mem-1", "mem-2"]), "s1");
        assert_eq!(changes.len(), 3, "{changes:?}");
        match &changes[0] {
            MemoryChange::Add(e) => {
                assert_eq!(e.text, "Likes blue");
                assert_eq!(e.session_id, "s1");
                assert_eq!(e.author, AUTHOR);
                assert!(e.event_id.starts_with("mem-"));
            }
            c => panic!("{c:?}"),
        }
        assert!(
            matches!(&changes[1], MemoryChange::Update(e) if e.event_id == "mem-1" && e.text == "Lives in Porto")
        );
        assert_eq!(changes[2], MemoryChange::Delete("mem-2".into()));
    }

    #[test]
    fn a_long_answer_is_bounded() {
        let ops: Vec<String> = (0..MAX_CHANGES + 10)
            .map(|i| {
                format!(
                    r#"{{"action":"add","text":"fact {i} {}"}}"#,
                    "x".repeat(MAX_FACT_BYTES)
                )
            })
            .collect();
        let answer = parse_answer(&format!(r#"{{"memories":[{}]}}"#, ops.join(","))).unwrap();
        let changes = changes_of(answer, &known(&[]), "s");
        assert_eq!(changes.len(), MAX_CHANGES);
        assert!(changes
            .iter()
            .all(|c| matches!(c, MemoryChange::Add(e) if e.text.len() <= MAX_FACT_BYTES)));
    }
}
