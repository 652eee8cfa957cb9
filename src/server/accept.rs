//! Accepting connections: a bound on how many are open, header-read and keep-alive timeouts,
//! and a graceful shutdown.
//!
//! `axum::serve` sets no timer, so a client that sends half a header holds its socket for ever:
//! a thousand of them made an agentd unreachable. Here hyper gets a timer and a header-read
//! timeout (which also closes keep-alive connections idle for that long), and a semaphore
//! bounds open connections; beyond the bound new ones wait in the listen backlog and a line
//! says so.

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
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
    let mut last_full_log: Option<Instant> = None;
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if last_full_log.is_none_or(|at| at.elapsed() >= FULL_LOG_EVERY) {
                    tracing::warn!(
                        max_connections = config.max_connections,
                        "connection limit reached (--max-connections); new connections wait"
                    );
                    last_full_log = Some(Instant::now());
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                    _ = stop.cancelled() => break,
                }
            }
        };
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
        // Small SSE frames stall ~40 ms under Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
        let service =
            app.clone()
                .map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(peer));
                    req
                });
        let conn = http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
