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

/// The admin URL (its user and password) pointed at `host:port`, database `db`.
fn node_url(admin: &str, host: &str, port: i32, db: &str) -> String {
    let mut url = reqwest::Url::parse(admin).expect("AGENTD_TEST_CITUS_URL is a URL");
    let _ = url.set_host(Some(host));
    let _ = url.set_port(u16::try_from(port).ok());
    url.set_path(&format!("/{db}"));
    url.to_string()
}

/// Creates database `name` on every node; returns the coordinator's URL for it and the nodes
/// (each as its admin URL).
pub async fn create(admin: &str, name: &str) -> (String, Vec<String>) {
    let (url, nodes) = create_plain(admin, name).await;
    register(admin, &url).await;
    (url, nodes)
}

/// The coordinator (host, port) of `admin` and its workers.
async fn topology(admin: &str) -> ((String, i32), Vec<(String, i32)>) {
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
    (me, workers)
}

/// Database `name` on every node, with the extension on the workers only: on the coordinator
/// it is a plain PostgreSQL database until [`register`] makes it a Citus one.
pub async fn create_plain(admin: &str, name: &str) -> (String, Vec<String>) {
    let (me, workers) = topology(admin).await;
    let mut nodes = vec![me.clone()];
    nodes.extend(workers.iter().cloned());
    let node_admins: Vec<String> = nodes
        .iter()
        .map(|(host, port)| node_url(admin, host, *port, "postgres"))
        .collect();
    for (host, port) in &nodes {
        let mut c = PgConnection::connect(&node_url(admin, host, *port, "postgres"))
            .await
            .expect("a Citus node answers");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut c)
            .await
            .expect("CREATE DATABASE on a Citus node");
        let _ = c.close().await;
        if (host, port) == (&me.0, &me.1) {
            continue;
        }
        let mut c = PgConnection::connect(&node_url(admin, host, *port, name))
            .await
            .expect("the new database");
        sqlx::query("CREATE EXTENSION citus")
            .execute(&mut c)
            .await
            .expect("CREATE EXTENSION citus");
        let _ = c.close().await;
    }
    (node_url(admin, &me.0, me.1, name), node_admins)
}

/// Makes the coordinator's database `url` a Citus one: the extension, the coordinator's own
/// address, the workers (as `docs/citus.md` tells an operator to).
pub async fn register(admin: &str, url: &str) {
    let (me, workers) = topology(admin).await;
    let name = reqwest::Url::parse(url)
        .expect("a URL")
        .path()
        .trim_start_matches('/')
        .to_string();
    let mut c = PgConnection::connect(url)
        .await
        .expect("the coordinator's database");
    sqlx::query("CREATE EXTENSION IF NOT EXISTS citus")
        .execute(&mut c)
        .await
        .expect("CREATE EXTENSION citus");
    sqlx::query("SELECT citus_set_coordinator_host($1, $2)")
        .bind(&me.0)
        .bind(me.1)
        .execute(&mut c)
        .await
        .expect("citus_set_coordinator_host");
    for (host, port) in &workers {
        // Adding a node syncs the metadata to it over a connection of its own, which another
        // test's database being created or dropped on that worker can break ("failure on
        // connection marked as essential"): the add rolls back and is tried again.
        let mut attempt = 0;
        loop {
            let added = sqlx::query("SELECT citus_add_node($1, $2)")
                .bind(host)
                .bind(port)
                .execute(&mut c)
                .await;
            match added {
                Ok(_) => break,
                Err(e) if attempt < 5 => {
                    attempt += 1;
                    eprintln!("citus_add_node({host}, {port}) failed, retrying: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
                }
                Err(e) => panic!("citus_add_node({host}, {port}): {e}"),
            }
        }
    }
    // Four shards per table rather than 32: distributing a schema per test stays quick.
    sqlx::query(&format!("ALTER DATABASE {name} SET citus.shard_count = 4"))
        .execute(&mut c)
        .await
        .expect("shard count");
    let _ = c.close().await;
}

/// Drops database `name` from every node (each given by its admin URL).
pub async fn drop(nodes: &[String], name: &str) {
    for node in nodes {
        if let Ok(mut c) = PgConnection::connect(node).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&mut c)
                .await;
        }
    }
}
