//! Schedules: runs started by a cron pattern in a time zone, each tick fired exactly once
//! across replicas. [`pattern`] reads and evaluates the pattern; [`ticker`] is the loop on
//! every replica that claims due ticks in the database and starts their runs. The design is in
//! `docs/background.md`.

pub mod pattern;
mod ticker;

pub use pattern::{plan, plan_with_min, CatchUp, Pattern};
pub use ticker::Ticker;

/// What a schedule may be (`--max-schedules-per-user`, `--schedule-min-interval-secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Schedules per user and app; 0: no limit.
    pub max_per_user: u32,
    /// The shortest period between two ticks, in seconds.
    pub min_interval_secs: u64,
}

impl Limits {
    /// What the flags say schedules may be.
    pub fn of(flags: &crate::config::BackgroundArgs) -> Self {
        Self {
            max_per_user: flags.max_schedules_per_user,
            min_interval_secs: flags.schedule_min_interval_secs,
        }
    }
}

/// Why a schedule's owner can no longer start its runs: the server pauses it.
pub const PAUSED_KEY_REVOKED: &str = "key_revoked";
/// The key that made the schedule expired.
pub const PAUSED_KEY_EXPIRED: &str = "key_expired";
