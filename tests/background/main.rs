//! Runs without a client, end to end over real processes: webhooks signed the Standard
//! Webhooks way and checked by the real `standardwebhooks` Python package, retried with the
//! same `webhook-id`, and delivered after a crash; schedules that fire each tick once across
//! two replicas while one is killed; and the refusals that store nothing.

#[path = "../common/mod.rs"]
mod common;

use common::procs::{Apps, Replica, USER};
use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

mod outboxes;
mod refusals;
mod schedules;
mod webhooks;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
