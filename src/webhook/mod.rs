//! Webhooks: a run's end told to a receiver, signed the Standard Webhooks way, never lost.
//!
//! A run carries its targets ([`WebhookTarget`]: the request's own `webhook` and its app's
//! `webhooks:` from `agentd.yaml`) from admission on, in `runs.webhooks`. The database writes
//! the deliveries itself, in the transaction that ends the run (a trigger: see
//! `migrations/postgres/0009_webhooks.sql`); [`Sender`] on every replica claims due ones,
//! signs ([`sign`]), posts them ([`payload`] builds the body) and retries with backoff. The
//! whole design is in `docs/background.md`. A2A push notification configs ride the same
//! outbox ([`a2a`]: the body A2A expects, sent with the config's token and credentials).

pub mod a2a;
mod payload;
mod sender;
pub mod sign;
mod target;

pub use sender::{Sender, SenderConfig};
pub use target::{
    check_resolves, A2aPush, AppWebhook, TargetError, WebhookPolicy, WebhookSpec, WebhookTarget,
    EVENTS,
};
