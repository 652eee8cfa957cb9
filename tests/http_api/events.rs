//! A session's events: the newest ones, pages by `seq`, and a big session comes back whole.

use super::*;
use crate::both_backends;

async fn get_session_limit_returns_newest_events(backend: Backend) {
    let s = TestServer::start(backend).await;
    create_session(&s, "s1", json!({})).await;
    for n in 0..5 {
        patch_state(&s, "s1", json!({ "n": n })).await;
    }
    let full = get_session(&s, "s1").await;
    assert_eq!(full["events"].as_array().unwrap().len(), 5);
    let resp = s.get(&format!("{}?limit=2", session_path("s1"))).await;
    let recent = json_with_status(resp, 200).await;
    let deltas: Vec<&Value> = recent["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["actions"]["stateDelta"]["n"])
        .collect();
    assert_eq!(deltas, [&json!(3), &json!(4)]);
    assert_eq!(recent["state"], json!({"n": 4}));
    assert_eq!(recent["events"][1], full["events"][4]);

    // A huge limit is read as the page maximum (1000), not as "load the whole session at
    // once": a session of 1,005 events answers its newest 1,000.
    let events: Vec<Value> = (0..1_005)
        .map(|i| {
            json!({"author": "user", "invocationId": "e-imported",
                   "content": {"role": "user", "parts": [{"text": format!("m{i}")}]}})
        })
        .collect();
    json_with_status(
        s.post_json(SESSIONS, json!({"sessionId": "big", "events": events}))
            .await,
        200,
    )
    .await;
    let resp = s
        .get(&format!("{}?limit=4294967295", session_path("big")))
        .await;
    let capped = json_with_status(resp, 200).await;
    let got = capped["events"].as_array().unwrap();
    assert_eq!(got.len(), 1_000);
    assert_eq!(got[0]["content"]["parts"][0]["text"], "m5");
    assert_eq!(got[999]["content"]["parts"][0]["text"], "m1004");
}

async fn list_events_pages_by_seq(backend: Backend) {
    let s = TestServer::start(backend).await;
    create_session(&s, "s1", json!({})).await;
    for n in 1..=5 {
        patch_state(&s, "s1", json!({ "n": n })).await;
    }
    let events = |query: &str| get_json(&s, format!("{}/events{query}", session_path("s1")));
    let seqs = |page: &Value| -> Vec<i64> {
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_i64().unwrap())
            .collect()
    };

    let all = events("").await;
    assert_eq!(seqs(&all), [1, 2, 3, 4, 5]);
    assert_eq!(all["hasMore"], false);
    assert!(
        all.get("nextAfter").is_none() && all.get("nextBefore").is_none(),
        "{all}"
    );
    let stored = get_session(&s, "s1").await;
    for (paged, stored) in all["events"]
        .as_array()
        .unwrap()
        .iter()
        .zip(stored["events"].as_array().unwrap())
    {
        let mut paged = paged.clone();
        paged.as_object_mut().unwrap().remove("seq");
        assert_eq!(
            &paged, stored,
            "an event page carries the stored events plus seq"
        );
    }

    let first = events("?limit=2").await;
    assert_eq!(
        (seqs(&first), &first["hasMore"], &first["nextAfter"]),
        (vec![1, 2], &json!(true), &json!(2))
    );
    let middle = events("?limit=2&after=2").await;
    assert_eq!(
        (seqs(&middle), &middle["nextAfter"]),
        (vec![3, 4], &json!(4))
    );
    let last = events("?limit=2&after=4").await;
    assert_eq!((seqs(&last), &last["hasMore"]), (vec![5], &json!(false)));
    assert!(last.get("nextAfter").is_none());

    let newest = events("?limit=2&before=6").await;
    assert_eq!(
        (seqs(&newest), &newest["hasMore"], &newest["nextBefore"]),
        (vec![4, 5], &json!(true), &json!(4))
    );
    let older = events("?limit=2&before=4").await;
    assert_eq!(
        (seqs(&older), &older["nextBefore"]),
        (vec![2, 3], &json!(2))
    );
    let oldest = events("?limit=2&before=2").await;
    assert_eq!(
        (seqs(&oldest), &oldest["hasMore"]),
        (vec![1], &json!(false))
    );
    assert!(oldest.get("nextBefore").is_none());

    let missing = s.get(&format!("{}/events", session_path("nope"))).await;
    assert_error(missing, 404, "Session not found", "session_not_found").await;
    let zero = s
        .get(&format!("{}/events?limit=0", session_path("s1")))
        .await;
    assert_validation(zero, "validation_error", json!(["query", "limit"])).await;
    let bad = s
        .get(&format!("{}/events?after=abc", session_path("s1")))
        .await;
    assert_validation(bad, "validation_error", json!(["query", "after"])).await;
}

/// A whole session is streamed page by page (500 events a read): 1,234 events come back
/// complete, in order, as one JSON document equal to the paged event listing.
async fn a_big_session_comes_back_whole(backend: Backend) {
    let s = TestServer::start(backend).await;
    let events: Vec<Value> = (0..1_234)
        .map(|i| {
            json!({"id": format!("ev-{i}"), "author": if i % 2 == 0 { "user" } else { "a" },
                "invocationId": "e-1", "timestamp": 1_700_000_000.0 + f64::from(i),
                "content": {"role": "user", "parts": [{"text": format!("message {i}")}]}})
        })
        .collect();
    json_with_status(
        s.post_json(
            SESSIONS,
            json!({"sessionId": "big", "state": {"k": "v"}, "events": events}),
        )
        .await,
        200,
    )
    .await;
    let session = get_session(&s, "big").await;
    assert_eq!(session["id"], "big");
    assert_eq!(session["state"], json!({"k": "v"}));
    let got = session["events"].as_array().unwrap();
    assert_eq!(got.len(), 1_234);
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e["id"], format!("ev-{i}"));
    }
    assert!(session["lastUpdateTime"].as_f64().unwrap() > 0.0);
    // As a browser asks for it: gzip-encoded, whole. (The encoder polls the body once more
    // after its end; that used to panic the streamed body and cut the connection without an
    // answer.)
    let resp = s
        .client
        .get(s.url(&session_path("big")))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .expect("GET with gzip");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    let zipped = resp.bytes().await.expect("gzip body");
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&zipped[..]), &mut plain)
        .expect("valid gzip");
    assert_eq!(
        serde_json::from_slice::<Value>(&plain).expect("JSON"),
        session
    );
    let limited = json_with_status(
        s.get(&format!("{}?limit=3", session_path("big"))).await,
        200,
    )
    .await;
    assert_eq!(limited["events"].as_array().unwrap().len(), 3);
    // PATCH answers the same document, with the new event last.
    let patched = json_with_status(
        s.patch_json(
            &session_path("big"),
            json!({"stateDelta": {"k": "w", "temp:t": 1}}),
        )
        .await,
        200,
    )
    .await;
    assert_eq!(patched["events"].as_array().unwrap().len(), 1_235);
    assert_eq!(patched["state"], json!({"k": "w", "temp:t": 1}));
}

both_backends!(
    a_big_session_comes_back_whole,
    get_session_limit_returns_newest_events,
    list_events_pages_by_seq,
);
