//! Bad schedules and webhooks are refused with a stable code, and nothing is stored.

use super::*;
use crate::both_backends;

/// Bad schedules and webhooks are refused with a stable code, and nothing is stored.
async fn bad_schedules_and_webhooks_are_refused(backend: Backend) {
    let s = TestServer::start(backend).await;
    let path = format!("/apps/echo/users/{USER}/schedules");
    let cases = [
        (
            // Every second, or every 30 s: faster than the default minimum period (60 s).
            json!({"cron": "* * * * * *", "message": "x"}),
            422,
            "cron_too_frequent",
        ),
        (
            json!({"cron": "0,30 * * * * *", "message": "x"}),
            422,
            "cron_too_frequent",
        ),
        (
            json!({"cron": "* * *", "message": "x"}),
            422,
            "invalid_cron",
        ),
        (
            json!({"cron": "61 * * * *", "message": "x"}),
            422,
            "invalid_cron",
        ),
        (
            json!({"cron": "* * * * *", "timezone": "Mars/Olympus", "message": "x"}),
            422,
            "invalid_timezone",
        ),
        (
            json!({"cron": "* * * * *", "message": ""}),
            422,
            "invalid_message",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "catchUp": "all"}),
            422,
            "validation_error",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "session": "a/b"}),
            400,
            "invalid_id",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "webhook": {"url": "ftp://example.com/", "secret": SECRET}}),
            422,
            "webhook_url_invalid",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "webhook": {"url": "http://127.0.0.1:9/", "secret": SECRET}}),
            422,
            "webhook_url_refused",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "webhook": {"url": "http://localhost:9/", "secret": SECRET}}),
            422,
            "webhook_url_refused",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "webhook": {"url": "https://example.com/", "secret": "hunter2"}}),
            422,
            "webhook_secret_invalid",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "webhook": {"url": "https://example.com/"}}),
            422,
            "webhook_secret_required",
        ),
    ];
    for (body, status, code) in &cases {
        let resp = s.post_json(&path, body.clone()).await;
        let got = json_with_status(resp, *status).await;
        assert_eq!(got["code"], *code, "{body} → {got}");
    }
    let unknown = json_with_status(
        s.post_json(
            &format!("/apps/nope/users/{USER}/schedules"),
            json!({"cron": "* * * * *", "message": "x"}),
        )
        .await,
        404,
    )
    .await;
    assert_eq!(unknown["code"], "app_not_found");
    let listed = json_with_status(s.get(&path).await, 200).await;
    assert_eq!(listed["schedules"], json!([]), "nothing stored");

    // A run with a refused webhook does not start: no run, no event.
    let created = s
        .post_json(
            &format!("/apps/echo/users/{USER}/sessions"),
            json!({"sessionId": "s1"}),
        )
        .await;
    json_with_status(created, 200).await;
    for (webhook, code) in [
        (
            json!({"url": "http://10.0.0.1/", "secret": SECRET}),
            "webhook_url_refused",
        ),
        (
            json!({"url": "https://example.com/", "secret": SECRET, "events": ["run.exploded"]}),
            "webhook_event_unknown",
        ),
    ] {
        let resp = s
            .post_json(
                "/run",
                json!({"appName": "echo", "userId": USER, "sessionId": "s1",
                       "newMessage": {"role": "user", "parts": [{"text": "x"}]},
                       "webhook": webhook}),
            )
            .await;
        let got = json_with_status(resp, 422).await;
        assert_eq!(got["code"], code, "{got}");
    }
    let session = json_with_status(
        s.get(&format!("/apps/echo/users/{USER}/sessions/s1")).await,
        200,
    )
    .await;
    assert_eq!(session["events"], json!([]), "nothing stored");
    let runs = json_with_status(s.get(&format!("/apps/echo/users/{USER}/runs")).await, 200).await;
    assert_eq!(runs["runs"], json!([]));
}

both_backends!(bad_schedules_and_webhooks_are_refused);

/// A user has at most `--max-schedules-per-user` schedules in an app: the next is 429
/// `too_many_schedules` and is not stored; deleting one makes room.
async fn a_users_schedules_are_bounded(backend: Backend) {
    let s = TestServer::start_with(backend, |a| {
        a.background.max_schedules_per_user = 3;
        a.background.scheduler = false;
    })
    .await;
    let path = format!("/apps/echo/users/{USER}/schedules");
    let body = json!({"cron": "0 9 * * *", "message": "report"});
    let mut ids = vec![];
    for _ in 0..3 {
        let made = json_with_status(s.post_json(&path, body.clone()).await, 201).await;
        ids.push(made["id"].as_str().expect("id").to_string());
    }
    let over = json_with_status(s.post_json(&path, body.clone()).await, 429).await;
    assert_eq!(over["code"], "too_many_schedules", "{over}");
    let listed = json_with_status(s.get(&path).await, 200).await;
    assert_eq!(listed["schedules"].as_array().map(Vec::len), Some(3));
    // Another user's quota is their own.
    json_with_status(
        s.post_json("/apps/echo/users/someone-else/schedules", body.clone())
            .await,
        201,
    )
    .await;
    let deleted = s
        .client
        .delete(s.url(&format!("{path}/{}", ids[0])))
        .send()
        .await
        .expect("DELETE");
    assert_eq!(deleted.status(), 204);
    json_with_status(s.post_json(&path, body).await, 201).await;
    // A pattern changed to fire faster than the minimum is refused, and the stored one kept.
    let faster = s
        .client
        .patch(s.url(&format!("{path}/{}", ids[1])))
        .json(&json!({"cron": "*/5 * * * * *"}))
        .send()
        .await
        .expect("PATCH");
    let got = json_with_status(faster, 422).await;
    assert_eq!(got["code"], "cron_too_frequent", "{got}");
    let kept = json_with_status(s.get(&format!("{path}/{}", ids[1])).await, 200).await;
    assert_eq!(kept["cron"], "0 9 * * *");

    // Pages: the last one has no `next` (never a `next` that leads to an empty page), and a
    // limit out of 1..=200 is 422 as on every list.
    let first = json_with_status(s.get(&format!("{path}?limit=2")).await, 200).await;
    let next = first["next"].as_str().expect("a next page").to_string();
    let last = json_with_status(s.get(&format!("{path}?limit=2&after={next}")).await, 200).await;
    assert_eq!(
        last["schedules"].as_array().map(Vec::len),
        Some(1),
        "{last}"
    );
    assert!(last.get("next").is_none(), "the last page: {last}");
    let exact = json_with_status(s.get(&format!("{path}?limit=3")).await, 200).await;
    assert!(exact.get("next").is_none(), "a full last page: {exact}");
    for bad in ["0", "201"] {
        let got = json_with_status(s.get(&format!("{path}?limit={bad}")).await, 422).await;
        assert_eq!(got["code"], "validation_error", "{got}");
    }
}

both_backends!(a_users_schedules_are_bounded);
