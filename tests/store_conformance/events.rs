//! `list_events` pages forward and backward; unknown event fields round-trip.

use super::*;
use crate::both_backends;

async fn events_page(
    store: &dyn Store,
    key: &SessionKey,
    after: Option<i64>,
    before: Option<i64>,
    limit: u32,
) -> (Vec<i64>, bool) {
    let page = store
        .list_events(
            key,
            EventRange {
                after,
                before,
                limit,
            },
        )
        .await
        .expect("list_events")
        .expect("session exists");
    (page.events.iter().map(|e| e.seq).collect(), page.has_more)
}

async fn with_ten_events(store: &dyn Store) -> SessionKey {
    let k = create(store, USER, "s1", json!({})).await;
    for _ in 0..10 {
        append(store, &k, json!({})).await;
    }
    k
}

async fn list_events_pages_forward_after(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = with_ten_events(&*store).await;
    let s = &*store;
    assert_eq!(
        events_page(s, &k, None, None, 4).await,
        (vec![1, 2, 3, 4], true)
    );
    assert_eq!(
        events_page(s, &k, Some(4), None, 4).await,
        (vec![5, 6, 7, 8], true)
    );
    assert_eq!(
        events_page(s, &k, Some(8), None, 4).await,
        (vec![9, 10], false)
    );
    assert!(
        !events_page(s, &k, None, None, 10).await.1,
        "exactly the rest"
    );
    assert_eq!(events_page(s, &k, Some(10), None, 4).await, (vec![], false));

    let page = store
        .list_events(
            &k,
            EventRange {
                after: Some(2),
                before: None,
                limit: 1,
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        page.events[0].event,
        get(s, &k).await.events[2],
        "seq 3 is the 3rd event"
    );
}

async fn list_events_pages_backward_before(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = with_ten_events(&*store).await;
    let s = &*store;
    assert_eq!(
        events_page(s, &k, None, Some(11), 4).await,
        (vec![7, 8, 9, 10], true)
    );
    assert_eq!(
        events_page(s, &k, None, Some(7), 4).await,
        (vec![3, 4, 5, 6], true)
    );
    assert_eq!(
        events_page(s, &k, None, Some(3), 4).await,
        (vec![1, 2], false)
    );
    assert_eq!(events_page(s, &k, None, Some(1), 4).await, (vec![], false));
    assert_eq!(
        events_page(s, &k, Some(2), Some(9), 10).await,
        (vec![3, 4, 5, 6, 7, 8], false)
    );
    assert_eq!(
        events_page(s, &k, Some(2), Some(9), 3).await,
        (vec![6, 7, 8], true)
    );
}

async fn list_events_of_missing_or_empty_session(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({})).await;
    assert_eq!(
        events_page(&*store, &k, None, None, 10).await,
        (vec![], false)
    );
    assert_eq!(
        events_page(&*store, &k, None, Some(5), 10).await,
        (vec![], false)
    );
    for missing in [key(USER, "nope"), key(OTHER_USER, "s1")] {
        let range = EventRange {
            limit: 10,
            ..Default::default()
        };
        assert!(store.list_events(&missing, range).await.unwrap().is_none());
    }
}

async fn unknown_event_fields_round_trip(backend: Backend) {
    let (_db, store) = open(backend).await;
    let raw = json!({
        "invocationId": "e-1", "author": "agent", "id": "ev-1", "timestamp": 1234.5,
        "groundingMetadata": {"chunks": [{"web": {"uri": "https://x"}}]},
        "outputTranscription": {"text": "hi", "finished": true},
        "content": {"role": "model", "parts": [{"text": "hi", "videoMetadata": {"fps": 2}}],
                    "futureContentField": 1},
        "actions": {"stateDelta": {"k": 1}, "compaction": {"startTimestamp": 1.0}}
    });
    let original: Event = serde_json::from_value(raw.clone()).unwrap();
    assert!(original.extra.contains_key("groundingMetadata"));

    let mut new = new_session(USER, Some("restored"), json!({}));
    new.events = vec![original.clone()];
    store.create_session(new).await.unwrap();
    let k = create(&*store, USER, "s1", json!({})).await;
    let appended = store
        .append_event(&k, original.clone(), vec![])
        .await
        .unwrap();
    assert_eq!(appended.event, original);

    for k in [key(USER, "restored"), k] {
        let s = get(&*store, &k).await;
        assert_eq!(s.events, std::slice::from_ref(&original));
        let wire = serde_json::to_value(&s.events[0]).unwrap();
        for field in ["groundingMetadata", "outputTranscription"] {
            assert_eq!(wire[field], raw[field], "{field}");
        }
        assert_eq!(
            wire["content"]["parts"][0]["videoMetadata"],
            json!({"fps": 2})
        );
        assert_eq!(wire["content"]["futureContentField"], json!(1));
        assert_eq!(wire["actions"]["compaction"], raw["actions"]["compaction"]);
    }
}

both_backends!(
    list_events_pages_forward_after,
    list_events_pages_backward_before,
    list_events_of_missing_or_empty_session,
    unknown_event_fields_round_trip,
);
