//! Time to the first chunk of an answer: over A2A (`message:stream`, HTTP+JSON, and
//! `SendStreamingMessage`, JSON-RPC) and over ADK's `/run_sse`, for the same echo app on the
//! same agentd, interleaved so every protocol sees the same machine state.
//!
//! The time is from sending the request to reading the first SSE frame that carries answer
//! text: an `artifactUpdate` over A2A, a partial event over `/run_sse`. What differs between
//! them is only the protocol's own work: admission, the session and the run are the same.

use crate::pg::Admin;
use crate::servers::single_app_agentd;
use crate::BenchArgs;
use anyhow::{bail, Result};
use futures::StreamExt;
use std::fmt::Write;
use std::time::Instant;

/// One measured request: POST `body` to `url`, the milliseconds to the first frame holding
/// `marker`. The rest of the stream is read to its end (the run finishes before the next).
async fn first_chunk(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
    marker: &str,
) -> Result<f64> {
    let start = Instant::now();
    let resp = client.post(url).json(body).send().await?;
    if !resp.status().is_success() {
        bail!("{url} answered {}", resp.status());
    }
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    let mut first = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if first.is_none() {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains(marker) {
                first = Some(start.elapsed().as_secs_f64() * 1000.0);
                seen.clear();
            }
        }
    }
    first.ok_or_else(|| anyhow::anyhow!("{url}: no frame with {marker:?}"))
}

pub async fn run(args: &BenchArgs, admin: &Admin, agentd_bin: &std::path::Path) -> Result<String> {
    let work = tempfile::Builder::new().prefix("agentd-bench-").tempdir()?;
    let (agentd, _) = single_app_agentd(
        args,
        admin,
        agentd_bin,
        work.path(),
        args.backend,
        "a2a",
        "first",
        &format!(
            "agent_class: EchoAgent\nname: first\nchunks: {}\n",
            args.chunks
        ),
    )
    .await?;
    let client = reqwest::Client::new();
    let text = "x".repeat(args.message_bytes);
    let n = args.a2a_runs;
    let (mut rest, mut rpc, mut adk) = (vec![], vec![], vec![]);
    for i in 0..n + 10 {
        let session = format!("s{}", i % 8);
        let message = serde_json::json!({"messageId": format!("m{i}"), "role": "ROLE_USER",
            "parts": [{"text": text}], "contextId": format!("a2a-{session}")});
        let a = first_chunk(
            &client,
            &format!("{}/a2a/first/message:stream", agentd.base),
            &serde_json::json!({"message": message}),
            "artifactUpdate",
        )
        .await?;
        let b = first_chunk(
            &client,
            &format!("{}/a2a/first", agentd.base),
            &serde_json::json!({"jsonrpc": "2.0", "id": i, "method": "SendStreamingMessage",
                "params": {"message": message}}),
            "artifactUpdate",
        )
        .await?;
        let c = first_chunk(
            &client,
            &format!("{}/run_sse", agentd.base),
            &serde_json::json!({"appName": "first", "userId": "a2a", "sessionId": format!("adk-{session}"),
                "createSession": true, "streaming": true,
                "newMessage": {"role": "user", "parts": [{"text": text}]}}),
            "\"partial\":true",
        )
        .await?;
        // The first ten of each are warm-up.
        if i >= 10 {
            rest.push(a);
            rpc.push(b);
            adk.push(c);
        }
    }
    agentd.stop().await;
    let mut out = String::new();
    writeln!(
        out,
        "time to the first answer chunk ({:?} backend, echo app with {} chunks, {}-byte \
         messages, {n} requests each, one after the other, interleaved):",
        args.backend, args.chunks, args.message_bytes
    )?;
    for (name, mut v) in [
        ("A2A HTTP+JSON message:stream", rest),
        ("A2A JSON-RPC SendStreamingMessage", rpc),
        ("ADK /run_sse", adk),
    ] {
        v.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        writeln!(
            out,
            "  {name:<36} p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
            pct(0.5),
            pct(0.9),
            pct(0.99)
        )?;
    }
    Ok(out)
}
