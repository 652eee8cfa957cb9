//! Concurrent runs per user (`--max-runs-per-user`), counted on this replica.
//!
//! A count per process, not a database fact: with several replicas a user may have up to
//! `replicas × limit` runs at once. It bounds what one user can take of one replica, which is
//! what it is for; docs/security.md says so.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct UserQuota {
    limit: usize,
    running: Arc<Mutex<HashMap<String, usize>>>,
}

/// One run's place in its user's count; dropping it (however the run's task ends) frees it.
pub struct Slot {
    user: String,
    running: Arc<Mutex<HashMap<String, usize>>>,
}

impl UserQuota {
    pub fn new(limit: usize) -> Self {
        UserQuota {
            limit,
            running: Arc::default(),
        }
    }

    /// A slot for `user`, or `None` when the user already has `limit` runs here.
    pub fn take(&self, user: &str) -> Option<Option<Slot>> {
        if self.limit == 0 {
            return Some(None);
        }
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let n = running.entry(user.to_string()).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(Some(Slot {
            user: user.to_string(),
            running: self.running.clone(),
        }))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = running.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                running.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::UserQuota;

    #[test]
    fn slots_are_counted_per_user_and_freed_on_drop() {
        let q = UserQuota::new(2);
        let a1 = q.take("alice").unwrap();
        let _a2 = q.take("alice").unwrap();
        assert!(q.take("alice").is_none());
        assert!(q.take("bob").is_some());
        drop(a1);
        assert!(q.take("alice").is_some());
        assert!(UserQuota::new(0).take("x").unwrap().is_none());
    }
}
