//! Compaction, as ADK defines it (`EventsCompactionConfig`): a long session's older turns are
//! summarised into one event, `actions.compaction` (`startTimestamp`, `endTimestamp`,
//! `compactedContent`), and a model is then sent the summary instead of the events in that
//! time range. Nothing is deleted. This file is the pure part: which range to summarise
//! ([`due_range`]), the summariser's prompt ([`prompt`]), the event ([`compaction_event`]),
//! and the view a model reads ([`view`]). The runner does the rest
//! (`src/runner/compact.rs`).

use crate::event::{new_invocation_id, Content, Event, JsonMap, Part};
use serde::Deserialize;
use serde_json::{json, Value};

/// When to compact (the app's `compaction:` block in `agentd.yaml`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CompactionPolicy {
    /// Summarise once this many new invocations have completed since the last summary.
    #[serde(default, alias = "compaction_interval")]
    pub interval: Option<usize>,
    /// How many invocations before the new ones the summary also covers.
    #[serde(default, alias = "overlap_size")]
    pub overlap: usize,
    /// Also summarise (every new invocation) once a model call's prompt reached this many
    /// tokens (its `usageMetadata.promptTokenCount`).
    #[serde(default, alias = "token_threshold")]
    pub token_threshold: Option<u64>,
}

impl CompactionPolicy {
    pub fn validate(&self) -> Result<(), String> {
        match (self.interval, self.token_threshold) {
            (Some(0), _) => Err("compaction: interval must be at least 1".into()),
            (_, Some(0)) => Err("compaction: tokenThreshold must be at least 1".into()),
            (None, None) => Err("compaction: set interval, tokenThreshold or both".into()),
            _ => Ok(()),
        }
    }
}

/// An event's `actions.compaction`: the time range it summarises and the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Compacted {
    pub start: f64,
    pub end: f64,
    pub content: Content,
}

/// The compaction an event carries, if any.
pub fn compaction_of(e: &Event) -> Option<Compacted> {
    let c = e.actions.extra.get("compaction")?;
    Some(Compacted {
        start: c.get("startTimestamp")?.as_f64()?,
        end: c.get("endTimestamp")?.as_f64()?,
        content: serde_json::from_value(c.get("compactedContent")?.clone()).ok()?,
    })
}

/// The events of `live` (oldest first, rewinds already applied) that a new summary should
/// cover, as a range of indexes, or `None` when nothing is due. ADK's sliding window: the
/// invocations whose latest event is newer than the last summary's end are new; once there
/// are `interval` of them (or, with `tokenThreshold`, the latest prompt reached it), the range
/// runs from `overlap` invocations before the first new one to the end of the last one, cut
/// short where a function call would lose its response and started earlier where a response
/// would lose its call.
pub fn due_range(live: &[Event], policy: &CompactionPolicy) -> Option<std::ops::Range<usize>> {
    let last_end = live
        .iter()
        .filter_map(compaction_of)
        .map(|c| c.end)
        .fold(0.0_f64, f64::max);
    // Invocations in first-seen order with their latest timestamp.
    let mut invocations: Vec<(&str, f64)> = vec![];
    for e in live.iter().filter(|e| compaction_of(e).is_none()) {
        match invocations
            .iter_mut()
            .find(|(id, _)| *id == e.invocation_id)
        {
            Some((_, t)) => *t = t.max(e.timestamp),
            None => invocations.push((&e.invocation_id, e.timestamp)),
        }
    }
    let first_new = invocations.iter().position(|(_, t)| *t > last_end)?;
    let new = invocations.len() - first_new;
    let by_count = policy.interval.is_some_and(|n| new >= n);
    let by_tokens = policy
        .token_threshold
        .is_some_and(|t| latest_prompt_tokens(live).is_some_and(|n| n >= t));
    if !(by_count || by_tokens) {
        return None;
    }
    let start_inv = invocations[first_new.saturating_sub(policy.overlap)].0;
    let end_inv = invocations.last()?.0;
    let mut start = live.iter().position(|e| e.invocation_id == start_inv)?;
    let end = live.iter().rposition(|e| e.invocation_id == end_inv)? + 1;
    let end = start + self_contained(&live[start..end]);
    // A response in the range to a call before it: the range starts at that call instead.
    while let Some(call) = earlier_call(live, start, end) {
        start = call;
    }
    // A response whose call is not in `live` at all (before what was read): the range starts
    // after it, so the call and its response stay together, unsummarised.
    while let Some(i) = orphan_response(live, start, end) {
        start = i + 1;
    }
    (end > start).then_some(start..end)
}

/// The index of the last event in `start..end` holding a response to a call `live` does not
/// hold, if any.
fn orphan_response(live: &[Event], start: usize, end: usize) -> Option<usize> {
    let end = end.min(live.len());
    (start..end).rev().find(|&i| {
        live[i].function_responses().any(|r| {
            let id = r.id.as_deref();
            id.is_some()
                && !live[..end]
                    .iter()
                    .any(|e| e.function_calls().any(|c| c.id.as_deref() == id))
        })
    })
}

/// The index of a call before `start` that an event in `start..end` answers, if any.
fn earlier_call(live: &[Event], start: usize, end: usize) -> Option<usize> {
    live[start..end.min(live.len())]
        .iter()
        .flat_map(|e| e.function_responses().filter_map(|r| r.id.as_deref()))
        .find_map(|id| {
            live[..start]
                .iter()
                .rposition(|e| e.function_calls().any(|c| c.id.as_deref() == Some(id)))
        })
}

/// The prompt size of the newest model call after the last summary.
fn latest_prompt_tokens(live: &[Event]) -> Option<u64> {
    for e in live.iter().rev() {
        if compaction_of(e).is_some() {
            return None;
        }
        if let Some(n) = e
            .usage_metadata
            .as_ref()
            .and_then(|u| u.get("promptTokenCount"))
            .and_then(Value::as_u64)
        {
            return Some(n);
        }
    }
    None
}

/// The length of the longest prefix of `events` that leaves no function call without its
/// response (a summary must not separate them).
fn self_contained(events: &[Event]) -> usize {
    let mut open: Vec<String> = vec![];
    let mut best = 0;
    for (i, e) in events.iter().enumerate() {
        for c in e.function_calls() {
            if let Some(id) = &c.id {
                open.push(id.clone());
            }
        }
        for r in e.function_responses() {
            if let Some(id) = &r.id {
                open.retain(|o| o != id);
            }
        }
        if open.is_empty() {
            best = i + 1;
        }
    }
    best
}

/// Longest text of one tool call or response in the summariser's prompt.
const MAX_TOOL_TEXT: usize = 2000;

fn clip(text: String) -> String {
    if text.chars().count() <= MAX_TOOL_TEXT {
        return text;
    }
    let kept: String = text.chars().take(MAX_TOOL_TEXT).collect();
    format!(
        "{kept}… [{} more characters]",
        text.chars().count() - MAX_TOOL_TEXT
    )
}

/// The instruction that precedes the conversation in the summariser's prompt.
pub const DEFAULT_PROMPT: &str = "Below is a conversation between a user and an AI agent; it \
may begin with a summary of an earlier part. Summarise it so the agent can continue without \
the original: restate what the user asked for, the decisions made and the facts learned, and \
what is still open. Name the language the user writes in on the first line (for example \
\"Conversation language: English\"), and list by exact name every tool the agent called. Be \
brief.";

/// The summariser's prompt for `events`: the instruction, then one line per part (`author:
/// text`, `author called tool: name(args)`, `Tool response from name: response`).
pub fn prompt(instruction: &str, events: &[Event]) -> String {
    let mut lines: Vec<String> = vec![];
    for e in events {
        let Some(content) = &e.content else { continue };
        for p in &content.parts {
            if let Some(t) = &p.text {
                if p.thought == Some(true) {
                    lines.push(format!("{} (thought): {t}", e.author));
                } else {
                    lines.push(format!("{}: {t}", e.author));
                }
            } else if let Some(c) = &p.function_call {
                let args = Value::Object(c.args.clone()).to_string();
                lines.push(format!(
                    "{} called tool: {}({})",
                    e.author,
                    c.name,
                    clip(args)
                ));
            } else if let Some(r) = &p.function_response {
                let body = Value::Object(r.response.clone()).to_string();
                lines.push(format!("Tool response from {}: {}", r.name, clip(body)));
            }
        }
    }
    format!("{instruction}\n\n{}", lines.join("\n"))
}

/// The event that records a summary of `range` (ADK's shape: author `user`, no content,
/// `actions.compaction`), with the summariser's token counts.
pub fn compaction_event(range: &[Event], summary: String, usage: Option<Value>) -> Event {
    let start = range.first().map_or(0.0, |e| e.timestamp);
    let end = range.last().map_or(0.0, |e| e.timestamp);
    let mut e = Event::new(new_invocation_id(), "user");
    e.actions.extra.insert(
        "compaction".into(),
        json!({
            "startTimestamp": start,
            "endTimestamp": end,
            "compactedContent": {"role": "model", "parts": [{"text": summary}]},
        }),
    );
    e.usage_metadata = usage;
    e
}

/// What a model reads of `events` (oldest first, rewinds applied): each summary in place of
/// the events it summarised — those before it whose time lies in its range — at the place of
/// the first of them. A summary whose range lies inside a later, larger one gives way to it
/// (ADK's rule); overlapping ones both stand. The order is the session's, not the clocks'.
pub fn view(events: &[Event]) -> Vec<ViewItem<'_>> {
    let mut ranges: Vec<(f64, f64, usize, Compacted)> = events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| compaction_of(e).map(|c| (c.start, c.end, i, c)))
        .collect();
    if ranges.is_empty() {
        return events.iter().map(ViewItem::Event).collect();
    }
    // By start, then the widest, then the newest: a range is kept if it reaches further
    // than every range kept before it.
    ranges.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then(b.1.total_cmp(&a.1))
            .then(b.2.cmp(&a.2))
    });
    let mut kept: Vec<(f64, f64, usize, Compacted)> = vec![];
    let mut reach = f64::NEG_INFINITY;
    for r in ranges {
        if r.1 > reach {
            reach = r.1;
            kept.push(r);
        }
    }
    // Each summary's place: its first summarised event (or its own, if none is left).
    let mut place: Vec<usize> = kept.iter().map(|k| k.2).collect();
    let mut items: Vec<(usize, u8, ViewItem<'_>)> = vec![];
    for (i, e) in events.iter().enumerate() {
        if compaction_of(e).is_some() {
            continue;
        }
        let by = kept
            .iter()
            .position(|(s, end, at, _)| i < *at && (*s..=*end).contains(&e.timestamp));
        match by {
            Some(k) => place[k] = place[k].min(i),
            None => items.push((i, 1, ViewItem::Event(e))),
        }
    }
    items.extend(
        kept.into_iter()
            .zip(place)
            .map(|((_, _, _, c), at)| (at, 0, ViewItem::Summary(c.content))),
    );
    items.sort_by_key(|(at, order, _)| (*at, *order));
    items.into_iter().map(|(_, _, item)| item).collect()
}

/// One entry of [`view`].
#[derive(Debug, Clone, PartialEq)]
pub enum ViewItem<'a> {
    Event(&'a Event),
    /// A summary, sent as the model's own turn.
    Summary(Content),
}

/// A summary's content as a model turn (role `model`, its text parts only).
pub fn summary_turn(content: &Content) -> Content {
    Content {
        role: Some("model".into()),
        parts: content
            .parts
            .iter()
            .filter(|p| p.text.is_some())
            .cloned()
            .collect::<Vec<Part>>(),
        extra: JsonMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(inv: &str, author: &str, text: &str, t: f64) -> Event {
        let mut e = Event::new(inv, author).with_content(Content::text(
            if author == "user" { "user" } else { "model" },
            text,
        ));
        e.timestamp = t;
        e
    }

    fn turns(n: usize) -> Vec<Event> {
        (1..=n)
            .flat_map(|i| {
                let t = i as f64 * 10.0;
                [
                    ev(&format!("i{i}"), "user", &format!("q{i}"), t),
                    ev(&format!("i{i}"), "agent", &format!("a{i}"), t + 1.0),
                ]
            })
            .collect()
    }

    #[test]
    fn the_sliding_window_is_adks() {
        let policy = CompactionPolicy {
            interval: Some(2),
            overlap: 1,
            token_threshold: None,
        };
        let mut events = turns(1);
        assert_eq!(due_range(&events, &policy), None);
        events = turns(2);
        assert_eq!(due_range(&events, &policy), Some(0..4));
        events.push(compaction_event(&events[0..4], "S1".into(), None));
        events.extend(turns(4).into_iter().skip(4));
        // Invocations 3 and 4 are new; the window reaches back one (invocation 2).
        assert_eq!(due_range(&events, &policy), Some(2..9));
        let range = due_range(&events, &policy).unwrap();
        let covered: Vec<&str> = events[range]
            .iter()
            .filter(|e| compaction_of(e).is_none())
            .filter_map(|e| e.content.as_ref()?.parts[0].text.as_deref())
            .collect();
        assert_eq!(covered, ["q2", "a2", "q3", "a3", "q4", "a4"]);
    }

    #[test]
    fn the_model_reads_summaries_in_place_of_their_ranges() {
        let mut events = turns(3);
        let s1 = compaction_event(&events[0..4], "S1".into(), None);
        events.insert(4, s1);
        let text = |item: &ViewItem| match item {
            ViewItem::Event(e) => e.content.as_ref().unwrap().parts[0].text.clone().unwrap(),
            ViewItem::Summary(c) => c.parts[0].text.clone().unwrap(),
        };
        let seen: Vec<String> = view(&events).iter().map(text).collect();
        assert_eq!(seen, ["S1", "q3", "a3"]);
        // A later summary that contains the first replaces it.
        events.push(compaction_event(&events[0..7], "S2".into(), None));
        let seen: Vec<String> = view(&events).iter().map(text).collect();
        assert_eq!(seen, ["S2"]);
    }

    #[test]
    fn a_summary_never_separates_a_call_from_its_response() {
        let mut call = Event::new("i1", "agent");
        call.content = Some(Content {
            role: Some("model".into()),
            parts: vec![Part {
                function_call: Some(crate::event::FunctionCall {
                    id: Some("c1".into()),
                    name: "f".into(),
                    args: JsonMap::new(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            extra: JsonMap::new(),
        });
        let events = vec![ev("i1", "user", "q", 1.0), call];
        assert_eq!(self_contained(&events), 1);
    }

    fn call(inv: &str, id: &str, t: f64) -> Event {
        let mut e = Event::new(inv, "agent");
        e.timestamp = t;
        e.content = Some(Content {
            role: Some("model".into()),
            parts: vec![Part {
                function_call: Some(crate::event::FunctionCall {
                    id: Some(id.into()),
                    name: "f".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            extra: JsonMap::new(),
        });
        e
    }

    fn answer(inv: &str, id: &str, t: f64) -> Event {
        let mut e = Event::new(inv, "user");
        e.timestamp = t;
        e.content = Some(Content {
            role: Some("user".into()),
            parts: vec![Part {
                function_response: Some(crate::event::FunctionResponse {
                    id: Some(id.into()),
                    name: "f".into(),
                    response: JsonMap::new(),
                    extra: JsonMap::new(),
                }),
                ..Default::default()
            }],
            extra: JsonMap::new(),
        });
        e
    }

    #[test]
    fn a_range_starts_at_the_call_its_first_response_answers() {
        // i1 asks the client (a long-running call), i2 answers it; a window over i2 and i3
        // reaches back to the call.
        let events = vec![
            ev("i1", "user", "q1", 1.0),
            call("i1", "c1", 2.0),
            answer("i2", "c1", 3.0),
            ev("i2", "agent", "a2", 4.0),
            ev("i3", "user", "q3", 5.0),
            ev("i3", "agent", "a3", 6.0),
        ];
        assert_eq!(earlier_call(&events, 2, 6), Some(1));
        let policy = CompactionPolicy {
            interval: Some(3),
            overlap: 0,
            token_threshold: None,
        };
        assert_eq!(due_range(&events, &policy), Some(0..6));
    }

    #[test]
    fn a_response_whose_call_was_not_read_is_left_out() {
        let events = vec![
            answer("i1", "c0", 1.0),
            ev("i1", "agent", "a1", 2.0),
            ev("i2", "user", "q2", 3.0),
            ev("i2", "agent", "a2", 4.0),
        ];
        let policy = CompactionPolicy {
            interval: Some(2),
            overlap: 0,
            token_threshold: None,
        };
        assert_eq!(orphan_response(&events, 0, 4), Some(0));
        assert_eq!(due_range(&events, &policy), Some(1..4));
    }

    #[test]
    fn an_event_after_a_summary_is_never_hidden_by_its_clock() {
        // The newest user message carries a time inside the summarised range (a replica's
        // clock behind): it was not summarised, so the model reads it, in session order.
        let mut events = turns(2);
        let summary = compaction_event(&events[0..4], "S".into(), None);
        events.push(summary);
        events.push(ev("i9", "user", "late clock", 15.0));
        let seen: Vec<String> = view(&events)
            .iter()
            .map(|item| match item {
                ViewItem::Event(e) => e.content.as_ref().unwrap().parts[0].text.clone().unwrap(),
                ViewItem::Summary(c) => c.parts[0].text.clone().unwrap(),
            })
            .collect();
        assert_eq!(seen, ["S", "late clock"]);
    }

    #[test]
    fn the_prompt_lists_each_part() {
        let events = turns(1);
        let p = prompt("Summarise.", &events);
        assert_eq!(p, "Summarise.\n\nuser: q1\nagent: a1");
    }
}
