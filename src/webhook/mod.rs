//! Webhooks: a run's end told to a receiver, signed the Standard Webhooks way, never lost.
//!
//! A run carries its targets ([`WebhookTarget`]: the request's own `webhook` and its app's
//! `webhooks:` from `agentd.yaml`) from admission on. The statement that ends the run writes
//! their deliveries in the same transaction (`store::postgres::outbox`; SQLite in its
//! transaction); [`Sender`] on every replica claims due ones, signs ([`sign`]), posts them
//! ([`payload`] builds the body) and retries with backoff. The whole design is in
//! `docs/background.md`. A2A push notification configs ride the same outbox (the body A2A
//! expects, from [`crate::a2a_task`], sent with the config's token and credentials).

pub mod fair;
mod payload;
mod sender;
pub mod sign;
mod target;

pub use sender::{Sender, SenderConfig};
pub use target::{
    check_resolves, A2aPush, AppWebhook, TargetError, WebhookPolicy, WebhookSpec, WebhookTarget,
    EVENTS,
};
