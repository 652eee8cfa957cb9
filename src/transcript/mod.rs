//! The run as data: what a run hands its client ([`RunItem`]) and how its events become facts
//! before the client sees them (the outbox), and which of a session's events a rewind annulled
//! ([`rewind`]).
//!
//! Below `runner`, `agent` and `http` alike: the runner drives a run, an agent emits into it,
//! the HTTP layer maps its items to frames, and none of them needs the others' internals.

pub mod compaction;
mod item;
mod meter;
mod outbox;
pub mod rewind;

pub use item::{RunItem, RunObserver};
pub use meter::Meter;
pub use outbox::{
    temp_keys, CommitError, CommitResult, EmitState, Outbox, OutboxParts, HOLD_LIMIT,
};
