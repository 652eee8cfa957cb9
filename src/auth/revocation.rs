//! Hearing of API key changes made by any replica (a revocation), so cached keys go at once.
//!
//! A revocation notifies channel [`KEYS_CHANNEL`] in the same statement that revokes the key
//! (see `store::keys`). Every replica counts what it hears in a [`KeyChanges`]; the key cache
//! ([`super::Authenticator`]) holds entries only for the count they were read at. A lost
//! notification connection counts as a change too: anything may have been missed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The PostgreSQL notification channel of API key changes.
pub const KEYS_CHANNEL: &str = "agentd_keys";

/// How many key changes this replica has heard of. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct KeyChanges(Arc<AtomicU64>);

impl KeyChanges {
    /// A change was heard (or may have been missed).
    pub fn changed(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// The count now: a cached key read at another count is stale.
    pub fn generation(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
