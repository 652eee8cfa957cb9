//! Writes to a session that are not turns: they take the session as a run does ([`hold`]),
//! so no run interleaves with them, and commit fenced by that ownership.
//!
//! - [`rewind`]: ADK's `rewind_async`, one event that annuls the turns from an invocation on
//!   (also the first half of a regenerate or an edit, which a run commits with its user event).
//! - [`compact`]: a summary of older turns, after a run, by the app's `compaction:` block.
//! - [`fork`]: a new session from a point of another (no hold: the source is only read).
//!
//! The transcript's own rules (what a rewind annuls, what a summary covers) are in
//! [`crate::transcript`]; these files are the runner's side: taking the session, reading it
//! page by page, committing.

pub(super) mod compact;
pub(super) mod fork;
pub(super) mod hold;
pub(super) mod rewind;
