//! A throwaway Citus database per test: a database of the same name on the coordinator and on
//! every worker of the cluster at `AGENTD_TEST_CITUS_URL` (started by `scripts/test.sh` with
//! `scripts/citus.sh`), the extension in each, the workers registered in the coordinator's.
//! agentd's own migration then distributes the tables (`src/store/postgres/citus.rs`).

use sqlx::{Connection, PgConnection, Row};

/// The coordinator's admin URL, if the suite was given a Citus cluster.
pub fn admin_url() -> Option<String> {
    std::env::var("AGENTD_TEST_CITUS_URL")
        .ok()
        .filter(|u| u.starts_with("postgres"))
}

/// Why a Citus test did not run (printed, never a silent pass).
pub fn not_run(test: &str) {
    eprintln!(
        "citus: {test} did NOT run on Citus: AGENTD_TEST_CITUS_URL is not set. \
         ./scripts/test.sh sets it, installing Citus (scripts/citus.sh install) when it is \
         missing; or start a cluster with `scripts/citus.sh start DIR` and export its URL."
    );
}

fn node_url(host: &str, port: i32, db: &str) -> String {
    format!("postgres://postgres@{host}:{port}/{db}")
}

/// Creates database `name` on every node; returns the coordinator's URL for it and the nodes.
pub async fn create(admin: &str, name: &str) -> (String, Vec<(String, i32)>) {
    let mut coord = PgConnection::connect(admin).await.unwrap_or_else(|e| {
        panic!(
            "the Citus coordinator at {admin} did not answer ({e}); start one with \
             scripts/citus.sh start DIR, or unset AGENTD_TEST_CITUS_URL"
        )
    });
    let me: (String, i32) = {
        let url = reqwest::Url::parse(admin).expect("AGENTD_TEST_CITUS_URL is a URL");
        (
            url.host_str().unwrap_or("127.0.0.1").to_string(),
            i32::from(url.port().unwrap_or(5432)),
        )
    };
    let workers: Vec<(String, i32)> = sqlx::query(
        "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary'
          ORDER BY nodeport",
    )
    .fetch_all(&mut coord)
    .await
    .expect("the coordinator lists its workers")
    .iter()
    .map(|r| (r.get::<String, _>(0), r.get::<i32, _>(1)))
    .collect();
    let _ = coord.close().await;
    let mut nodes = vec![me.clone()];
    nodes.extend(workers.iter().cloned());
    for (host, port) in &nodes {
        let mut c = PgConnection::connect(&node_url(host, *port, "postgres"))
            .await
            .expect("a Citus node answers");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut c)
            .await
            .expect("CREATE DATABASE on a Citus node");
        let _ = c.close().await;
        let mut c = PgConnection::connect(&node_url(host, *port, name))
            .await
            .expect("the new database");
        sqlx::query("CREATE EXTENSION citus")
            .execute(&mut c)
            .await
            .expect("CREATE EXTENSION citus");
        let _ = c.close().await;
    }
    let url = node_url(&me.0, me.1, name);
    let mut c = PgConnection::connect(&url)
        .await
        .expect("the coordinator's database");
    sqlx::query("SELECT citus_set_coordinator_host($1, $2)")
        .bind(&me.0)
        .bind(me.1)
        .execute(&mut c)
        .await
        .expect("citus_set_coordinator_host");
    for (host, port) in &workers {
        sqlx::query("SELECT citus_add_node($1, $2)")
            .bind(host)
            .bind(port)
            .execute(&mut c)
            .await
            .expect("citus_add_node");
    }
    // Four shards per table rather than 32: distributing a schema per test stays quick.
    sqlx::query(&format!("ALTER DATABASE {name} SET citus.shard_count = 4"))
        .execute(&mut c)
        .await
        .expect("shard count");
    let _ = c.close().await;
    (url, nodes)
}

/// Drops database `name` from every node.
pub async fn drop(nodes: &[(String, i32)], name: &str) {
    for (host, port) in nodes {
        if let Ok(mut c) = PgConnection::connect(&node_url(host, *port, "postgres")).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&mut c)
                .await;
        }
    }
}
