//! The dev stack's Redis and MariaDB (issue 22): started only on request, on
//! loopback, with the same fault injection as the other servers, and gone after
//! drop.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use sqlx::Connection;
use tenure::devstack::{DevStack, DevStackOptions};

fn only_redis_and_mariadb() -> DevStackOptions {
    DevStackOptions {
        etcd: false,
        nats: false,
        postgres: false,
        redis: true,
        mariadb: true,
        ..Default::default()
    }
}

async fn redis_get(url: &str, key: &str) -> Result<Option<String>, String> {
    let attempt = async {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("GET")
            .arg(key)
            .query_async::<Option<String>>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .map_err(|_| "timed out".to_string())?
}

async fn redis_set(url: &str, key: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("v")
        .query_async(&mut conn)
        .await
        .unwrap();
}

async fn mysql_count(url: &str) -> Result<i64, String> {
    let attempt = async {
        let mut conn = sqlx::MySqlConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM kept")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| e.to_string())
    };
    tokio::time::timeout(Duration::from_secs(3), attempt)
        .await
        .map_err(|_| "timed out".to_string())?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_forgets_its_keys_on_restart_and_a_paused_redis_answers_nothing() {
    let stack = DevStack::start_with(only_redis_and_mariadb())
        .await
        .expect("stack");
    let url = stack.redis_url();
    assert!(url.starts_with("redis://127.0.0.1:"), "{url}");
    redis_set(&url, "lock").await;
    assert_eq!(redis_get(&url, "lock").await.unwrap().as_deref(), Some("v"));

    stack.redis_server().pause().expect("pause");
    let frozen = redis_get(&url, "lock").await;
    assert!(frozen.is_err(), "a paused Redis answered: {frozen:?}");
    stack.redis_server().resume().expect("resume");
    assert_eq!(redis_get(&url, "lock").await.unwrap().as_deref(), Some("v"));

    // No persistence: a restarted Redis has lost every lock it held.
    stack.redis_server().restart().expect("restart");
    stack
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("ready");
    assert_eq!(redis_get(&url, "lock").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_keeps_committed_rows_across_a_kill_and_stops_with_the_stack() {
    let stack = DevStack::start_with(only_redis_and_mariadb())
        .await
        .expect("stack");
    let url = stack.create_mysql_database("kept_rows").await.expect("db");
    assert!(url.starts_with("mysql://root@127.0.0.1:"), "{url}");
    let mut conn = sqlx::MySqlConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE kept (id INT PRIMARY KEY) ENGINE=InnoDB; INSERT INTO kept VALUES (1), (2);",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    drop(conn);

    stack.mariadb_server().pause().expect("pause");
    let frozen = mysql_count(&url).await;
    assert!(frozen.is_err(), "a paused MariaDB answered: {frozen:?}");
    stack.mariadb_server().resume().expect("resume");
    assert_eq!(mysql_count(&url).await.unwrap(), 2);

    stack.mariadb_server().kill().expect("kill");
    assert!(
        mysql_count(&url).await.is_err(),
        "a killed MariaDB answered"
    );
    stack.mariadb_server().restart().expect("restart");
    stack
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("ready");
    assert_eq!(mysql_count(&url).await.unwrap(), 2, "InnoDB lost a commit");

    let pids: Vec<u32> = stack.processes().filter_map(|p| p.pid()).collect();
    assert_eq!(pids.len(), 2, "redis and mariadb only");
    drop(stack);
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "process {pid} outlived its stack"
        );
    }
}
