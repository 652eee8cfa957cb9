//! Rewind, as ADK defines it (`Runner.rewind_async`): a session is never edited; a rewind is
//! one more event, `actions.rewindBeforeInvocationId`, whose state delta restores the session
//! state (plain keys) and whose artifact delta restores each session artifact's version, as of
//! just before that invocation's first event. Everything that reads history for a model reads
//! it through [`live`], which drops what a rewind annulled.

use crate::event::{Event, JsonMap};
use serde_json::Value;
use std::collections::BTreeMap;

/// Which of `events` (oldest first) are still part of the conversation. ADK's backward scan:
/// a rewind event hides itself and every event from the first event of the invocation it
/// names up to it; the scan then goes on before that invocation (a rewind that was itself
/// rewound hides nothing).
pub fn live(events: &[Event]) -> Vec<bool> {
    let mut keep = vec![true; events.len()];
    let mut i = events.len();
    while i > 0 {
        i -= 1;
        if let Some(target) = events[i].actions.rewind_before_invocation_id.as_deref() {
            keep[i] = false;
            if let Some(first) = events[..i].iter().position(|e| e.invocation_id == target) {
                keep[first..i].iter_mut().for_each(|k| *k = false);
                i = first;
            }
        }
    }
    keep
}

fn shared(key: &str) -> bool {
    key.starts_with("app:") || key.starts_with("user:") || key.starts_with("temp:")
}

/// Applies one event's state delta to the session's plain state (`null` removes a key).
pub fn fold_state(state: &mut JsonMap, delta: &JsonMap) {
    for (k, v) in delta {
        if shared(k) {
            continue;
        }
        if v.is_null() {
            state.remove(k);
        } else {
            state.insert(k.clone(), v.clone());
        }
    }
}

/// The state delta that takes the session's plain keys from `current` back to `then` (the
/// plain state as of the rewind point, folded by the caller): changed keys get their old
/// value, keys added since get `null` (removed). `app:`, `user:` and `temp:` keys are left
/// alone.
pub fn delta_from(then: &JsonMap, current: &JsonMap) -> JsonMap {
    let mut delta = JsonMap::new();
    for (k, v) in then {
        if current.get(k) != Some(v) {
            delta.insert(k.clone(), v.clone());
        }
    }
    for k in current.keys() {
        if !shared(k) && !then.contains_key(k) {
            delta.insert(k.clone(), Value::Null);
        }
    }
    delta
}

/// The session artifacts to restore, from each file's version as of the rewind point and now
/// (folded by the caller): each filename whose version changed, with its version then
/// (`None`: it did not exist, so it gets a deletion marker). `user:` artifacts belong to the
/// user, not the session, and are left alone.
pub fn changes_from(
    then: &BTreeMap<String, i64>,
    now: &BTreeMap<String, i64>,
) -> Vec<(String, Option<i64>)> {
    now.iter()
        .filter(|(f, n)| !f.starts_with("user:") && then.get(*f) != Some(*n))
        .map(|(f, _)| (f.clone(), then.get(f).copied()))
        .collect()
}

/// A message the user typed, the start of a turn: a user event with content that is not only
/// answers to calls (a tool result, a confirmation continues the turn it answers), and not a
/// rewind. A user event without a message (a state PATCH, a compaction's summary) starts none.
pub fn is_user_turn(e: &Event) -> bool {
    e.author == "user"
        && e.actions.rewind_before_invocation_id.is_none()
        && e.content.as_ref().is_some_and(|c| {
            c.parts
                .iter()
                .any(|p| p.function_response.is_none() && p.function_call.is_none())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rewinds::rewound_ranges;
    use serde_json::json;

    fn ev(inv: &str, delta: Value) -> Event {
        let mut e = Event::new(inv, "agent");
        e.actions.state_delta = serde_json::from_value(delta).unwrap();
        e
    }

    fn rewind(inv: &str, target: &str) -> Event {
        let mut e = Event::new(inv, "user");
        e.actions.rewind_before_invocation_id = Some(target.into());
        e
    }

    #[test]
    fn a_rewind_hides_its_range_and_itself() {
        let events = vec![
            ev("e1", json!({})),
            ev("e2", json!({})),
            ev("e2", json!({})),
            ev("e3", json!({})),
            rewind("r1", "e2"),
            ev("e4", json!({})),
        ];
        assert_eq!(live(&events), [true, false, false, false, false, true]);
        // A rewind naming an unknown invocation hides only itself.
        assert_eq!(
            live(&[ev("e1", json!({})), rewind("r", "nope")]),
            [true, false]
        );
    }

    #[test]
    fn rewound_ranges_agree_with_live() {
        // seqs 1..=8: e1 e2 e2 r(e2) e3 r(e1) e4 r(nope)
        let events = vec![
            ev("e1", json!({})),
            ev("e2", json!({})),
            ev("e2", json!({})),
            rewind("r1", "e2"),
            ev("e3", json!({})),
            rewind("r2", "e1"),
            ev("e4", json!({})),
            rewind("r3", "nope"),
        ];
        let live = live(&events);
        let ranges = rewound_ranges(&[(4, Some(2)), (6, Some(1)), (8, None)]);
        assert_eq!(ranges, [(1, 6), (8, 8)]);
        for (i, keep) in live.iter().enumerate() {
            let seq = i as i64 + 1;
            let hidden = ranges.iter().any(|(a, b)| (*a..=*b).contains(&seq));
            assert_eq!(*keep, !hidden, "seq {seq}");
        }
    }

    #[test]
    fn state_is_restored_as_adk_computes_it() {
        let before = vec![
            ev("e1", json!({"a": 1, "b": 2, "app:x": 1})),
            ev("e1", json!({"b": null})),
        ];
        let current: JsonMap =
            serde_json::from_value(json!({"a": 5, "c": 3, "app:x": 9, "user:y": 1})).unwrap();
        let mut then = JsonMap::new();
        for e in &before {
            fold_state(&mut then, &e.actions.state_delta);
        }
        let delta = delta_from(&then, &current);
        assert_eq!(Value::Object(delta), json!({"a": 1, "c": null}));
    }

    #[test]
    fn artifacts_changed_since_the_point_are_restored() {
        let with = |inv: &str, a: Value| {
            let mut e = Event::new(inv, "agent");
            e.actions.artifact_delta = serde_json::from_value(a).unwrap();
            e
        };
        let all = vec![
            with("e1", json!({"f": 0, "user:u": 0})),
            with("e2", json!({"f": 1, "g": 0, "user:u": 1})),
        ];
        let versions = |events: &[Event]| {
            let mut v: BTreeMap<String, i64> = BTreeMap::new();
            for e in events {
                v.extend(e.actions.artifact_delta.clone());
            }
            v
        };
        let changes = changes_from(&versions(&all[..1]), &versions(&all));
        assert_eq!(
            changes,
            [("f".to_string(), Some(0)), ("g".to_string(), None)]
        );
    }
}
