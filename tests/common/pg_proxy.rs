//! A TCP proxy between agentd and PostgreSQL that can cut every connection at once: what a
//! PostgreSQL restart or a network cut looks like to the pool.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

pub struct PgProxy {
    pub port: u16,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl PgProxy {
    /// Forwards 127.0.0.1:<port> to `upstream` (`host:port`).
    pub async fn start(upstream: String) -> PgProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let conns: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let list = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
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
        }
    }

    /// Drops every connection made so far (both sides see the socket close).
    pub fn cut_all(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
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

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_all();
    }
}
