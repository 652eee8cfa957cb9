//! A whole session as JSON (`GET …/sessions/{id}`, the answer to `PATCH`), streamed page by
//! page: a session of 100,000 events is never held in memory at once.
//!
//! The head (state, version) is read first; events are then read in pages up to that version,
//! so the body is the session as of the head, whatever is appended meanwhile. If the session
//! disappears mid-way (deleted) or the database fails, the body is cut off with an error, so
//! a client never takes a truncated session for a whole one.

use crate::error_code::ErrorCode;
use crate::event::JsonMap;
use crate::http::error::{ApiError, ApiResult};
use crate::http::AppState;
use crate::store::Rewound;
use crate::store::{EventRange, SessionHead, SessionKey};
use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use std::sync::Arc;

/// Events per database read.
const PAGE: u32 = 500;

/// Answers the session `key` (404 if it does not exist). `extra_state` is merged into the
/// state shown (PATCH echoes `temp:` keys).
pub async fn session_response(
    state: &AppState,
    key: SessionKey,
    extra_state: JsonMap,
) -> ApiResult<Response> {
    session_body(state, key, extra_state, true).await
}

/// [`session_response`]; without `include_rewound`, the events a rewind annulled (and the
/// rewind events) are left out, as a model sees the conversation.
pub async fn session_body(
    state: &AppState,
    key: SessionKey,
    extra_state: JsonMap,
    include_rewound: bool,
) -> ApiResult<Response> {
    let mut head = state
        .store
        .session_head(&key)
        .await?
        .ok_or_else(ApiError::session_not_found)?;
    head.state.extend(extra_state);
    let hidden = Arc::new(match include_rewound {
        true => Rewound::default(),
        false => state.store.rewound(&key, head.last_seq).await?,
    });
    let reader = Reader {
        state: state.clone(),
        key,
        hidden,
        last_seq: head.last_seq,
    };
    // The first page is read before answering, so the common failures are still JSON errors.
    let first = reader.read_page(0).await?;
    let start = Step::Prefix {
        prefix: prefix(&head)?,
        first,
        suffix: format!(
            "],\"lastUpdateTime\":{}}}",
            serde_json::to_string(&head.last_update_time).map_err(ApiError::internal)?
        ),
    };
    let body = futures::stream::unfold(start, move |step| reader.clone().step(step));
    // Fused: a body may be polled again after its end (tower-http's gzip encoder does), and an
    // `unfold` polled after it ended panics, which cut the connection with no response.
    let mut resp = Response::new(Body::from_stream(futures::StreamExt::fuse(body)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// What the body's pages are read with: the session as of its head's version.
#[derive(Clone)]
struct Reader {
    state: AppState,
    key: SessionKey,
    /// Events a rewind annulled, left out.
    hidden: Arc<Rewound>,
    last_seq: i64,
}

impl Reader {
    /// The body's next chunk and the step after it.
    async fn step(self, step: Step) -> Option<(std::io::Result<Bytes>, Step)> {
        match step {
            Step::Prefix {
                prefix,
                first,
                suffix,
            } => Some((
                Ok(Bytes::from(prefix)),
                Step::Page {
                    page: first,
                    suffix,
                    comma: false,
                },
            )),
            Step::Page {
                page: (events, next),
                suffix,
                comma,
            } => {
                let chunk = match serialize(&events, comma) {
                    Ok(c) => c,
                    Err(e) => return Some((Err(e), Step::Done)),
                };
                let comma = comma || !events.is_empty();
                let following = match next {
                    None => Step::Suffix(suffix),
                    Some(after) => match self.read_page(after).await {
                        Ok(page) => Step::Page {
                            page,
                            suffix,
                            comma,
                        },
                        Err(e) => {
                            tracing::warn!(code = e.code.as_str(), "session body cut off");
                            let cut = std::io::Error::other("reading the events failed");
                            return Some((Err(cut), Step::Done));
                        }
                    },
                };
                Some((Ok(chunk), following))
            }
            Step::Suffix(suffix) => Some((Ok(Bytes::from(suffix)), Step::Done)),
            Step::Done => None,
        }
    }

    async fn read_page(&self, after: i64) -> ApiResult<Page> {
        let page = self
            .state
            .store
            .list_events(
                &self.key,
                EventRange {
                    after: Some(after),
                    before: None,
                    limit: PAGE,
                },
            )
            .await?
            .ok_or_else(ApiError::session_not_found)?;
        let mut reached = after;
        let mut events = Vec::with_capacity(page.events.len());
        for e in page.events {
            if e.seq > self.last_seq {
                break;
            }
            reached = e.seq;
            if !self.hidden.hides(e.seq) {
                events.push(e.event);
            }
        }
        if reached < self.last_seq && !page.has_more {
            // Seqs run from 1 to the head's without gaps: ending short means the session was
            // deleted (and perhaps re-created) meanwhile. Never pass that off as the session.
            return Err(ApiError::new(
                ErrorCode::SessionChanged,
                "The session was deleted or replaced while it was being read; read it again.",
            ));
        }
        Ok((events, (reached < self.last_seq).then_some(reached)))
    }
}

/// Events of one page, and the seq to read after if there is more.
type Page = (Vec<crate::event::Event>, Option<i64>);

enum Step {
    Prefix {
        prefix: String,
        first: Page,
        suffix: String,
    },
    Page {
        page: Page,
        suffix: String,
        comma: bool,
    },
    Suffix(String),
    Done,
}

fn prefix(head: &SessionHead) -> ApiResult<String> {
    let field = |v: &str| serde_json::to_string(v).map_err(ApiError::internal);
    Ok(format!(
        "{{\"id\":{},\"appName\":{},\"userId\":{},\"state\":{},\"events\":[",
        field(&head.key.session_id)?,
        field(&head.key.app_name)?,
        field(&head.key.user_id)?,
        serde_json::to_string(&head.state).map_err(ApiError::internal)?,
    ))
}

fn serialize(events: &[crate::event::Event], comma: bool) -> Result<Bytes, std::io::Error> {
    let mut out = Vec::with_capacity(events.len() * 256);
    for (i, e) in events.iter().enumerate() {
        if comma || i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, e).map_err(std::io::Error::other)?;
    }
    Ok(Bytes::from(out))
}
