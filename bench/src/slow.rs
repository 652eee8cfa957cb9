//! Slow readers: many clients reading a long streamed reply a few bytes at a time, what they
//! cost agentd in memory while they read and after they hang up, and what they do to other
//! clients' time to first byte meanwhile.
//!
//! Each slow client is a raw TCP socket with a small receive buffer that sends `POST /run` for
//! a long echo reply and then reads 10 bytes every 100 ms (so the kernel's buffers fill and
//! agentd has to hold, or stop producing, the rest). HTTP client libraries read ahead into
//! their own buffers, so they cannot be slow readers; a socket can.

use crate::load::{self, RunSpec};
use crate::proc_stats;
use crate::servers::Env;
use crate::BenchArgs;
use anyhow::{Context, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::servers::APP;

pub struct SlowResult {
    pub clients: usize,
    pub reply_bytes: usize,
    pub rss_before_kib: u64,
    pub rss_reading_kib: u64,
    pub rss_after_kib: u64,
    pub bytes_read: usize,
    pub ttfb_alone: (f64, f64),
    pub ttfb_with_slow: (f64, f64),
}

/// p50 and p99 of `POST /run` TTFB in ms, from 8 clients running for `secs`.
async fn ttfb(spec: &RunSpec, secs: f64) -> Result<(f64, f64)> {
    let client = load::client(16)?;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = vec![];
    for _ in 0..8 {
        let (client, spec) = (client.clone(), spec.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = vec![];
            while Instant::now() < deadline {
                out.push(load::one_run(&client, &spec).await?.ttfb);
            }
            anyhow::Ok(out)
        }));
    }
    let mut all = vec![];
    for t in tasks {
        all.extend(t.await??);
    }
    all.sort();
    let at = |q: f64| {
        all.get(((all.len() as f64 - 1.0) * q) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Ok((at(0.5), at(0.99)))
}

/// One slow reader: sends the run, then reads 10 bytes every 100 ms until told to stop.
async fn slow_reader(
    addr: std::net::SocketAddr,
    request: Arc<Vec<u8>>,
    read: Arc<AtomicUsize>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(4096)?;
    let mut stream = socket.connect(addr).await?;
    stream.write_all(&request).await?;
    let mut buf = [0u8; 10];
    loop {
        tokio::select! {
            _ = stop.changed() => return Ok(()),
            n = stream.read(&mut buf) => {
                let n = n?;
                if n == 0 {
                    return Ok(());
                }
                read.fetch_add(n, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn run(args: &BenchArgs, env: &Env) -> Result<SlowResult> {
    let n = args.slow_readers;
    let reply = args.slow_reply_bytes;
    eprintln!("slow readers: {n} clients reading a {reply}-byte reply at 10 bytes / 100 ms…");
    let server = env
        .extra_agentd(&env.agentd_url, "slow", args.db_max_connections)
        .await?;
    let result = async {
        let client = load::client(64)?;
        let normal = RunSpec::new(&server.base, APP, args.message_bytes, args.chunks);
        let long = RunSpec::new(&server.base, APP, reply, args.chunks);
        // Warm up, then the time to first byte with no slow readers.
        ttfb(&normal, 2.0).await?;
        let ttfb_alone = ttfb(&normal, 5.0).await?;
        let mut sessions = vec![];
        for _ in 0..n {
            sessions.push(load::create_session(&client, &long).await?);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rss_before_kib = proc_stats::sample(server.pid)?.rss_kib;

        let addr: std::net::SocketAddr = server
            .base
            .trim_start_matches("http://")
            .parse()
            .context("server address")?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let read = Arc::new(AtomicUsize::new(0));
        let mut tasks = vec![];
        for session in &sessions {
            let body = serde_json::to_vec(&long.run_body(session))?;
            let mut request = format!(
                "POST /run HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n",
                body.len()
            );
            if let Some(key) = crate::credentials::API_KEY.get() {
                request.push_str(&format!("x-api-key: {key}\r\n"));
            }
            request.push_str("\r\n");
            let mut request = request.into_bytes();
            request.extend_from_slice(&body);
            tasks.push(tokio::spawn(slow_reader(
                addr,
                Arc::new(request),
                read.clone(),
                stop_rx.clone(),
            )));
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let ttfb_with_slow = ttfb(&normal, 5.0).await?;
        let rss_reading_kib = proc_stats::sample(server.pid)?.rss_kib;
        let bytes_read = read.load(Ordering::Relaxed);
        let _ = stop_tx.send(true);
        for t in tasks {
            t.await??;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        let rss_after_kib = proc_stats::sample(server.pid)?.rss_kib;
        anyhow::Ok(SlowResult {
            clients: n,
            reply_bytes: reply,
            rss_before_kib,
            rss_reading_kib,
            rss_after_kib,
            bytes_read,
            ttfb_alone,
            ttfb_with_slow,
        })
    }
    .await;
    server.stop().await;
    result
}

pub fn report(r: &SlowResult) -> String {
    let mib = |k: u64| k as f64 / 1024.0;
    let per_client = (r.rss_reading_kib as f64 - r.rss_before_kib as f64) / r.clients.max(1) as f64;
    format!(
        "## Slow readers\n\n\
         {} clients, each reading a {}-byte echo reply at 10 bytes / 100 ms (4 KiB receive \
         buffer); 8 other clients run normal runs meanwhile.\n\n\
         | | value |\n|---|---|\n\
         | agentd RSS before | {:.1} MiB |\n\
         | agentd RSS while they read | {:.1} MiB ({:.0} KiB per slow client) |\n\
         | agentd RSS 10 s after they hung up | {:.1} MiB |\n\
         | bytes the slow clients read in ~10 s | {} |\n\
         | other clients' TTFB p50 / p99, alone | {:.2} / {:.2} ms |\n\
         | other clients' TTFB p50 / p99, with the slow readers | {:.2} / {:.2} ms |\n",
        r.clients,
        r.reply_bytes,
        mib(r.rss_before_kib),
        mib(r.rss_reading_kib),
        per_client,
        mib(r.rss_after_kib),
        r.bytes_read,
        r.ttfb_alone.0,
        r.ttfb_alone.1,
        r.ttfb_with_slow.0,
        r.ttfb_with_slow.1,
    )
}
