//! Schedules: runs started by a cron pattern in a time zone, each tick fired exactly once
//! across replicas. [`pattern`] reads and evaluates the pattern; [`ticker`] is the loop on
//! every replica that claims due ticks in the database and starts their runs. The design is in
//! `docs/background.md`.

pub mod pattern;
mod ticker;

pub use pattern::{plan, CatchUp, Pattern};
pub use ticker::Ticker;
