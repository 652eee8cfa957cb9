//! Where a session was rewound: each rewind event's seq and the first seq of the invocation
//! it names, found by the database, so a reader can leave the annulled events out of a
//! session it streams page by page (`GET …/sessions/{id}?includeRewound=false`) without
//! holding the session in memory.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::{SessionKey, StoreResult};
use crate::event::JsonMap;
use async_trait::async_trait;
use sqlx::Row;

/// `crate::transcript::rewind::live` by seq ranges, for a reader that streams a session: given each rewind event's seq
/// and the first seq of the invocation it names (oldest first), the inclusive seq ranges a
/// rewind annulled (rewind events included), oldest first.
pub fn rewound_ranges(marks: &[(i64, Option<i64>)]) -> Vec<(i64, i64)> {
    let mut out = vec![];
    let mut floor = i64::MAX;
    for &(seq, first) in marks.iter().rev() {
        // Inside a range already annulled: hidden, and its own range does not count.
        if seq >= floor {
            continue;
        }
        let from = first.filter(|f| *f < seq).unwrap_or(seq);
        out.push((from, seq));
        floor = from;
    }
    out.reverse();
    out
}

/// What a session's rewinds annulled, as seq ranges ([`rewound_ranges`]): asked of each
/// event by readers that page through a session without holding it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rewound(Vec<(i64, i64)>);

impl Rewound {
    /// From each rewind event's seq and the first seq of the invocation it names, oldest
    /// first.
    pub fn new(marks: &[(i64, Option<i64>)]) -> Self {
        Rewound(rewound_ranges(marks))
    }

    /// Whether the event at `seq` was annulled (or is a rewind event).
    pub fn hides(&self, seq: i64) -> bool {
        self.0.iter().any(|(a, b)| (*a..=*b).contains(&seq))
    }

    /// The annulled seq ranges, inclusive, oldest first.
    pub fn ranges(&self) -> &[(i64, i64)] {
        &self.0
    }
}

/// One rewind event of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RewindMark {
    /// The rewind event's seq.
    pub seq: i64,
    /// The first seq of the invocation it names, before it (`None`: not in the session).
    pub first: Option<i64>,
}

#[async_trait]
pub trait RewindStore: Send + Sync + 'static {
    /// The session's rewind events, oldest first.
    async fn rewind_marks(&self, key: &SessionKey) -> StoreResult<Vec<RewindMark>>;

    /// The plain state the session was created with (empty when it was created with none, or
    /// before migration 0013 recorded it): where a rewind or a fork starts folding the events'
    /// deltas. ADK rebuilds the state from the events alone and so loses it; agentd keeps it.
    async fn initial_state(&self, key: &SessionKey) -> StoreResult<JsonMap>;

    /// What the session's rewind events up to seq `up_to` annulled.
    async fn rewound(&self, key: &SessionKey, up_to: i64) -> StoreResult<Rewound> {
        let marks: Vec<(i64, Option<i64>)> = self
            .rewind_marks(key)
            .await?
            .iter()
            .filter(|m| m.seq <= up_to)
            .map(|m| (m.seq, m.first))
            .collect();
        Ok(Rewound::new(&marks))
    }
}

/// PostgreSQL: the actions are `jsonb`.
const PG_MARKS: &str = "SELECT r.seq,
        (SELECT min(e.seq) FROM events e
          WHERE e.app_name = r.app_name AND e.user_id = r.user_id
            AND e.session_id = r.session_id AND e.seq < r.seq
            AND e.invocation_id = r.event->'actions'->>'rewindBeforeInvocationId')
   FROM events r
  WHERE r.app_name = $1 AND r.user_id = $2 AND r.session_id = $3
    AND r.event->'actions' ? 'rewindBeforeInvocationId'
  ORDER BY r.seq";

/// SQLite: the event is JSON text.
const SQLITE_MARKS: &str = "SELECT r.seq,
        (SELECT min(e.seq) FROM events e
          WHERE e.app_name = r.app_name AND e.user_id = r.user_id
            AND e.session_id = r.session_id AND e.seq < r.seq
            AND e.invocation_id = json_extract(r.event, '$.actions.rewindBeforeInvocationId'))
   FROM events r
  WHERE r.app_name = ? AND r.user_id = ? AND r.session_id = ?
    AND json_extract(r.event, '$.actions.rewindBeforeInvocationId') IS NOT NULL
  ORDER BY r.seq";

/// The state a session was created with, as JSON text (NULL: none recorded).
const PG_INITIAL: &str =
    "SELECT initial_state::text FROM sessions WHERE app_name = $1 AND user_id = $2 AND id = $3";
const SQLITE_INITIAL: &str =
    "SELECT initial_state FROM sessions WHERE app_name = $1 AND user_id = $2 AND id = $3";

macro_rules! rewind_store {
    ($store:ty, $sql:expr, $initial:expr, $pool:ident) => {
        #[async_trait]
        impl RewindStore for $store {
            async fn initial_state(&self, key: &SessionKey) -> StoreResult<JsonMap> {
                let text: Option<Option<String>> = sqlx::query_scalar($initial)
                    .bind(&key.app_name)
                    .bind(&key.user_id)
                    .bind(&key.session_id)
                    .fetch_optional(&self.$pool)
                    .await?;
                match text.flatten() {
                    Some(t) => Ok(serde_json::from_str(&t)?),
                    None => Ok(JsonMap::new()),
                }
            }

            async fn rewind_marks(&self, key: &SessionKey) -> StoreResult<Vec<RewindMark>> {
                let rows = sqlx::query($sql)
                    .bind(&key.app_name)
                    .bind(&key.user_id)
                    .bind(&key.session_id)
                    .fetch_all(&self.$pool)
                    .await?;
                rows.iter()
                    .map(|r| {
                        Ok(RewindMark {
                            seq: r.try_get(0)?,
                            first: r.try_get(1)?,
                        })
                    })
                    .collect()
            }
        }
    };
}

rewind_store!(PgStore, PG_MARKS, PG_INITIAL, pool);
rewind_store!(SqliteStore, SQLITE_MARKS, SQLITE_INITIAL, reader);
