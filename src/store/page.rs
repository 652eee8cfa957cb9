//! A page of events bounded by what it holds in memory, not only by how many events it has.
//!
//! An event's size in memory is not its count: one with a thousand parts, or a long text,
//! weighs as much as thousands of small ones. Every read of events (a session's, a run's)
//! takes rows one at a time from the database and stops at the first event that would take
//! the page past [`PAGE_BYTES`] (a page always holds at least one event, so paging always
//! moves on). A page cut short says there is more, as a full one does: every caller that
//! pages on `has_more` (or its last seq) reads the rest in the next page.

use super::{StoreResult, StoredEvent};
use crate::event::Event;
use futures::{Stream, TryStreamExt};

/// What one page of events may hold, by [`event_weight`].
pub const PAGE_BYTES: usize = 16 * 1024 * 1024;

/// An estimate of the memory a parsed event takes, from the length of its stored JSON: the
/// text twice over (strings, and the maps of function arguments and responses), a part's
/// fixed size for each part, and the event's own fields.
pub fn event_weight(json_len: usize, e: &Event) -> usize {
    let parts = e.content.as_ref().map_or(0, |c| c.parts.len());
    2 * json_len + 384 * parts + 512
}

/// Takes up to `limit` events from `rows` (which the query fetched `limit + 1` of), within
/// [`PAGE_BYTES`]; whether more are left. `parse` reads one row into its event and the length
/// of its stored JSON.
pub async fn take<R, S>(
    rows: S,
    limit: usize,
    parse: impl Fn(&R) -> StoreResult<(StoredEvent, usize)>,
) -> StoreResult<(Vec<StoredEvent>, bool)>
where
    S: Stream<Item = Result<R, sqlx::Error>>,
{
    let mut rows = std::pin::pin!(rows);
    let mut events = Vec::new();
    let mut held = 0usize;
    while let Some(row) = rows.try_next().await? {
        if events.len() >= limit {
            return Ok((events, true));
        }
        let (event, json_len) = parse(&row)?;
        let weight = event_weight(json_len, &event.event);
        if !events.is_empty() && held + weight > PAGE_BYTES {
            return Ok((events, true));
        }
        held += weight;
        events.push(event);
    }
    Ok((events, false))
}
