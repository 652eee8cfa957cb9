//! Schedules: each tick fires once across replicas while one is killed; they belong to their user.

use super::*;
use crate::both_backends;

/// Two replicas fire a schedule every 2 seconds for about 20 seconds; one is killed with
/// SIGKILL half way. Every tick from the first to the last fires exactly once, each with its
/// own run.
async fn a_schedule_fires_each_tick_once_across_replicas_and_a_kill() {
    let db = TestDb::new(Backend::Postgres).await;
    let apps = Apps::new().echo("echo", "chunks: 1");
    let flags = [
        "--run-lease-secs",
        "2",
        "--schedule-poll-ms",
        "200",
        "--schedule-min-interval-secs",
        "1",
    ];
    let a = Replica::spawn(&db, &apps, "tick-a", &flags).await;
    let b = Replica::spawn(&db, &apps, "tick-b", &flags).await;
    let created = json_with_status(
        a.post(
            &format!("/apps/echo/users/{USER}/schedules"),
            json!({"cron": "*/2 * * * * *", "message": "tick", "session": "new"}),
        )
        .await,
        201,
    )
    .await;
    let id = created["id"].as_str().expect("id").to_string();
    assert_eq!(created["timezone"], "UTC");
    assert_eq!(created["catchUp"], "one");
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut a = a;
    a.signal("-KILL");
    let _ = a.child.wait().await;
    let killed_at = start.elapsed();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let stopped = json_with_status(
        b.client
            .patch(b.url(&format!("/apps/echo/users/{USER}/schedules/{id}")))
            .json(&json!({"enabled": false}))
            .send()
            .await
            .expect("PATCH"),
        200,
    )
    .await;
    assert_eq!(stopped["enabled"], false);
    assert!(stopped.get("nextTick").is_none());
    // Whatever was claimed before the pause starts (or is taken over) within a lease or two.
    tokio::time::sleep(Duration::from_secs(6)).await;

    let page = json_with_status(
        b.get(&format!(
            "/apps/echo/users/{USER}/schedules/{id}/runs?limit=200"
        ))
        .await,
        200,
    )
    .await;
    let mut ticks: Vec<Value> = page["ticks"].as_array().expect("ticks").clone();
    ticks.sort_by(|x, y| {
        x["tickTime"]
            .as_f64()
            .partial_cmp(&y["tickTime"].as_f64())
            .expect("times")
    });
    let times: Vec<f64> = ticks
        .iter()
        .map(|t| t["tickTime"].as_f64().expect("time"))
        .collect();
    assert!(times.len() >= 8, "ticks: {ticks:?}");
    let expected = ((times[times.len() - 1] - times[0]) / 2.0).round() as usize + 1;
    let mut runs: Vec<&str> = ticks
        .iter()
        .map(|t| t["runId"].as_str().expect("run"))
        .collect();
    runs.sort();
    runs.dedup();
    eprintln!(
        "schedule kill test: {} ticks fired, {expected} expected from {} to {} (replica killed \
         at {:.1} s); statuses {:?}",
        times.len(),
        times[0],
        times[times.len() - 1],
        killed_at.as_secs_f64(),
        ticks
            .iter()
            .map(|t| t["status"].as_str().unwrap_or(""))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        times.len(),
        expected,
        "a tick was lost or doubled: {times:?}"
    );
    assert_eq!(runs.len(), times.len(), "one run per tick");
    for t in &ticks {
        assert_eq!(t["status"], "started", "{t}");
        let run = json_with_status(
            b.get(&format!("/runs/{}", t["runId"].as_str().unwrap_or("")))
                .await,
            200,
        )
        .await;
        assert_ne!(run["status"], "running", "{run}");
    }
    // Each run is an ordinary run of the user, in its own session.
    let listed = json_with_status(
        b.get(&format!("/apps/echo/users/{USER}/runs?limit=200"))
            .await,
        200,
    )
    .await;
    assert_eq!(listed["runs"].as_array().map(Vec::len), Some(times.len()));
}

/// A schedule's life through the API: created, read, listed, changed, paused, deleted; and
/// another user's schedule is not found.
async fn schedules_belong_to_their_user(backend: Backend) {
    let s = TestServer::start_with(backend, |a| a.background.scheduler = false).await;
    let path = format!("/apps/echo/users/{USER}/schedules");
    let created = json_with_status(
        s.post_json(
            &path,
            json!({"cron": "0 9 * * 1-5", "timezone": "Europe/Paris", "message": "standup",
                   "session": "daily", "onBusy": "enqueue", "catchUp": "none"}),
        )
        .await,
        201,
    )
    .await;
    let id = created["id"].as_str().expect("id").to_string();
    assert_eq!(created["session"], "daily");
    assert_eq!(created["onBusy"], "enqueue");
    assert_eq!(created["message"]["parts"][0]["text"], "standup");
    let next = created["nextTick"].as_f64().expect("nextTick");
    assert!(next > agentd::event::now_ts());
    let one = json_with_status(s.get(&format!("{path}/{id}")).await, 200).await;
    assert_eq!(one["id"], id.as_str());
    let other = json_with_status(
        s.get(&format!("/apps/echo/users/u2/schedules/{id}")).await,
        404,
    )
    .await;
    assert_eq!(other["code"], "schedule_not_found");
    let other = json_with_status(
        s.delete(&format!("/apps/echo/users/u2/schedules/{id}"))
            .await,
        404,
    )
    .await;
    assert_eq!(other["code"], "schedule_not_found");
    let listed = json_with_status(s.get("/apps/echo/users/u2/schedules").await, 200).await;
    assert_eq!(listed["schedules"], json!([]));

    let paused = json_with_status(
        s.patch_json(&format!("{path}/{id}"), json!({"enabled": false}))
            .await,
        200,
    )
    .await;
    assert_eq!(paused["enabled"], false);
    assert!(paused.get("nextTick").is_none());
    let bad = json_with_status(
        s.patch_json(&format!("{path}/{id}"), json!({"cron": "nope"}))
            .await,
        422,
    )
    .await;
    assert_eq!(bad["code"], "invalid_cron");
    let resumed = json_with_status(
        s.patch_json(
            &format!("{path}/{id}"),
            json!({"enabled": true, "cron": "*/5 * * * *", "timezone": "UTC"}),
        )
        .await,
        200,
    )
    .await;
    assert_eq!(resumed["cron"], "*/5 * * * *");
    assert!(resumed["nextTick"].as_f64().expect("nextTick") <= agentd::event::now_ts() + 300.0);
    let listed = json_with_status(s.get(&path).await, 200).await;
    assert_eq!(listed["schedules"].as_array().map(Vec::len), Some(1));
    let ticks = json_with_status(s.get(&format!("{path}/{id}/runs")).await, 200).await;
    assert_eq!(ticks["ticks"], json!([]));
    assert_eq!(s.delete(&format!("{path}/{id}")).await.status(), 204);
    json_with_status(s.get(&format!("{path}/{id}")).await, 404).await;
}

both_backends!(schedules_belong_to_their_user);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_ticks_fire_once_across_replicas_when_one_is_killed() {
    a_schedule_fires_each_tick_once_across_replicas_and_a_kill().await;
}
