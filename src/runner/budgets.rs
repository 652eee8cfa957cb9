//! The budgets admission checks, cached: most users, apps and keys have none, and asking the
//! database "is there a budget?" on every run costs a round trip before the run's first byte
//! (measured: +0.2 ms TTFB at c=1). A budget is read once per payer, then kept until a change is
//! heard (`PUT`/`DELETE` notify [`BUDGETS_CHANNEL`] on PostgreSQL, and this replica bumps the
//! generation itself), a gap in the notifications, or [`MAX_AGE`]: a change made elsewhere
//! whose notification was lost applies within that.
//!
//! What is *spent* is never cached: it is read from the database whenever a budget exists.

use crate::store::{KeyStore, StoreResult, UsageStore};
use crate::usage::{Budget, ChargedKey, Limit, Payer};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::store::usage::BUDGETS_CHANNEL;

/// The longest a cached budget is trusted without a notification.
pub const MAX_AGE: Duration = Duration::from_secs(10);

/// Entries kept at most (one per payer seen within [`MAX_AGE`]); past it the cache
/// starts again empty.
const MAX_ENTRIES: usize = 100_000;

type Entries = HashMap<Payer, (Option<Budget>, Instant)>;

/// The cache (see the module docs).
#[derive(Debug, Default)]
pub struct BudgetCache {
    generation: Arc<AtomicU64>,
    entries: Mutex<(u64, Entries)>,
}

impl BudgetCache {
    /// A budget changed (or a change may have been missed): every entry is stale.
    pub fn changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// A handle that marks the cache stale, for the notification listener.
    pub fn on_change(&self) -> impl Fn() + Send + Sync + 'static {
        let generation = self.generation.clone();
        move || {
            generation.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The budgets a run of `user` in `app`, started with API key `key` (if any), is held
    /// to: the user's in the app, the app's and the key's, those that exist.
    pub async fn limits(
        &self,
        store: &dyn UsageStore,
        app: &str,
        user: &str,
        key: Option<&ChargedKey>,
    ) -> StoreResult<Vec<Limit>> {
        let mut payers = vec![
            Payer::User {
                app: app.to_string(),
                user: user.to_string(),
            },
            Payer::App {
                app: app.to_string(),
            },
        ];
        payers.extend(key.map(ChargedKey::payer));
        let mut limits = vec![];
        for payer in payers {
            if let Some(budget) = self.get(store, &payer).await? {
                limits.push(Limit { payer, budget });
            }
        }
        Ok(limits)
    }

    /// The budget of `payer`, from the cache or the database.
    pub async fn get(&self, store: &dyn UsageStore, payer: &Payer) -> StoreResult<Option<Budget>> {
        let generation = self.generation.load(Ordering::SeqCst);
        {
            let entries = lock(&self.entries);
            if entries.0 == generation {
                if let Some((budget, at)) = entries.1.get(payer) {
                    if at.elapsed() < MAX_AGE {
                        return Ok(*budget);
                    }
                }
            }
        }
        let read_at = Instant::now();
        let budget = store.budget(payer).await?;
        let mut entries = lock(&self.entries);
        // A change heard while the read was under way: the answer may predate it.
        if self.generation.load(Ordering::SeqCst) == generation {
            if entries.0 != generation || entries.1.len() >= MAX_ENTRIES {
                entries.1.clear();
                entries.0 = generation;
            }
            entries.1.insert(payer.clone(), (budget, read_at));
        }
        Ok(budget)
    }
}

/// The key a run not started by a request is charged to (a resumed run's, a schedule's),
/// from its stored id. A key gone from the database charges nobody.
pub async fn charged_key(store: &dyn KeyStore, id: &str) -> StoreResult<Option<ChargedKey>> {
    Ok(store.find_api_key(id).await?.map(|k| ChargedKey {
        user: (!k.admin).then_some(k.user_id),
        id: k.id,
    }))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
