//! The sender: on every replica, a loop that claims due deliveries, signs and posts them,
//! and records each attempt's outcome. Claims are leases in the database (see
//! [`crate::store::webhooks`]): a replica that dies mid-attempt leaves the delivery due again
//! for any other one, under the same `webhook-id`.

use super::payload;
use super::sign::{decode_secret, signature};
use super::target::{WebhookPolicy, WebhookTarget};
use crate::store::{Delivery, Settle, Store};
use crate::tools::egress::Resolver;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// How many due deliveries are looked at for each free slot: some are held back by their
/// user's or their host's share ([`super::fair`]).
const CANDIDATES_PER_SLOT: usize = 8;

/// The turns' kind of the senders' look.
const WEBHOOKS: &str = crate::store::turns::kind::WEBHOOKS;

/// What one look for due deliveries came to.
struct Look {
    /// Every free slot found a delivery (look again).
    filled: bool,
    /// Nothing was due.
    none_due: bool,
}
/// The first retry's delay; each next one doubles, up to [`MAX_BACKOFF`], with ±25% jitter.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// HTTP clients kept (one per set of extra `allow_private` rules).
const MAX_CLIENTS: usize = 64;

/// The sender's settings (flags).
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// This replica's id: the claimer recorded on deliveries.
    pub owner: String,
    pub policy: WebhookPolicy,
    /// One attempt's limit (connect, send, answer).
    pub timeout: Duration,
    /// After this long since the run's end, a delivery that keeps failing is `failed`.
    pub retry_for: Duration,
    /// How often to look for due deliveries when nothing wakes the sender.
    pub poll: Duration,
    /// Deliveries in flight at a time on this replica (`--webhook-in-flight`).
    pub in_flight: usize,
    /// Of them, at most so many per user and per receiving host.
    pub caps: super::fair::Caps,
}

pub struct Sender {
    store: Arc<dyn Store>,
    config: SenderConfig,
    nudge: Arc<Notify>,
    clients: Mutex<HashMap<Vec<String>, reqwest::Client>>,
    shares: super::fair::Shares,
}

fn now() -> f64 {
    crate::event::now_ts()
}

impl Sender {
    /// `nudge`: notified when a run of this replica ends (its deliveries are due at once).
    pub fn new(store: Arc<dyn Store>, config: SenderConfig, nudge: Arc<Notify>) -> Arc<Sender> {
        Arc::new(Sender {
            store,
            shares: super::fair::Shares::new(config.caps),
            config,
            nudge,
            clients: Mutex::new(HashMap::new()),
        })
    }

    /// Runs the loop until `stop`; the task ends with it.
    pub fn spawn(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let sender = self.clone();
        tokio::spawn(async move { sender.run(stop).await })
    }

    fn lease(&self) -> Duration {
        // Longer than any attempt can take, so a live sender never loses its claim mid-way.
        self.config.timeout * 2 + Duration::from_secs(10)
    }

    async fn run(self: Arc<Self>, stop: CancellationToken) {
        let slots = Arc::new(tokio::sync::Semaphore::new(self.config.in_flight.max(1)));
        // Woken by a nudge (work of this replica's), or the first look after start.
        let mut nudged = true;
        loop {
            // A look the poll woke takes a turn first (`store::turns`): one replica of the
            // deployment scans per period when there is nothing to do.
            let look = nudged
                || tokio::select! {
                    _ = stop.cancelled() => return,
                    t = self.store.take_turn(WEBHOOKS, self.config.poll) => {
                        t.unwrap_or(true)
                    }
                };
            // While every free slot finds a delivery, look again; then wait for a nudge (a run
            // ended, an attempt finished) or the poll.
            if look {
                // Before the look, so a retry recorded during it keeps the next look granted.
                let since = self.store.turn_clock().await.ok().flatten();
                let mut none_due = false;
                while let Some(l) = self.fill(&slots, &stop).await {
                    none_due = l.none_due;
                    if !l.filled {
                        break;
                    }
                }
                // Nothing due: no replica's sender looks before the next pending delivery is
                // due, unless a retry is recorded meanwhile. A new delivery needs no look of
                // another replica's: the replica whose statement ended the run is nudged (one
                // that dies before sending it leaves it for the quiet's end, at most
                // `MAX_QUIET`).
                if let (true, Some(since)) = (none_due, since) {
                    let next = self.store.next_delivery_at().await;
                    crate::store::turns::go_quiet(&*self.store, WEBHOOKS, since, next).await;
                }
            }
            if stop.is_cancelled() {
                return;
            }
            nudged = tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.nudge.notified() => true,
                _ = tokio::time::sleep(self.config.poll) => false,
            };
        }
    }

    /// Waits for a free slot, then claims due deliveries for the free slots, each within its
    /// user's and its host's share, and starts them. Whether every free slot was filled, and
    /// whether nothing was due (`None`: stopping).
    async fn fill(
        self: &Arc<Self>,
        slots: &Arc<tokio::sync::Semaphore>,
        stop: &CancellationToken,
    ) -> Option<Look> {
        let first = tokio::select! {
            _ = stop.cancelled() => return None,
            p = slots.clone().acquire_owned() => p.ok()?,
        };
        let free = slots.available_permits() + 1;
        let per_user = match self.config.caps.per_user {
            0 => free,
            n => n,
        };
        let due = tokio::select! {
            _ = stop.cancelled() => return None,
            d = self.store.due_deliveries(per_user as u32, (free * CANDIDATES_PER_SLOT) as u32) => d,
        };
        let due = match due {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "could not look for webhook deliveries");
                return Some(Look {
                    filled: false,
                    none_due: false,
                });
            }
        };
        let mut spare = Some(first);
        let mut started = 0;
        for d in &due {
            let permit = match spare.take() {
                Some(p) => p,
                None => match slots.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            // Held back: its user or its host has its share in flight (it stays due).
            let Some(share) = self.shares.take(&d.user_id, &d.url) else {
                spare = Some(permit);
                continue;
            };
            let claimed = self
                .store
                .claim_delivery(&self.config.owner, self.lease().as_secs_f64(), d)
                .await;
            match claimed {
                Ok(Some(delivery)) => {
                    started += 1;
                    let sender = self.clone();
                    tokio::spawn(async move {
                        sender.attempt(delivery).await;
                        drop(share);
                        drop(permit);
                        // What this one held back may go now.
                        sender.nudge.notify_one();
                    });
                }
                // Another sender claimed it first.
                Ok(None) => spare = Some(permit),
                Err(e) => {
                    tracing::warn!(error = %e, "could not claim a webhook delivery");
                    break;
                }
            }
        }
        Some(Look {
            filled: started == free,
            none_due: due.is_empty(),
        })
    }

    async fn attempt(&self, d: Delivery) {
        let span =
            tracing::info_span!("webhook", run = %d.run_id, webhook = %d.id, attempt = d.attempt);
        let (outcome, sent_as) = self.send(&d).instrument(span).await;
        let label = match &outcome {
            Settle::Delivered { .. } => {
                metrics::histogram!("agentd_webhook_delivery_seconds")
                    .record((now() - d.created_at).max(0.0));
                "delivered"
            }
            Settle::Retry { .. } => "retry",
            Settle::Failed { .. } => {
                metrics::counter!("agentd_webhook_deliveries_failed_total").increment(1);
                "failed"
            }
            Settle::Skipped => "skipped",
        };
        metrics::counter!("agentd_webhook_attempts_total", "outcome" => label).increment(1);
        match &outcome {
            Settle::Retry { error, .. } | Settle::Failed { error, .. } => {
                tracing::warn!(run = %d.run_id, webhook = %d.id, attempt = d.attempt, outcome = label, %error, "webhook not delivered");
            }
            _ => tracing::debug!(run = %d.run_id, webhook = %d.id, outcome = label, "webhook"),
        }
        let sent_as = sent_as.filter(|t| *t != d.event_type);
        match self
            .store
            .settle_delivery(&d, &self.config.owner, &outcome, sent_as.as_deref())
            .await
        {
            Ok(true) => {}
            // Our lease ran out and another replica took the delivery over: its outcome counts.
            Ok(false) => tracing::warn!(webhook = %d.id, "webhook attempt outlived its claim"),
            // The claim's lease makes the delivery due again: it is retried (same id).
            Err(e) => {
                tracing::warn!(webhook = %d.id, error = %e, "could not record a webhook attempt")
            }
        }
    }

    /// One attempt: its outcome, and the event it was sent as.
    async fn send(&self, d: &Delivery) -> (Settle, Option<String>) {
        let target: WebhookTarget = match serde_json::from_value(d.target.clone()) {
            Ok(t) => t,
            Err(e) => return (failed(None, format!("unreadable target: {e}")), None),
        };
        if target.a2a.is_some() {
            return match payload::build_a2a(self.store.as_ref(), d).await {
                Ok((event_type, body)) => (
                    self.post(d, &target, &Auth::A2a, body).await,
                    Some(event_type),
                ),
                Err(e) => (
                    self.retry(d, None, format!("could not read the run: {e}")),
                    None,
                ),
            };
        }
        let key = match decode_secret(&target.secret) {
            Ok(k) => k,
            Err(e) => return (failed(None, e), None),
        };
        let (event_type, body) =
            match payload::build(self.store.as_ref(), d, target.include_text).await {
                Ok(b) => b,
                Err(e) => {
                    return (
                        self.retry(d, None, format!("could not read the run: {e}")),
                        None,
                    )
                }
            };
        if !target.events.contains(&event_type) {
            return (Settle::Skipped, Some(event_type));
        }
        let outcome = self.post(d, &target, &Auth::Signed(&key), body).await;
        (outcome, Some(event_type))
    }

    async fn post(
        &self,
        d: &Delivery,
        target: &WebhookTarget,
        auth: &Auth<'_>,
        body: Vec<u8>,
    ) -> Settle {
        let Ok(url) = reqwest::Url::parse(&target.url) else {
            return failed(None, "unreadable URL".into());
        };
        let client = match self.client(&target.allow_private) {
            Ok(c) => c,
            Err(e) => return failed(None, e),
        };
        if let Ok(egress) = self.config.policy.egress(&target.allow_private) {
            if let Err(r) = egress.check_url(&url) {
                return failed(None, super::target::refusal(&r));
            }
        }
        let ts = now() as i64;
        let mut req = client
            .post(url)
            .header("content-type", "application/json")
            .header("user-agent", concat!("agentd/", env!("CARGO_PKG_VERSION")))
            .header("webhook-id", &d.id)
            .header("webhook-timestamp", ts.to_string());
        match (auth, &target.a2a) {
            (Auth::Signed(key), _) => {
                req = req.header("webhook-signature", signature(key, &d.id, ts, &body));
            }
            (Auth::A2a, Some(push)) => {
                if !push.token.is_empty() {
                    req = req.header("x-a2a-notification-token", &push.token);
                }
                if !push.scheme.is_empty() && !push.credentials.is_empty() {
                    req = req.header(
                        "authorization",
                        format!("{} {}", push.scheme, push.credentials),
                    );
                }
            }
            (Auth::A2a, None) => {}
        }
        let sent = req.body(body).send().await;
        match sent {
            Ok(r) if r.status().is_success() => Settle::Delivered {
                status: r.status().as_u16(),
            },
            // Standard Webhooks: 410 Gone means "stop sending".
            Ok(r) if r.status() == reqwest::StatusCode::GONE => {
                failed(Some(410), "the receiver answered 410 Gone".into())
            }
            Ok(r) if r.status().is_redirection() => self.retry(
                d,
                Some(r.status().as_u16()),
                format!(
                    "the receiver answered {} (redirects are not followed)",
                    r.status()
                ),
            ),
            Ok(r) => self.retry(
                d,
                Some(r.status().as_u16()),
                format!("the receiver answered {}", r.status()),
            ),
            Err(e) => {
                let why = if e.is_timeout() {
                    self.shares.slow(&target.url);
                    format!("no answer within {} s", self.config.timeout.as_secs())
                } else {
                    // The chain's innermost cause says what happened (refused address, DNS).
                    let mut source: &dyn std::error::Error = &e;
                    while let Some(s) = source.source() {
                        source = s;
                    }
                    use crate::tools::egress::Refused;
                    let refused = source.downcast_ref::<Refused>().or_else(|| {
                        source
                            .downcast_ref::<std::io::Error>()
                            .and_then(|io| io.get_ref())
                            .and_then(|e| e.downcast_ref::<Refused>())
                    });
                    // The kind of failure, not the resolver's or the socket's words (they can
                    // name internal addresses); those go to the log.
                    match refused {
                        Some(r) => super::target::refusal(r),
                        None => {
                            tracing::info!(delivery = %d.id, error = %source, "webhook send failed");
                            let kind = if e.is_connect() {
                                "could not connect"
                            } else {
                                "could not send"
                            };
                            format!("{kind} to the receiver")
                        }
                    }
                };
                self.retry(d, None, why)
            }
        }
    }

    /// A retry after exponential backoff with jitter, or `failed` once the retry window is
    /// over.
    fn retry(&self, d: &Delivery, status: Option<u16>, error: String) -> Settle {
        let exp = FIRST_BACKOFF
            .saturating_mul(1u32 << d.attempt.clamp(1, 20).saturating_sub(1))
            .min(MAX_BACKOFF);
        let jitter = 0.75 + 0.5 * (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0;
        let retry_at = now() + exp.as_secs_f64() * jitter;
        if retry_at > d.created_at + self.config.retry_for.as_secs_f64() {
            return failed(
                status,
                format!("{error}; gave up after {} attempts", d.attempt),
            );
        }
        Settle::Retry {
            status,
            error,
            retry_at,
        }
    }

    fn client(&self, extra: &[String]) -> Result<reqwest::Client, String> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(extra) {
            return Ok(c.clone());
        }
        let egress = self.config.policy.egress(extra)?;
        let client = reqwest::Client::builder()
            // A proxy would be the address checked, and would then reach any target.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(self.config.timeout)
            .connect_timeout(self.config.timeout.min(Duration::from_secs(10)))
            .dns_resolver(Arc::new(Resolver(egress)))
            .build()
            .map_err(|e| e.to_string())?;
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        clients.insert(extra.to_vec(), client.clone());
        Ok(client)
    }
}

/// How a delivery proves where it comes from.
enum Auth<'a> {
    /// A Standard Webhooks signature with this key.
    Signed(&'a [u8]),
    /// An A2A push config's own token and credentials.
    A2a,
}

fn failed(status: Option<u16>, error: String) -> Settle {
    Settle::Failed { status, error }
}
