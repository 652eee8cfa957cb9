//! Accepting connections: a bound on how many are open, header-read and keep-alive timeouts,
//! shedding of stalled connections at the bound, and a graceful shutdown.
//!
//! `axum::serve` sets no timer, so a client that sends half a header holds its socket for ever:
//! a thousand of them made an agentd unreachable. Here hyper gets a timer and a header-read
//! timeout (which also closes keep-alive connections idle for that long), and a semaphore
//! bounds open connections. When a new client arrives at the bound, the oldest connection that
//! is answering no request (still sending its header, or idle between requests) is closed to
//! make room (as Envoy's overload manager and HAProxy do), so a client that sends a whole
//! request is served while stalled ones would otherwise hold every slot until their timeout; a
//! line per burst says so and `agentd_connections_shed_total` counts them. Only when every
//! open connection is answering a request does the new one wait.

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

#[derive(Debug, Clone, Copy)]
pub struct AcceptConfig {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// How often the "connection limit reached" line may repeat.
const FULL_LOG_EVERY: Duration = Duration::from_secs(10);

/// hyper's per-connection buffer bound (see `serve`).
const MAX_CONNECTION_BUFFER: usize = 64 * 1024;

/// Descriptors kept free of connections: the database pool, the log, files, child processes.
const RESERVED_FDS: u64 = 128;

/// A connection younger than this is never shed: it may not have been read from yet.
const MIN_SHED_AGE: Duration = Duration::from_millis(250);

/// How often a client waiting for a free slot looks again for a connection to shed.
const SHED_RETRY: Duration = Duration::from_millis(100);

/// The connection bound: `--max-connections`, lowered to what the process's open-file limit
/// leaves after the database pool and [`RESERVED_FDS`], at two descriptors a connection (a
/// run's client connection and its outbound one to the model provider or a tool); past the
/// limit `accept` and every outbound connect fail with EMFILE and nobody is served.
pub fn effective_max_connections(configured: usize, db_pool: u32) -> usize {
    let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(u64::MAX, |(soft, _)| soft);
    let room = soft.saturating_sub(RESERVED_FDS + u64::from(db_pool)) / 2;
    configured
        .min(usize::try_from(room).unwrap_or(usize::MAX))
        .max(1)
}

/// One open connection, as the accept loop sees it.
struct Open {
    /// Closes the connection (it is dropped where it is: mid-header or idle).
    close: CancellationToken,
    /// Requests being answered on it (a response body still being written counts): a
    /// connection with one is never shed.
    busy: Arc<AtomicUsize>,
    accepted: Instant,
}

/// The open connections by age (accept order), for shedding the oldest idle one.
#[derive(Default)]
struct Registry {
    next: u64,
    open: BTreeMap<u64, Open>,
}

impl Registry {
    /// Closes the oldest connection that is answering no request (still sending a header, or
    /// idle between requests) and is older than [`MIN_SHED_AGE`]; false if there is none.
    fn shed_oldest_idle(&mut self) -> bool {
        let Some(id) = self
            .open
            .iter()
            .find(|(_, c)| {
                c.busy.load(Ordering::SeqCst) == 0 && c.accepted.elapsed() >= MIN_SHED_AGE
            })
            .map(|(id, _)| *id)
        else {
            return false;
        };
        if let Some(c) = self.open.remove(&id) {
            c.close.cancel();
        }
        true
    }
}

fn lock(r: &Mutex<Registry>) -> std::sync::MutexGuard<'_, Registry> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes a connection from the registry when its task ends, however it ends.
struct Deregister {
    registry: Arc<Mutex<Registry>>,
    id: u64,
}

impl Drop for Deregister {
    fn drop(&mut self) {
        lock(&self.registry).open.remove(&self.id);
    }
}

/// One request in flight on a connection, until its response body is written or dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(busy: &Arc<AtomicUsize>) -> Self {
        busy.fetch_add(1, Ordering::SeqCst);
        InFlight(busy.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its request counted as in flight while it is written.
struct Tracked {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `app` on `listener` until `stop` is cancelled, then lets open connections finish
/// their current request (the caller bounds how long it waits).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    config: AcceptConfig,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        .keep_alive(true)
        // What one connection may buffer, each way (hyper's default is ~400 KiB). A client
        // that reads slowly then holds at most this much (plus the one frame being written)
        // before back-pressure reaches the run; 201 slow readers held ~1 MiB each before.
        // Also the largest request head accepted.
        .max_buf_size(MAX_CONNECTION_BUFFER);
    let registry = Arc::new(Mutex::new(Registry::default()));
    let mut last_full_log: Option<Instant> = None;
    let mut last_shed_log: Option<Instant> = None;
    'accept: loop {
        // Accept first: a slot is made (by shedding) only for a client that is really here.
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            // Full. Make room by closing the oldest idle connection and take its permit as its
            // task ends; with none, wait for a slot, looking again now and then.
            Err(_) => loop {
                let shed = lock(&registry).shed_oldest_idle();
                if shed {
                    metrics::counter!("agentd_connections_shed_total").increment(1);
                    if last_shed_log.is_none_or(|at| at.elapsed() >= FULL_LOG_EVERY) {
                        tracing::warn!(
                            max_connections = config.max_connections,
                            "connection limit reached; closing the oldest connections that \
                             are answering no request"
                        );
                        last_shed_log = Some(Instant::now());
                    }
                } else if last_full_log.is_none_or(|at| at.elapsed() >= FULL_LOG_EVERY) {
                    tracing::warn!(
                        max_connections = config.max_connections,
                        "connection limit reached (--max-connections); new connections wait"
                    );
                    last_full_log = Some(Instant::now());
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => match permit {
                        Ok(permit) => break permit,
                        Err(_) => break 'accept,
                    },
                    // Looked again only when nothing was shed: a shed connection's permit is
                    // on its way, and shedding another would close one more than needed.
                    _ = tokio::time::sleep(SHED_RETRY), if !shed => {}
                    _ = stop.cancelled() => break 'accept,
                }
            },
        };
        // Small SSE frames stall ~40 ms under Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
        let busy = Arc::new(AtomicUsize::new(0));
        let close = CancellationToken::new();
        let deregister = {
            let mut r = lock(&registry);
            let id = r.next;
            r.next += 1;
            r.open.insert(
                id,
                Open {
                    close: close.clone(),
                    busy: busy.clone(),
                    accepted: Instant::now(),
                },
            );
            Deregister {
                registry: registry.clone(),
                id,
            }
        };
        let app = app.clone();
        let service = tower::service_fn(move |mut req: axum::http::Request<Incoming>| {
            // A whole request header arrived: busy until its response is written.
            let in_flight = InFlight::new(&busy);
            req.extensions_mut().insert(ConnectInfo(peer));
            let answered = app.clone().oneshot(req);
            async move {
                let resp = answered.await?;
                Ok::<_, Infallible>(resp.map(|inner| {
                    Body::new(Tracked {
                        inner,
                        _in_flight: in_flight,
                    })
                }))
            }
        });
        let conn = http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _permit = permit;
            let _deregister = deregister;
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                },
                // Shed: dropping the connection closes its socket.
                _ = close.cancelled() => tracing::debug!(%peer, "idle connection shed"),
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
