//! A fair share of the sender's slots: at most so many deliveries in flight per user and per
//! receiving host, so one tenant's slow or dead receivers cannot hold every slot of the
//! replica while other users' deliveries wait.
//!
//! A host that let an attempt time out is *slow* for a while: it gets one slot, so retries
//! to a receiver that never answers take one slot at a time, not the host's whole share.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a host that timed out is held to one slot.
const SLOW_FOR: Duration = Duration::from_secs(60);

/// The caps (`--webhook-in-flight-per-user`, `--webhook-in-flight-per-host`; 0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub per_user: usize,
    pub per_host: usize,
}

#[derive(Default)]
struct Counts {
    by_user: HashMap<String, usize>,
    by_host: HashMap<String, usize>,
    slow_until: HashMap<String, Instant>,
}

/// What is in flight, by user and by host.
#[derive(Clone)]
pub struct Shares {
    caps: Caps,
    counts: Arc<Mutex<Counts>>,
}

/// One delivery's place in its user's and its host's share; dropping it frees both.
pub struct Share {
    user: String,
    host: String,
    counts: Arc<Mutex<Counts>>,
}

/// The key a host's share is counted under: scheme, host and port (two receivers on one
/// machine's different ports are different hosts).
pub fn host_of(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => format!(
            "{}://{}:{}",
            u.scheme(),
            u.host_str().unwrap_or(""),
            u.port_or_known_default().unwrap_or(0)
        ),
        Err(_) => url.chars().take(256).collect(),
    }
}

impl Shares {
    pub fn new(caps: Caps) -> Shares {
        Shares {
            caps,
            counts: Arc::default(),
        }
    }

    /// A place for a delivery of `user` to `url`, or `None` while the user or the host has its
    /// share in flight.
    pub fn take(&self, user: &str, url: &str) -> Option<Share> {
        let host = host_of(url);
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        c.slow_until.retain(|_, until| *until > now);
        let host_cap = if c.slow_until.contains_key(&host) {
            1
        } else {
            self.caps.per_host
        };
        let full = |n: Option<&usize>, cap: usize| cap > 0 && n.copied().unwrap_or(0) >= cap;
        if full(c.by_user.get(user), self.caps.per_user) || full(c.by_host.get(&host), host_cap) {
            return None;
        }
        *c.by_user.entry(user.to_string()).or_insert(0) += 1;
        *c.by_host.entry(host.clone()).or_insert(0) += 1;
        Some(Share {
            user: user.to_string(),
            host,
            counts: self.counts.clone(),
        })
    }

    /// `url`'s host let an attempt time out: one slot for it for a while.
    pub fn slow(&self, url: &str) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.slow_until.insert(host_of(url), Instant::now() + SLOW_FOR);
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut guard = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let c = &mut *guard;
        for (map, key) in [(&mut c.by_user, &self.user), (&mut c.by_host, &self.host)] {
            if let Some(n) = map.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_user_and_host_gets_its_share_and_gives_it_back() {
        let s = Shares::new(Caps {
            per_user: 2,
            per_host: 3,
        });
        let a1 = s
            .take("a", "http://slow.example:8080/x")
            .expect("a's first");
        let _a2 = s
            .take("a", "http://slow.example:8080/y")
            .expect("a's second");
        assert!(
            s.take("a", "http://other.example/").is_none(),
            "a has its 2"
        );
        let _b1 = s.take("b", "http://slow.example:8080/").expect("b's first");
        assert!(
            s.take("c", "http://slow.example:8080/").is_none(),
            "the host has its 3"
        );
        assert!(
            s.take("c", "http://slow.example:8081/").is_some(),
            "another port"
        );
        drop(a1);
        assert!(
            s.take("a", "http://other.example/").is_some(),
            "a's place is back"
        );
        s.slow("https://dead.example/hook");
        let d = s
            .take("d", "https://dead.example:443/other")
            .expect("one slot");
        assert!(
            s.take("e", "https://dead.example/").is_none(),
            "a slow host: one"
        );
        drop(d);
        assert!(s.take("e", "https://dead.example/").is_some());
    }
}
