//! A TCP proxy between agentd and PostgreSQL that injects connection faults: cut every
//! connection at once (what a PostgreSQL restart looks like to the pool), or cut the one
//! connection whose next reply acknowledges an INSERT, after PostgreSQL committed it and
//! before agentd hears of it (an ambiguous commit: the fault Temporal injects in its storage
//! tests).
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// The `CommandComplete` tag of a one-row INSERT (an event append). PostgreSQL sends it, with
/// `ReadyForQuery`, after the implicit transaction of the statement has committed.
const INSERT_ACK: &[u8] = b"INSERT 0 1\0";

pub struct PgProxy {
    pub port: u16,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
    cut_next_insert: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    freeze: Arc<Freeze>,
}

/// "Freeze after the next INSERT": the acknowledgement reaches agentd, then nothing more
/// reaches PostgreSQL (statements wait, as if the network had stopped) until `thaw`.
#[derive(Default)]
struct Freeze {
    armed: AtomicBool,
    frozen: AtomicBool,
    thawed: Notify,
}

impl Freeze {
    async fn wait_thawed(&self) {
        loop {
            let thawed = self.thawed.notified();
            if !self.frozen.load(Ordering::SeqCst) {
                return;
            }
            thawed.await;
        }
    }
}

impl PgProxy {
    /// Forwards 127.0.0.1:<port> to `upstream` (`host:port`).
    pub async fn start(upstream: String) -> PgProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let conns: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let cut_next_insert = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let freeze = Arc::new(Freeze::default());
        let (list, arm, count) = (conns.clone(), cut_next_insert.clone(), cuts.clone());
        let frozen = freeze.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let (arm, count, frozen) = (arm.clone(), count.clone(), frozen.clone());
                let task = tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, arm, count, frozen).await;
                    }
                });
                list.lock().unwrap().push(task.abort_handle());
            }
        })
        .abort_handle();
        PgProxy {
            port,
            conns,
            accept,
            cut_next_insert,
            cuts,
            freeze,
        }
    }

    /// The next reply that acknowledges a one-row INSERT reaches agentd; after it nothing
    /// agentd sends reaches PostgreSQL until [`PgProxy::thaw`].
    pub fn freeze_after_next_insert(&self) {
        self.freeze.armed.store(true, Ordering::SeqCst);
    }

    /// Whether the freeze has happened.
    pub fn is_frozen(&self) -> bool {
        self.freeze.frozen.load(Ordering::SeqCst)
    }

    /// Lets traffic through again.
    pub fn thaw(&self) {
        self.freeze.frozen.store(false, Ordering::SeqCst);
        self.freeze.thawed.notify_waiters();
    }

    /// A proxy in front of the server of `url` (a postgres:// URL), and `url` rewritten to go
    /// through it.
    pub async fn in_front_of(url: &str) -> (PgProxy, String) {
        let rest = url.split_once('@').map_or(url, |(_, r)| r);
        let upstream = rest.split('/').next().unwrap_or("127.0.0.1:5432");
        let proxy = PgProxy::start(upstream.to_string()).await;
        let proxied = proxy.url_for(url);
        (proxy, proxied)
    }

    /// Drops every connection made so far (both sides see the socket close); returns how many
    /// were still open (a connection that had already closed by itself is not counted).
    pub fn cut_all(&self) -> usize {
        let mut cut = 0;
        for c in self.conns.lock().unwrap().drain(..) {
            if !c.is_finished() {
                cut += 1;
            }
            c.abort();
        }
        cut
    }

    /// The next reply that acknowledges a one-row INSERT is swallowed and its connection cut.
    pub fn cut_after_next_insert(&self) {
        self.cut_next_insert.store(true, Ordering::SeqCst);
    }

    /// How many acknowledged INSERTs were cut.
    pub fn insert_cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }

    /// `url` (a postgres:// URL) rewritten to go through this proxy.
    pub fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let (auth, tail) = match rest.split_once('@') {
            Some((a, t)) => (format!("{a}@"), t),
            None => (String::new(), rest),
        };
        let path = tail.find('/').map_or("", |i| &tail[i..]);
        format!("{scheme}://{auth}127.0.0.1:{}{path}", self.port)
    }
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    arm: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    freeze: Arc<Freeze>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let gate = freeze.clone();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            gate.wait_thawed().await;
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match sr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        if chunk.windows(INSERT_ACK.len()).any(|w| w == INSERT_ACK)
            && arm.swap(false, Ordering::SeqCst)
        {
            cuts.fetch_add(1, Ordering::SeqCst);
            break; // the acknowledgement never reaches agentd
        }
        // Frozen before agentd can read the acknowledgement, so nothing it sends after slips by.
        if chunk.windows(INSERT_ACK.len()).any(|w| w == INSERT_ACK)
            && freeze.armed.swap(false, Ordering::SeqCst)
        {
            freeze.frozen.store(true, Ordering::SeqCst);
        }
        if cw.write_all(chunk).await.is_err() {
            break;
        }
    }
    up.abort();
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_all();
    }
}
