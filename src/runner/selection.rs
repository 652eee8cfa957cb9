//! Agent selection: which agent of the app answers the new message.

use super::INVOCATION_ABORTED;
use crate::agent::{Agent, AgentTree};
use crate::store::{EventRange, SessionKey, SessionStore, StoreError};
use std::sync::Arc;

/// How far back agent selection looks for the last agent that spoke.
const SELECTION_SCAN_LIMIT: usize = 1000;

/// A new message that answers function calls (a long-running tool's result, a
/// confirmation) goes to the agent that made the calls. Otherwise the last agent that
/// spoke keeps the conversation if it and its ancestors allow it, else the root answers.
/// Sealing events of cancelled runs do not count as speaking, nor do turns a rewind annulled.
/// Reads history newest-first, a page at a time.
pub(crate) async fn select_agent(
    store: &dyn SessionStore,
    tree: &AgentTree,
    key: &SessionKey,
    answered_calls: &[String],
) -> Result<Arc<dyn Agent>, StoreError> {
    let root = tree.root();
    // Newest first: `before` past the last seq asks for the newest page.
    let mut before = Some(i64::MAX);
    let mut scanned = 0;
    // Newest first, a rewind event names the invocation whose first event its range starts
    // at: everything until then (older rewinds included) was annulled.
    let mut annulled: Option<(String, bool)> = None;
    while scanned < SELECTION_SCAN_LIMIT {
        let Some(page) = store
            .list_events(
                key,
                EventRange {
                    after: None,
                    before,
                    limit: 50,
                },
            )
            .await?
        else {
            break;
        };
        for stored in page.events.iter().rev() {
            let event = &stored.event;
            if let Some((target, reached)) = &mut annulled {
                if event.invocation_id == *target {
                    *reached = true;
                    continue;
                }
                if !*reached {
                    continue;
                }
                annulled = None;
            }
            if let Some(target) = &event.actions.rewind_before_invocation_id {
                annulled = Some((target.clone(), false));
                continue;
            }
            let author = stored.event.author.as_str();
            if !answered_calls.is_empty() {
                let made_call = stored
                    .event
                    .function_calls()
                    .any(|c| c.id.as_ref().is_some_and(|id| answered_calls.contains(id)));
                if let (true, Some(agent)) = (made_call, tree.find(author)) {
                    return Ok(agent.clone());
                }
                continue;
            }
            if author == "user" || stored.event.error_code.as_deref() == Some(INVOCATION_ABORTED) {
                continue;
            }
            if author == root.name() {
                return Ok(root.clone());
            }
            if let Some(agent) = tree.find(author) {
                if tree.may_keep_turn(author) {
                    return Ok(agent.clone());
                }
            }
        }
        scanned += page.events.len();
        match (page.has_more, page.events.first()) {
            (true, Some(first)) => before = Some(first.seq),
            _ => break,
        }
    }
    Ok(root.clone())
}
