//! The memory service: the text of a user's past sessions, searchable by the agents of the
//! same app (ADK's `MemoryService`, used by `PATCH …/memory` and the `load_memory` tool).
//!
//! Memory lives in the same database as the sessions: PostgreSQL full-text search
//! ([`super::postgres`]'s `memory.rs`) or SQLite FTS5 ([`super::sqlite`]'s). A memory is one
//! complete event that carries text; it belongs to `(app, user)` and is never returned to
//! another user or app. Adding a session is idempotent: each event is stored once, and a
//! per-session watermark makes adding a long session again read only its new events. A
//! rewind takes what it annulled out of memory when the rewind event is added.
//!
//! A query matches memories containing **any** of its words (ADK's in-memory service does the
//! same), best matches first: more matched words and rarer words rank higher. Query text is
//! reduced to its words before it reaches the database, so no input is a syntax error.
//!
//! Memories also carry vectors ([`vectors`]), when the app has an embedding model and the
//! database can store them; a search then ranks by meaning and by words together
//! ([`fusion`]). A memory can also be added directly (a fact, not an event of a session), read
//! by id, and deleted.

pub mod changes;
pub mod due;
pub mod fusion;
pub mod sql;
pub mod vectors;

use super::{EventRange, SessionKey, SessionStore, StoreError, StoreResult};
use crate::event::{Content, Event, Part};
use async_trait::async_trait;

/// Memory search over the sessions of one `(app, user)`.
#[async_trait]
pub trait MemoryStore: Send + Sync {
    /// Adds the session's complete events that carry text to memory; idempotent (an event
    /// already in memory is skipped). `Err(StoreError::SessionNotFound)` when the session does
    /// not exist. Returns how many entries were newly added.
    async fn add_session_to_memory(&self, key: &SessionKey) -> StoreResult<usize>;

    /// Best matches first, at most `limit`, only (app, user)'s memories. An empty/blank query
    /// returns nothing.
    async fn search_memory(
        &self,
        app: &str,
        user: &str,
        query: &str,
        limit: usize,
    ) -> StoreResult<Vec<MemoryEntry>>;

    /// The memory `id` of (app, user) (for a session's memory, its event's id).
    async fn get_memory(&self, app: &str, user: &str, id: &str)
        -> StoreResult<Option<MemoryEntry>>;

    /// Deletes the memory `id` of (app, user), text and vector; whether it existed. Adding
    /// its session again does not bring it back (the session's mark is past it).
    async fn delete_memory(&self, app: &str, user: &str, id: &str) -> StoreResult<bool>;

    /// Deletes every memory of (app, user), and how far each of the user's sessions was added,
    /// so adding a session later adds it whole. Returns how many memories were deleted.
    async fn forget_user(&self, app: &str, user: &str) -> StoreResult<u64>;

    /// Stores `entry` (a fact added directly, see [`fact_entry`]) for (app, user); its event
    /// id must be new.
    async fn insert_memory(&self, app: &str, user: &str, entry: &MemoryEntry) -> StoreResult<()>;

    /// How far the session has been added to memory (`ingested_seq` 0 when it was never
    /// added, or was made again since); `None` when the session does not exist.
    async fn memory_mark(&self, key: &SessionKey) -> StoreResult<Option<IngestMark>>;

    /// Applies `changes` to (app, user)'s memories and moves the session's mark from `from` to
    /// `to`, in one transaction, only while the mark is still `from` and the session the one
    /// it was read for: `Ok(None)` (nothing applied) when another call moved it first (so two
    /// extractions of the same events never both apply), or the session was deleted or made
    /// again since.
    async fn apply_memory_changes(
        &self,
        key: &SessionKey,
        from: IngestMark,
        to: IngestMark,
        changes: &[changes::MemoryChange],
    ) -> StoreResult<Option<changes::Applied>>;

    /// Forgets every memory of `app` (and every revision) stated or last updated before
    /// `before` (seconds since the epoch): an app's `memory: ttl_days:`. How many memories.
    async fn expire_memories(&self, app: &str, before: f64) -> StoreResult<u64>;

    /// The earlier texts of memory `id` of (app, user), oldest first (none for a memory never
    /// updated, or one that does not exist).
    async fn memory_revisions(
        &self,
        app: &str,
        user: &str,
        id: &str,
    ) -> StoreResult<Vec<changes::MemoryRevision>>;
}

/// The memory of a fact added directly (`POST …/memory`): no session, a fresh `mem-` id,
/// authored by `author`, now. `None` when the text is blank.
pub fn fact_entry(author: &str, text: &str) -> Option<MemoryEntry> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut text = text.to_string();
    truncate_at_char(&mut text, MAX_MEMORY_TEXT_BYTES);
    let role = if author == "user" { "user" } else { "model" };
    Some(MemoryEntry {
        session_id: String::new(),
        event_id: format!("mem-{}", uuid::Uuid::new_v4()),
        author: author.to_string(),
        timestamp: crate::event::now_ts(),
        content: Content::text(role, text.clone()),
        text,
    })
}

/// One remembered event.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryEntry {
    pub session_id: String,
    pub event_id: String,
    pub author: String,
    pub timestamp: f64,
    /// The indexed text: the event's text parts, one per line.
    pub text: String,
    /// The event's content reduced to those text parts (no thoughts, blobs or calls).
    pub content: Content,
}

/// Longest text indexed per event, in bytes. PostgreSQL refuses a tsvector over 1 MB; a
/// memory is a snippet for a model's context, not a document store.
pub const MAX_MEMORY_TEXT_BYTES: usize = 64 * 1024;

/// Most memories one write forgets to keep a user within `--max-memories-per-user`: the
/// count stops growing at once, and a limit lowered later is reached a write at a time.
pub const TRIM_BATCH: i64 = 1_000;

/// Most query words used; the rest of a very long query is ignored.
pub const MAX_QUERY_WORDS: usize = 32;

/// Events read per page while adding a session.
const INGEST_PAGE: u32 = 200;

/// The memory entry of a stored event of session `session_id`, if it is one: complete, not an
/// ADK-internal function event, and with non-blank text outside `thought` parts.
pub fn memory_entry(session_id: &str, event: &Event) -> Option<MemoryEntry> {
    if event.is_partial() {
        return None;
    }
    let internal = event
        .function_calls()
        .map(|c| c.name.as_str())
        .chain(event.function_responses().map(|r| r.name.as_str()))
        .any(|n| crate::event::INTERNAL_FUNCTIONS.contains(&n));
    if internal {
        return None;
    }
    let content = event.content.as_ref()?;
    let texts: Vec<&str> = content
        .parts
        .iter()
        .filter(|p| p.thought != Some(true))
        .filter_map(|p| p.text.as_deref())
        .filter(|t| !t.trim().is_empty())
        .collect();
    if texts.is_empty() {
        return None;
    }
    let mut text = texts.join("\n");
    truncate_at_char(&mut text, MAX_MEMORY_TEXT_BYTES);
    Some(MemoryEntry {
        session_id: session_id.to_string(),
        event_id: event.id.clone(),
        author: event.author.clone(),
        timestamp: event.timestamp,
        text,
        content: Content {
            parts: texts.into_iter().map(Part::text).collect(),
            role: content.role.clone(),
            extra: Default::default(),
        },
    })
}

/// Cuts `s` to at most `max` bytes, at a character boundary.
pub(crate) fn truncate_at_char(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// The words of a search query: maximal runs of alphanumeric characters (any script), at most
/// [`MAX_QUERY_WORDS`], duplicates (ignoring case) dropped. Punctuation, quotes and operators
/// are separators, so `"a" AND (b* -c):d` is the words `a AND b c d`. Empty for a blank query.
pub fn query_words(query: &str) -> Vec<&str> {
    let mut words: Vec<&str> = Vec::new();
    for w in query.split(|c: char| !c.is_alphanumeric()) {
        if w.is_empty() || words.iter().any(|x| x.to_lowercase() == w.to_lowercase()) {
            continue;
        }
        words.push(w);
        if words.len() == MAX_QUERY_WORDS {
            break;
        }
    }
    words
}

/// English stop words: the Snowball list PostgreSQL's `english` configuration drops
/// (`tsearch_data/english.stop`). SQLite's FTS5 has no stop words, so its search drops these
/// from the query itself ([`content_words`]): both backends then match the same words, and
/// "what do I like?" does not match every memory that says "I".
pub const ENGLISH_STOP_WORDS: &[&str] = &[
    "i",
    "me",
    "my",
    "myself",
    "we",
    "our",
    "ours",
    "ourselves",
    "you",
    "your",
    "yours",
    "yourself",
    "yourselves",
    "he",
    "him",
    "his",
    "himself",
    "she",
    "her",
    "hers",
    "herself",
    "it",
    "its",
    "itself",
    "they",
    "them",
    "their",
    "theirs",
    "themselves",
    "what",
    "which",
    "who",
    "whom",
    "this",
    "that",
    "these",
    "those",
    "am",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "being",
    "have",
    "has",
    "had",
    "having",
    "do",
    "does",
    "did",
    "doing",
    "a",
    "an",
    "the",
    "and",
    "but",
    "if",
    "or",
    "because",
    "as",
    "until",
    "while",
    "of",
    "at",
    "by",
    "for",
    "with",
    "about",
    "against",
    "between",
    "into",
    "through",
    "during",
    "before",
    "after",
    "above",
    "below",
    "to",
    "from",
    "up",
    "down",
    "in",
    "out",
    "on",
    "off",
    "over",
    "under",
    "again",
    "further",
    "then",
    "once",
    "here",
    "there",
    "when",
    "where",
    "why",
    "how",
    "all",
    "any",
    "both",
    "each",
    "few",
    "more",
    "most",
    "other",
    "some",
    "such",
    "no",
    "nor",
    "not",
    "only",
    "own",
    "same",
    "so",
    "than",
    "too",
    "very",
    "s",
    "t",
    "can",
    "will",
    "just",
    "don",
    "should",
    "now",
];

/// [`query_words`] without [`ENGLISH_STOP_WORDS`] (compared ignoring case).
pub fn content_words(query: &str) -> Vec<&str> {
    query_words(query)
        .into_iter()
        .filter(|w| !ENGLISH_STOP_WORDS.contains(&w.to_lowercase().as_str()))
        .collect()
}

/// `"w1" or "w2" …`: the words as quoted terms joined by OR. Quoting makes every word a plain
/// term in both dialects (PostgreSQL `websearch_to_tsquery` and SQLite FTS5 query syntax),
/// even `AND`, `OR`, `NOT`, `NEAR`; the words contain no quotes, so the quoting is safe.
pub fn or_query(words: &[&str], or: &str) -> String {
    words
        .iter()
        .map(|w| format!("\"{w}\""))
        .collect::<Vec<_>>()
        .join(&format!(" {or} "))
}

/// How far a session has been added to memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IngestMark {
    /// The session's `create_time`: a recreated session (same id) starts over.
    pub session_create_time: f64,
    /// Every event with `seq <= ingested_seq` is in memory.
    pub ingested_seq: i64,
}

/// What a backend provides so [`add_session`] can add a session page by page.
#[async_trait]
pub(crate) trait MemoryBackend: SessionStore {
    /// Removes from memory the session's events whose seq lies in one of `ranges` (inclusive):
    /// what a rewind annulled. Returns how many entries were removed.
    async fn forget_memory(&self, key: &SessionKey, ranges: &[(i64, i64)]) -> StoreResult<usize>;

    /// Stores `entries` (skipping events already in memory) and records `mark`, in one
    /// transaction. Returns how many entries were new.
    async fn write_memory(
        &self,
        key: &SessionKey,
        mark: IngestMark,
        entries: &[MemoryEntry],
    ) -> StoreResult<usize>;
}

/// The memory entries of a page of the session's events, each with its event's seq, without
/// what a rewind annulled; and, when the page holds a rewind, what the session's rewinds
/// annulled (so a caller can forget what it stored of it before). Raw adds and extraction
/// read a session the same way.
pub(crate) async fn page_entries<S: super::rewinds::RewindStore + ?Sized>(
    store: &S,
    key: &SessionKey,
    events: &[super::StoredEvent],
) -> StoreResult<(Vec<(i64, MemoryEntry)>, Option<super::Rewound>)> {
    let rewound = match events
        .iter()
        .any(|e| e.event.actions.rewind_before_invocation_id.is_some())
    {
        true => Some(store.rewound(key, i64::MAX).await?),
        false => None,
    };
    let entries = events
        .iter()
        .filter(|e| !rewound.as_ref().is_some_and(|r| r.hides(e.seq)))
        .filter_map(|e| memory_entry(&key.session_id, &e.event).map(|m| (e.seq, m)))
        .collect();
    Ok((entries, rewound))
}

/// [`MemoryStore::add_session_to_memory`] for any backend: reads the events after the
/// session's mark a page at a time and writes each page's entries with the advanced mark.
pub(crate) async fn add_session<
    S: MemoryBackend + MemoryStore + super::rewinds::RewindStore + ?Sized,
>(
    store: &S,
    key: &SessionKey,
) -> StoreResult<usize> {
    let mut mark = store
        .memory_mark(key)
        .await?
        .ok_or(StoreError::SessionNotFound)?;
    let mut added = 0;
    loop {
        let range = EventRange {
            after: Some(mark.ingested_seq),
            before: None,
            limit: INGEST_PAGE,
        };
        let Some(page) = store.list_events(key, range).await? else {
            // Deleted while we read it: what was read is in memory, the rest is gone.
            return if added > 0 {
                Ok(added)
            } else {
                Err(StoreError::SessionNotFound)
            };
        };
        let Some(last) = page.events.last() else {
            return Ok(added);
        };
        mark.ingested_seq = last.seq;
        // A rewind in this page: what it annulled leaves memory (entries added by earlier
        // calls are removed before the mark passes the rewind, so a crash in between repeats
        // the removal), and is not added from this page.
        let (entries, rewound) = page_entries(store, key, &page.events).await?;
        if let Some(rewound) = rewound {
            store.forget_memory(key, rewound.ranges()).await?;
        }
        let entries: Vec<MemoryEntry> = entries.into_iter().map(|(_, e)| e).collect();
        added += store.write_memory(key, mark, &entries).await?;
        if !page.has_more {
            return Ok(added);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::FunctionCall;

    #[test]
    fn query_words_drop_every_operator_and_quote() {
        assert_eq!(
            query_words(r#""weather" AND (Zürich* -rain):today"#),
            ["weather", "AND", "Zürich", "rain", "today"]
        );
        assert_eq!(query_words(" \t\"*()-: "), Vec::<&str>::new());
        assert_eq!(query_words("Tokyo tokyo 東京"), ["Tokyo", "東京"]);
        assert_eq!(
            or_query(&["a", "OR", "東京"], "OR"),
            r#""a" OR "OR" OR "東京""#
        );
        let many = "w ".repeat(10) + &(0..100).map(|i| format!("x{i} ")).collect::<String>();
        assert_eq!(query_words(&many).len(), MAX_QUERY_WORDS);
    }

    #[test]
    fn stop_words_leave_the_query() {
        assert_eq!(content_words("Which hue do I like?"), ["hue", "like"]);
        assert_eq!(content_words("What IS it"), Vec::<&str>::new());
        assert_eq!(content_words("Zürich the 東京"), ["Zürich", "東京"]);
    }

    #[test]
    fn memory_entries_take_text_but_not_thoughts_partials_or_internal_calls() {
        let mut e = Event::new("inv", "model").with_content(Content {
            parts: vec![
                Part {
                    thought: Some(true),
                    ..Part::text("secret reasoning")
                },
                Part::text("It is sunny."),
                Part::text("  "),
                Part::text("Enjoy!"),
            ],
            role: Some("model".into()),
            extra: Default::default(),
        });
        let m = memory_entry("s1", &e).expect("an entry");
        assert_eq!(m.text, "It is sunny.\nEnjoy!");
        assert_eq!(m.content.parts.len(), 2);
        assert_eq!(m.session_id, "s1");

        e.partial = Some(true);
        assert!(memory_entry("s1", &e).is_none());
        e.partial = None;

        e.content.as_mut().unwrap().parts.push(Part {
            function_call: Some(FunctionCall {
                name: "transfer_to_agent".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(memory_entry("s1", &e).is_none());

        let thoughts_only = Event::new("inv", "model").with_content(Content {
            parts: vec![Part {
                thought: Some(true),
                ..Part::text("hmm")
            }],
            ..Default::default()
        });
        assert!(memory_entry("s1", &thoughts_only).is_none());
        assert!(memory_entry("s1", &Event::new("inv", "model")).is_none());
    }

    #[test]
    fn long_text_is_cut_at_a_char_boundary() {
        let e = Event::new("inv", "user")
            .with_content(Content::text("user", "é".repeat(MAX_MEMORY_TEXT_BYTES)));
        let m = memory_entry("s", &e).unwrap();
        assert!(m.text.len() <= MAX_MEMORY_TEXT_BYTES);
        assert!(m.text.len() >= MAX_MEMORY_TEXT_BYTES - 1);
    }
}
