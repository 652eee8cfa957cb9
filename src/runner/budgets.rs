//! The budgets admission checks, cached: most users have none, and asking the database "is
//! there a budget?" on every run costs a round trip before the run's first byte (measured:
//! +0.2 ms TTFB at c=1). A budget is read once per user and app, then kept until a change is
//! heard (`PUT`/`DELETE` notify [`BUDGETS_CHANNEL`] on PostgreSQL, and this replica bumps the
//! generation itself), a gap in the notifications, or [`MAX_AGE`]: a change made elsewhere
//! whose notification was lost applies within that.
//!
//! What is *spent* is never cached: it is read from the database whenever a budget exists.

use crate::store::{Store, StoreResult};
use crate::usage::Budget;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::store::usage::BUDGETS_CHANNEL;

/// The longest a cached budget is trusted without a notification.
pub const MAX_AGE: Duration = Duration::from_secs(10);

/// Entries kept at most (one per user and app seen within [`MAX_AGE`]); past it the cache
/// starts again empty.
const MAX_ENTRIES: usize = 100_000;

type Entries = HashMap<(String, String), (Option<Budget>, Instant)>;

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

    /// The budget of `user` in `app`, from the cache or the database.
    pub async fn get(
        &self,
        store: &dyn Store,
        app: &str,
        user: &str,
    ) -> StoreResult<Option<Budget>> {
        let key = (app.to_string(), user.to_string());
        let generation = self.generation.load(Ordering::SeqCst);
        {
            let entries = lock(&self.entries);
            if entries.0 == generation {
                if let Some((budget, at)) = entries.1.get(&key) {
                    if at.elapsed() < MAX_AGE {
                        return Ok(*budget);
                    }
                }
            }
        }
        let read_at = Instant::now();
        let budget = store.budget(app, user).await?;
        let mut entries = lock(&self.entries);
        // A change heard while the read was under way: the answer may predate it.
        if self.generation.load(Ordering::SeqCst) == generation {
            if entries.0 != generation || entries.1.len() >= MAX_ENTRIES {
                entries.1.clear();
                entries.0 = generation;
            }
            entries.1.insert(key, (budget, read_at));
        }
        Ok(budget)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
