//! The runner's output, as every consumer sees it: the items of one run, in order.
//!
//! This is the protocol between the runner and whoever delivers a run (the HTTP routes and
//! every frontend adapter map these items to frames; the bus forwards them to followers).
//! It lives below both so that `http` never reaches into `agent` for it.

use crate::event::Event;
use crate::store::RunStatus;

/// What a run hands to its client, in order.
#[derive(Debug, Clone)]
pub enum RunItem {
    /// A partial event (`seq: None`) or a committed one.
    Event { event: Box<Event>, seq: Option<i64> },
    /// The run failed after it started; nothing more follows but `Done`.
    Error { kind: String, message: String },
    /// The run is over.
    Done {
        status: RunStatus,
        last_seq: Option<i64>,
    },
}

/// Sees every item of a run as it is handed to the client (and even when the client has gone):
/// how the runner lets followers on this and other replicas watch a run. `after` is the run's
/// last committed seq at that moment.
pub trait RunObserver: Send + Sync {
    fn observe(&self, item: &RunItem, after: Option<i64>);
}
