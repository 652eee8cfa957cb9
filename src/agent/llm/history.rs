//! The conversation an LLM agent sends to its model, built from the session's stored
//! events the ADK way:
//!
//! - only events on the agent's branch (a parallel sibling's events are not seen);
//! - the user's and this agent's own events as they are;
//! - other agents' turns as user-role context ("For context: \[agent\] said: …"), so the
//!   model neither impersonates them nor sees tool calls it cannot answer;
//! - ADK-internal confirmation calls left out;
//! - a compaction's summary in place of the events it summarised ([`crate::transcript::compaction`]);
//! - each function response placed right after its call, using the latest response for a
//!   call answered twice (a confirmation round trip) and a clear placeholder for a call that
//!   never got one (providers reject unanswered calls).
//!
//! Events are read incrementally: [`History::refresh`] fetches only what was committed since
//! the last step, so a long tool loop does not re-read the whole session. An agent that sees
//! only the current turn (`include_contents: none`) starts with [`History::load`], which reads
//! newest first and stops at the turn's user message: what such a turn reads is bounded by
//! the turn, not by the session's length.

use crate::agent::{AgentError, AgentResult, InvocationContext};
use crate::event::{
    Content, Event, FunctionResponse, JsonMap, Part, CONFIRMATION_REQUIRED, REQUEST_CONFIRMATION,
};
use crate::store::{EventRange, SessionKey, SessionStore, StoredEvent};
use crate::transcript::compaction::ViewItem;
use crate::transcript::rewind::is_user_turn;
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// Which past events go to the model (ADK `include_contents`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IncludeContents {
    /// The whole conversation on this branch.
    #[default]
    Default,
    /// Only the current turn (since the latest user message).
    None,
}

/// The session's events, read page by page and kept for the rest of the agent's turn.
#[derive(Default)]
pub struct History {
    pub events: Vec<Event>,
    last_seq: Option<i64>,
    /// Events fetched from the store so far (what building this history cost to read).
    read: usize,
}

const PAGE: u32 = 500;
/// The first page [`History::load`] reads of the current turn.
const FIRST_TURN_PAGE: u32 = 50;

/// Whether agent `agent` wrote `event` in one of this session's runs on this server (`runs`:
/// their invocation ids, [`crate::store::RunStore::run_invocations`]).
///
/// A session holds events a client wrote as well as the server's: a run's new message (authored
/// `user`, but with the run's invocation id) and events imported with create-session or seeded
/// by a frontend (authored as the client likes, but with invocation ids no run of this server
/// had). Anything that makes the server act (run a tool, honour an approval) must come from an
/// event that passes this test, never from one a client could have written.
pub fn written_by(event: &Event, agent: &str, runs: &HashSet<String>) -> bool {
    event.author != "user" && event.author == agent && runs.contains(&event.invocation_id)
}

/// Drops the events a rewind annulled, and the rewind events ([`crate::transcript::rewind::live`]).
fn drop_rewound(events: &mut Vec<Event>) {
    if events
        .iter()
        .any(|e| e.actions.rewind_before_invocation_id.is_some())
    {
        let mut keep = crate::transcript::rewind::live(events).into_iter();
        events.retain(|_| keep.next().unwrap_or(true));
    }
}

impl History {
    /// The history a turn starts from: the whole session, or with [`IncludeContents::None`]
    /// only the current turn (from the latest user message on, or the whole session if it
    /// has none), which is all [`contents`] sends then. Later steps [`History::refresh`].
    pub async fn load(&mut self, ctx: &InvocationContext, include: IncludeContents) -> AgentResult {
        // An event held back for the run's outcome (a workflow's previous agent) is history.
        ctx.flush().await?;
        match include {
            IncludeContents::Default => self.refresh(ctx).await,
            IncludeContents::None => {
                self.load_turn(ctx.store().as_ref(), ctx.session_key())
                    .await
            }
        }
    }

    /// Fetches events committed since the last refresh.
    pub async fn refresh(&mut self, ctx: &InvocationContext) -> AgentResult {
        ctx.flush().await?;
        self.fetch_after(ctx.store().as_ref(), ctx.session_key())
            .await
    }

    async fn fetch_after(&mut self, store: &dyn SessionStore, key: &SessionKey) -> AgentResult {
        loop {
            let page = fetch_page(
                store,
                key,
                EventRange {
                    after: self.last_seq.or(Some(0)),
                    before: None,
                    limit: PAGE,
                },
            )
            .await?;
            self.read += page.events.len();
            for stored in page.events {
                self.last_seq = Some(stored.seq);
                self.events.push(stored.event);
            }
            if !page.has_more {
                drop_rewound(&mut self.events);
                return Ok(());
            }
        }
    }

    /// Reads the current turn into an empty history: pages newest first until one holds a
    /// user message, then keeps the events from that message on.
    async fn load_turn(&mut self, store: &dyn SessionStore, key: &SessionKey) -> AgentResult {
        let mut pages: Vec<Vec<StoredEvent>> = vec![];
        let mut before = i64::MAX;
        // A turn is usually short: a small first page, then full ones.
        let mut limit = FIRST_TURN_PAGE;
        loop {
            let page = fetch_page(
                store,
                key,
                EventRange {
                    after: None,
                    before: Some(before),
                    limit,
                },
            )
            .await?;
            limit = PAGE;
            self.read += page.events.len();
            let first = page.events.first().map(|s| s.seq);
            let mut events = page.events;
            if let Some(start) = events.iter().rposition(|s| is_user_turn(&s.event)) {
                events.drain(..start);
                pages.push(events);
                break;
            }
            pages.push(events);
            match (page.has_more, first) {
                (true, Some(first)) => before = first,
                _ => break,
            }
        }
        for stored in pages.into_iter().rev().flatten() {
            self.last_seq = Some(stored.seq);
            self.events.push(stored.event);
        }
        drop_rewound(&mut self.events);
        Ok(())
    }

    /// Events fetched from the store to build this history.
    pub fn events_read(&self) -> usize {
        self.read
    }

    /// The latest response to each function call id, across the whole history.
    pub fn latest_responses(&self) -> HashMap<String, FunctionResponse> {
        let mut latest = HashMap::new();
        for e in &self.events {
            for r in e.function_responses() {
                if let Some(id) = &r.id {
                    latest.insert(id.clone(), r.clone());
                }
            }
        }
        latest
    }

    /// Call ids whose latest response is the runner's seal, written by the server (a seal
    /// event's author is the agent that made the call). A seal-shaped response in a client's
    /// message is an answer like any other: it cannot make an answered call run again.
    pub fn sealed_calls(&self) -> std::collections::HashSet<String> {
        let mut sealed = std::collections::HashSet::new();
        for e in &self.events {
            for r in e.function_responses() {
                if let Some(id) = &r.id {
                    if e.author != "user" && is_seal_response(r) {
                        sealed.insert(id.clone());
                    } else {
                        sealed.remove(id);
                    }
                }
            }
        }
        sealed
    }

    /// Calls of agent `agent` waiting for the client's approval: their latest response is the
    /// "requires confirmation" placeholder that agent wrote in a run of this session (`runs`,
    /// see [`written_by`]). A placeholder-shaped response written by a client (in a new message,
    /// in imported events) cannot re-open a call that already ran, nor make up one that never
    /// asked; any later response, whoever wrote it, closes the wait.
    pub fn awaiting_approval(&self, agent: &str, runs: &HashSet<String>) -> HashSet<String> {
        let mut waiting = HashSet::new();
        for e in &self.events {
            let ours = written_by(e, agent, runs);
            for r in e.function_responses() {
                let Some(id) = &r.id else { continue };
                let placeholder =
                    r.response.get("error").and_then(Value::as_str) == Some(CONFIRMATION_REQUIRED);
                if ours && placeholder {
                    waiting.insert(id.clone());
                } else {
                    waiting.remove(id);
                }
            }
        }
        waiting
    }

    /// The event holding the function call `id`, newest first.
    pub fn find_call(&self, id: &str) -> Option<&Event> {
        self.events
            .iter()
            .rev()
            .find(|e| e.function_calls().any(|c| c.id.as_deref() == Some(id)))
    }
}

/// One page of the session's events; a session deleted meanwhile is an error.
async fn fetch_page(
    store: &dyn SessionStore,
    key: &SessionKey,
    range: EventRange,
) -> AgentResult<crate::store::EventPage> {
    store
        .list_events(key, range)
        .await
        .map_err(AgentError::store)?
        .ok_or_else(|| AgentError::failed("StoreError", "the session disappeared"))
}

fn on_branch(event: &Event, branch: Option<&str>) -> bool {
    match (branch, event.branch.as_deref()) {
        (_, None) | (None, _) => true,
        (Some(mine), Some(theirs)) => {
            mine == theirs
                || (mine.starts_with(theirs) && mine.as_bytes().get(theirs.len()) == Some(&b'.'))
        }
    }
}

fn is_internal(part: &Part) -> bool {
    part.function_call
        .as_ref()
        .is_some_and(|c| c.name == REQUEST_CONFIRMATION)
        || part
            .function_response
            .as_ref()
            .is_some_and(|r| r.name == REQUEST_CONFIRMATION)
}

/// A seal response (the runner's answer to calls left open by a cancelled run).
pub fn is_seal_response(r: &FunctionResponse) -> bool {
    r.response.get("error").and_then(Value::as_str) == Some("cancelled")
        && r.response.contains_key("message")
}

/// Another agent's event, retold as user-role context.
fn as_context(event: &Event) -> Option<Content> {
    let author = &event.author;
    let mut parts = vec![Part::text("For context:")];
    for p in &event.content.as_ref()?.parts {
        if p.thought == Some(true) || is_internal(p) {
            continue;
        }
        if let Some(t) = &p.text {
            parts.push(Part::text(format!("[{author}] said: {t}")));
        } else if let Some(c) = &p.function_call {
            parts.push(Part::text(format!(
                "[{author}] called tool `{}` with parameters: {}",
                c.name,
                crate::model::json_text(&c.args)
            )));
        } else if let Some(r) = &p.function_response {
            parts.push(Part::text(format!(
                "[{author}] `{}` tool returned result: {}",
                r.name,
                crate::model::json_text(&r.response)
            )));
        }
    }
    (parts.len() > 1).then(|| Content {
        parts,
        role: Some("user".into()),
        extra: JsonMap::new(),
    })
}

/// The model's view of the conversation for agent `agent` on `branch`.
pub fn contents(
    history: &History,
    agent: &str,
    branch: Option<&str>,
    include: IncludeContents,
) -> Vec<Content> {
    let events: &[Event] = match include {
        IncludeContents::Default => &history.events,
        IncludeContents::None => {
            let start = history.events.iter().rposition(is_user_turn).unwrap_or(0);
            &history.events[start..]
        }
    };
    let latest = history.latest_responses();
    // Calls of this agent: their responses are placed right after them.
    let own_calls: HashSet<String> = events
        .iter()
        .filter(|e| e.author == agent && on_branch(e, branch))
        .flat_map(|e| e.function_calls().filter_map(|c| c.id.clone()))
        .collect();

    // Who made each call: a response to another agent's call is retold as context, and a
    // response to a call that does not exist (a stale id from a client) is dropped; either
    // would be an orphan tool message that providers reject.
    let call_authors: HashMap<String, &str> = history
        .events
        .iter()
        .flat_map(|e| {
            e.function_calls()
                .filter_map(move |c| Some((c.id.clone()?, e.author.as_str())))
        })
        .collect();

    let mut out: Vec<Content> = vec![];
    // Summaries stand in for the events they compacted.
    for item in crate::transcript::compaction::view(events) {
        let event = match item {
            ViewItem::Event(e) => e,
            ViewItem::Summary(c) => {
                out.push(crate::transcript::compaction::summary_turn(&c));
                continue;
            }
        };
        if event.partial == Some(true) || !on_branch(event, branch) {
            continue;
        }
        let Some(content) = &event.content else {
            continue;
        };
        if event.author != "user" && event.author != agent {
            out.extend(as_context(event));
            continue;
        }
        let mut parts: Vec<Part> = vec![];
        let mut context: Vec<Part> = vec![];
        let mut calls_here: Vec<(String, String)> = vec![];
        for p in &content.parts {
            if is_internal(p) {
                continue;
            }
            if let Some(r) = &p.function_response {
                let id = r.id.as_deref().unwrap_or_default();
                if own_calls.contains(id) {
                    continue; // placed after its call
                }
                if let Some(author) = call_authors.get(id).filter(|a| **a != agent) {
                    context.push(Part::text(format!(
                        "[{author}] `{}` tool returned result: {}",
                        r.name,
                        crate::model::json_text(&r.response)
                    )));
                }
                continue;
            }
            if let Some(c) = &p.function_call {
                if let Some(id) = &c.id {
                    calls_here.push((id.clone(), c.name.clone()));
                }
            }
            parts.push(p.clone());
        }
        if !context.is_empty() {
            context.insert(0, Part::text("For context:"));
            out.push(Content {
                parts: context,
                role: Some("user".into()),
                extra: JsonMap::new(),
            });
        }
        if parts.is_empty() {
            continue;
        }
        out.push(Content {
            parts,
            role: content.role.clone().or_else(|| {
                Some(
                    if event.author == "user" {
                        "user"
                    } else {
                        "model"
                    }
                    .into(),
                )
            }),
            extra: content.extra.clone(),
        });
        if !calls_here.is_empty() && event.author == agent {
            let responses = calls_here
                .into_iter()
                .map(|(id, name)| {
                    let response = latest.get(&id).cloned().unwrap_or_else(|| {
                        let mut m = JsonMap::new();
                        m.insert(
                            "error".into(),
                            "no result was recorded for this call (it may still be pending)".into(),
                        );
                        FunctionResponse {
                            id: Some(id.clone()),
                            name,
                            response: m,
                            extra: JsonMap::new(),
                        }
                    });
                    Part {
                        function_response: Some(response),
                        ..Default::default()
                    }
                })
                .collect();
            out.push(Content {
                parts: responses,
                role: Some("user".into()),
                extra: JsonMap::new(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::FunctionCall;

    fn call_event(author: &str, id: &str, name: &str) -> Event {
        Event::new("e-1", author).with_content(Content {
            parts: vec![Part {
                function_call: Some(FunctionCall {
                    id: Some(id.into()),
                    name: name.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            role: Some("model".into()),
            ..Default::default()
        })
    }

    fn response_event(author: &str, id: &str, name: &str, v: Value) -> Event {
        Event::new("e-1", author).with_content(Content {
            parts: vec![Part {
                function_response: Some(FunctionResponse {
                    id: Some(id.into()),
                    name: name.into(),
                    response: serde_json::from_value(v).unwrap(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            role: Some("user".into()),
            ..Default::default()
        })
    }

    #[test]
    fn responses_follow_calls_and_latest_wins() {
        let h = History {
            events: vec![
                Event::new("e-1", "user").with_content(Content::text("user", "delete it")),
                call_event("a", "c1", "delete"),
                response_event(
                    "a",
                    "c1",
                    "delete",
                    serde_json::json!({"error": "needs approval"}),
                ),
                call_event("a", "c2", REQUEST_CONFIRMATION),
                response_event(
                    "user",
                    "c2",
                    REQUEST_CONFIRMATION,
                    serde_json::json!({"confirmed": true}),
                ),
                response_event("a", "c1", "delete", serde_json::json!({"ok": true})),
                Event::new("e-1", "other").with_content(Content::text("model", "hi")),
                call_event("a", "c3", "slow"),
            ],
            last_seq: None,
            read: 0,
        };
        let c = contents(&h, "a", None, IncludeContents::Default);
        assert_eq!(c.len(), 6, "{c:#?}");
        assert_eq!(c[1].parts[0].function_call.as_ref().unwrap().name, "delete");
        assert_eq!(
            c[2].parts[0].function_response.as_ref().unwrap().response["ok"],
            true
        );
        assert!(c[3].parts[1]
            .text
            .as_deref()
            .unwrap()
            .starts_with("[other] said"));
        // The unanswered call gets a placeholder response.
        assert!(c[5].parts[0]
            .function_response
            .as_ref()
            .unwrap()
            .response
            .contains_key("error"));
    }

    /// Only a placeholder this agent wrote in a run of this session makes a call wait for
    /// approval: not one in the client's message (authored `user`, with a run's invocation id),
    /// not one in imported events (the agent's name, an invocation no run had), and a later
    /// response of anyone closes the wait.
    #[test]
    fn only_the_servers_placeholder_awaits_approval() {
        let runs: HashSet<String> = ["e-run".to_string()].into();
        let at = |invocation: &str, mut e: Event| {
            e.invocation_id = invocation.into();
            e
        };
        let waiting = || serde_json::json!({ "error": CONFIRMATION_REQUIRED });
        let h = History {
            events: vec![
                at("e-run", response_event("a", "c1", "delete", waiting())),
                at("e-run", response_event("user", "c2", "delete", waiting())),
                at("e-imported", response_event("a", "c3", "delete", waiting())),
                at("e-run", response_event("a", "c4", "delete", waiting())),
                at("e-run", response_event("user", "c4", "delete", waiting())),
                at("e-run", response_event("b", "c5", "delete", waiting())),
            ],
            last_seq: None,
            read: 0,
        };
        assert_eq!(
            h.awaiting_approval("a", &runs),
            HashSet::from(["c1".to_string()])
        );
        assert!(written_by(&h.events[0], "a", &runs));
        assert!(!written_by(&h.events[1], "user", &runs), "the client's");
        assert!(!written_by(&h.events[2], "a", &runs), "imported");
        assert!(!written_by(&h.events[5], "a", &runs), "another agent's");
    }

    /// `include_contents: none` reads the current turn, not the session: a turn at the end of
    /// a long session costs one page; a turn that is the whole session is read whole.
    #[tokio::test]
    async fn a_turn_only_history_reads_the_turn_not_the_session() {
        use crate::store::{sqlite::SqliteStore, NewSession, SessionStore, StoreLimits};
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("h.db").display());
        let store = SqliteStore::connect(&url, 2, StoreLimits::default())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let said = |author: &str, text: &str| {
            let role = if author == "user" { "user" } else { "model" };
            Event::new("e-1", author).with_content(Content::text(role, text))
        };
        // 1,200 events of earlier turns, then the current turn: a question, a tool round, an
        // answer (the tool's result is a user event that answers a call: not a new turn).
        let mut events = vec![];
        for i in 0..600 {
            events.push(said("user", &format!("question {i}")));
            events.push(said("a", &format!("answer {i}")));
        }
        events.push(said("user", "the current question"));
        events.push(call_event("a", "c1", "lookup"));
        events.push(response_event(
            "user",
            "c1",
            "lookup",
            serde_json::json!({"ok": 1}),
        ));
        events.push(said("a", "the current answer"));
        store
            .create_session(NewSession {
                app_name: "app".into(),
                user_id: "u".into(),
                session_id: Some("long".into()),
                state: JsonMap::new(),
                events,
            })
            .await
            .unwrap();
        let key = SessionKey::new("app", "u", "long");

        let mut turn = History::default();
        turn.load_turn(&store, &key).await.unwrap();
        assert_eq!(turn.events.len(), 4, "the turn from its user message on");
        assert_eq!(
            turn.events[0].content.as_ref().unwrap().parts[0]
                .text
                .as_deref(),
            Some("the current question")
        );
        assert!(
            turn.events_read() <= PAGE as usize,
            "read {} events",
            turn.events_read()
        );
        let mut whole = History::default();
        whole.fetch_after(&store, &key).await.unwrap();
        assert_eq!(whole.events.len(), 1204);
        assert_eq!(
            contents(&turn, "a", None, IncludeContents::None),
            contents(&whole, "a", None, IncludeContents::None),
            "the model is sent the same either way"
        );
        // Later steps read only what was committed since.
        store
            .append_event(&key, said("a", "one more"), vec![])
            .await
            .unwrap();
        turn.fetch_after(&store, &key).await.unwrap();
        assert_eq!(turn.events.len(), 5);
        assert_eq!(turn.events_read(), FIRST_TURN_PAGE as usize + 1);

        // No user message at all: the turn is the whole session, read page by page.
        let events: Vec<Event> = (0..1100).map(|i| said("a", &format!("note {i}"))).collect();
        store
            .create_session(NewSession {
                app_name: "app".into(),
                user_id: "u".into(),
                session_id: Some("notes".into()),
                state: JsonMap::new(),
                events,
            })
            .await
            .unwrap();
        let mut turn = History::default();
        turn.load_turn(&store, &SessionKey::new("app", "u", "notes"))
            .await
            .unwrap();
        assert_eq!(turn.events.len(), 1100);
        assert_eq!(turn.events_read(), 1100);
        assert_eq!(
            turn.events[0].content.as_ref().unwrap().parts[0]
                .text
                .as_deref(),
            Some("note 0")
        );
    }

    #[test]
    fn branches() {
        let mut e = Event::new("e", "x");
        e.branch = Some("p.a".into());
        assert!(on_branch(&e, Some("p.a")));
        assert!(on_branch(&e, Some("p.a.b")));
        assert!(!on_branch(&e, Some("p.b")));
        assert!(!on_branch(&e, Some("p.ab")));
        assert!(on_branch(&e, None));
    }
}
