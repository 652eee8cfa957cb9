//! The tap that forwards a run's items to its session's followers.

use super::{Bus, BusMsg};
use crate::store::SessionKey;
use crate::transcript::{RunItem, RunObserver};
use std::sync::Arc;

/// Forwards a run's items to its session's followers (see [`bus`]). Costs nothing per item
/// when nobody follows the session.
pub(crate) struct BusTap {
    pub(crate) bus: Arc<Bus>,
    pub(crate) key: SessionKey,
    pub(crate) run_id: Arc<str>,
    /// For `agentd_run_time_to_first_event_seconds`.
    pub(crate) started: std::time::Instant,
    pub(crate) first_event: std::sync::atomic::AtomicBool,
}

impl RunObserver for BusTap {
    fn observe(&self, item: &RunItem, after: Option<i64>) {
        if matches!(item, RunItem::Event { .. })
            && !self
                .first_event
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            metrics::histogram!("agentd_run_time_to_first_event_seconds", "app" => self.key.app_name.clone())
                .record(self.started.elapsed().as_secs_f64());
        }
        let msg = match item {
            RunItem::Event { event, seq: None } => {
                if !self.bus.is_followed(&self.key) {
                    return;
                }
                BusMsg::Partial {
                    run_id: self.run_id.clone(),
                    after,
                    event: Arc::new((**event).clone()),
                }
            }
            RunItem::Event {
                event,
                seq: Some(seq),
            } => BusMsg::Committed {
                run_id: Some(self.run_id.clone()),
                seq: *seq,
                event: self
                    .bus
                    .is_followed(&self.key)
                    .then(|| Arc::new((**event).clone())),
                in_run_stream: true,
            },
            RunItem::Error { kind, message } => BusMsg::Error {
                run_id: self.run_id.clone(),
                kind: kind.clone(),
                message: message.clone(),
            },
            RunItem::Done { status, last_seq } => BusMsg::Done {
                run_id: self.run_id.clone(),
                status: *status,
                last_seq: *last_seq,
            },
        };
        self.bus.publish(&self.key, msg);
    }
}
